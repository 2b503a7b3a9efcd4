//! Kubernetes Events, one per thing said. kube's `Recorder` counts a repeat
//! into the first Event's series by reason and object alone, keeping the
//! first note: "wave rest is Done" was shown as the earlier "wave canary is
//! Done". Here a repeat joins a series only when it says the same thing;
//! anything new is an Event of its own.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Reporter};
use kube::{Api, Client};

/// How long a series stays open for repeats, as kube's Recorder keeps it.
const SERIES_OPEN: Duration = Duration::from_secs(6 * 60);

/// What makes two Events the same one said again.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Said {
    warning: bool,
    action: String,
    reason: String,
    note: Option<String>,
    regarding: [Option<String>; 5],
}

impl Said {
    pub fn new(ev: &Event, about: &ObjectReference) -> Self {
        Said {
            warning: ev.type_ == EventType::Warning,
            action: ev.action.clone(),
            reason: ev.reason.clone(),
            note: ev.note.clone(),
            regarding: [
                about.api_version.clone(),
                about.kind.clone(),
                about.namespace.clone(),
                about.name.clone(),
                about.uid.clone(),
            ],
        }
    }
}

/// What to send for an Event.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    Create,
    /// The same said again: the series of the Event `name` counts it.
    Repeat {
        name: String,
        count: i32,
    },
}

struct Open {
    name: String,
    count: i32,
    last: Instant,
}

/// The series still open, per thing said. Pure.
#[derive(Default)]
pub struct Series(HashMap<Said, Open>);

impl Series {
    pub fn step(&mut self, said: &Said, now: Instant) -> Step {
        self.0
            .retain(|_, o| now.saturating_duration_since(o.last) < SERIES_OPEN);
        match self.0.get(said) {
            Some(o) => Step::Repeat {
                name: o.name.clone(),
                count: o.count + 1,
            },
            None => Step::Create,
        }
    }

    /// Records what was sent: an Event created, or its series counted.
    pub fn sent(&mut self, said: Said, name: String, count: i32, now: Instant) {
        self.0.insert(
            said,
            Open {
                name,
                count,
                last: now,
            },
        );
    }

    /// A repeat that could not be counted (the Event expired): the next
    /// one creates an Event again.
    pub fn forget(&mut self, said: &Said) {
        self.0.remove(said);
    }
}

/// Sends Events for one reporting controller and instance.
pub struct Sender {
    client: Client,
    reporter: Reporter,
    series: Mutex<Series>,
}

impl Sender {
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Sender {
            client,
            reporter,
            series: Mutex::default(),
        }
    }

    fn series(&self) -> std::sync::MutexGuard<'_, Series> {
        self.series.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub async fn publish(&self, ev: &Event, about: &ObjectReference) -> kube::Result<()> {
        let said = Said::new(ev, about);
        let step = self.series().step(&said, Instant::now());
        let namespace = about.namespace.as_deref().unwrap_or("default");
        let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), namespace);
        let now = k8s_openapi::jiff::Timestamp::now();
        let (name, count) = match step {
            Step::Create => {
                let event = object(ev, about, &self.reporter, now);
                let name = event.metadata.name.clone().unwrap_or_default();
                api.create(&PostParams::default(), &event).await?;
                (name, 1)
            }
            Step::Repeat { name, count } => {
                let series = serde_json::json!({"series": EventSeries {
                    count,
                    last_observed_time: MicroTime(now),
                }});
                let patched = api
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&series))
                    .await;
                if let Err(e) = patched {
                    self.series().forget(&said);
                    return Err(e);
                }
                (name, count)
            }
        };
        self.series().sent(said, name, count, Instant::now());
        Ok(())
    }
}

/// The events.k8s.io/v1 object for `ev` about `about`, as of `now`. Pure.
pub fn object(
    ev: &Event,
    about: &ObjectReference,
    reporter: &Reporter,
    now: k8s_openapi::jiff::Timestamp,
) -> K8sEvent {
    let controller = &reporter.controller;
    K8sEvent {
        action: Some(ev.action.clone()),
        reason: Some(ev.reason.clone()),
        event_time: Some(MicroTime(now)),
        regarding: Some(about.clone()),
        related: ev.secondary.clone(),
        note: ev.note.clone(),
        metadata: ObjectMeta {
            namespace: about.namespace.clone(),
            name: Some(format!(
                "{}.{:x}",
                about.name.as_deref().unwrap_or(controller),
                now.as_nanosecond()
            )),
            ..Default::default()
        },
        reporting_controller: Some(controller.clone()),
        reporting_instance: Some(
            reporter
                .instance
                .clone()
                .unwrap_or_else(|| controller.clone()),
        ),
        type_: Some(
            match ev.type_ {
                EventType::Normal => "Normal",
                EventType::Warning => "Warning",
            }
            .into(),
        ),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn said(reason: &str, note: &str) -> Said {
        let about = ObjectReference {
            name: Some("api".into()),
            namespace: Some("team".into()),
            uid: Some("u1".into()),
            ..Default::default()
        };
        let ev = Event {
            type_: EventType::Normal,
            reason: reason.into(),
            note: Some(note.into()),
            action: "Rollout".into(),
            secondary: None,
        };
        Said::new(&ev, &about)
    }

    #[test]
    fn a_new_note_of_the_same_reason_is_an_event_of_its_own() {
        let (mut s, t) = (Series::default(), Instant::now());
        let canary = said("WaveDone", "wave canary is Done");
        assert_eq!(s.step(&canary, t), Step::Create);
        s.sent(canary.clone(), "api.1".into(), 1, t);
        let rest = said("WaveDone", "wave rest is Done");
        assert_eq!(s.step(&rest, t), Step::Create);
    }

    #[test]
    fn the_same_said_again_counts_into_its_series_until_it_closes() {
        let (mut s, t) = (Series::default(), Instant::now());
        let w = said("ClusterFailed", "cluster member-2 failed");
        s.sent(w.clone(), "api.1".into(), 1, t);
        let again = s.step(&w, t + Duration::from_secs(10));
        assert_eq!(
            again,
            Step::Repeat {
                name: "api.1".into(),
                count: 2
            }
        );
        s.sent(w.clone(), "api.1".into(), 2, t + Duration::from_secs(10));
        assert_eq!(s.step(&w, t + SERIES_OPEN * 2), Step::Create);
        s.sent(w.clone(), "api.2".into(), 1, t);
        s.forget(&w);
        assert_eq!(s.step(&w, t), Step::Create);
    }
}
