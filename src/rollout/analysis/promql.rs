//! The Prometheus provider's pure half: which queries a run sends, and what
//! an answer of `/api/v1/query` proves. `prometheus.rs` sends them.

use serde::Deserialize;

use super::condition::Condition;

/// The placeholders a query may use, and nothing else after a `$` that
/// starts a name: a typo must be refused with the spec, not sent.
const PLACEHOLDERS: [&str; 4] = ["cluster", "namespace", "name", "revision"];

/// The values the placeholders stand for in one query.
#[derive(Clone, Debug, PartialEq)]
pub struct Vars<'a> {
    pub cluster: Option<&'a str>,
    pub namespace: &'a str,
    pub name: &'a str,
    pub revision: &'a str,
}

/// Every `$name` of a query, in order.
fn placeholders(query: &str) -> Vec<(usize, String)> {
    let bytes = query.as_bytes();
    let mut found = Vec::new();
    for (i, b) in bytes.iter().enumerate() {
        if *b != b'$' {
            continue;
        }
        let word: String = query[i + 1..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        // `$1` is a label_replace back-reference, not ours.
        if word.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
            found.push((i, word));
        }
    }
    found
}

/// The query's placeholders are all known.
pub fn check_query(query: &str) -> Result<(), String> {
    if query.trim().is_empty() {
        return Err("is empty".into());
    }
    for (_, word) in placeholders(query) {
        if !PLACEHOLDERS.contains(&word.as_str()) {
            return Err(format!(
                "${word} is not a placeholder (use $cluster, $namespace, $name or $revision)"
            ));
        }
    }
    Ok(())
}

/// Whether the query runs once per cluster.
pub fn per_cluster(query: &str) -> bool {
    placeholders(query).iter().any(|(_, w)| w == "cluster")
}

/// Escaped for the inside of a PromQL double-quoted string, so a value can
/// never end the string it stands in.
fn escaped(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"")
}

/// The query with its placeholders replaced.
pub fn render(query: &str, vars: &Vars) -> String {
    let mut out = String::with_capacity(query.len());
    let mut rest = 0;
    for (at, word) in placeholders(query) {
        let value = match word.as_str() {
            "cluster" => vars.cluster.unwrap_or_default(),
            "namespace" => vars.namespace,
            "name" => vars.name,
            "revision" => vars.revision,
            _ => continue,
        };
        out.push_str(&query[rest..at]);
        out.push_str(&escaped(value));
        rest = at + 1 + word.len();
    }
    out.push_str(&query[rest..]);
    out
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Response {
    status: String,
    #[serde(default)]
    data: Option<Data>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Data {
    result_type: String,
    result: serde_json::Value,
}

#[derive(Deserialize)]
struct Sample {
    #[serde(default)]
    metric: std::collections::BTreeMap<String, String>,
    value: (f64, String),
}

/// How much of an answer's text is kept.
const ANSWER_CHARS: usize = 200;

fn short(text: &str) -> String {
    text.chars().take(ANSWER_CHARS).collect()
}

/// What one answer proves: `Ok(answer)` when every sample meets the
/// condition, `Err(answer)` otherwise. An error, no sample, NaN or a
/// result that is not a number fail: nothing passes by default.
pub fn verdict(http_status: u16, body: &[u8], condition: &Condition) -> Result<String, String> {
    // Fixed words, never the answer's text (#59): the status would carry
    // whatever the called address says.
    let response: Response = serde_json::from_slice(body)
        .map_err(|_| format!("HTTP {http_status}: not a Prometheus answer"))?;
    if response.status != "success" {
        return Err(format!("HTTP {http_status}: Prometheus refused the query"));
    }
    let data = response.data.ok_or("an answer without data")?;
    let samples: Vec<Sample> = match data.result_type.as_str() {
        "scalar" => {
            let value: (f64, String) = serde_json::from_value(data.result)
                .map_err(|_| "a scalar that is not a sample".to_string())?;
            vec![Sample {
                metric: Default::default(),
                value,
            }]
        }
        "vector" => serde_json::from_value(data.result)
            .map_err(|_| "a vector that is not samples".to_string())?,
        other => {
            return Err(format!(
                "a {other} result (use a query that gives a vector or a scalar)"
            ));
        }
    };
    if samples.is_empty() {
        return Err("no data".into());
    }
    for s in &samples {
        let value = s.value.1.parse::<f64>().unwrap_or(f64::NAN);
        if !condition.holds(value) {
            let labels: Vec<String> = s
                .metric
                .iter()
                .filter(|(k, _)| *k != "__name__")
                .map(|(k, v)| format!("{k}={v:?}"))
                .collect();
            let labels = match labels.is_empty() {
                true => String::new(),
                false => format!(" {{{}}}", labels.join(",")),
            };
            return Err(short(&format!(
                "result {}{labels} does not meet {condition}",
                s.value.1
            )));
        }
    }
    Ok(match samples.as_slice() {
        [one] => format!("result {}", one.value.1),
        all => format!("{} samples meet {condition}", all.len()),
    })
}

/// One run's verdict from its queries' (a query per cluster, or one):
/// it passes when there is at least one and all passed; the answer names
/// the cluster of a failure.
pub fn combine(results: Vec<(Option<String>, Result<String, String>)>) -> (bool, String) {
    let named = |cluster: &Option<String>, text: &str| match cluster {
        Some(c) => format!("{c}: {text}"),
        None => text.to_string(),
    };
    if let Some((cluster, Err(e))) = results.iter().find(|(_, r)| r.is_err()) {
        return (false, short(&named(cluster, e)));
    }
    if results.is_empty() {
        return (false, "no query to run (a wave without clusters)".into());
    }
    let answers: Vec<String> = results
        .iter()
        .filter_map(|(c, r)| r.as_ref().ok().map(|a| named(c, a)))
        .collect();
    (true, short(&answers.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::super::condition::parse;
    use super::*;

    fn vars(cluster: Option<&str>) -> Vars<'_> {
        Vars {
            cluster,
            namespace: "shop",
            name: "api",
            revision: "api-0123",
        }
    }

    #[test]
    fn placeholders_are_replaced_as_label_values() {
        let q = r#"sum(rate(errors{cluster="$cluster",ns="$namespace",app="$name",rev="$revision"}[1m]))"#;
        assert!(per_cluster(q));
        assert_eq!(
            render(q, &vars(Some("member-1"))),
            r#"sum(rate(errors{cluster="member-1",ns="shop",app="api",rev="api-0123"}[1m]))"#
        );
        // `$name` is not the start of `$namespace`, and `$1` is PromQL's.
        let q = r#"label_replace(up{a="$namespace"}, "b", "$1", "c", "(.*)")"#;
        assert!(!per_cluster(q));
        assert_eq!(
            render(q, &vars(None)),
            r#"label_replace(up{a="shop"}, "b", "$1", "c", "(.*)")"#
        );
    }

    #[test]
    fn a_value_cannot_end_its_string() {
        let v = Vars {
            cluster: Some(r#"a"} or vector(0) #\"#),
            ..vars(None)
        };
        let q = render(r#"x{c="$cluster"}"#, &v);
        assert_eq!(q, r#"x{c="a\"} or vector(0) #\\"}"#);
    }

    #[test]
    fn unknown_placeholders_and_empty_queries_are_refused() {
        assert!(check_query(r#"up{c="$cluster"}"#).is_ok());
        assert!(check_query("up").is_ok());
        let e = check_query(r#"up{c="$clustr"}"#).unwrap_err();
        assert!(e.contains("$clustr is not a placeholder"), "{e}");
        assert_eq!(check_query("  ").unwrap_err(), "is empty");
    }

    fn answer(result_type: &str, result: serde_json::Value) -> Vec<u8> {
        serde_json::json!({"status": "success", "data": {"resultType": result_type, "result": result}})
            .to_string()
            .into_bytes()
    }

    #[test]
    fn every_sample_must_meet_the_condition() {
        let c = parse("result < 0.01").unwrap();
        let one = answer(
            "vector",
            serde_json::json!([{"metric": {}, "value": [1.5, "0.002"]}]),
        );
        assert_eq!(verdict(200, &one, &c), Ok("result 0.002".into()));
        let two = answer(
            "vector",
            serde_json::json!([
                {"metric": {"cluster": "member-1"}, "value": [1.5, "0.002"]},
                {"metric": {"__name__": "e", "cluster": "member-2"}, "value": [1.5, "0.5"]},
            ]),
        );
        assert_eq!(
            verdict(200, &two, &c),
            Err(r#"result 0.5 {cluster="member-2"} does not meet result < 0.01"#.into())
        );
        let scalar = answer("scalar", serde_json::json!([1.5, "0"]));
        assert_eq!(verdict(200, &scalar, &c), Ok("result 0".into()));
    }

    #[test]
    fn nothing_passes_by_default() {
        let c = parse("result < 0.01").unwrap();
        for (status, body, reason) in [
            (200, answer("vector", serde_json::json!([])), "no data"),
            (
                200,
                answer(
                    "vector",
                    serde_json::json!([{"metric": {}, "value": [1, "NaN"]}]),
                ),
                "result NaN does not meet",
            ),
            (
                200,
                answer("matrix", serde_json::json!([])),
                "a matrix result",
            ),
            (
                200,
                answer("string", serde_json::json!([1, "x"])),
                "a string result",
            ),
            (
                400,
                br#"{"status":"error","errorType":"bad_data","error":"parse error"}"#.to_vec(),
                "HTTP 400: Prometheus refused the query",
            ),
            (
                502,
                b"Bad Gateway".to_vec(),
                "HTTP 502: not a Prometheus answer",
            ),
            (
                200,
                b"<html>internal admin page</html>".to_vec(),
                "HTTP 200: not a Prometheus answer",
            ),
            (200, br#"{"status":"success"}"#.to_vec(), "without data"),
            (
                200,
                answer("vector", serde_json::json!([{"value": "x"}])),
                "not samples",
            ),
        ] {
            let e = verdict(status, &body, &c).expect_err(reason);
            assert!(e.contains(reason), "{reason}: {e}");
        }
    }

    #[test]
    fn a_run_passes_only_when_each_query_passed() {
        let ok = |c: &str, a: &str| (Some(c.to_string()), Ok(a.to_string()));
        assert_eq!(
            combine(vec![ok("m1", "result 0"), ok("m2", "result 0.001")]),
            (true, "m1: result 0; m2: result 0.001".into())
        );
        assert_eq!(
            combine(vec![
                ok("m1", "result 0"),
                (Some("m2".into()), Err("no data".into()))
            ]),
            (false, "m2: no data".into())
        );
        assert_eq!(
            combine(vec![(None, Ok("result 1".into()))]),
            (true, "result 1".into())
        );
        assert!(!combine(vec![]).0);
    }
}
