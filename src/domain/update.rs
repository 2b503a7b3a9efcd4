//! The object to send when a live child differs from the desired one. The
//! result keeps the live object's metadata (resourceVersion, so the write is
//! conditional; uid; fields set by others) and replaces only what we own.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

fn merge_labels(live: &mut ObjectMeta, desired: &ObjectMeta) {
    let mut labels = live.labels.take().unwrap_or_default();
    labels.extend(desired.labels.clone().unwrap_or_default());
    live.labels = Some(labels);
}

fn stamp(meta: &mut ObjectMeta, annotations: &BTreeMap<String, String>) {
    if annotations.is_empty() {
        return;
    }
    meta.annotations
        .get_or_insert_with(BTreeMap::new)
        .extend(annotations.clone());
}

/// A new child: the desired object plus the writer's annotations.
pub fn for_create<T: Clone + kube::Resource>(
    desired: &T,
    annotations: &BTreeMap<String, String>,
) -> T {
    let mut obj = desired.clone();
    stamp(obj.meta_mut(), annotations);
    obj
}

/// Deployment: labels merged, spec replaced wholesale.
pub fn deployment_update(
    live: &Deployment,
    desired: &Deployment,
    annotations: &BTreeMap<String, String>,
) -> Deployment {
    let mut next = live.clone();
    merge_labels(&mut next.metadata, &desired.metadata);
    stamp(&mut next.metadata, annotations);
    next.spec = desired.spec.clone();
    next.status = None;
    next
}

/// Service: labels merged; type, selector and ports replaced; clusterIP and
/// every other allocated field kept.
pub fn service_update(
    live: &Service,
    desired: &Service,
    annotations: &BTreeMap<String, String>,
) -> Service {
    let mut next = live.clone();
    merge_labels(&mut next.metadata, &desired.metadata);
    stamp(&mut next.metadata, annotations);
    let want = desired.spec.clone().unwrap_or_default();
    let spec = next.spec.get_or_insert_with(Default::default);
    spec.type_ = want.type_;
    spec.selector = want.selector;
    spec.ports = want.ports;
    next.status = None;
    next
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::contains::{deployment_in_sync, service_in_sync};
    use crate::domain::desired::{PlatformDefaults, desired};
    use crate::domain::fixtures::ms;

    fn stamp_of(holder: &str) -> BTreeMap<String, String> {
        BTreeMap::from([("platform.example.io/writer".to_string(), holder.to_string())])
    }

    #[test]
    fn deployment_update_keeps_foreign_labels_and_resource_version() {
        let want = desired(
            &ms("api").image("app:2").build(),
            &PlatformDefaults::default(),
        )
        .unwrap();
        let mut live = desired(
            &ms("api").image("app:1").build(),
            &PlatformDefaults::default(),
        )
        .unwrap()
        .deployment;
        live.metadata.resource_version = Some("41".into());
        live.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("team".into(), "payments".into());
        let next = deployment_update(&live, &want.deployment, &stamp_of("r1"));
        assert_eq!(next.metadata.resource_version.as_deref(), Some("41"));
        assert_eq!(next.metadata.labels.as_ref().unwrap()["team"], "payments");
        assert_eq!(
            next.metadata.annotations.as_ref().unwrap()["platform.example.io/writer"],
            "r1"
        );
        assert!(deployment_in_sync(&next, &want.deployment));
    }

    #[test]
    fn service_update_keeps_cluster_ip() {
        let want = desired(&ms("api").port(9090).build(), &PlatformDefaults::default()).unwrap();
        let mut live = desired(&ms("api").port(8080).build(), &PlatformDefaults::default())
            .unwrap()
            .service;
        live.spec.as_mut().unwrap().cluster_ip = Some("10.96.0.9".into());
        let next = service_update(&live, &want.service, &BTreeMap::new());
        let spec = next.spec.as_ref().unwrap();
        assert_eq!(spec.cluster_ip.as_deref(), Some("10.96.0.9"));
        assert_eq!(spec.ports.as_ref().unwrap()[0].port, 9090);
        assert!(service_in_sync(&next, &want.service));
        assert_eq!(next.metadata.annotations, None, "no empty annotation map");
    }

    #[test]
    fn label_merge_overrides_our_keys_only() {
        let want = desired(&ms("api").build(), &PlatformDefaults::default()).unwrap();
        let mut live = want.service.clone();
        let labels = live.metadata.labels.as_mut().unwrap();
        labels.insert("app".into(), "tampered".into());
        labels.insert("extra".into(), "kept".into());
        let next = service_update(&live, &want.service, &BTreeMap::new());
        let labels = next.metadata.labels.unwrap();
        assert_eq!(labels["app"], "api");
        assert_eq!(labels["extra"], "kept");
    }
}
