//! The invariants, pure: each takes what was recorded (the apiservers' audit
//! logs, the workload's answers, the state read after the quiet period) and
//! returns the violations it finds. No I/O here, so each is unit-tested on
//! hand-made histories that break it.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;

#[derive(Debug, Clone, PartialEq)]
pub struct Violation {
    pub invariant: &'static str,
    pub at: Option<Timestamp>,
    pub detail: String,
}

fn violation(invariant: &'static str, at: Option<Timestamp>, detail: String) -> Violation {
    Violation {
        invariant,
        at,
        detail,
    }
}

// The names `make chaos` prints, fixed in the product brief (§10).
pub const ONE_WRITER: &str = "member-fence";
pub const FLEET_WRITER: &str = "fleet-fence";
/// The DNS writer's status marks (FleetDnsDegraded) inside the DNS term,
/// from the home audit log; `dns-fence` proper judges the records in etcd.
pub const DNS_WRITER: &str = "dns-status-fence";
pub const NO_FALSE_SUCCESS: &str = "wait-truth";
pub const WAVE_ORDER: &str = "wave-order";
pub const BAKE_HELD: &str = "bake-held";
pub const APPROVAL_BOUND: &str = "approval-bound";
pub const CONVERGED: &str = "converged";
pub const NOTHING_LEFT: &str = "no-orphans";
pub const NO_EXIT: &str = "no-unasked-exit";
pub const NO_ORPHAN_RECORD: &str = "registry-no-orphan-record";
pub const DNS_FENCE: &str = "dns-fence";
pub const WINDOW_HELD: &str = "window-held";
pub const DNS_NEVER_EMPTY: &str = "dns-never-empty";

/// Every invariant this checker judges, in the order the report prints them.
pub const INVARIANTS: [&str; 17] = [
    ONE_WRITER,
    FLEET_WRITER,
    DNS_WRITER,
    NO_FALSE_SUCCESS,
    WAVE_ORDER,
    BAKE_HELD,
    APPROVAL_BOUND,
    WINDOW_HELD,
    crate::placement::FAILOVER_COUNT,
    crate::placement::NO_DELETE_UNREACHABLE,
    DNS_FENCE,
    DNS_NEVER_EMPTY,
    crate::withdrawn::DNS_WITHDRAWN,
    CONVERGED,
    NOTHING_LEFT,
    NO_EXIT,
    NO_ORPHAN_RECORD,
];

/// What one invariant judged: how many cases, and what broke.
#[derive(Debug, Default)]
pub struct Judged {
    pub checked: usize,
    pub violations: Vec<Violation>,
    /// Evidence that could not be read or parsed: it fails the run too.
    pub unverifiable: Vec<String>,
}

impl Judged {
    pub fn of(checked: usize, violations: Vec<Violation>) -> Self {
        Judged {
            checked,
            violations,
            unverifiable: Vec::new(),
        }
    }
}

/// One successful write of a Lease: who sent it and whom it names.
#[derive(Debug, Clone)]
pub struct LeaseWrite {
    pub at: Timestamp,
    pub writer: String,
    /// Empty when the write released the Lease.
    pub holder: String,
}

/// One successful operator write, from a cluster's audit log.
#[derive(Debug, Clone)]
pub struct Write {
    pub cluster: String,
    pub writer: String,
    pub at: Timestamp,
    pub what: String,
}

/// Every write was received while its writer held the Lease: the last
/// Lease write before it names the writer, and the writer renewed within
/// `limit` (the Lease duration: before any successor may acquire) before it.
pub fn writes_inside_terms(
    invariant: &'static str,
    leases: &[LeaseWrite],
    writes: &[Write],
    limit: Duration,
) -> Judged {
    let limit = jiff::SignedDuration::try_from(limit).expect("a short limit");
    let mut out = Vec::new();
    for w in writes {
        let last = leases.iter().rev().find(|l| l.at <= w.at);
        let renewed = leases
            .iter()
            .rev()
            .find(|r| r.at <= w.at && r.writer == w.writer && r.holder == w.writer);
        let inside = last.is_some_and(|l| l.holder == w.writer)
            && renewed.is_some_and(|r| w.at.duration_since(r.at) <= limit);
        if !inside {
            out.push(violation(
                invariant,
                Some(w.at),
                format!(
                    "{} wrote {} in {} outside its term; the Lease's last write before it: {}",
                    w.writer,
                    w.what,
                    w.cluster,
                    last.map_or("none".into(), |l| format!(
                        "{} by {} naming {:?}",
                        l.at, l.writer, l.holder
                    )),
                ),
            ));
        }
    }
    Judged::of(writes.len(), out)
}

/// One status write of a Microservice, from its body in the audit log.
#[derive(Debug, Clone)]
pub struct StatusWrite {
    pub cluster: String,
    pub name: String,
    pub at: Timestamp,
    pub generation: i64,
    pub image: String,
    /// Available=True for this generation, and observedGeneration caught up.
    pub available: bool,
}

impl StatusWrite {
    fn runs(&self, image: &str) -> bool {
        self.available && self.image == image
    }
}

/// A `flotilla wait` or `flotilla rollout wait` answer the workload got.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Answer {
    pub command: String,
    pub name: String,
    pub image: String,
    pub clusters: Vec<String>,
    pub server: String,
    pub started: Timestamp,
    pub answered: Timestamp,
    pub code: i32,
}

/// Every exit 0 is matched at that instant by every required cluster: the
/// last status write before the answer shows the target image Available
/// at the generation it was written for.
pub fn no_false_success(answers: &[Answer], status: &[StatusWrite]) -> Judged {
    let mut out = Vec::new();
    let mut checked = 0;
    for a in answers.iter().filter(|a| a.code == 0) {
        for c in &a.clusters {
            checked += 1;
            let last = status
                .iter()
                .filter(|s| s.cluster == *c && s.name == a.name && s.at <= a.answered)
                .max_by_key(|s| s.at);
            if !last.is_some_and(|s| s.runs(&a.image)) {
                out.push(violation(
                    NO_FALSE_SUCCESS,
                    Some(a.answered),
                    format!(
                        "`{}` for {} at {} said done (server {}), but {c}'s last status before it was {}",
                        a.command,
                        a.name,
                        a.image,
                        a.server,
                        last.map_or("none".into(), |s| format!(
                            "{} at generation {}, available {}, written {}",
                            s.image, s.generation, s.available, s.at
                        )),
                    ),
                ));
            }
        }
    }
    Judged::of(checked, out)
}

/// One write of a member Microservice by the fleet controller.
#[derive(Debug, Clone)]
pub struct FleetWrite {
    pub cluster: String,
    pub name: String,
    pub at: Timestamp,
    pub image: String,
    /// The revision annotation it carried.
    pub revision: String,
}

/// Whether `w` brings a new image: one no cluster ran Available before the
/// image was first written anywhere (`first`). A rollback's image ran
/// before, and may go everywhere at once.
fn brings_new_image(w: &FleetWrite, first: Timestamp, status: &[StatusWrite]) -> bool {
    !status
        .iter()
        .any(|s| s.name == w.name && s.runs(&w.image) && s.at < first)
}

/// Whether `w`'s cluster counted as the canary: it carried the label at
/// `grace` before the write, or was given it since.
fn to_the_canary(w: &FleetWrite, canary: &[CanaryMove], grace: jiff::SignedDuration) -> bool {
    let from = w.at.checked_sub(grace).unwrap_or(w.at);
    canary
        .iter()
        .rev()
        .find(|m| m.at <= from)
        .is_some_and(|m| m.member == w.cluster)
        || canary
            .iter()
            .any(|m| m.at > from && m.at <= w.at && m.member == w.cluster)
}

/// When each (object, image) was first written anywhere.
fn first_writes(writes: &[FleetWrite]) -> BTreeMap<(&str, &str), Timestamp> {
    let mut firsts: BTreeMap<(&str, &str), Timestamp> = BTreeMap::new();
    for w in writes {
        firsts
            .entry((&w.name, &w.image))
            .and_modify(|t| *t = (*t).min(w.at))
            .or_insert(w.at);
    }
    firsts
}

/// Where the canary label was: from `at`, `member` carries it.
#[derive(Debug, Clone)]
pub struct CanaryMove {
    pub at: Timestamp,
    pub member: String,
}

/// How stale the fleet controller's view of a member's status may be when
/// it writes: a flip this close before a write is not held against it.
pub const READ_LAG: Duration = Duration::from_secs(1);

/// Wave order and bake, over every fleet write (not only the first per
/// cluster). `wave-order`: a new image (one never Available anywhere before
/// it was first written) reaches a cluster outside the canary wave only
/// after another cluster ran it Available for `bake`. `bake-held`: that
/// cluster stayed Available at the image for the whole bake, up to
/// `READ_LAG` before the write. A cluster counts as the canary if it
/// carried the label within `grace` before the write (the replicas read
/// label files a moment late). A write of the revision the last status
/// names good is a return to it (a rollback, seed 487269228), not a wave.
pub fn wave_order(
    writes: &[FleetWrite],
    status: &[StatusWrite],
    fleet: &[FleetStatus],
    canary: &[CanaryMove],
    bake: Duration,
    grace: Duration,
) -> (Judged, Judged) {
    let bake = jiff::SignedDuration::try_from(bake).expect("a short bake");
    let grace = jiff::SignedDuration::try_from(grace).expect("a short grace");
    let lag = jiff::SignedDuration::try_from(READ_LAG).expect("a short lag");
    let firsts = first_writes(writes);
    let (mut order, mut held) = (Judged::default(), Judged::default());
    for w in writes {
        let (name, image, cluster, at) = (&w.name, &w.image, &w.cluster, w.at);
        let first = firsts[&(name.as_str(), image.as_str())];
        if !brings_new_image(w, first, status)
            || names_good(fleet, name, &w.revision, at)
            || to_the_canary(w, canary, grace)
        {
            continue;
        }
        order.checked += 1;
        let evidence = status.iter().any(|s| {
            s.name == *name
                && s.runs(image)
                && s.cluster != *cluster
                && at.duration_since(s.at) >= bake
        });
        if !evidence {
            order.violations.push(violation(
                WAVE_ORDER,
                Some(at),
                format!(
                    "{cluster} (not the canary) got {name} at {image} at {at} before any cluster ran it Available for {bake:#}"
                ),
            ));
            continue;
        }
        held.checked += 1;
        let (bake_from, seen_until) = (
            at.checked_sub(bake).unwrap_or(at),
            at.checked_sub(lag).unwrap_or(at),
        );
        let ran_through = |c: &str| {
            let on = |s: &&StatusWrite| s.cluster == c && s.name == *name;
            let before = status
                .iter()
                .filter(on)
                .filter(|s| s.at <= bake_from)
                .max_by_key(|s| s.at);
            before.is_some_and(|s| s.runs(image))
                && status
                    .iter()
                    .filter(on)
                    .filter(|s| s.at > bake_from && s.at <= seen_until)
                    .all(|s| s.runs(image))
        };
        let clusters: std::collections::BTreeSet<&str> = status
            .iter()
            .filter(|s| s.cluster != *cluster)
            .map(|s| s.cluster.as_str())
            .collect();
        if !clusters.into_iter().any(ran_through) {
            held.violations.push(violation(
                BAKE_HELD,
                Some(at),
                format!(
                    "{cluster} got {name} at {image} at {at}, but no other cluster ran it Available through the {bake:#} before"
                ),
            ));
        }
    }
    (order, held)
}

/// An approval of a wave, as the object's approvals annotation keeps it.
#[derive(Debug, Clone)]
pub struct ApprovalSeen {
    pub wave: String,
    pub revision: String,
    pub by: String,
    pub at: Timestamp,
}

/// An attempt to approve with an identity that lacks the right.
#[derive(Debug, Clone)]
pub struct Forbidden {
    pub at: Timestamp,
    pub code: i32,
    pub answer: String,
}

/// `approval-bound`, for the object `name` whose non-canary wave `wave` is
/// Manual: every write of a new image outside the canary carries a revision
/// approved for `wave` before the write by an identity in `allowed`; no
/// approval is by anyone else; and every attempt by an identity without
/// the right was refused. A return to the good revision (`names_good`) is
/// no wave and needs no approval, as in the planner.
#[allow(clippy::too_many_arguments)]
pub fn approval_bound(
    name: &str,
    wave: &str,
    writes: &[FleetWrite],
    status: &[StatusWrite],
    canary: &[CanaryMove],
    fleet: &[FleetStatus],
    grace: Duration,
    approvals: &[ApprovalSeen],
    allowed: &[&str],
    forbidden: &[Forbidden],
) -> Judged {
    let grace = jiff::SignedDuration::try_from(grace).expect("a short grace");
    let firsts = first_writes(writes);
    let mut j = Judged::default();
    for w in writes.iter().filter(|w| w.name == name) {
        let first = firsts[&(w.name.as_str(), w.image.as_str())];
        if !brings_new_image(w, first, status)
            || names_good(fleet, name, &w.revision, w.at)
            || to_the_canary(w, canary, grace)
        {
            continue;
        }
        j.checked += 1;
        let approved = approvals.iter().any(|a| {
            a.wave == wave
                && a.revision == w.revision
                && allowed.contains(&a.by.as_str())
                && a.at <= w.at
        });
        if !approved {
            j.violations.push(violation(
                APPROVAL_BOUND,
                Some(w.at),
                format!(
                    "{} got {name} at {} (revision {}) at {} with no approval of wave {wave} for that revision before it",
                    w.cluster, w.image, w.revision, w.at
                ),
            ));
        }
    }
    for a in approvals {
        j.checked += 1;
        if !allowed.contains(&a.by.as_str()) {
            j.violations.push(violation(
                APPROVAL_BOUND,
                Some(a.at),
                format!(
                    "wave {} of {name} approved for {} by {}, who may not approve",
                    a.wave, a.revision, a.by
                ),
            ));
        }
    }
    for f in forbidden {
        j.checked += 1;
        if f.code == 0 {
            j.violations.push(violation(
                APPROVAL_BOUND,
                Some(f.at),
                format!(
                    "an approve of {name} without the right was accepted: {}",
                    f.answer
                ),
            ));
        }
    }
    j
}

/// One Microservice as a member holds it after the quiet period.
#[derive(Debug, Clone, PartialEq)]
pub struct Seen {
    pub image: String,
    /// Available at its generation, observedGeneration caught up.
    pub done: bool,
}

/// What the workload's own record says must be true at the end.
#[derive(Debug, Clone, Default)]
pub struct Expected {
    /// Plain Microservices, created in every member: the last image, or
    /// None when the last operation deleted it.
    pub microservices: BTreeMap<String, Option<String>>,
    /// FleetMicroservices: the (phase, image every member runs) pairs their
    /// last release allows; any one of them is convergence.
    pub fleet: BTreeMap<String, Vec<(String, String)>>,
    /// FleetMicroservices placed by count: Complete, and on exactly that
    /// many members, each Available at the image.
    pub counted: BTreeMap<String, (usize, String)>,
}

/// What was read from the apiservers and the replicas after the quiet period.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    pub members: Vec<String>,
    /// (cluster, name) -> the Microservice there.
    pub microservices: BTreeMap<(String, String), Seen>,
    /// FleetMicroservice -> its phase.
    pub phases: BTreeMap<String, String>,
    /// A watch client's view: name -> cluster -> image.
    pub watch: BTreeMap<String, BTreeMap<String, String>>,
    /// The dashboard event stream's view, the same way.
    pub dashboard: BTreeMap<String, BTreeMap<String, String>>,
}

impl Observed {
    /// The apiservers' view as a watch client should hold it: name ->
    /// cluster -> image.
    pub fn truth(&self) -> BTreeMap<String, BTreeMap<String, String>> {
        let mut truth: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
        for ((cluster, name), s) in &self.microservices {
            truth
                .entry(name.clone())
                .or_default()
                .insert(cluster.clone(), s.image.clone());
        }
        truth
    }
}

/// Every Microservice matches its last spec and is Available; every
/// FleetMicroservice ends as its last release deserves; the views of the
/// gRPC watch client and of the dashboard stream equal the apiservers'.
pub fn converged(expected: &Expected, observed: &Observed) -> Judged {
    let checked = expected.microservices.len() * observed.members.len()
        + expected.fleet.len()
        + expected.counted.len()
        + 2;
    let mut out = Vec::new();
    let mut miss = |d: String| out.push(violation(CONVERGED, None, d));
    for (name, want) in &expected.microservices {
        for m in &observed.members {
            let seen = observed.microservices.get(&(m.clone(), name.clone()));
            match (want, seen) {
                (Some(image), Some(s)) if s.image == *image && s.done => {}
                (None, None) => {}
                (Some(image), s) => miss(format!(
                    "{name} in {m}: want {image} Available, found {s:?}"
                )),
                (None, Some(s)) => {
                    miss(format!("{name} in {m}: deleted last, still there ({s:?})"))
                }
            }
        }
    }
    for (name, allowed) in &expected.fleet {
        let phase = observed.phases.get(name);
        let runs = |image: &str| {
            observed.members.iter().all(|m| {
                observed
                    .microservices
                    .get(&(m.clone(), name.clone()))
                    .is_some_and(|s| s.image == image && s.done)
            })
        };
        let fits = allowed
            .iter()
            .any(|(p, image)| Some(p) == phase && runs(image));
        if !fits {
            let found: Vec<_> = observed
                .members
                .iter()
                .map(|m| (m, observed.microservices.get(&(m.clone(), name.clone()))))
                .collect();
            miss(format!(
                "FleetMicroservice {name}: phase {phase:?} with members {found:?}; allowed: {allowed:?}"
            ));
        }
    }
    for (name, (n, image)) in &expected.counted {
        let holders: Vec<_> = observed
            .microservices
            .iter()
            .filter(|((_, ms), _)| ms == name)
            .collect();
        let complete = observed.phases.get(name).map(String::as_str) == Some("Complete");
        if !complete
            || holders.len() != *n
            || !holders.iter().all(|(_, s)| s.image == *image && s.done)
        {
            miss(format!(
                "FleetMicroservice {name}: phase {:?} with {holders:?}; want Complete on {n} members at {image}",
                observed.phases.get(name)
            ));
        }
    }
    let truth = observed.truth();
    let names = |m: &BTreeMap<String, BTreeMap<String, String>>| {
        m.iter()
            .map(|(k, v)| format!("{k}{v:?}"))
            .collect::<Vec<_>>()
    };
    for (client, view) in [
        ("the watch client", &observed.watch),
        ("the dashboard stream", &observed.dashboard),
    ] {
        if truth != *view {
            miss(format!(
                "{client}'s view differs from the apiservers': {client} {:?}, apiservers {:?}",
                names(view),
                names(&truth)
            ));
        }
    }
    Judged::of(checked, out)
}

/// Children with no living owner, and DNS names of deleted Microservices
/// that still answer; `inspected` children and names were looked at.
pub fn nothing_left(orphans: &[String], stale_names: &[String], inspected: usize) -> Judged {
    let out = orphans
        .iter()
        .map(|o| violation(NOTHING_LEFT, None, format!("orphaned child {o}")))
        .chain(stale_names.iter().map(|n| {
            violation(
                NOTHING_LEFT,
                None,
                format!("{n} still resolves after its Microservice was deleted"),
            )
        }))
        .collect();
    Judged::of(inspected, out)
}

/// A replica exit the nemesis did not cause.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Exit {
    pub replica: String,
    pub at: Timestamp,
    pub status: String,
}

/// Judged once per replica the run kept.
pub fn no_exit(exits: &[Exit], replicas: usize) -> Judged {
    let out = exits
        .iter()
        .map(|e| {
            violation(
                NO_EXIT,
                Some(e.at),
                format!("{} exited by itself: {}", e.replica, e.status),
            )
        })
        .collect();
    Judged::of(replicas, out)
}

/// A Microservice the workload deleted and saw gone from its member, with
/// etcd's revision read after that (#67).
#[derive(Debug, Clone)]
pub struct Gone {
    pub uid: String,
    pub object: String,
    pub revision: i64,
    /// Whether a registry stop overlapped the deletion.
    pub during_registry_stop: bool,
}

/// One record write in etcd's history (or a record there now): its key,
/// the object uid it carries, and its revision.
#[derive(Debug, Clone)]
pub struct RecordPut {
    pub key: String,
    pub uid: String,
    /// Whether the value parsed as one of our records.
    pub parsed: bool,
    pub revision: i64,
}

/// No record of a deleted object is written after its deletion was seen,
/// and none is left at the end (#67). Judged per deletion whose object was
/// registered at some point (a real case): how many were, and the
/// violations. A value that does not parse is unverifiable, not passed.
pub fn no_orphan_record(gone: &[Gone], history: &[RecordPut], now: &[RecordPut]) -> Judged {
    let mut violations = Vec::new();
    let unverifiable: Vec<String> = history
        .iter()
        .chain(now)
        .filter(|p| !p.parsed)
        .map(|p| format!("{} at revision {} is not a record", p.key, p.revision))
        .collect();
    let mut checked = 0;
    for g in gone.iter().filter(|g| !g.uid.is_empty()) {
        let ours = |p: &&RecordPut| p.uid == g.uid;
        if history.iter().any(|p| ours(&p)) {
            checked += 1;
        }
        for p in history
            .iter()
            .filter(ours)
            .filter(|p| p.revision > g.revision)
        {
            violations.push(violation(
                NO_ORPHAN_RECORD,
                None,
                format!(
                    "{} ({}) written at revision {}, after its deletion was seen at {}",
                    p.key, g.object, p.revision, g.revision
                ),
            ));
        }
        for p in now.iter().filter(ours) {
            violations.push(violation(
                NO_ORPHAN_RECORD,
                None,
                format!("{} ({}, deleted) is still in etcd", p.key, g.object),
            ));
        }
    }
    Judged {
        unverifiable,
        ..Judged::of(checked, violations)
    }
}

/// A claim of the fleet DNS writer's term key: its revision and the term
/// number it stored.
#[derive(Debug, Clone)]
pub struct TermPut {
    pub revision: i64,
    pub epoch: i64,
}

/// A put of one of the fleet DNS writer's records, with the term it carries.
#[derive(Debug, Clone)]
pub struct DnsPut {
    pub key: String,
    pub revision: i64,
    pub epoch: i64,
}

/// `dns-fence`, from etcd's own history: every record the fleet DNS
/// writer put carries the term the term key held just before it (each
/// write checks that key in its transaction; a claim is a transaction of
/// its own, so strictly before). Deletes carry no writer and are not judged.
pub fn dns_fence(terms: &[TermPut], puts: &[DnsPut]) -> Judged {
    let mut out = Vec::new();
    for p in puts {
        let held = terms
            .iter()
            .filter(|t| t.revision < p.revision)
            .max_by_key(|t| t.revision);
        if held.is_none_or(|t| t.epoch != p.epoch) {
            out.push(violation(
                DNS_FENCE,
                None,
                format!(
                    "{} put at revision {} by term {}, while the term key held {}",
                    p.key,
                    p.revision,
                    p.epoch,
                    held.map_or("no term".into(), |t| format!(
                        "term {} (claimed at revision {})",
                        t.epoch, t.revision
                    ))
                ),
            ));
        }
    }
    Judged::of(puts.len(), out)
}

/// Whether the last status of `name` at or before `t` names `revision` the
/// last good one: a write of it then is a rollback's or an undo's to a
/// revision that completed, which goes everywhere at once (the planner's
/// `is_good`).
pub fn names_good(status: &[FleetStatus], name: &str, revision: &str, t: Timestamp) -> bool {
    status
        .iter()
        .filter(|s| s.name == name && s.at <= t)
        .max_by_key(|s| s.at)
        .is_some_and(|s| s.last_good.as_deref() == Some(revision))
}

/// A stretch in which a windowed FleetMicroservice's waves may not start.
#[derive(Debug, Clone)]
pub struct Shut {
    pub name: String,
    pub from: Timestamp,
    pub to: Timestamp,
}

/// One status write of a FleetMicroservice by the fleet controller, from
/// its body in the home audit log: the update revision, and each wave's
/// clusters and start stamp.
#[derive(Debug, Clone)]
pub struct FleetStatus {
    pub name: String,
    pub at: Timestamp,
    pub update: String,
    /// The last revision that completed, as this status names it.
    pub last_good: Option<String>,
    pub waves: Vec<WaveSeen>,
    /// Placement clusters it holds unreachable (`unreachableSince` set).
    pub unreachable: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct WaveSeen {
    pub name: String,
    pub clusters: Vec<String>,
    pub started: Option<Timestamp>,
}

/// `window-held`: no wave starts while its object's windows are shut.
/// Each start (a wave's start stamp, the round's clock, as first recorded)
/// lies outside every shut stretch; and each member write inside one,
/// `READ_LAG` after it shut, is of a wave the last status before it shows
/// started (a started wave finishes), or not of the update revision (a
/// rollback's target). A revision the last status before it names the
/// last good one is a rollback's or an undo's to it, which windows do not
/// hold (the planner's `is_good`); one that completed long before and was
/// replaced since is held again.
pub fn window_held(shut: &[Shut], status: &[FleetStatus], writes: &[FleetWrite]) -> Judged {
    let lag = jiff::SignedDuration::try_from(READ_LAG).expect("a short lag");
    let shut_at = |name: &str, t: Timestamp, lag: jiff::SignedDuration| {
        shut.iter()
            .find(|s| s.name == name && s.from.checked_add(lag).is_ok_and(|f| f <= t) && t < s.to)
    };
    let windowed = |name: &str| shut.iter().any(|s| s.name == name);
    let proven = |name: &str, revision: &str, t: Timestamp| names_good(status, name, revision, t);
    let mut out = Vec::new();
    let mut checked = 0;
    let mut seen = std::collections::BTreeSet::new();
    for st in status.iter().filter(|st| windowed(&st.name)) {
        for w in &st.waves {
            let Some(started) = w.started else { continue };
            // The status before the start: the one the round planned from.
            let before = started
                .checked_sub(jiff::SignedDuration::from_millis(1))
                .unwrap_or(started);
            if !seen.insert((st.name.clone(), w.name.clone(), started))
                || proven(&st.name, &st.update, before)
            {
                continue;
            }
            checked += 1;
            if let Some(s) = shut_at(&st.name, started, jiff::SignedDuration::ZERO) {
                out.push(violation(
                    WINDOW_HELD,
                    Some(started),
                    format!(
                        "wave {} of {} at {} started at {started} (recorded {}), inside the shut stretch {}..{}",
                        w.name, st.name, st.update, st.at, s.from, s.to
                    ),
                ));
            }
        }
    }
    for w in writes.iter().filter(|w| windowed(&w.name)) {
        checked += 1;
        let Some(s) = shut_at(&w.name, w.at, lag) else {
            continue;
        };
        let last = status
            .iter()
            .filter(|st| st.name == w.name && st.at <= w.at)
            .max_by_key(|st| st.at);
        let excused = proven(&w.name, &w.revision, w.at)
            || last.is_some_and(|st| {
                st.update != w.revision
                    || st
                        .waves
                        .iter()
                        .any(|v| v.started.is_some() && v.clusters.contains(&w.cluster))
            });
        if !excused {
            out.push(violation(
                WINDOW_HELD,
                Some(w.at),
                format!(
                    "{} got {} at {} ({}) inside the shut stretch {}..{}, its wave not started: the last status before it: {}",
                    w.cluster,
                    w.name,
                    w.revision,
                    w.at,
                    s.from,
                    s.to,
                    last.map_or("none".into(), |st| format!("{} at {}", st.update, st.at)),
                ),
            ));
        }
    }
    Judged::of(checked, out)
}

/// One change of a record in the zone, from etcd's history: a put names
/// the object its record stands for, and whether the fleet DNS writer put
/// it (an answer) or a member's leader (a candidate); a delete names none.
#[derive(Debug, Clone)]
pub struct DnsChange {
    pub key: String,
    pub revision: i64,
    pub put: Option<ZoneRecord>,
}

#[derive(Debug, Clone)]
pub struct ZoneRecord {
    pub object: String,
    pub fleet: bool,
    /// Written as part of an answer that failed open.
    pub fail_open: bool,
}

/// `dns-never-empty`: the fleet DNS writer never leaves a name it answered
/// without an answer while a candidate (a member's record of the object)
/// exists: after each of its own transactions on the name, the name has an
/// answer or no candidate (it fails open rather than withdraw the last).
/// A member's deletion takes its own answer with it in its transaction;
/// that one is the writer's to repair on its next pass, and is not judged.
/// `initial` holds the records present when the history starts; changes
/// of one revision (one transaction) are applied together before judging.
pub fn dns_never_empty(initial: &[(String, ZoneRecord)], changes: &[DnsChange]) -> Judged {
    let mut zone = Zone::default();
    for (key, r) in initial {
        zone.set(key, Some(r));
    }
    let mut verdicts: Vec<(i64, String, bool)> = Vec::new();
    let mut i = 0;
    use std::collections::BTreeMap;
    while i < changes.len() {
        let revision = changes[i].revision;
        // Per object touched: whether only answers changed (the writer's).
        let mut touched: BTreeMap<String, bool> = BTreeMap::new();
        while i < changes.len() && changes[i].revision == revision {
            let c = &changes[i];
            if let Some((object, answer)) = zone.set(&c.key, c.put.as_ref()) {
                *touched.entry(object).or_insert(true) &= answer;
            }
            i += 1;
        }
        for (object, by_writer) in touched {
            let n = &zone.names[&object];
            if by_writer && n.answered && !n.candidates.is_empty() {
                verdicts.push((revision, object, n.answers.is_empty()));
            }
        }
    }
    let out: Vec<Violation> = verdicts
        .iter()
        .filter(|(_, _, empty)| *empty)
        .map(|(revision, object, _)| {
            violation(
                DNS_NEVER_EMPTY,
                None,
                format!("{object}'s fleet name had no answer at revision {revision} while a member listed it"),
            )
        })
        .collect();
    Judged::of(verdicts.len(), out)
}

/// The zone's records as replayed: who stands for each key, and each
/// object's answers and candidates.
#[derive(Default)]
struct Zone {
    owner: BTreeMap<String, ZoneRecord>,
    names: BTreeMap<String, Name>,
}

#[derive(Default)]
struct Name {
    answers: std::collections::BTreeSet<String>,
    candidates: std::collections::BTreeSet<String>,
    /// It has had an answer.
    answered: bool,
}

impl Zone {
    /// `key` now holds `put` (None: deleted); the object it touched, and
    /// whether the key is an answer (the fleet writer's).
    fn set(&mut self, key: &str, put: Option<&ZoneRecord>) -> Option<(String, bool)> {
        let old = self.owner.remove(key);
        if let Some(o) = &old {
            let n = self.names.entry(o.object.clone()).or_default();
            n.answers.remove(key);
            n.candidates.remove(key);
            // Gone from every member and the answer: a new one of the
            // same name is new, and its first answer takes a moment.
            if n.answers.is_empty() && n.candidates.is_empty() {
                n.answered = false;
            }
        }
        let touched = put.or(old.as_ref()).map(|r| (r.object.clone(), r.fleet));
        if let Some(r) = put {
            let n = self.names.entry(r.object.clone()).or_default();
            let keys = match r.fleet {
                true => &mut n.answers,
                false => &mut n.candidates,
            };
            keys.insert(key.to_string());
            n.answered |= r.fleet;
            self.owner.insert(key.to_string(), r.clone());
        }
        touched
    }
}
