//! "Is the cluster already right?" — whether a live object contains every
//! field we want. Fields the API server adds (defaults, status, allocations)
//! are not differences; lists are compared by length and position, because a
//! reordered container or port list is a real change.
//!
//! Maps compare as supersets, except where an extra key changes behaviour:
//! a selector with one more key selects fewer pods. The Service's selector
//! and the Deployment's selector compare exactly; labels on objects and on
//! the pod template stay supersets, since others may add their own.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use serde::Serialize;
use serde_json::Value;

/// True when `current` has every field of `desired` with an equal value.
pub fn contains(current: &Value, desired: &Value) -> bool {
    match (current, desired) {
        (_, Value::Null) => true,
        (Value::Object(cur), Value::Object(want)) => want
            .iter()
            .all(|(k, v)| v.is_null() || cur.get(k).is_some_and(|c| contains(c, v))),
        (Value::Array(cur), Value::Array(want)) => {
            cur.len() == want.len() && cur.iter().zip(want).all(|(c, w)| contains(c, w))
        }
        (c, w) => c == w,
    }
}

fn json<T: Serialize>(v: &T) -> Value {
    // Serializing k8s-openapi types cannot fail: they are plain data.
    serde_json::to_value(v).unwrap_or(Value::Null)
}

fn labels_contained(
    current: &Option<std::collections::BTreeMap<String, String>>,
    desired: &Option<std::collections::BTreeMap<String, String>>,
) -> bool {
    let Some(want) = desired else { return true };
    let empty = Default::default();
    let cur = current.as_ref().unwrap_or(&empty);
    want.iter().all(|(k, v)| cur.get(k) == Some(v))
}

/// The Deployment is in sync when its labels and spec contain ours and its
/// selector is exactly ours.
pub fn deployment_in_sync(current: &Deployment, desired: &Deployment) -> bool {
    let selector = |d: &Deployment| d.spec.as_ref().map(|s| json(&s.selector));
    labels_contained(&current.metadata.labels, &desired.metadata.labels)
        && contains(&json(&current.spec), &json(&desired.spec))
        && selector(current) == selector(desired)
}

/// The Service is in sync when its labels and spec contain ours and its
/// selector is exactly ours.
pub fn service_in_sync(current: &Service, desired: &Service) -> bool {
    let selector = |s: &Service| s.spec.as_ref().and_then(|s| s.selector.clone());
    labels_contained(&current.metadata.labels, &desired.metadata.labels)
        && contains(&json(&current.spec), &json(&desired.spec))
        && selector(current) == selector(desired)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::desired::{PlatformDefaults, desired};
    use crate::domain::fixtures::ms;
    use serde_json::json;

    #[test]
    fn extra_server_fields_are_not_a_difference() {
        let want = json!({"a": 1, "b": {"c": "x"}});
        let have = json!({"a": 1, "b": {"c": "x", "d": true}, "status": {"ready": 1}});
        assert!(contains(&have, &want));
    }

    #[test]
    fn changed_or_missing_fields_are_a_difference() {
        let want = json!({"a": 1, "b": {"c": "x"}});
        assert!(!contains(&json!({"a": 2, "b": {"c": "x"}}), &want));
        assert!(!contains(&json!({"a": 1, "b": {}}), &want));
        assert!(!contains(&json!({"a": 1}), &want));
    }

    #[test]
    fn lists_compare_by_length_and_position() {
        let want = json!({"ports": [{"port": 80}, {"port": 81}]});
        assert!(contains(
            &json!({"ports": [{"port": 80, "protocol": "TCP"}, {"port": 81}]}),
            &want
        ));
        assert!(!contains(
            &json!({"ports": [{"port": 81}, {"port": 80}]}),
            &want
        ));
        assert!(!contains(&json!({"ports": [{"port": 80}]}), &want));
        assert!(!contains(
            &json!({"ports": [{"port": 80}, {"port": 81}, {"port": 82}]}),
            &want
        ));
    }

    fn server_view<T: Serialize + serde::de::DeserializeOwned>(obj: &T, extra: Value) -> T {
        // Merge extra server-set fields into the object, as an API server would.
        fn merge(base: &mut Value, extra: Value) {
            match (base, extra) {
                (Value::Object(b), Value::Object(e)) => {
                    for (k, v) in e {
                        merge(b.entry(k).or_insert(Value::Null), v);
                    }
                }
                (b, e) => *b = e,
            }
        }
        let mut v = serde_json::to_value(obj).unwrap();
        merge(&mut v, extra);
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn defaulted_deployment_is_in_sync() {
        let want = desired(&ms("api").build(), &PlatformDefaults::default()).unwrap();
        let live = server_view(
            &want.deployment,
            json!({
                "metadata": {"resourceVersion": "7", "labels": {"team": "payments"}},
                "spec": {
                    "revisionHistoryLimit": 10,
                    "progressDeadlineSeconds": 600,
                    "strategy": {"type": "RollingUpdate"},
                    "template": {"spec": {"restartPolicy": "Always", "dnsPolicy": "ClusterFirst"}},
                },
                "status": {"availableReplicas": 2},
            }),
        );
        assert!(deployment_in_sync(&live, &want.deployment));
    }

    #[test]
    fn edited_image_or_missing_label_is_out_of_sync() {
        let want = desired(&ms("api").build(), &PlatformDefaults::default()).unwrap();
        let mut edited = want.deployment.clone();
        edited
            .spec
            .as_mut()
            .unwrap()
            .template
            .spec
            .as_mut()
            .unwrap()
            .containers[0]
            .image = Some("evil:1".into());
        assert!(!deployment_in_sync(&edited, &want.deployment));

        let mut unlabelled = want.service.clone();
        unlabelled.metadata.labels.as_mut().unwrap().remove("app");
        assert!(!service_in_sync(&unlabelled, &want.service));
    }

    #[test]
    fn a_selector_with_a_key_added_is_out_of_sync_while_extra_labels_are_not() {
        let want = desired(&ms("api").build(), &PlatformDefaults::default()).unwrap();
        let wider = server_view(
            &want.service,
            json!({"spec": {"selector": {"canary": "true"}}}),
        );
        assert!(!service_in_sync(&wider, &want.service));
        let wider = server_view(
            &want.deployment,
            json!({"spec": {"selector": {"matchLabels": {"canary": "true"}}}}),
        );
        assert!(!deployment_in_sync(&wider, &want.deployment));
        let labelled = server_view(
            &want.deployment,
            json!({"metadata": {"labels": {"team": "pay"}},
                   "spec": {"template": {"metadata": {"labels": {"team": "pay"}}}}}),
        );
        assert!(deployment_in_sync(&labelled, &want.deployment));
    }

    #[test]
    fn allocated_service_fields_are_kept_not_diffed() {
        let want = desired(&ms("api").build(), &PlatformDefaults::default()).unwrap();
        let live = server_view(
            &want.service,
            json!({"spec": {"clusterIP": "10.96.0.12", "clusterIPs": ["10.96.0.12"], "sessionAffinity": "None"}}),
        );
        assert!(service_in_sync(&live, &want.service));
    }
}
