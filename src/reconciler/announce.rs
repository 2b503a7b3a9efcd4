//! Events, sent off the reconcile path. A reconcile hands its Event to a
//! queue and goes on; one task per cluster sends them, and the member's
//! request budget gives Events a small bucket of their own, so an Event
//! never delays a child write. A full queue drops the Event, as client-go's
//! recorder does: Events are for people, status is the record.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Resource;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::ObjectRef;
use tokio::sync::mpsc;

use crate::crd::Microservice;
use crate::telemetry::events::Sender;

/// Events waiting to be sent, per cluster: client-go's broadcaster queue.
/// At the Event bucket's 5 a second that is over 3 minutes of Events.
const QUEUE: usize = 1000;

/// At most one Normal Event per Microservice per spec generation.
#[derive(Debug, Default)]
pub struct PerGeneration(Mutex<HashMap<ObjectRef<Microservice>, i64>>);

impl PerGeneration {
    /// True the first time it is asked for this generation.
    pub fn first(&self, key: ObjectRef<Microservice>, generation: i64) -> bool {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.insert(key, generation) != Some(generation)
    }

    pub fn forget(&self, key: &ObjectRef<Microservice>) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(key);
    }

    pub fn retain(&self, keep: impl Fn(&ObjectRef<Microservice>) -> bool) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|k, _| keep(k));
    }

    pub fn tracked(&self) -> usize {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

pub struct Announcer {
    queue: mpsc::Sender<(Event, ObjectReference)>,
    announced: PerGeneration,
}

impl Announcer {
    /// Starts the sending task; it ends when the controller drops this.
    pub fn start(recorder: Sender) -> Arc<Self> {
        let (queue, mut pending) = mpsc::channel::<(Event, ObjectReference)>(QUEUE);
        tokio::spawn(async move {
            while let Some((event, about)) = pending.recv().await {
                if let Err(e) = recorder.publish(&event, &about).await {
                    tracing::debug!(error = %e, reason = %event.reason, "could not publish event");
                }
            }
        });
        Arc::new(Announcer {
            queue,
            announced: PerGeneration::default(),
        })
    }

    /// A Normal Event, unless one was sent for this generation already.
    pub fn normal_once(&self, ms: &Microservice, reason: &str, note: String) {
        let generation = ms.metadata.generation.unwrap_or(0);
        if self.announced.first(ObjectRef::from_obj(ms), generation) {
            self.send(ms, EventType::Normal, reason, note);
        }
    }

    pub fn warning(&self, ms: &Microservice, reason: &str, note: String) {
        self.send(ms, EventType::Warning, reason, note);
    }

    pub fn forget(&self, key: &ObjectRef<Microservice>) {
        self.announced.forget(key);
    }

    /// Keeps the notes of the objects `keep` names only.
    pub fn retain(&self, keep: impl Fn(&ObjectRef<Microservice>) -> bool) {
        self.announced.retain(keep);
    }

    /// How many objects have a generation noted.
    pub fn tracked(&self) -> usize {
        self.announced.tracked()
    }

    fn send(&self, ms: &Microservice, type_: EventType, reason: &str, note: String) {
        let event = Event {
            type_,
            reason: reason.to_string(),
            note: Some(note),
            action: "Reconcile".into(),
            secondary: None,
        };
        if self.queue.try_send((event, ms.object_ref(&()))).is_err() {
            tracing::debug!(reason, "event queue full; event dropped");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_normal_event_per_generation() {
        let once = PerGeneration::default();
        let k = ObjectRef::<Microservice>::new("a").within("ns");
        assert!(once.first(k.clone(), 1));
        assert!(
            !once.first(k.clone(), 1),
            "the drift repair of generation 1"
        );
        assert!(once.first(k.clone(), 2));
        once.forget(&k);
        assert!(once.first(k, 2), "a new object of the same name");
    }
}
