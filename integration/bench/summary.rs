//! The one table (`make bench`, last step): reads the scenario results in
//! `.fleet/bench/*.json`, prints them as a Markdown table, Flotilla beside
//! sample-controller where both ran, and writes it to `.fleet/bench/summary.md`.
//! A row where Flotilla is slower says so.

#[path = "../tests/support/mod.rs"]
mod support;

#[path = "common/mod.rs"]
mod common;

use serde_json::Value;

use common::{Spread, bench_dir};

fn load(name: &str) -> Option<Value> {
    let text = std::fs::read_to_string(bench_dir().join(format!("{name}.json"))).ok()?;
    serde_json::from_str(&text).ok()
}

fn spread(v: &Value) -> Option<Spread> {
    serde_json::from_value(v.clone()).ok()
}

fn show(s: Option<Spread>, precision: usize) -> String {
    match s {
        Some(s) if s.median.is_finite() => format!("{s:.precision$}"),
        _ => "-".into(),
    }
}

/// Lower is better for every compared figure: the verdict on the medians,
/// `worse` naming what a higher figure means ("slower", "more requests").
fn verdict(flotilla: Option<Spread>, sample: Option<Spread>, worse: &str) -> String {
    match (flotilla, sample) {
        (Some(f), Some(s)) if f.median.is_finite() && s.median.is_finite() => {
            if f.median > s.median {
                if s.median > 0.0 {
                    format!("**Flotilla {worse}** ({:.1}x)", f.median / s.median)
                } else {
                    format!("**Flotilla {worse}**")
                }
            } else if f.median == s.median {
                "even".into()
            } else if f.median > 0.0 {
                format!("Flotilla {:.1}x lower", s.median / f.median)
            } else {
                "Flotilla 0".into()
            }
        }
        _ => String::new(),
    }
}

struct Table(Vec<[String; 5]>);

impl Table {
    fn both(
        &mut self,
        scenario: &str,
        figure: &str,
        f: Option<Spread>,
        s: Option<Spread>,
        p: usize,
    ) {
        let worse = if figure.contains("CPU") {
            "more"
        } else if figure.contains("(s)") || figure.contains("(ms)") {
            "slower"
        } else {
            "more"
        };
        self.0.push([
            scenario.into(),
            figure.into(),
            show(f, p),
            show(s, p),
            verdict(f, s, worse),
        ]);
    }
    fn ours(&mut self, scenario: &str, figure: &str, f: Option<Spread>, p: usize) {
        self.0.push([
            scenario.into(),
            figure.into(),
            show(f, p),
            "-".into(),
            String::new(),
        ]);
    }
}

fn side_by_side(t: &mut Table) {
    let Some(v) = load("side_by_side") else {
        return;
    };
    let n = v["n"].as_u64().unwrap_or(0);
    let rows = v["summary"].as_array().cloned().unwrap_or_default();
    let find = |who: &str, limits: &str| {
        rows.iter()
            .find(|r| r["controller"] == who && r["limits"] == limits)
            .cloned()
            .unwrap_or(Value::Null)
    };
    for (limits, label) in [
        ("defaults", "own default limits"),
        (
            "equal total",
            "equal total budget (sample-controller 2 x 5/10, Flotilla 10/20)",
        ),
    ] {
        let (f, s) = (find("flotilla", limits), find("sample-controller", limits));
        if f.is_null() && s.is_null() {
            continue;
        }
        let scenario = format!("1. Convergence, {n} objects, {label}");
        t.both(
            &scenario,
            "every Deployment created (s)",
            spread(&f["children_s"]),
            spread(&s["children_s"]),
            1,
        );
        t.ours(
            &scenario,
            "every object Reconciled=True (s)",
            spread(&f["converged_s"]),
            1,
        );
        t.both(
            &scenario,
            "requests per converged object, Events included",
            spread(&f["per_object"]),
            spread(&s["per_object"]),
            2,
        );
        t.both(
            &scenario,
            "requests per converged object, without Events",
            spread(&f["per_object_without_events"]),
            spread(&s["per_object_without_events"]),
            2,
        );
        t.both(
            &scenario,
            "member apiserver CPU to convergence (s)",
            spread(&f["apiserver_cpu_s"]),
            spread(&s["apiserver_cpu_s"]),
            1,
        );
        t.both(
            &scenario,
            "controller RSS once converged (MiB)",
            spread(&f["controller_rss_mib"]),
            spread(&s["controller_rss_mib"]),
            1,
        );
        if limits == "defaults" {
            let window = v["resync_window_s"].as_u64().unwrap_or(0);
            let scenario = format!("2. Restart over {n} objects in sync ({window} s window)");
            t.both(
                &scenario,
                "reads (GET, LIST)",
                spread(&f["resync_reads"]),
                spread(&s["resync_reads"]),
                0,
            );
            t.both(
                &scenario,
                "writes",
                spread(&f["resync_writes"]),
                spread(&s["resync_writes"]),
                0,
            );
        }
    }
}

/// The churn sweep (`churn-sweep`): one `latency` run per rate, saved as
/// `churn-<rate>.json`, then the highest rate each keeps p99 within 1 s.
fn churn(t: &mut Table) {
    let mut runs: Vec<(f64, Value)> = std::fs::read_dir(bench_dir())
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let rate = name.strip_prefix("churn-")?.strip_suffix(".json")?;
            Some((rate.parse().ok()?, load(&format!("churn-{rate}"))?))
        })
        .collect();
    runs.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut best = [0.0f64; 2];
    for (rate, v) in &runs {
        let rows = v["summary"].as_array().cloned().unwrap_or_default();
        let find = |who: &str| {
            rows.iter()
                .find(|r| r["controller"] == who)
                .cloned()
                .unwrap_or(Value::Null)
        };
        let (f, s) = (find("flotilla"), find("sample-controller"));
        let scenario = format!("3. Change to applied, {rate} changes/s, 3 members");
        t.both(
            &scenario,
            "p50 (ms)",
            spread(&f["p50_ms"]),
            spread(&s["p50_ms"]),
            0,
        );
        t.both(
            &scenario,
            "p99 (ms)",
            spread(&f["p99_ms"]),
            spread(&s["p99_ms"]),
            0,
        );
        t.both(
            &scenario,
            "apiserver CPU, 3 members (cores)",
            spread(&f["apiserver_cores"]),
            spread(&s["apiserver_cores"]),
            2,
        );
        for (i, r) in [&f, &s].into_iter().enumerate() {
            let p99 = spread(&r["p99_ms"]).map_or(f64::INFINITY, |p| p.median);
            if p99 <= 1000.0 && r["applied"] == r["changes"] {
                best[i] = best[i].max(*rate);
            }
        }
    }
    if !runs.is_empty() {
        let point = |x: f64| {
            Some(Spread {
                median: x,
                min: x,
                max: x,
            })
        };
        let scenario = "3. Change rate sustained with p99 <= 1 s";
        // Higher is better here: the verdict is said in words.
        t.0.push([
            scenario.into(),
            "highest rate (changes/s)".into(),
            show(point(best[0]), 0),
            show(point(best[1]), 0),
            match best {
                [f, s] if s > 0.0 => format!("Flotilla {:.1}x", f / s),
                [f, _] if f > 0.0 => "sample-controller none".into(),
                _ => String::new(),
            },
        ]);
    }
}

fn fleet_scale(t: &mut Table) {
    let Some(v) = load("fleet_scale") else { return };
    let s = &v["summary"];
    let n = v["objects_per_member"].as_u64().unwrap_or(0);
    let scenario = format!("4. Fleet scale, 3 members x {n}");
    t.ours(
        &scenario,
        "all observed and Available (s)",
        spread(&s["converged_s"]),
        1,
    );
    t.ours(
        &scenario,
        "RSS, replica leading a member (MiB)",
        spread(&s["leader_rss_mib"]),
        1,
    );
    t.ours(
        &scenario,
        "RSS, replica leading none (MiB)",
        spread(&s["idle_replica_rss_mib"]),
        1,
    );
    t.ours(
        &scenario,
        "idle CPU of a leader (% of a core)",
        spread(&s["leader_idle_cpu_percent"]),
        2,
    );
    let scenario = "5. gRPC, 16 clients";
    t.ours(
        scenario,
        "GetMicroservice p50 (ms)",
        spread(&s["get_p50_ms"]),
        1,
    );
    t.ours(
        scenario,
        "GetMicroservice p99 (ms)",
        spread(&s["get_p99_ms"]),
        1,
    );
    t.ours(
        scenario,
        "GetMicroservice (req/s)",
        spread(&s["get_rps"]),
        0,
    );
    t.ours(
        scenario,
        "ListMicroservices, 100 a page, p50 (ms)",
        spread(&s["list_p50_ms"]),
        1,
    );
    t.ours(
        scenario,
        "ListMicroservices, 100 a page, p99 (ms)",
        spread(&s["list_p99_ms"]),
        1,
    );
    t.ours(
        scenario,
        "ListMicroservices (req/s)",
        spread(&s["list_rps"]),
        0,
    );
    t.ours(
        scenario,
        "member change to Watch event p50 (ms)",
        spread(&s["watch_p50_ms"]),
        0,
    );
    t.ours(
        scenario,
        "member change to Watch event p99 (ms)",
        spread(&s["watch_p99_ms"]),
        0,
    );
}

fn failover(t: &mut Table) {
    let Some(v) = load("failover") else { return };
    let trials = v["trials"].as_u64().unwrap_or(0);
    for k in v["kills"].as_array().cloned().unwrap_or_default() {
        let scenario = format!(
            "6. {} of member-1's leader, {trials} trials",
            k["kind"].as_str().unwrap_or("?")
        );
        t.ours(
            &scenario,
            "to a new leader (s)",
            spread(&k["to_leader_s"]),
            2,
        );
        t.ours(
            &scenario,
            "to the next successful write (s)",
            spread(&k["to_write_s"]),
            2,
        );
    }
    let scenario = format!("6. a 4th replica joins, then leaves (SIGTERM), {trials} trials");
    t.ours(
        &scenario,
        "join: last renewal to the new holder's acquisition (ms)",
        spread(&v["handoff_join_ms"]),
        0,
    );
    t.ours(
        &scenario,
        "leave: last renewal to the new holder's acquisition (ms)",
        spread(&v["handoff_leave_ms"]),
        0,
    );
    let o = &v["outage"];
    let scenario = format!("6. member-2's apiserver down, {trials} trials");
    t.ours(
        &scenario,
        "member-1/3 change to applied p99, before (ms)",
        spread(&o["baseline_p99_ms"]),
        0,
    );
    t.ours(
        &scenario,
        "member-1/3 change to applied p99, during (ms)",
        spread(&o["outage_p99_ms"]),
        0,
    );
}

fn main() {
    let mut t = Table(Vec::new());
    side_by_side(&mut t);
    churn(&mut t);
    fleet_scale(&mut t);
    failover(&mut t);
    let mut out = String::from(
        "| scenario | figure | Flotilla | sample-controller | |\n|---|---|---|---|---|\n",
    );
    for row in &t.0 {
        out.push_str(&format!("| {} |\n", row.join(" | ")));
    }
    out.push_str(
        "\nmedian [min, max] over the runs of each scenario; lower is better everywhere.\n",
    );
    println!("{out}");
    std::fs::write(bench_dir().join("summary.md"), &out).expect("summary");
    assert!(!t.0.is_empty(), "no results in {}", bench_dir().display());
}
