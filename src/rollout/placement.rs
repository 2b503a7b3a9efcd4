//! Where a FleetMicroservice goes and what each cluster gets: label
//! selectors over cluster labels, waves, and overrides. All pure.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::spec::{Override, Wave};
use crate::crd::{EnvEntry, MicroserviceSpec};
pub use crate::domain::digest::{digest, digest_bytes};

pub type Labels = BTreeMap<String, String>;

/// The name of the wave that holds the clusters no declared wave selects.
pub const REMAINING: &str = "remaining";

/// Whether `selector` selects `labels`, with Kubernetes' semantics: the
/// empty selector selects everything. Infallible because every selector is
/// checked whole by [`check_selector`] before any is evaluated; an operator
/// that slipped past selects nothing.
pub fn selects(selector: &LabelSelector, labels: &Labels) -> bool {
    let by_labels = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    by_labels
        && selector.match_expressions.iter().flatten().all(|e| {
            let values = e.values.as_deref().unwrap_or_default();
            let have = labels.get(&e.key);
            match e.operator.as_str() {
                "In" => have.is_some_and(|v| values.contains(v)),
                "NotIn" => have.is_none_or(|v| !values.contains(v)),
                "Exists" => have.is_some(),
                "DoesNotExist" => have.is_none(),
                _ => false,
            }
        })
}

/// Checks a selector by its structure, as the apiserver checks a
/// LabelSelector: every requirement, not only those an evaluation reaches.
/// A known operator, a key, and values exactly when the operator needs them.
pub fn check_selector(what: &str, selector: &LabelSelector) -> Result<(), String> {
    for k in selector.match_labels.iter().flatten().map(|(k, _)| k) {
        if k.is_empty() {
            return Err(format!("{what}: matchLabels has an empty key"));
        }
    }
    for (i, e) in selector.match_expressions.iter().flatten().enumerate() {
        let at = format!("{what}: matchExpressions[{i}] (key {:?})", e.key);
        if e.key.is_empty() {
            return Err(format!("{at}: the key is empty"));
        }
        let values = e.values.as_deref().unwrap_or_default();
        match e.operator.as_str() {
            "In" | "NotIn" if values.is_empty() => {
                return Err(format!("{at}: operator {} needs values", e.operator));
            }
            "Exists" | "DoesNotExist" if !values.is_empty() => {
                return Err(format!("{at}: operator {} takes no values", e.operator));
            }
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            other => {
                return Err(format!(
                    "{at}: operator {other:?} is not one of In, NotIn, Exists, DoesNotExist"
                ));
            }
        }
    }
    Ok(())
}

/// A declared wave, as placement and leaving read it: the spec's, or the
/// checked one (`rollout::checked::Wave`, which implements it there).
pub trait Declared {
    fn name(&self) -> &str;
    fn selector(&self) -> &LabelSelector;
    /// How many of `size` clusters may change at once.
    fn parallel(&self, size: usize) -> usize;
}

impl Declared for Wave {
    fn name(&self) -> &str {
        &self.name
    }
    fn selector(&self) -> &LabelSelector {
        &self.cluster_selector
    }
    fn parallel(&self, size: usize) -> usize {
        max_parallel(self.max_parallel.as_ref(), size).unwrap_or(1)
    }
}

/// Each cluster's wave: the first wave that selects it, else [`REMAINING`].
/// Returns the waves in order with their clusters (sorted), leaving out an
/// empty `remaining` wave.
pub fn waves<'a, W: Declared>(
    declared: &'a [W],
    clusters: impl IntoIterator<Item = (&'a str, &'a Labels)>,
) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = declared
        .iter()
        .map(|w| (w.name().to_string(), Vec::new()))
        .collect();
    let mut rest = Vec::new();
    for (name, labels) in clusters {
        let first = declared.iter().position(|w| selects(w.selector(), labels));
        match first {
            Some(i) => out[i].1.push(name.to_string()),
            None => rest.push(name.to_string()),
        }
    }
    if !rest.is_empty() || declared.is_empty() {
        out.push((REMAINING.to_string(), rest));
    }
    for (_, clusters) in &mut out {
        clusters.sort();
    }
    out
}

/// How many of `size` clusters may update at once: a count, or a
/// percentage rounded up; at least one, and all when unset.
pub fn max_parallel(value: Option<&IntOrString>, size: usize) -> Result<usize, String> {
    let n = match value {
        None => size,
        Some(IntOrString::Int(n)) if *n >= 1 => *n as usize,
        Some(IntOrString::Int(n)) => return Err(format!("maxParallel {n} must be at least 1")),
        Some(IntOrString::String(s)) => {
            let pct: u32 = s
                .strip_suffix('%')
                .and_then(|p| p.parse().ok())
                .filter(|p| (1..=100).contains(p))
                .ok_or_else(|| {
                    format!("maxParallel {s:?} must be a count or a percentage from 1% to 100%")
                })?;
            (size * pct as usize).div_ceil(100)
        }
    };
    Ok(n.max(1))
}

/// The Microservice spec one cluster gets: the template with every
/// override that selects the cluster applied in order.
pub fn member_spec(
    template: &MicroserviceSpec,
    overrides: &[Override],
    labels: &Labels,
) -> MicroserviceSpec {
    let mut spec = template.clone();
    for o in overrides {
        if selects(&o.cluster_selector, labels) {
            apply(&mut spec, o);
        }
    }
    spec
}

/// `o`'s changes, made to `spec` whatever its selector.
pub fn apply(spec: &mut MicroserviceSpec, o: &Override) {
    if let Some(r) = o.replicas {
        spec.replicas = r;
    }
    for e in &o.env {
        set_env(&mut spec.env, e);
    }
}

fn set_env(env: &mut Vec<EnvEntry>, entry: &EnvEntry) {
    match env.iter_mut().find(|e| e.name == entry.name) {
        Some(e) => e.value = entry.value.clone(),
        None => env.push(entry.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    pub fn by_label(k: &str, v: &str) -> LabelSelector {
        LabelSelector {
            match_labels: Some(labels(&[(k, v)])),
            ..Default::default()
        }
    }

    fn expr(key: &str, op: &str, values: &[&str]) -> LabelSelector {
        LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: key.into(),
                operator: op.into(),
                values: Some(values.iter().map(|v| v.to_string()).collect()),
            }]),
            ..Default::default()
        }
    }

    #[test]
    fn selectors_follow_kubernetes() {
        let l = labels(&[("ring", "canary"), ("region", "eu")]);
        assert!(selects(&LabelSelector::default(), &l));
        assert!(selects(&by_label("ring", "canary"), &l));
        assert!(!selects(&by_label("ring", "main"), &l));
        assert!(selects(&expr("region", "In", &["eu", "us"]), &l));
        assert!(!selects(&expr("region", "NotIn", &["eu"]), &l));
        assert!(selects(&expr("zone", "NotIn", &["a"]), &l));
        assert!(selects(&expr("ring", "Exists", &[]), &l));
        assert!(selects(&expr("zone", "DoesNotExist", &[]), &l));
    }

    /// Every requirement is checked, also one an evaluation would never
    /// reach because an earlier one fails (review H1).
    #[test]
    fn selectors_are_checked_by_structure_not_by_evaluation() {
        let behind = |op: &str, values: &[&str]| {
            let mut s = by_label("env", "prod");
            s.match_expressions = Some(vec![
                LabelSelectorRequirement {
                    key: "ring".into(),
                    operator: "Exists".into(),
                    values: None,
                },
                LabelSelectorRequirement {
                    key: "tier".into(),
                    operator: op.into(),
                    values: Some(values.iter().map(|v| v.to_string()).collect()),
                },
            ]);
            s
        };
        for (op, values, says) in [
            ("in", &["web"][..], "\"in\" is not one of"),
            ("Near", &[][..], "\"Near\" is not one of"),
            ("In", &[][..], "In needs values"),
            ("NotIn", &[][..], "NotIn needs values"),
            ("Exists", &["x"][..], "Exists takes no values"),
            ("DoesNotExist", &["x"][..], "DoesNotExist takes no values"),
        ] {
            let e = check_selector("placement", &behind(op, values)).unwrap_err();
            assert!(
                e.contains(says) && e.contains("matchExpressions[1]"),
                "{op}: {e}"
            );
        }
        assert!(check_selector("placement", &behind("In", &["web"])).is_ok());
        assert!(check_selector("placement", &expr("", "Exists", &[])).is_err());
        assert!(check_selector("placement", &LabelSelector::default()).is_ok());
    }

    #[test]
    fn a_cluster_joins_the_first_wave_that_selects_it() {
        let a = labels(&[("ring", "canary")]);
        let b = labels(&[("ring", "canary"), ("tier", "1")]);
        let c = labels(&[]);
        let declared = vec![
            Wave {
                name: "canary".into(),
                cluster_selector: by_label("ring", "canary"),
                max_parallel: None,
                approval: Default::default(),
            },
            Wave {
                name: "tier1".into(),
                cluster_selector: by_label("tier", "1"),
                max_parallel: None,
                approval: Default::default(),
            },
        ];
        let w = waves(&declared, [("b", &b), ("a", &a), ("c", &c)]);
        assert_eq!(
            w,
            vec![
                ("canary".to_string(), vec!["a".to_string(), "b".to_string()]),
                ("tier1".to_string(), vec![]),
                (REMAINING.to_string(), vec!["c".to_string()]),
            ]
        );
        // No declared waves: one wave with everything.
        let w = waves::<Wave>(&[], [("a", &a)]);
        assert_eq!(w, vec![(REMAINING.to_string(), vec!["a".to_string()])]);
    }

    #[test]
    fn parallelism_counts_and_percentages() {
        assert_eq!(max_parallel(None, 5).unwrap(), 5);
        assert_eq!(max_parallel(Some(&IntOrString::Int(2)), 5).unwrap(), 2);
        let pct = |s: &str| IntOrString::String(s.into());
        assert_eq!(max_parallel(Some(&pct("50%")), 5).unwrap(), 3);
        assert_eq!(max_parallel(Some(&pct("1%")), 5).unwrap(), 1);
        assert_eq!(max_parallel(Some(&pct("100%")), 0).unwrap(), 1);
        for bad in ["0%", "101%", "half", "50"] {
            assert!(max_parallel(Some(&pct(bad)), 5).is_err(), "{bad}");
        }
        assert!(max_parallel(Some(&IntOrString::Int(0)), 5).is_err());
    }

    #[test]
    fn later_overrides_win_and_env_merges_by_name() {
        let template = MicroserviceSpec {
            image: "a:1".into(),
            port: 80,
            replicas: 2,
            env: vec![EnvEntry {
                name: "LOG".into(),
                value: "info".into(),
            }],
        };
        let env = |n: &str, v: &str| EnvEntry {
            name: n.into(),
            value: v.into(),
        };
        let overrides = vec![
            Override {
                cluster_selector: by_label("region", "eu"),
                replicas: Some(3),
                env: vec![env("LOG", "debug"), env("REGION", "eu")],
            },
            Override {
                cluster_selector: by_label("big", "yes"),
                replicas: Some(5),
                env: vec![],
            },
        ];
        let eu_big = member_spec(
            &template,
            &overrides,
            &labels(&[("region", "eu"), ("big", "yes")]),
        );
        assert_eq!(eu_big.replicas, 5);
        assert_eq!(eu_big.env, vec![env("LOG", "debug"), env("REGION", "eu")]);
        let other = member_spec(&template, &overrides, &labels(&[]));
        assert_eq!(other, template);
        assert_ne!(digest(&other), digest(&eu_big));
        assert_eq!(digest(&other), digest(&template.clone()));
    }
}
