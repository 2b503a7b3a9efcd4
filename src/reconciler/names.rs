//! Who holds each Deployment and Service name in the scope. Our children's
//! caches see only objects with our label; this metadata-only watch of
//! every object answers "is that name free?" from memory, so creating a
//! child needs no GET first, and a stranger's change or deletion wakes the
//! Microservice whose name it blocks.

use std::fmt::Debug;

use futures::{Stream, StreamExt};
use k8s_openapi::NamespaceResourceScope;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;

use super::triggers::owner_of;
use crate::crd::Microservice;

/// The names of every object of one kind in the scope, with just what
/// tells who controls it.
pub type Names<K> = Store<PartialObjectMeta<K>>;

/// Keeps the identity and ownerReferences; drops managedFields, labels and
/// annotations (a last-applied annotation alone can be kilobytes), so each
/// entry stays a few hundred bytes however large the object.
fn strip<K>(m: &mut PartialObjectMeta<K>)
where
    PartialObjectMeta<K>: Resource,
{
    crate::watching::strip(m);
    m.metadata.annotations = None;
    m.metadata.labels = None;
}

/// Whether `name` is held in `ns`, by anything.
pub fn taken<K>(names: &Names<K>, ns: &str, name: &str) -> bool
where
    K: Resource<DynamicType = ()> + Clone,
{
    names.get(&ObjectRef::new(name).within(ns)).is_some()
}

/// The Microservice an object's change may unblock: the one of the same
/// name, unless the object is that Microservice's own child (its own
/// watch wakes it then).
pub fn blocked_by<K>(obj: &PartialObjectMeta<K>) -> Option<ObjectRef<Microservice>> {
    let ns = obj.metadata.namespace.as_deref()?;
    let name = obj.metadata.name.as_deref()?;
    let same = ObjectRef::<Microservice>::new(name).within(ns);
    match owner_of(&obj.metadata) {
        Some(owner) if owner == same => None,
        _ => Some(same),
    }
}

/// The store and the stream of changed objects that feeds it.
pub fn watch<K>(
    api: Api<PartialObjectMeta<K>>,
    config: watcher::Config,
) -> (
    Names<K>,
    impl Stream<Item = Result<PartialObjectMeta<K>, watcher::Error>> + Send,
)
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + Debug
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store();
    // An Api of PartialObjectMeta asks for metadata only.
    let stream = crate::watching::retried(watcher(api, config))
        .modify(strip)
        .reflect(writer)
        .touched_objects()
        .boxed();
    (store, stream)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::Deployment;
    use serde_json::json;

    fn meta(owner: Option<&str>) -> PartialObjectMeta<Deployment> {
        let refs = owner.map(|o| {
            json!([{"apiVersion": "platform.example.io/v1alpha1", "kind": "Microservice",
                    "name": o, "uid": "u", "controller": true}])
        });
        serde_json::from_value(json!({
            "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
            "metadata": {"namespace": "ns", "name": "api", "ownerReferences": refs,
                         "labels": {"a": "b"}, "annotations": {"x": "y".repeat(4096)},
                         "managedFields": [{"manager": "kubectl"}]},
        }))
        .unwrap()
    }

    #[test]
    fn strangers_wake_the_microservice_of_their_name_and_our_children_do_not() {
        let named = ObjectRef::<Microservice>::new("api").within("ns");
        assert_eq!(blocked_by(&meta(None)), Some(named.clone()));
        assert_eq!(blocked_by(&meta(Some("other"))), Some(named));
        assert_eq!(blocked_by(&meta(Some("api"))), None);
    }

    #[test]
    fn stripping_keeps_identity_and_owners_only() {
        let mut m = meta(Some("api"));
        strip(&mut m);
        assert!(m.metadata.annotations.is_none() && m.metadata.labels.is_none());
        assert!(m.metadata.managed_fields.is_none());
        assert_eq!(m.metadata.name.as_deref(), Some("api"));
        assert_eq!(m.metadata.owner_references.map(|r| r.len()), Some(1));
    }
}
