//! deploy/monitoring's alerting rules, with the promtool of the Prometheus
//! the test bed builds from its Go module: the rules load (`promtool check
//! rules`), each alert fires on the series it should and stays silent on
//! the rest (`promtool test rules`, integration/monitoring/rules-test.yaml),
//! and every metric the rules read is one the operator exports.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// promtool, built once per machine (integration/toolchain/prometheus.sh).
fn promtool() -> PathBuf {
    let out = Command::new("timeout")
        .arg("1200")
        .arg(root().join("integration/toolchain/prometheus.sh"))
        .arg("promtool")
        .output()
        .expect("integration/toolchain/prometheus.sh");
    assert!(
        out.status.success(),
        "building promtool failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// The PrometheusRule's spec: a rule file as Prometheus reads it.
fn rule_groups() -> serde_yaml::Value {
    let text = std::fs::read_to_string(root().join("deploy/monitoring/prometheusrule.yaml"))
        .expect("prometheusrule.yaml");
    let rule = serde_yaml::Value::deserialize(serde_yaml::Deserializer::from_str(&text))
        .expect("one YAML document");
    assert_eq!(rule["kind"], "PrometheusRule");
    rule["spec"].clone()
}

fn promtool_in(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("timeout")
        .args(["120"])
        .arg(promtool())
        .args(args)
        .current_dir(dir)
        .output()
        .expect("promtool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?}:\n{text}");
    text
}

#[test]
fn promtool_checks_the_rules_and_every_alert_fires_only_when_it_should() {
    let dir = std::env::temp_dir().join(format!("flotilla-rules-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("rules.yaml"),
        serde_yaml::to_string(&rule_groups()).unwrap(),
    )
    .unwrap();
    std::fs::copy(
        root().join("integration/monitoring/rules-test.yaml"),
        dir.join("rules-test.yaml"),
    )
    .unwrap();
    let checked = promtool_in(&dir, &["check", "rules", "rules.yaml"]);
    assert!(checked.contains("SUCCESS"), "{checked}");
    let tested = promtool_in(&dir, &["test", "rules", "rules-test.yaml"]);
    assert!(tested.contains("SUCCESS"), "{tested}");
    // Every alert has a test.
    let tests = std::fs::read_to_string(dir.join("rules-test.yaml")).unwrap();
    for rule in rule_groups()["groups"][0]["rules"].as_sequence().unwrap() {
        let alert = rule["alert"].as_str().expect("an alerting rule");
        assert!(
            tests.contains(&format!("alertname: {alert}")),
            "{alert} has no promtool test"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_rules_read_only_metrics_the_operator_exports() {
    // Where every metric is declared, with its full name.
    let declared = include_str!("../../src/telemetry/metrics.rs");
    let mut read = 0;
    for rule in rule_groups()["groups"][0]["rules"].as_sequence().unwrap() {
        let expr = rule["expr"].as_str().unwrap();
        for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if word.starts_with("flotilla_") {
                read += 1;
                let name = format!("\"{word}\"");
                assert!(
                    declared.contains(&format!("Gauge {name}"))
                        || declared.contains(&format!("Counter {name}")),
                    "{word}, read by {}, is not a metric the operator exports",
                    rule["alert"].as_str().unwrap_or("?")
                );
            }
        }
    }
    assert!(read >= 7, "the rules read {read} metrics");
}
