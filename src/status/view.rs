//! What the fleet knows about one Microservice, and the verdicts drawn from
//! it: per-cluster state, the aggregate, and rollout progress. All pure.

use std::collections::BTreeMap;
use std::time::SystemTime;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use crate::domain::conditions::{self, AVAILABLE, PROGRESSING, RECONCILED};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    Connecting,
    Reachable,
    Unreachable,
    Invalid,
}

/// A member cluster as this replica sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterInfo {
    pub source: String,
    pub reach: Reach,
    pub reason: String,
    pub last_seen: Option<SystemTime>,
    pub holder: Option<String>,
    pub epoch: Option<i32>,
    pub led_here: bool,
    /// The status caches completed their first listing.
    pub synced: bool,
    /// The status watch has been failing for a while: what this replica
    /// shows for the cluster may be stale even though its Lease answers.
    pub feed_error: Option<String>,
    /// From the registration, with the cluster's own name.
    pub labels: BTreeMap<String, String>,
    /// Why the registration's labels cannot be read; the last good ones stay.
    pub labels_error: Option<String>,
}

impl ClusterInfo {
    pub fn new(source: &str) -> Self {
        ClusterInfo {
            source: source.to_string(),
            reach: Reach::Connecting,
            reason: String::new(),
            last_seen: None,
            holder: None,
            epoch: None,
            led_here: false,
            synced: false,
            feed_error: None,
            labels: BTreeMap::new(),
            labels_error: None,
        }
    }

    /// Settled for readiness: its caches are current, or it cannot have any.
    pub fn settled(&self) -> bool {
        self.synced || matches!(self.reach, Reach::Unreachable | Reach::Invalid)
    }

    /// Whether "not listed here" means "not there": the status caches
    /// listed the cluster, it answers, and its status watch is healthy.
    /// Otherwise an object may be there unseen. Waits and rollouts share
    /// this one rule.
    pub fn absence_is_known(&self) -> bool {
        self.synced && self.reach == Reach::Reachable && self.feed_error.is_none()
    }

    /// Why absence here says nothing, for messages.
    fn why_not_listed(&self) -> &'static str {
        if self.reach != Reach::Reachable {
            "the cluster is not answering"
        } else if !self.synced {
            "its first listing has not completed"
        } else {
            "its status watch is failing"
        }
    }
}

/// A Microservice in one cluster, from its spec, metadata and status.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Facts {
    pub generation: i64,
    pub observed_generation: i64,
    pub image: String,
    pub labels: BTreeMap<String, String>,
    pub conditions: Vec<Condition>,
    pub phase: String,
    /// The FleetMicroservice revision it was written from, if any.
    pub fleet_revision: Option<String>,
    /// Its spec's digest, so the fleet can tell a drifted copy.
    pub spec_digest: u64,
    /// It has a deletionTimestamp (a finalizer keeps it).
    pub deleting: bool,
}

/// The Deployment's replica counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Replicas {
    pub desired: i32,
    pub updated: i32,
    pub ready: i32,
    pub available: i32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum EntryState {
    Done,
    Progressing,
    Failed,
    Unknown,
}

/// One cluster's entry, with the cluster's reachability folded in.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub cluster: String,
    pub facts: Facts,
    pub replicas: Option<Replicas>,
    pub reach: Reach,
    pub last_seen: Option<SystemTime>,
    pub state: EntryState,
    pub reason: String,
    pub message: String,
}

/// A failure at the current generation: a permanent one no retry fixes,
/// or a rollout past its progress deadline.
fn failure(f: &Facts) -> Option<&Condition> {
    if f.observed_generation != f.generation {
        return None;
    }
    let permanent = conditions::find(&f.conditions, RECONCILED)
        .filter(|c| c.status == "False" && conditions::is_permanent_reason(&c.reason));
    let stuck = conditions::find(&f.conditions, PROGRESSING)
        .filter(|c| c.status == "False" && c.reason == "ProgressDeadlineExceeded");
    permanent.or(stuck)
}

/// Done means the current generation is observed and Available=True; a
/// True carried over from an older generation does not count.
pub fn entry_state(f: &Facts, reach: Reach) -> (EntryState, String, String) {
    if reach != Reach::Reachable {
        return (
            EntryState::Unknown,
            "ClusterUnreachable".into(),
            "the cluster is not answering; this is its last known state".into(),
        );
    }
    if let Some(c) = failure(f) {
        return (EntryState::Failed, c.reason.clone(), c.message.clone());
    }
    if f.observed_generation != f.generation {
        return (
            EntryState::Progressing,
            "GenerationNotObserved".into(),
            format!(
                "generation {} is not yet observed (status is for {})",
                f.generation, f.observed_generation
            ),
        );
    }
    match conditions::find(&f.conditions, AVAILABLE) {
        Some(c) if c.status == "True" => (EntryState::Done, c.reason.clone(), c.message.clone()),
        // The leader's own watches are failing: it does not know.
        Some(c) if c.status == "Unknown" && c.reason == crate::domain::status::CACHES_STALE => {
            (EntryState::Unknown, c.reason.clone(), c.message.clone())
        }
        Some(c) => (EntryState::Progressing, c.reason.clone(), c.message.clone()),
        None => (
            EntryState::Progressing,
            "AvailabilityUnknown".into(),
            "no Available condition yet".into(),
        ),
    }
}

pub fn entry(
    cluster: &str,
    facts: &Facts,
    replicas: Option<Replicas>,
    info: Option<&ClusterInfo>,
) -> Entry {
    let reach = info.map_or(Reach::Connecting, |i| i.reach);
    let (state, reason, message) = match info.and_then(|i| i.feed_error.as_ref()) {
        _ if reach == Reach::Reachable && info.is_some_and(|i| !i.synced) => (
            EntryState::Unknown,
            "NotListedYet".to_string(),
            "this replica is listing the cluster again (its registration changed); this is its last known state"
                .to_string(),
        ),
        Some(error) if reach == Reach::Reachable => (
            EntryState::Unknown,
            "StatusWatchFailing".to_string(),
            format!(
                "this replica cannot watch the cluster's status ({error}); this is its last known state"
            ),
        ),
        _ => entry_state(facts, reach),
    };
    Entry {
        cluster: cluster.to_string(),
        facts: facts.clone(),
        replicas,
        reach,
        // Only an unreachable cluster's entry says when it was last heard.
        last_seen: info
            .filter(|i| i.reach != Reach::Reachable)
            .and_then(|i| i.last_seen),
        state,
        reason,
        message,
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Aggregate {
    pub clusters: u32,
    pub done: u32,
    pub progressing: u32,
    pub failed: u32,
    pub unknown: u32,
    pub all_done: bool,
    pub summary: String,
}

fn names(entries: &[Entry], state: EntryState) -> String {
    entries
        .iter()
        .filter(|e| e.state == state)
        .map(|e| e.cluster.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

pub fn aggregate(entries: &[Entry]) -> Aggregate {
    let count = |s: EntryState| entries.iter().filter(|e| e.state == s).count() as u32;
    let (done, progressing, failed, unknown) = (
        count(EntryState::Done),
        count(EntryState::Progressing),
        count(EntryState::Failed),
        count(EntryState::Unknown),
    );
    let clusters = entries.len() as u32;
    let mut summary =
        format!("Available in {done}/{clusters} clusters at their current generation");
    for (n, state, word) in [
        (failed, EntryState::Failed, "failed"),
        (progressing, EntryState::Progressing, "progressing"),
        (unknown, EntryState::Unknown, "unknown"),
    ] {
        if n > 0 {
            summary.push_str(&format!("; {word}: {}", names(entries, state)));
        }
    }
    Aggregate {
        clusters,
        done,
        progressing,
        failed,
        unknown,
        all_done: clusters > 0 && done == clusters,
        summary,
    }
}

/// What a rollout waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Image(String),
    Generation(i64),
    /// A minimum per cluster, and one for the rest.
    Generations {
        at_least: BTreeMap<String, i64>,
        otherwise: i64,
    },
}

impl Target {
    /// The generation a cluster must reach, when the target is one.
    fn generation_for(&self, cluster: &str) -> Option<i64> {
        match self {
            Target::Image(_) => None,
            Target::Generation(g) => Some(*g),
            Target::Generations {
                at_least,
                otherwise,
            } => Some(at_least.get(cluster).copied().unwrap_or(*otherwise)),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RolloutResult {
    InProgress,
    Succeeded,
    Failed(Vec<String>),
}

/// One cluster's entry judged against the rollout's target: a cluster is
/// done only when the target is in its spec and that generation is done.
/// `floor` is the generation the cluster's live object had when the wait
/// began (read from its apiserver, not from this index): an entry below it
/// is older than what the caller saw and cannot end the wait.
pub fn rollout_entry(target: &Target, floor: Option<i64>, e: &Entry) -> Entry {
    let mut e = e.clone();
    if e.state == EntryState::Unknown {
        return e;
    }
    if let Some(floor) = floor.filter(|f| e.facts.generation < *f) {
        e.state = EntryState::Progressing;
        e.reason = "GenerationNotSeenYet".into();
        e.message = format!(
            "the cluster was at generation {floor} when the wait began; this replica shows {}",
            e.facts.generation
        );
        return e;
    }
    let behind = match (target, target.generation_for(&e.cluster)) {
        (Target::Image(image), _) if e.facts.image != *image => Some((
            "ImageNotInSpec",
            format!("the spec has image {}, not {image}", e.facts.image),
        )),
        (_, Some(g)) if e.facts.generation < g => Some((
            "GenerationNotReached",
            format!(
                "the spec is at generation {}, not yet {g}",
                e.facts.generation
            ),
        )),
        _ => None,
    };
    if let Some((reason, message)) = behind {
        e.state = EntryState::Progressing;
        e.reason = reason.into();
        e.message = message;
    }
    e
}

/// A cluster the rollout must wait for, with no entry for the
/// Microservice: known to be missing only where absence is known;
/// elsewhere it is unknown (absence is not evidence).
pub fn absent_entry(cluster: &str, info: Option<&ClusterInfo>) -> Entry {
    let mut e = entry(cluster, &Facts::default(), None, info);
    let (state, reason, message) = match info {
        None => (
            EntryState::Unknown,
            "NotRegistered",
            "the cluster is not registered on this replica".to_string(),
        ),
        Some(i) if !i.absence_is_known() => (
            EntryState::Unknown,
            NOT_LISTED,
            format!(
                "this replica has not listed the cluster ({}); the Microservice may be there",
                i.why_not_listed()
            ),
        ),
        Some(_) => (
            EntryState::Progressing,
            "NotFound",
            "the Microservice is not in this cluster".to_string(),
        ),
    };
    e.state = state;
    e.reason = reason.into();
    e.message = message;
    e
}

/// The reason of an entry for a cluster whose absence says nothing.
pub const NOT_LISTED: &str = "NotListed";

/// The clusters a wait judges. Named ones, never dropped. Otherwise (the
/// wait follows the fleet): every cluster the Microservice is seen in,
/// every registered cluster where it may be unseen, and any cluster given
/// a generation of its own. Recomputed on every pass, so a cluster that
/// becomes known, or the Microservice deleted where absence is known,
/// moves the answer.
pub fn required_clusters(
    named: &std::collections::BTreeSet<String>,
    own_targets: &BTreeMap<String, i64>,
    seen: Option<&[Entry]>,
    registered: &BTreeMap<String, ClusterInfo>,
) -> std::collections::BTreeSet<String> {
    if !named.is_empty() {
        return named.clone();
    }
    let mut required: std::collections::BTreeSet<String> = own_targets.keys().cloned().collect();
    required.extend(seen.unwrap_or_default().iter().map(|e| e.cluster.clone()));
    required.extend(
        registered
            .iter()
            .filter(|(_, info)| !info.absence_is_known())
            .map(|(name, _)| name.clone()),
    );
    required
}

pub fn rollout_result(entries: &[Entry]) -> RolloutResult {
    let failed: Vec<String> = entries
        .iter()
        .filter(|e| e.state == EntryState::Failed)
        .map(|e| e.cluster.clone())
        .collect();
    if !failed.is_empty() {
        RolloutResult::Failed(failed)
    } else if !entries.is_empty() && entries.iter().all(|e| e.state == EntryState::Done) {
        RolloutResult::Succeeded
    } else {
        RolloutResult::InProgress
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cond(type_: &str, status: &str, reason: &str, generation: i64) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: format!("{type_} is {status}"),
            observed_generation: Some(generation),
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                jiff::Timestamp::UNIX_EPOCH,
            ),
        }
    }

    fn facts(generation: i64, observed: i64, image: &str, available: &str) -> Facts {
        Facts {
            generation,
            observed_generation: observed,
            image: image.into(),
            conditions: vec![
                cond(RECONCILED, "True", "Applied", observed),
                cond(AVAILABLE, available, "MinimumReplicasAvailable", observed),
            ],
            ..Default::default()
        }
    }

    fn reachable() -> ClusterInfo {
        ClusterInfo {
            reach: Reach::Reachable,
            synced: true,
            ..ClusterInfo::new("file m")
        }
    }

    #[test]
    fn a_stale_available_from_an_older_generation_is_not_done() {
        let (state, reason, _) = entry_state(&facts(7, 6, "a:2", "True"), Reach::Reachable);
        assert_eq!(state, EntryState::Progressing);
        assert_eq!(reason, "GenerationNotObserved");
        let (state, ..) = entry_state(&facts(7, 7, "a:2", "True"), Reach::Reachable);
        assert_eq!(state, EntryState::Done);
        let (state, ..) = entry_state(&facts(7, 7, "a:2", "False"), Reach::Reachable);
        assert_eq!(state, EntryState::Progressing);
    }

    #[test]
    fn a_leader_whose_watches_fail_makes_the_entry_unknown() {
        let mut f = facts(2, 2, "a:1", "True");
        f.conditions[1] = cond(AVAILABLE, "Unknown", "CachesStale", 2);
        let (state, reason, _) = entry_state(&f, Reach::Reachable);
        assert_eq!(
            (state, reason.as_str()),
            (EntryState::Unknown, "CachesStale")
        );
    }

    #[test]
    fn an_unreachable_cluster_is_unknown_whatever_it_last_said() {
        for reach in [Reach::Unreachable, Reach::Connecting, Reach::Invalid] {
            let (state, reason, _) = entry_state(&facts(1, 1, "a:1", "True"), reach);
            assert_eq!(state, EntryState::Unknown);
            assert_eq!(reason, "ClusterUnreachable");
        }
    }

    #[test]
    fn a_permanent_failure_counts_only_at_the_current_generation() {
        let mut f = facts(3, 3, "a:1", "False");
        f.conditions[0] = cond(RECONCILED, "False", "OwnershipConflict", 3);
        assert_eq!(entry_state(&f, Reach::Reachable).0, EntryState::Failed);
        // The spec moved on since: the old failure says nothing about it.
        f.generation = 4;
        assert_eq!(entry_state(&f, Reach::Reachable).0, EntryState::Progressing);
        // A rollout past its progress deadline fails the generation it is for.
        let mut stuck = facts(3, 3, "a:1", "False");
        stuck
            .conditions
            .push(cond(PROGRESSING, "False", "ProgressDeadlineExceeded", 3));
        let (state, reason, _) = entry_state(&stuck, Reach::Reachable);
        assert_eq!(
            (state, reason.as_str()),
            (EntryState::Failed, "ProgressDeadlineExceeded")
        );
        stuck.generation = 4;
        assert_eq!(
            entry_state(&stuck, Reach::Reachable).0,
            EntryState::Progressing
        );
        // A transient API error is not a failure.
        let mut g = facts(3, 3, "a:1", "False");
        g.conditions[0] = cond(RECONCILED, "False", "ApiError", 3);
        assert_eq!(entry_state(&g, Reach::Reachable).0, EntryState::Progressing);
    }

    #[test]
    fn the_aggregate_counts_and_names_clusters() {
        let info = reachable();
        let down = ClusterInfo {
            reach: Reach::Unreachable,
            ..ClusterInfo::new("file m3")
        };
        let entries = vec![
            entry("m1", &facts(2, 2, "a:2", "True"), None, Some(&info)),
            entry("m2", &facts(2, 1, "a:2", "True"), None, Some(&info)),
            entry("m3", &facts(2, 2, "a:2", "True"), None, Some(&down)),
        ];
        let a = aggregate(&entries);
        assert_eq!((a.clusters, a.done, a.progressing, a.unknown), (3, 1, 1, 1));
        assert!(!a.all_done);
        assert_eq!(
            a.summary,
            "Available in 1/3 clusters at their current generation; progressing: m2; unknown: m3"
        );
        let all = aggregate(&entries[..1]);
        assert!(all.all_done);
        assert_eq!(
            all.summary,
            "Available in 1/1 clusters at their current generation"
        );
        assert!(!aggregate(&[]).all_done);
    }

    #[test]
    fn a_rollout_waits_for_the_target_in_the_spec_and_fails_on_a_permanent_error() {
        let info = reachable();
        let old = entry("m1", &facts(1, 1, "a:1", "True"), None, Some(&info));
        let image = Target::Image("a:2".into());
        let judged = rollout_entry(&image, None, &old);
        assert_eq!(judged.state, EntryState::Progressing);
        assert_eq!(judged.reason, "ImageNotInSpec");
        // The new spec is there but not observed: the old True must not end it.
        let pending = entry("m1", &facts(2, 1, "a:2", "True"), None, Some(&info));
        assert_eq!(
            rollout_result(&[rollout_entry(&image, None, &pending)]),
            RolloutResult::InProgress
        );
        let done = entry("m1", &facts(2, 2, "a:2", "True"), None, Some(&info));
        let mut failed_facts = facts(2, 2, "a:2", "False");
        failed_facts.conditions[0] = cond(RECONCILED, "False", "OwnershipConflict", 2);
        let failed = entry("m2", &failed_facts, None, Some(&info));
        assert_eq!(
            rollout_result(&[rollout_entry(&image, None, &done)]),
            RolloutResult::Succeeded
        );
        assert_eq!(
            rollout_result(&[
                rollout_entry(&image, None, &done),
                rollout_entry(&image, None, &failed)
            ]),
            RolloutResult::Failed(vec!["m2".into()])
        );
        let by_generation = Target::Generation(3);
        assert_eq!(
            rollout_entry(&by_generation, None, &done).reason,
            "GenerationNotReached"
        );
        // Per cluster: m1 must reach 3, the rest 2.
        let per_cluster = Target::Generations {
            at_least: BTreeMap::from([("m1".to_string(), 3)]),
            otherwise: 2,
        };
        assert_eq!(
            rollout_entry(&per_cluster, None, &done).reason,
            "GenerationNotReached"
        );
        let mut done_m2 = done.clone();
        done_m2.cluster = "m2".into();
        assert_eq!(
            rollout_entry(&per_cluster, None, &done_m2).state,
            EntryState::Done
        );
        // Missing where absence is known; unknown where it is not.
        let listed = ClusterInfo {
            synced: true,
            ..reachable()
        };
        let absent = absent_entry("m9", Some(&listed));
        assert_eq!(
            (absent.state, absent.reason.as_str()),
            (EntryState::Progressing, "NotFound")
        );
        let unsynced = ClusterInfo {
            synced: false,
            ..reachable()
        };
        let unlisted = absent_entry("m9", Some(&unsynced));
        // An entry from before a re-registration, not listed again yet.
        let relisting = entry("m1", &facts(2, 2, "a:2", "True"), None, Some(&unsynced));
        assert_eq!(
            (relisting.state, relisting.reason.as_str()),
            (EntryState::Unknown, "NotListedYet")
        );
        assert_eq!(
            (unlisted.state, unlisted.reason.as_str()),
            (EntryState::Unknown, "NotListed")
        );
        let unregistered = absent_entry("m9", None);
        assert_eq!(
            (unregistered.state, unregistered.reason.as_str()),
            (EntryState::Unknown, "NotRegistered")
        );
        assert_eq!(rollout_result(&[]), RolloutResult::InProgress);
    }

    #[test]
    fn readiness_waits_for_synced_or_unreachable_clusters() {
        let mut c = ClusterInfo::new("file m");
        assert!(!c.settled());
        c.reach = Reach::Reachable;
        assert!(!c.settled());
        c.synced = true;
        assert!(c.settled());
        let down = ClusterInfo {
            reach: Reach::Unreachable,
            ..ClusterInfo::new("file m")
        };
        assert!(down.settled());
    }
}
