//! A stranger's object holding a child's name. The children's watches see
//! only objects with our label, so a stranger's deletion would wait for the
//! resync. While it blocks, it is watched by name (metadata only), and any
//! change to it wakes the Microservice at once.

use std::collections::HashSet;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::NamespaceResourceScope;
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;

use crate::crd::Microservice;

type Watched = (&'static str, String, String);

#[derive(Debug)]
pub struct Strangers {
    watching: Mutex<HashSet<Watched>>,
    wake: mpsc::UnboundedSender<ObjectRef<Microservice>>,
}

impl Strangers {
    /// The watcher set, and the stream of Microservices to wake. When the
    /// stream is dropped (the controller stopped), every watch ends.
    pub fn new() -> (Arc<Self>, mpsc::UnboundedReceiver<ObjectRef<Microservice>>) {
        let (wake, woken) = mpsc::unbounded_channel();
        (
            Arc::new(Strangers {
                watching: Mutex::new(HashSet::new()),
                wake,
            }),
            woken,
        )
    }

    /// Watches `kind` `ns/name` until it changes or goes, then wakes `owner`.
    /// One watch per blocked name, however often the conflict is seen.
    pub fn watch<K>(
        self: &Arc<Self>,
        client: Client,
        kind: &'static str,
        ns: &str,
        name: &str,
        owner: ObjectRef<Microservice>,
    ) where
        K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
            + Clone
            + DeserializeOwned
            + Debug
            + Send
            + 'static,
    {
        let id: Watched = (kind, ns.to_string(), name.to_string());
        let fresh = self
            .watching
            .lock()
            .map(|mut w| w.insert(id.clone()))
            .unwrap_or(false);
        if !fresh {
            return;
        }
        let this = self.clone();
        let api = Api::<PartialObjectMeta<K>>::namespaced(client, ns);
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        tokio::spawn(async move {
            let changed = until_changed(watcher(api, config), &this.wake).await;
            if let Ok(mut w) = this.watching.lock() {
                w.remove(&id);
            }
            if changed {
                this.wake.send(owner).ok();
            }
        });
    }
}

/// True once the watched object changes or is found gone; false if the
/// controller stopped first.
async fn until_changed<T: Send>(
    events: impl futures::Stream<Item = Result<Event<T>, watcher::Error>> + Send,
    wake: &mpsc::UnboundedSender<ObjectRef<Microservice>>,
) -> bool {
    let mut events = std::pin::pin!(events.backoff(crate::watching::backoff()));
    let mut present = false;
    loop {
        let event = tokio::select! {
            _ = wake.closed() => return false,
            e = events.next() => e,
        };
        match event {
            None => return false,
            Some(Err(_)) => continue,
            Some(Ok(Event::Init)) => present = false,
            Some(Ok(Event::InitApply(_))) => present = true,
            // Gone before the watch began.
            Some(Ok(Event::InitDone)) if !present => return true,
            Some(Ok(Event::InitDone)) => {}
            Some(Ok(Event::Apply(_) | Event::Delete(_))) => return true,
        }
    }
}
