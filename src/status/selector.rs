//! Kubernetes label selectors, as the status API accepts them:
//! `k=v`, `k==v`, `k!=v`, `k`, `!k`, `k in (a,b)` and `k notin (a,b)`,
//! joined by commas.

use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    Exists(String),
    NotExists(String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector(Vec<Requirement>);

const MAX_LEN: usize = 4096;

fn key(s: &str) -> Result<String, String> {
    let k = s.trim();
    let valid = !k.is_empty()
        && k.len() <= 317
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
    if valid {
        Ok(k.to_string())
    } else {
        Err(format!("{k:?} is not a label key"))
    }
}

fn value(s: &str) -> Result<String, String> {
    let v = s.trim();
    let valid = v.len() <= 63
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if valid {
        Ok(v.to_string())
    } else {
        Err(format!("{v:?} is not a label value"))
    }
}

/// Splits on commas that are not inside parentheses.
fn clauses(s: &str) -> Result<Vec<&str>, String> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        if !(0..=1).contains(&depth) {
            return Err("unbalanced parentheses".into());
        }
    }
    if depth != 0 {
        return Err("unbalanced parentheses".into());
    }
    out.push(&s[start..]);
    Ok(out)
}

fn set(rest: &str) -> Result<Vec<String>, String> {
    let inner = rest
        .trim()
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or("a set must be written (a,b)")?;
    inner.split(',').map(value).collect()
}

fn requirement(clause: &str) -> Result<Requirement, String> {
    let c = clause.trim();
    if c.is_empty() {
        return Err("empty requirement".into());
    }
    if let Some((k, v)) = c.split_once("!=") {
        return Ok(Requirement::NotEquals(key(k)?, value(v)?));
    }
    if let Some((k, v)) = c.split_once("==").or_else(|| c.split_once('=')) {
        return Ok(Requirement::Equals(key(k)?, value(v)?));
    }
    if let Some(k) = c.strip_prefix('!') {
        return Ok(Requirement::NotExists(key(k)?));
    }
    let mut words = c.splitn(2, char::is_whitespace);
    let k = words.next().unwrap_or_default();
    match words.next().map(str::trim_start) {
        None => Ok(Requirement::Exists(key(k)?)),
        Some(rest) => {
            if let Some(r) = rest.strip_prefix("notin") {
                Ok(Requirement::NotIn(key(k)?, set(r)?))
            } else if let Some(r) = rest.strip_prefix("in") {
                Ok(Requirement::In(key(k)?, set(r)?))
            } else {
                Err(format!("{c:?}: expected =, !=, in or notin"))
            }
        }
    }
}

impl Selector {
    /// The empty string selects everything.
    pub fn parse(s: &str) -> Result<Self, String> {
        if s.len() > MAX_LEN {
            return Err(format!("label selector longer than {MAX_LEN} bytes"));
        }
        if s.trim().is_empty() {
            return Ok(Selector::default());
        }
        let reqs = clauses(s)?
            .into_iter()
            .map(requirement)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("label selector {s:?}: {e}"))?;
        Ok(Selector(reqs))
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|r| match r {
            Requirement::Equals(k, v) => labels.get(k) == Some(v),
            Requirement::NotEquals(k, v) => labels.get(k) != Some(v),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::NotExists(k) => !labels.contains_key(k),
            Requirement::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn every_operator_matches_as_kubernetes_does() {
        let l = labels(&[("team", "pay"), ("tier", "web")]);
        for (sel, want) in [
            ("", true),
            ("team=pay", true),
            ("team==pay", true),
            ("team!=pay", false),
            ("team=pay,tier!=db", true),
            ("owner", false),
            ("!owner", true),
            ("tier in (web, db)", true),
            ("tier notin (web)", false),
            ("owner notin (x)", true),
            ("app.kubernetes.io/name", false),
        ] {
            let s = Selector::parse(sel).unwrap_or_else(|e| panic!("{sel}: {e}"));
            assert_eq!(s.matches(&l), want, "{sel}");
        }
    }

    #[test]
    fn malformed_selectors_are_refused_with_a_reason() {
        for bad in [
            "team=pay,",
            "=x",
            "tier in web",
            "tier in (web",
            "a b c",
            "team=has space",
        ] {
            assert!(Selector::parse(bad).is_err(), "{bad} was accepted");
        }
        assert!(
            Selector::parse(&"a=b,".repeat(2000))
                .unwrap_err()
                .contains("longer")
        );
    }
}
