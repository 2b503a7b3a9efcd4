//! Why a reconcile ran: each trigger stream notes the Microservice it wakes,
//! and the reconcile takes the notes. Several events before one reconcile
//! coalesce; a reconcile with no note was a requeue (resync, retry).

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use kube::runtime::reflector::ObjectRef;

use crate::crd::Microservice;

#[derive(Debug, Default)]
pub struct Triggers(Mutex<HashMap<ObjectRef<Microservice>, BTreeSet<&'static str>>>);

impl Triggers {
    pub fn note(&self, target: ObjectRef<Microservice>, why: &'static str) {
        if let Ok(mut m) = self.0.lock() {
            m.entry(target).or_default().insert(why);
        }
    }

    /// The Microservice is gone: its notes (its children's deletions) go too.
    pub fn forget(&self, gone: &ObjectRef<Microservice>) {
        if let Ok(mut m) = self.0.lock() {
            m.remove(gone);
        }
    }

    /// Keeps the notes of the objects `keep` names only.
    pub fn retain(&self, keep: impl Fn(&ObjectRef<Microservice>) -> bool) {
        if let Ok(mut m) = self.0.lock() {
            m.retain(|k, _| keep(k));
        }
    }

    /// How many objects have notes: for tests of bounded memory.
    pub fn tracked(&self) -> usize {
        self.0.lock().map(|m| m.len()).unwrap_or(0)
    }

    /// The notes for `target` since its last reconcile, oldest kinds first.
    pub fn take(&self, target: &ObjectRef<Microservice>) -> Vec<&'static str> {
        let notes = self.0.lock().ok().and_then(|mut m| m.remove(target));
        match notes {
            Some(n) if !n.is_empty() => n.into_iter().collect(),
            _ => vec!["Requeue"],
        }
    }
}

/// The Microservice a child names as its controller, if any.
pub fn owner_of(meta: &kube::api::ObjectMeta) -> Option<ObjectRef<Microservice>> {
    let ns = meta.namespace.as_deref()?;
    meta.owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true) && o.kind == "Microservice")
        .map(|o| ObjectRef::new(&o.name).within(ns))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_coalesce_until_taken_and_none_means_a_requeue() {
        let t = Triggers::default();
        let a = ObjectRef::<Microservice>::new("a").within("ns");
        t.note(a.clone(), "Service");
        t.note(a.clone(), "EndpointSlice");
        t.note(a.clone(), "Service");
        assert_eq!(t.take(&a), ["EndpointSlice", "Service"]);
        assert_eq!(t.take(&a), ["Requeue"]);
    }

    #[test]
    fn notes_of_objects_that_are_gone_are_pruned() {
        // 10,000 objects created and deleted with no Delete event seen
        // (deleted during a watch gap): each left a note; pruning against
        // the store (which holds none of them) leaves nothing.
        let t = Triggers::default();
        for i in 0..10_000 {
            t.note(ObjectRef::new(&format!("m{i}")).within("ns"), "Deployment");
        }
        let kept = ObjectRef::<Microservice>::new("m7").within("ns");
        t.retain(|k| *k == kept);
        assert_eq!(t.tracked(), 1);
    }
}
