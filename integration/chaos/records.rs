//! What the apiservers recorded, read from their audit logs into the
//! checker's types: Lease writes, operator writes, status writes with
//! their bodies, and the fleet controller's member writes.

use std::time::Duration;

use jiff::Timestamp;

use crate::check::{FleetStatus, FleetWrite, LeaseWrite, StatusWrite, WaveSeen, Write};
use crate::proxy::Delivery;
use crate::support::replicas::{LEASE_NAMESPACE, MEMBERS};
use crate::support::rollout::{fleet_controller_writes, fleet_writes, written_by};
use crate::support::{audit_events, audited_writes, fleet_dir, lease_writes, received};

/// When a write left its writer: a late delivery brought it its lag after
/// (`proxy::sent_at`). Terms and fences are judged by when writes left,
/// which is all a writer's fence decides.
fn sent(late: &[Delivery], received: Timestamp, source: &str) -> Timestamp {
    crate::proxy::sent_at(late, source, received)
}

fn leases(late: &[Delivery], cluster: &str, namespace: &str, lease: &str) -> Vec<LeaseWrite> {
    let mut out: Vec<LeaseWrite> = lease_writes(cluster, namespace, lease)
        .into_iter()
        .map(|l| LeaseWrite {
            at: sent(late, l.received, &l.source),
            writer: first_word(&l.writer),
            holder: l.holder,
        })
        .collect();
    out.sort_by_key(|l| l.at);
    out
}

fn first_word(s: &str) -> String {
    s.split_whitespace().next().unwrap_or_default().to_string()
}

/// A member's Lease history and the member leaders' writes to `namespace`
/// there (children and status), with the writes whose time cannot be read
/// (unverifiable, not dropped).
pub fn member_terms(
    late: &[Delivery],
    member: &str,
    namespace: &str,
    lease: &str,
) -> (Vec<LeaseWrite>, Vec<Write>, Vec<String>) {
    let (mut writes, mut unreadable) = (Vec::new(), Vec::new());
    for w in audited_writes(member, namespace) {
        let Some(writer) = w.user_agent.strip_prefix("flotilla/") else {
            continue;
        };
        let what = format!("{} {} {}", w.verb, w.resource, w.name);
        match w.received.parse() {
            Ok(at) => writes.push(Write {
                cluster: member.to_string(),
                writer: first_word(writer),
                at: sent(late, at, &w.source),
                what,
            }),
            Err(e) => unreadable.push(format!(
                "{member}: {what} by {writer} received {:?}: {e}",
                w.received
            )),
        }
    }
    (
        leases(late, member, LEASE_NAMESPACE, lease),
        writes,
        unreadable,
    )
}

/// Every complete line of `cluster`'s audit log that is not a JSON event,
/// named. The last line may be one the apiserver is still writing: one
/// without its newline is read again a moment later before it counts.
pub fn unparsed(cluster: &str) -> Vec<String> {
    let path = fleet_dir()
        .join("logs")
        .join(format!("{cluster}-audit.log"));
    let mut text = String::new();
    for attempt in 0..3 {
        if attempt > 0 {
            std::thread::sleep(Duration::from_millis(500));
        }
        match std::fs::read_to_string(&path) {
            Ok(t) => text = t,
            Err(e) => return vec![format!("{}: {e}", path.display())],
        }
        if text.is_empty() || text.ends_with('\n') {
            break;
        }
    }
    text.split_inclusive('\n')
        .enumerate()
        .filter(|(_, l)| serde_json::from_str::<serde_json::Value>(l.trim_end()).is_err())
        .map(|(i, l)| {
            let head: String = l.chars().take(80).collect();
            format!("{cluster} audit line {}: {head:?}", i + 1)
        })
        .collect()
}

/// The home rollout Lease's history and every fleet-controller write, a
/// member write at when it left (`sent`).
pub fn fleet_terms(
    late: &[Delivery],
    namespace: &str,
    lease: &str,
) -> (Vec<LeaseWrite>, Vec<Write>) {
    let home = fleet_controller_writes(namespace)
        .into_iter()
        .filter(|(cluster, ..)| cluster == "home")
        .map(|(cluster, writer, at, what)| Write {
            cluster,
            writer: first_word(&writer),
            at,
            what,
        });
    let members = MEMBERS.iter().flat_map(|m| {
        fleet_writes(m, namespace).into_iter().map(move |w| Write {
            cluster: m.to_string(),
            writer: first_word(w.user_agent.trim_start_matches("flotilla-fleet/")),
            at: sent(late, w.received, &w.source),
            what: format!("{} {}", w.verb, w.name),
        })
    });
    let writes = home.chain(members).collect();
    (leases(late, "home", namespace, lease), writes)
}

/// The DNS Lease's history and the DNS writer's FleetMicroservice status
/// writes (FleetDnsDegraded), which that Lease fences.
pub fn dns_terms(namespace: &str, lease: &str) -> (Vec<LeaseWrite>, Vec<Write>) {
    let writes = audit_events("home")
        .into_iter()
        .filter(|e| {
            e["objectRef"]["namespace"] == namespace
                && e["objectRef"]["resource"] == "fleetmicroservices"
                && written_by(e, flotilla::dns::writer::FIELD_MANAGER)
        })
        .filter_map(|e| {
            Some(Write {
                cluster: "home".into(),
                writer: first_word(e["userAgent"].as_str()?.strip_prefix("flotilla/")?),
                at: received(&e),
                what: format!("FleetDnsDegraded of {}", e["objectRef"]["name"].as_str()?),
            })
        })
        .collect();
    (leases(&[], "home", namespace, lease), writes)
}

/// The fleet controller's Microservice writes that carried an image.
pub fn fleet_member_writes(namespace: &str) -> Vec<FleetWrite> {
    MEMBERS
        .iter()
        .flat_map(|m| {
            fleet_writes(m, namespace).into_iter().filter_map(move |w| {
                Some(FleetWrite {
                    cluster: m.to_string(),
                    name: w.name,
                    at: w.received,
                    image: w.image?,
                    revision: w.revision.unwrap_or_default(),
                })
            })
        })
        .collect()
}

/// Every status write of a Microservice in `namespace` that may have been
/// stored, with what its body says (the audit policy keeps status bodies):
/// the successful ones, and those the apiserver answered 504, whose write
/// may still complete after the timeout (seen in a 30-minute run: a 504'd
/// Available=True was stored, watched and answered from).
pub fn status_writes(namespace: &str) -> Vec<StatusWrite> {
    let mut out = Vec::new();
    for m in MEMBERS {
        let path = fleet_dir().join("logs").join(format!("{m}-audit.log"));
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("audit log {}: {e}", path.display()));
        for line in text
            .lines()
            .filter(|l| l.contains("\"subresource\":\"status\"") && l.contains(namespace))
        {
            let Ok(e) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            if e["objectRef"]["namespace"] != namespace
                || e["objectRef"]["resource"] != "microservices"
                || !e["responseStatus"]["code"]
                    .as_u64()
                    .is_some_and(may_be_stored)
            {
                continue;
            }
            if let Some(s) = status_write(m, &e) {
                out.push(s);
            }
        }
    }
    out.sort_by_key(|s| s.at);
    out
}

/// Whether a write answered `code` may have been stored: a success, or a
/// 504, after which the apiserver may still complete the write.
pub fn may_be_stored(code: u64) -> bool {
    code < 300 || code == 504
}

fn status_write(cluster: &str, e: &serde_json::Value) -> Option<StatusWrite> {
    let body = &e["requestObject"];
    let generation = body["metadata"]["generation"].as_i64()?;
    let observed = body["status"]["observedGeneration"].as_i64();
    let available = body["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| {
            c["type"] == "Available"
                && c["status"] == "True"
                && c["observedGeneration"].as_i64() == Some(generation)
        });
    Some(StatusWrite {
        cluster: cluster.to_string(),
        name: e["objectRef"]["name"].as_str()?.to_string(),
        at: e["requestReceivedTimestamp"].as_str()?.parse().ok()?,
        generation,
        image: body["spec"]["image"].as_str()?.to_string(),
        available: available && observed == Some(generation),
    })
}

/// How long after a writer's last renewal reached the apiserver its writes
/// may still arrive: the Lease duration the chaos replicas run with
/// (`FAST_ELECTION`, 2 s). No other candidate may acquire before it has
/// seen the Lease unrenewed that long, so a write that arrives sooner
/// cannot overlap another writer's term. (The renew deadline plus 200 ms,
/// the fence's own cut-off, was the bound before: under `make test`'s load
/// a member apiserver received a renewal 0.5 s after it was sent, and a
/// write sent inside the renew deadline arrived 0.4 s past it, with the
/// Lease still the writer's.)
pub const TERM_LIMIT: Duration = Duration::from_secs(2);

/// The fleet controller's FleetMicroservice status writes in `namespace`,
/// from their bodies in the home audit log, oldest first; with the ones
/// that do not read (unverifiable, not dropped).
pub fn fleet_status_writes(namespace: &str) -> (Vec<FleetStatus>, Vec<String>) {
    let (mut out, mut unreadable) = (Vec::new(), Vec::new());
    for e in audit_events("home") {
        if e["objectRef"]["namespace"] != namespace
            || e["objectRef"]["resource"] != "fleetmicroservices"
            || e["objectRef"]["subresource"] != "status"
            || e["verb"] != "update"
            || !e["userAgent"]
                .as_str()
                .is_some_and(|a| a.starts_with("flotilla"))
            // The DNS writer's marks copy a cached status; and a refused
            // write said nothing.
            || written_by(&e, flotilla::dns::writer::FIELD_MANAGER)
            || !e["responseStatus"]["code"]
                .as_u64()
                .is_some_and(may_be_stored)
        {
            continue;
        }
        match fleet_status(&e) {
            Some(s) => out.push(s),
            None => unreadable.push(format!(
                "home: a FleetMicroservice status write of {} received {} does not read",
                e["objectRef"]["name"], e["requestReceivedTimestamp"]
            )),
        }
    }
    out.sort_by_key(|s| s.at);
    (out, unreadable)
}

fn fleet_status(e: &serde_json::Value) -> Option<FleetStatus> {
    let status = &e["requestObject"]["status"];
    let waves = status["waves"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|w| {
            Some(WaveSeen {
                name: w["name"].as_str()?.to_string(),
                clusters: w["clusters"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|c| c.as_str().map(String::from))
                    .collect(),
                started: match w["started"].as_str() {
                    Some(t) => Some(t.parse().ok()?),
                    None => None,
                },
            })
        })
        .collect::<Option<Vec<_>>>()?;
    Some(FleetStatus {
        name: e["objectRef"]["name"].as_str()?.to_string(),
        at: e["requestReceivedTimestamp"].as_str()?.parse().ok()?,
        update: status["updateRevision"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        last_good: status["lastGoodRevision"].as_str().map(String::from),
        waves,
        unreachable: status["placement"]["clusters"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| !c["unreachableSince"].is_null())
            .filter_map(|c| c["name"].as_str().map(String::from))
            .collect(),
    })
}

/// The fleet controller's creates and deletes of `name`'s Microservice in
/// every member, with when each left its writer.
pub fn placed_events(
    late: &[Delivery],
    namespace: &str,
    name: &str,
) -> Vec<crate::placement::Placed> {
    MEMBERS
        .iter()
        .flat_map(|m| {
            fleet_writes(m, namespace)
                .into_iter()
                .filter(|w| w.name == name && matches!(w.verb.as_str(), "create" | "delete"))
                .map(move |w| crate::placement::Placed {
                    cluster: m.to_string(),
                    received: w.received,
                    sent: sent(late, w.received, &w.source),
                    create: w.verb == "create",
                })
        })
        .collect()
}

/// How many operator writes and Lease writes in the members a late
/// delivery brought: the cases `late-delivery` gave the fences.
pub fn late_writes(late: &[Delivery], namespace: &str, lease: &str) -> usize {
    MEMBERS
        .iter()
        .map(|m| {
            let writes = audited_writes(m, namespace)
                .into_iter()
                .filter_map(|w| Some((w.received.parse::<Timestamp>().ok()?, w.source)));
            let leases = lease_writes(m, LEASE_NAMESPACE, lease)
                .into_iter()
                .map(|l| (l.received, l.source));
            writes
                .chain(leases)
                .filter(|(at, source)| sent(late, *at, source) != *at)
                .count()
        })
        .sum()
}
