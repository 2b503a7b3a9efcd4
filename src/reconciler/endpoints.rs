//! Ready endpoints per Service, kept up to date from the EndpointSlice
//! watch, so a reconcile reads one entry instead of scanning every slice.
//! The slices themselves are not kept: only one count per slice.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::watcher::Event;

use crate::domain::status::ready_endpoints;

const SERVICE_NAME: &str = "kubernetes.io/service-name";

/// (namespace, name)
type Key = (String, String);

#[derive(Debug, Default)]
struct Counts {
    /// Each slice's Service and ready count.
    slices: HashMap<Key, (String, usize)>,
    /// Each Service's slices and their ready counts.
    services: HashMap<Key, BTreeMap<String, usize>>,
}

impl Counts {
    fn remove(&mut self, ns: &str, slice: &str) {
        let key = (ns.to_string(), slice.to_string());
        if let Some((service, _)) = self.slices.remove(&key) {
            let skey = (ns.to_string(), service);
            if let Some(by) = self.services.get_mut(&skey) {
                by.remove(slice);
                if by.is_empty() {
                    self.services.remove(&skey);
                }
            }
        }
    }

    fn put(&mut self, s: &EndpointSlice) {
        let (Some(ns), Some(name)) = (&s.metadata.namespace, &s.metadata.name) else {
            return;
        };
        self.remove(ns, name);
        let Some(service) = s.metadata.labels.as_ref().and_then(|l| l.get(SERVICE_NAME)) else {
            return;
        };
        let ready = ready_endpoints(std::iter::once(s));
        self.slices
            .insert((ns.clone(), name.clone()), (service.clone(), ready));
        self.services
            .entry((ns.clone(), service.clone()))
            .or_default()
            .insert(name.clone(), ready);
    }

    fn ready(&self, ns: &str, service: &str) -> usize {
        self.services
            .get(&(ns.to_string(), service.to_string()))
            .map(|by| by.values().sum())
            .unwrap_or(0)
    }
}

#[derive(Debug, Default)]
struct State {
    current: Counts,
    /// A relist in progress: it replaces `current` when complete, so a
    /// slice deleted while the watch was down does not linger.
    relisting: Option<Counts>,
    synced: bool,
}

/// The ready-endpoint count of every Service the watch sees.
#[derive(Debug, Default)]
pub struct ReadyEndpoints {
    state: Mutex<State>,
}

impl ReadyEndpoints {
    /// Applies one watch event.
    pub fn apply(&self, event: &Event<EndpointSlice>) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match event {
            Event::Apply(s) => st.current.put(s),
            Event::Delete(s) => {
                if let (Some(ns), Some(name)) = (&s.metadata.namespace, &s.metadata.name) {
                    st.current.remove(ns, name);
                }
            }
            Event::Init => st.relisting = Some(Counts::default()),
            Event::InitApply(s) => st.relisting.get_or_insert_with(Counts::default).put(s),
            Event::InitDone => {
                if let Some(fresh) = st.relisting.take() {
                    st.current = fresh;
                }
                st.synced = true;
            }
        }
    }

    /// Whether the first listing has completed: until then a count of 0
    /// is a guess.
    pub fn synced(&self) -> bool {
        self.state.lock().map(|s| s.synced).unwrap_or(false)
    }

    pub fn ready(&self, ns: &str, service: &str) -> usize {
        self.state
            .lock()
            .map(|s| s.current.ready(ns, service))
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn slice(ns: &str, name: &str, service: Option<&str>, ready: &[bool]) -> EndpointSlice {
        let labels = service
            .map(|s| json!({ SERVICE_NAME: s }))
            .unwrap_or(json!({}));
        serde_json::from_value(json!({
            "metadata": {"namespace": ns, "name": name, "labels": labels},
            "addressType": "IPv4",
            "endpoints": ready.iter().enumerate().map(|(i, r)| json!({
                "addresses": [format!("10.0.0.{i}")],
                "conditions": {"ready": r},
            })).collect::<Vec<_>>(),
        }))
        .unwrap()
    }

    fn listed(items: Vec<EndpointSlice>) -> ReadyEndpoints {
        let r = ReadyEndpoints::default();
        r.apply(&Event::Init);
        for s in items {
            r.apply(&Event::InitApply(s));
        }
        r.apply(&Event::InitDone);
        r
    }

    #[test]
    fn counts_ready_endpoints_across_a_services_slices() {
        let r = listed(vec![
            slice("a", "web-1", Some("web"), &[true, false]),
            slice("a", "web-2", Some("web"), &[true]),
            slice("b", "web-1", Some("web"), &[true, true, true]),
            slice("a", "loose", None, &[true]),
        ]);
        assert!(r.synced());
        assert_eq!(r.ready("a", "web"), 2);
        assert_eq!(r.ready("b", "web"), 3);
        assert_eq!(r.ready("a", "api"), 0);
    }

    #[test]
    fn updates_deletes_and_a_moved_slice_are_followed() {
        let r = listed(vec![slice("a", "web-1", Some("web"), &[true])]);
        r.apply(&Event::Apply(slice("a", "web-1", Some("web"), &[false])));
        assert_eq!(r.ready("a", "web"), 0);
        r.apply(&Event::Apply(slice("a", "web-1", Some("api"), &[true])));
        assert_eq!((r.ready("a", "web"), r.ready("a", "api")), (0, 1));
        r.apply(&Event::Delete(slice("a", "web-1", Some("api"), &[true])));
        assert_eq!(r.ready("a", "api"), 0);
    }

    #[test]
    fn a_relist_drops_slices_deleted_while_the_watch_was_down() {
        let r = listed(vec![
            slice("a", "web-1", Some("web"), &[true]),
            slice("a", "web-2", Some("web"), &[true]),
        ]);
        r.apply(&Event::Init);
        r.apply(&Event::InitApply(slice("a", "web-2", Some("web"), &[true])));
        // Until the relist completes, the last complete listing answers.
        assert_eq!(r.ready("a", "web"), 2);
        r.apply(&Event::InitDone);
        assert_eq!(r.ready("a", "web"), 1);
    }

    #[test]
    fn not_synced_before_the_first_listing() {
        let r = ReadyEndpoints::default();
        r.apply(&Event::Init);
        assert!(!r.synced());
    }
}
