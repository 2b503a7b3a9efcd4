//! `flotilla rollout`: FleetRollouts calls. `wait` follows WatchRollouts,
//! reconnecting to any replica in `--server` and resuming, until the
//! rollout of the current spec ends or the timeout passes.

use std::time::Duration;

use tokio::time::Instant;

use super::remote::{Format, exit, first_of};
use super::rollout_output as out;
use super::wait::retry_after;
use crate::api::client::{ClientOptions, RolloutsClient, connect_rollouts};
use crate::api::pb::{self, WatchEventType};

fn status_error(s: tonic::Status) -> String {
    format!("{:?}: {}", s.code(), s.message())
}

async fn connect_first(o: &ClientOptions) -> Result<RolloutsClient, String> {
    first_of(o, |o| async move { connect_rollouts(&o).await }).await
}

fn key(namespace: &str, name: &str) -> pb::RolloutRef {
    pb::RolloutRef {
        namespace: namespace.into(),
        name: name.into(),
    }
}

/// Which part of a rollout a table shows (JSON has all of it).
#[derive(Clone, Copy)]
pub enum View {
    Status,
    History,
    Placement,
}

fn print(r: &pb::Rollout, format: Format, view: View) {
    match (format, view) {
        (Format::Json, _) => println!("{}", out::json(r)),
        (Format::Table, View::Status) => print!("{}", out::status_text(r)),
        (Format::Table, View::History) => print!("{}", out::history_text(r)),
        (Format::Table, View::Placement) => print!("{}", out::placement_text(r)),
    }
}

pub async fn status(
    o: &ClientOptions,
    format: Format,
    ns: &str,
    name: &str,
    view: View,
) -> Result<u8, String> {
    let r = connect_first(o)
        .await?
        .get_rollout(key(ns, name))
        .await
        .map_err(status_error)?
        .into_inner();
    print(&r, format, view);
    Ok(exit::DONE)
}

pub enum Change {
    Pause,
    Resume,
    Undo(i64),
    /// A wave, and the revision to approve it for ("" for the update one).
    Approve {
        wave: String,
        revision: String,
    },
}

pub async fn change(
    o: &ClientOptions,
    format: Format,
    ns: &str,
    name: &str,
    what: Change,
) -> Result<u8, String> {
    let mut c = connect_first(o).await?;
    let r = match what {
        Change::Pause => c.pause_rollout(key(ns, name)).await,
        Change::Resume => c.resume_rollout(key(ns, name)).await,
        Change::Undo(to_revision) => {
            c.undo_rollout(pb::UndoRolloutRequest {
                namespace: ns.into(),
                name: name.into(),
                to_revision,
            })
            .await
        }
        Change::Approve { wave, revision } => {
            c.approve_wave(pb::ApproveWaveRequest {
                namespace: ns.into(),
                name: name.into(),
                wave,
                revision,
            })
            .await
        }
    }
    .map_err(status_error)?
    .into_inner();
    print(&r, format, View::Status);
    Ok(exit::DONE)
}

/// Why one attempt ended.
enum Ended {
    Verdict(u8),
    /// Worth another attempt (the replica went away, the stream ended),
    /// after the server's RetryInfo when it sent one.
    Retry(String, Option<Duration>),
    Fatal(String),
}

/// A failed call as an attempt's end: retried when the server's details
/// (or, without them, the code) say a retry can help.
fn ended(s: tonic::Status, backoff: Duration) -> Ended {
    match retry_after(&s, backoff) {
        Some(pause) => Ended::Retry(status_error(s), Some(pause)),
        None => Ended::Fatal(status_error(s)),
    }
}

pub async fn wait(
    o: &ClientOptions,
    format: Format,
    ns: &str,
    name: &str,
    timeout: Duration,
) -> Result<u8, String> {
    let deadline = Instant::now() + timeout;
    let mut resume = (0u64, String::new());
    let mut answered = false;
    let mut last_line = String::new();
    let mut ever_seen = false;
    let mut delay = Duration::from_millis(200);
    loop {
        let attempt = async {
            let mut c = match connect_first(o).await {
                Ok(c) => c,
                Err(e) => return Ended::Retry(e, None),
            };
            let stream = c
                .watch_rollouts(pb::WatchRolloutsRequest {
                    namespace: ns.into(),
                    resume_from: resume.0,
                    index_id: resume.1.clone(),
                })
                .await;
            let mut stream = match stream {
                Ok(s) => s.into_inner(),
                Err(s) => return ended(s, delay),
            };
            answered = true;
            let mut in_snapshot = false;
            let mut in_this_snapshot = false;
            loop {
                let event = match stream.message().await {
                    Ok(Some(e)) => e,
                    Ok(None) => return Ended::Retry("the stream ended".into(), None),
                    Err(s) => return ended(s, delay),
                };
                let kind = WatchEventType::try_from(event.r#type).unwrap_or_default();
                if event.revision > 0 {
                    resume = (event.revision, event.index_id.clone());
                }
                let ours = event
                    .rollout
                    .as_ref()
                    .filter(|r| r.name == name && r.namespace == ns);
                match (kind, ours) {
                    (WatchEventType::Reset, _) => {
                        in_snapshot = true;
                        in_this_snapshot = false;
                    }
                    (WatchEventType::Delete, Some(_)) => {
                        return Ended::Fatal(format!("{ns}/{name} was deleted while waiting"));
                    }
                    (WatchEventType::Snapshot | WatchEventType::Upsert, Some(r)) => {
                        ever_seen = true;
                        in_this_snapshot = true;
                        let line = out::progress_line(r);
                        if line != last_line && matches!(format, Format::Table) {
                            eprintln!("{line}");
                        }
                        last_line = line;
                        if let Some(code) = out::verdict(r) {
                            if matches!(format, Format::Json) {
                                println!("{}", out::json(r));
                            }
                            return Ended::Verdict(code);
                        }
                    }
                    // A whole snapshot without it: gone if it was there
                    // before; otherwise it may not exist yet, and is waited for.
                    (WatchEventType::Synced, _) if in_snapshot && !in_this_snapshot => {
                        if ever_seen {
                            return Ended::Fatal(format!("{ns}/{name} was deleted while waiting"));
                        }
                        eprintln!("no FleetMicroservice {ns}/{name} yet; waiting for it");
                        in_snapshot = false;
                    }
                    (WatchEventType::Synced, _) => in_snapshot = false,
                    _ => {}
                }
            }
        };
        let limit = deadline + Duration::from_secs(2);
        match tokio::time::timeout_at(limit, attempt).await {
            Ok(Ended::Verdict(code)) => return Ok(code),
            Ok(Ended::Fatal(e)) => return Err(e),
            Ok(Ended::Retry(e, pause)) => {
                if Instant::now() >= deadline {
                    break;
                }
                eprintln!("reconnecting: {e}");
                let pause = pause.unwrap_or(delay);
                tokio::time::sleep(pause.min(deadline - Instant::now())).await;
                delay = (delay * 2).min(Duration::from_secs(2));
            }
            Err(_) => break,
        }
    }
    if answered {
        eprintln!("timed out after {timeout:?}");
        Ok(exit::TIMED_OUT)
    } else {
        Err("no replica answered".into())
    }
}
