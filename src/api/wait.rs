//! WaitForRollout: one stream that follows a Microservice's rollout across
//! the fleet until a verdict, its deadline or shutdown. The verdict is
//! recomputed on every pass from the index (pure, in `status::view`), with
//! two inputs the index cannot give: which clusters must be judged (every
//! registered one whose absence is not known, or whose live read found the
//! object or failed) and, for "current" targets, the generation each
//! cluster's live object had when the wait began.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::time::Instant;

use super::errors::{Reason, Refusal};
use super::{convert, pb};
use crate::status::index::{Key, MicroserviceView, Snapshot};
use crate::status::live::Live;
use crate::status::view::{self, Entry, EntryState, RolloutResult, Target};

/// A floor that could not be read is read again after this.
pub const FLOOR_RETRY: Duration = Duration::from_secs(1);

/// What a read of each member found when the wait began: whether the
/// Microservice is there (so a cluster whose index feed lags, or that
/// stopped answering before the replica noticed, is still judged) and, for
/// targets that mean "what is there now", its generation, the floor: an
/// image (so an older generation that carried it never counts) or
/// `--generation` alone.
#[derive(Debug, Default)]
pub struct Floors {
    /// Whether the generation read is the target's floor.
    wanted: bool,
    /// Clusters given a generation of their own: the caller's number wins.
    exempt: BTreeSet<String>,
    /// Read: the generation, or `None` where the object was not there.
    read: BTreeMap<String, Option<i64>>,
    /// Not read yet: when it was last tried, and why it failed.
    failed: BTreeMap<String, (Instant, String)>,
    /// The server can read its members (false for `none`).
    reads: bool,
    /// The wait names no cluster: every registered one is read for
    /// presence, whatever the target.
    follow: bool,
}

impl Floors {
    pub fn new(target: &Target, current: bool) -> Self {
        let (wanted, exempt) = match target {
            Target::Image(_) => (true, BTreeSet::new()),
            Target::Generation(_) => (false, BTreeSet::new()),
            Target::Generations { at_least, .. } => (current, at_least.keys().cloned().collect()),
        };
        Floors {
            wanted,
            exempt,
            reads: true,
            ..Default::default()
        }
    }

    /// In follow mode (no cluster named), every cluster is read once for
    /// presence, whatever the target.
    pub fn following(mut self, follow: bool) -> Self {
        self.follow = follow;
        self
    }

    /// No floors at all (a server that cannot read its members).
    pub fn none() -> Self {
        Floors::default()
    }

    /// Whether this wait judges clusters against their live generations.
    pub fn wanted(&self) -> bool {
        self.wanted
    }

    /// `cluster`'s floor, or why it is not known yet.
    pub fn get(&self, cluster: &str) -> Result<Option<i64>, &str> {
        if !self.wanted || self.exempt.contains(cluster) {
            return Ok(None);
        }
        self.live(cluster).unwrap_or(Err("not read yet"))
    }

    /// What the live read of `cluster` found (`None` where the object was
    /// not there), why it failed, or `None` before it was tried.
    pub fn live(&self, cluster: &str) -> Option<Result<Option<i64>, &str>> {
        match (self.read.get(cluster), self.failed.get(cluster)) {
            (Some(g), _) => Some(Ok(*g)),
            (None, Some((_, why))) => Some(Err(why.as_str())),
            (None, None) => None,
        }
    }

    /// The registered clusters that may hold the Microservice as far as
    /// the reads know: every one but those a read found without it (a
    /// failed read, or one still under way when the deadline comes, settles
    /// nothing). None for a server that cannot read its members.
    pub fn may_hold<'a>(
        &'a self,
        registered: &'a BTreeMap<String, view::ClusterInfo>,
    ) -> impl Iterator<Item = &'a String> + 'a {
        registered
            .keys()
            .filter(move |c| self.reads && self.read.get(*c) != Some(&None))
    }

    /// The clusters to read now, each until one read succeeds: for the
    /// floor, and in follow mode for presence whatever the target.
    pub fn due(&self, required: &BTreeSet<String>, now: Instant) -> Vec<String> {
        required
            .iter()
            .filter(|c| !self.read.contains_key(*c) && (self.follow || self.get(c).is_err()))
            .filter(|c| {
                self.failed
                    .get(*c)
                    .is_none_or(|(at, _)| now.duration_since(*at) >= FLOOR_RETRY)
            })
            .cloned()
            .collect()
    }

    /// When the next failed read is due again, if any is pending.
    pub fn next_retry(&self, required: &BTreeSet<String>) -> Option<Instant> {
        self.failed
            .iter()
            .filter(|(c, _)| required.contains(*c) && !self.read.contains_key(*c))
            .map(|(_, (at, _))| *at + FLOOR_RETRY)
            .min()
    }

    pub fn record(&mut self, cluster: &str, read: Result<Option<i64>, String>, now: Instant) {
        match read {
            Ok(g) => {
                self.failed.remove(cluster);
                self.read.insert(cluster.to_string(), g);
            }
            Err(why) => {
                self.failed.insert(cluster.to_string(), (now, why));
            }
        }
    }

    /// Reads the due floors from the members, all at once.
    pub async fn read_due(&mut self, live: &Live, key: &Key, due: Vec<String>) {
        let reads = due.into_iter().map(|c| async move {
            let got = live.0.generation(&c, &key.0, &key.1).await;
            (c, got)
        });
        for (c, got) in futures::future::join_all(reads).await {
            self.record(&c, got, Instant::now());
        }
    }
}

/// The clusters whose live generation a wait reads: the judged ones, and
/// in follow mode every registered cluster, so that one whose index feed
/// lags (absence looks known, the object is there) is found.
pub fn to_read(
    required: &BTreeSet<String>,
    named: &BTreeSet<String>,
    registered: &BTreeMap<String, view::ClusterInfo>,
) -> BTreeSet<String> {
    let mut out = required.clone();
    if named.is_empty() {
        out.extend(registered.keys().cloned());
    }
    out
}

/// The clusters judged: the required ones and, in follow mode, every
/// registered cluster whose live read found the Microservice, failed or
/// has not ended. A member that stops answering is "reachable and listed"
/// in the index for a few seconds, until its feed notices; its failed read
/// keeps it judged (Unknown) through those seconds instead of leaving it
/// out. A cluster no longer registered is not judged for its read.
pub fn judged(
    mut required: BTreeSet<String>,
    named: &BTreeSet<String>,
    floors: &Floors,
    registered: &BTreeMap<String, view::ClusterInfo>,
) -> BTreeSet<String> {
    if named.is_empty() {
        required.extend(floors.may_hold(registered).cloned());
    }
    required
}

/// The rollout as it stands: each required cluster's entry judged against
/// the target and its floor. Pure.
pub fn progress(
    v: Option<&MicroserviceView>,
    required: &BTreeSet<String>,
    target: &Target,
    floors: &Floors,
    snap: &Snapshot,
) -> (Vec<Entry>, RolloutResult) {
    let entries: Vec<Entry> = required
        .iter()
        .map(|cluster| {
            let seen = v.and_then(|v| v.entries.iter().find(|e| e.cluster == *cluster));
            let floor = floors.get(cluster);
            let mut e = match (seen, floors.live(cluster)) {
                (Some(e), _) => view::rollout_entry(target, floor.ok().flatten(), e),
                (None, Some(Ok(Some(g)))) => {
                    let mut e = view::absent_entry(cluster, snap.clusters().get(cluster));
                    e.state = EntryState::Unknown;
                    e.reason = "NotSeenYet".into();
                    e.message = format!(
                        "the cluster holds generation {g}, which this replica has not seen yet"
                    );
                    e
                }
                (None, Some(Err(why))) => {
                    let mut e = view::absent_entry(cluster, snap.clusters().get(cluster));
                    if e.state != EntryState::Unknown {
                        e.state = EntryState::Unknown;
                        e.reason = "LiveReadFailed".into();
                        e.message = format!(
                            "the cluster could not be read, so the Microservice may be there: {why}"
                        );
                    }
                    e
                }
                (None, _) => view::absent_entry(cluster, snap.clusters().get(cluster)),
            };
            if let Err(why) = floor
                && e.state != EntryState::Unknown
            {
                e.state = EntryState::Unknown;
                e.reason = "CurrentGenerationUnread".into();
                e.message = format!("the cluster's live generation could not be read: {why}");
            }
            e
        })
        .collect();
    let result = view::rollout_result(&entries);
    (entries, result)
}

pub fn progress_message(
    entries: &[Entry],
    result: &RolloutResult,
    revision: u64,
) -> pb::RolloutProgress {
    let aggregate = view::aggregate(entries);
    let (code, failed, summary) = match result {
        RolloutResult::InProgress => (
            pb::RolloutResult::InProgress,
            vec![],
            aggregate.summary.clone(),
        ),
        RolloutResult::Succeeded => (
            pb::RolloutResult::Succeeded,
            vec![],
            format!("rolled out: {}", aggregate.summary),
        ),
        RolloutResult::Failed(clusters) => (
            pb::RolloutResult::Failed,
            clusters.clone(),
            format!("failed in {}: {}", clusters.join(", "), aggregate.summary),
        ),
    };
    pb::RolloutProgress {
        result: code as i32,
        clusters: entries.iter().map(convert::entry).collect(),
        aggregate: Some(convert::aggregate(&aggregate)),
        failed_clusters: failed,
        revision,
        summary,
        floors: false,
    }
}

/// The clusters the caller named (with `clusters` or a generation of their
/// own) that are not registered; the answer lists the registered ones.
pub fn unregistered(
    named: &BTreeSet<String>,
    target: &Target,
    registered: &BTreeMap<String, view::ClusterInfo>,
) -> Result<(), Refusal> {
    let own = match target {
        Target::Generations { at_least, .. } => at_least.keys().collect(),
        _ => Vec::new(),
    };
    let unknown: Vec<&str> = named
        .iter()
        .chain(own)
        .filter(|c| !registered.contains_key(*c))
        .map(String::as_str)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    if unknown.is_empty() {
        return Ok(());
    }
    let known: Vec<&str> = registered.keys().map(String::as_str).collect();
    let message = format!(
        "not registered: {}; registered clusters: {}",
        unknown.join(", "),
        if known.is_empty() {
            "none".to_string()
        } else {
            known.join(", ")
        }
    );
    Err(Refusal::new(Reason::ClusterNotRegistered, message)
        .field("clusters")
        .meta("cluster", unknown.join(","))
        .meta("registered", known.join(",")))
}

/// The target's clusters with a generation of their own.
pub fn own_targets(target: &Target) -> BTreeMap<String, i64> {
    match target {
        Target::Generations { at_least, .. } => at_least.clone(),
        _ => BTreeMap::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::index::Index;
    use crate::status::view::{Facts, Reach};

    fn facts(generation: i64, image: &str) -> Facts {
        use crate::domain::conditions::{AVAILABLE, RECONCILED};
        let cond = |t: &str| k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
            type_: t.into(),
            status: "True".into(),
            reason: "Ok".into(),
            message: String::new(),
            observed_generation: Some(generation),
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                jiff::Timestamp::UNIX_EPOCH,
            ),
        };
        Facts {
            generation,
            observed_generation: generation,
            image: image.into(),
            conditions: vec![cond(RECONCILED), cond(AVAILABLE)],
            ..Default::default()
        }
    }

    fn key() -> Key {
        ("shop".into(), "web".into())
    }

    /// member-1 and member-3 synced and done on web:2; member-2 as `m2`.
    fn index(m2: impl FnOnce(&mut view::ClusterInfo)) -> Index {
        let mut ix = Index::default();
        ix.registry_read();
        for c in ["member-1", "member-2", "member-3"] {
            ix.update_cluster(c, "file", |i| {
                i.reach = Reach::Reachable;
                i.synced = true;
            });
        }
        ix.update_cluster("member-2", "file", m2);
        ix.upsert_microservice("member-1", key(), facts(2, "web:2"));
        ix.upsert_microservice("member-3", key(), facts(2, "web:2"));
        ix
    }

    fn judge(ix: &Index, named: &[&str], target: &Target, floors: &Floors) -> RolloutResult {
        let snap = ix.snapshot();
        let v = snap.view(&key(), None);
        let named: BTreeSet<String> = named.iter().map(|s| s.to_string()).collect();
        let required = view::required_clusters(
            &named,
            &own_targets(target),
            v.as_ref().map(|v| v.entries.as_slice()),
            snap.clusters(),
        );
        let required = judged(required, &named, floors, snap.clusters());
        progress(v.as_ref(), &required, target, floors, &snap).1
    }

    #[test]
    fn a_cluster_never_listed_keeps_a_follow_wait_in_progress() {
        let image = Target::Image("web:2".into());
        for (what, m2) in [
            ("never synced", (Reach::Reachable, false, None)),
            (
                "unreachable, never synced",
                (Reach::Unreachable, false, None),
            ),
            ("synced but unreachable", (Reach::Unreachable, true, None)),
            ("connecting", (Reach::Connecting, false, None)),
            (
                "status watch failing",
                (Reach::Reachable, true, Some("403".to_string())),
            ),
        ] {
            let ix = index(|i| {
                (i.reach, i.synced, i.feed_error) = m2.clone();
            });
            assert_eq!(
                judge(&ix, &[], &image, &Floors::none()),
                RolloutResult::InProgress,
                "{what}"
            );
            // Its entry says why: unknown, not listed.
            let snap = ix.snapshot();
            let e = view::absent_entry("member-2", snap.clusters().get("member-2"));
            assert_eq!(
                (e.state, e.reason.as_str()),
                (EntryState::Unknown, "NotListed"),
                "{what}"
            );
        }
        // Listed, answering and watched: absence is known, member-2 has none.
        let ix = index(|_| {});
        assert_eq!(
            judge(&ix, &[], &image, &Floors::none()),
            RolloutResult::Succeeded
        );
        // Naming the clusters narrows the wait.
        let ix = index(|i| i.synced = false);
        assert_eq!(
            judge(&ix, &["member-1", "member-3"], &image, &Floors::none()),
            RolloutResult::Succeeded
        );
    }

    #[test]
    fn a_cluster_with_its_own_target_is_never_dropped() {
        let ix = index(|_| {});
        let target = Target::Generations {
            at_least: BTreeMap::from([("member-2".to_string(), 5)]),
            otherwise: 1,
        };
        // member-2 has no object yet, and absence there is known: it is
        // still judged, because the caller gave it a generation.
        assert_eq!(
            judge(&ix, &[], &target, &Floors::none()),
            RolloutResult::InProgress
        );
    }

    #[test]
    fn an_index_behind_the_live_generation_cannot_end_the_wait() {
        let ix = index(|_| {});
        let target = Target::Generations {
            at_least: BTreeMap::new(),
            otherwise: 1,
        };
        let mut floors = Floors::new(&target, true);
        let required: BTreeSet<String> = ["member-1", "member-2", "member-3"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let now = Instant::now();
        assert_eq!(floors.due(&required, now).len(), 3, "all to read");
        // Unread floors hold the wait.
        assert_eq!(judge(&ix, &[], &target, &floors), RolloutResult::InProgress);
        // member-1's live object is at 3; the index still shows 2, done.
        floors.record("member-1", Ok(Some(3)), now);
        floors.record("member-2", Ok(None), now);
        floors.record("member-3", Err("no answer".into()), now);
        assert_eq!(floors.due(&required, now), Vec::<String>::new());
        assert_eq!(
            floors.due(&required, now + FLOOR_RETRY),
            vec!["member-3".to_string()]
        );
        assert_eq!(floors.next_retry(&required), Some(now + FLOOR_RETRY));
        assert_eq!(judge(&ix, &[], &target, &floors), RolloutResult::InProgress);
        floors.record("member-3", Ok(Some(2)), now);
        assert_eq!(judge(&ix, &[], &target, &floors), RolloutResult::InProgress);
        floors.record("member-1", Ok(Some(2)), now);
        assert_eq!(judge(&ix, &[], &target, &floors), RolloutResult::Succeeded);
    }

    #[test]
    fn an_image_seen_at_an_older_generation_does_not_count() {
        // A rollback: generation 3 carries web:2 again; the index still
        // shows generation 2 (web:2, done).
        let ix = index(|_| {});
        let image = Target::Image("web:2".into());
        let mut floors = Floors::new(&image, false);
        let now = Instant::now();
        floors.record("member-1", Ok(Some(3)), now);
        floors.record("member-2", Ok(None), now);
        floors.record("member-3", Ok(Some(2)), now);
        assert_eq!(judge(&ix, &[], &image, &floors), RolloutResult::InProgress);
        // An explicit generation is the caller's: no floor for it.
        let explicit = Target::Generations {
            at_least: BTreeMap::from([("member-1".to_string(), 2)]),
            otherwise: 2,
        };
        assert_eq!(Floors::new(&explicit, true).get("member-1"), Ok(None));
        assert!(Floors::new(&explicit, true).get("member-3").is_err());
        assert_eq!(Floors::new(&explicit, false).get("member-3"), Ok(None));
    }

    #[test]
    fn a_cluster_the_index_has_not_seen_the_object_in_is_judged_when_it_is_there() {
        // member-2 is listed, answering and watched, but its feed lags:
        // no entry yet, while its live object is at generation 1.
        let ix = index(|_| {});
        let image = Target::Image("web:2".into());
        let mut floors = Floors::new(&image, false);
        let now = Instant::now();
        floors.record("member-1", Ok(Some(2)), now);
        floors.record("member-2", Ok(Some(1)), now);
        floors.record("member-3", Ok(Some(2)), now);
        let snap = ix.snapshot();
        let v = snap.view(&key(), None);
        let none = BTreeSet::new();
        let required = view::required_clusters(
            &none,
            &BTreeMap::new(),
            v.as_ref().map(|v| v.entries.as_slice()),
            snap.clusters(),
        );
        assert!(!required.contains("member-2"), "absence looks known");
        let read = to_read(&required, &none, snap.clusters());
        assert!(
            read.contains("member-2"),
            "every registered cluster is read"
        );
        let judged = judged(required, &none, &floors, snap.clusters());
        let (entries, result) = progress(v.as_ref(), &judged, &image, &floors, &snap);
        assert_eq!(result, RolloutResult::InProgress);
        let m2 = entries.iter().find(|e| e.cluster == "member-2").unwrap();
        assert_eq!(
            (m2.state, m2.reason.as_str()),
            (EntryState::Unknown, "NotSeenYet")
        );
    }

    #[test]
    fn unregistered_names_are_refused_with_the_registered_ones() {
        let ix = index(|_| {});
        let snap = ix.snapshot();
        let target = Target::Generations {
            at_least: BTreeMap::from([("memebr-2".to_string(), 5)]),
            otherwise: 1,
        };
        let err = unregistered(&BTreeSet::new(), &target, snap.clusters()).unwrap_err();
        assert_eq!(
            err.message,
            "not registered: memebr-2; registered clusters: member-1, member-2, member-3"
        );
        assert_eq!(err.reason, Reason::ClusterNotRegistered);
        assert!(
            err.metadata
                .contains(&("cluster".into(), "memebr-2".into()))
        );
        let named = BTreeSet::from(["nope".to_string(), "member-1".to_string()]);
        assert!(
            unregistered(&named, &Target::Generation(1), snap.clusters())
                .unwrap_err()
                .message
                .starts_with("not registered: nope;")
        );
        assert!(unregistered(&BTreeSet::new(), &Target::Generation(1), snap.clusters()).is_ok());
    }

    #[test]
    fn a_member_whose_live_read_failed_is_judged_before_its_feed_notices() {
        // member-2 stopped answering a moment ago: the index still has it
        // listed and answering, without web (created there since), and the
        // wait's read of it failed. For any target, it is judged Unknown.
        let ix = index(|_| {});
        let now = Instant::now();
        for target in [
            Target::Image("web:2".into()),
            Target::Generation(2),
            Target::Generations {
                at_least: BTreeMap::new(),
                otherwise: 2,
            },
        ] {
            let mut floors = Floors::new(&target, true).following(true);
            floors.record("member-1", Ok(Some(2)), now);
            floors.record("member-2", Err("no answer within 3s".into()), now);
            floors.record("member-3", Ok(Some(2)), now);
            assert_eq!(
                judge(&ix, &[], &target, &floors),
                RolloutResult::InProgress,
                "{target:?}"
            );
            let snap = ix.snapshot();
            let v = snap.view(&key(), None);
            let m2 = progress(
                v.as_ref(),
                &BTreeSet::from(["member-2".to_string()]),
                &target,
                &floors,
                &snap,
            )
            .0
            .remove(0);
            assert_eq!(
                (m2.state, m2.reason.as_str()),
                (EntryState::Unknown, "LiveReadFailed"),
                "{target:?}"
            );
            assert!(m2.message.contains("no answer within 3s"), "{m2:?}");
            // Read again and found empty: absent, and the rest decide.
            floors.record("member-2", Ok(None), now);
            assert_eq!(
                judge(&ix, &[], &target, &floors),
                RolloutResult::Succeeded,
                "{target:?}"
            );
        }
    }

    #[test]
    fn a_read_of_a_cluster_no_longer_registered_holds_nothing() {
        let mut ix = index(|_| {});
        ix.retain_clusters(&["member-1", "member-3"].map(String::from).into());
        for member_2 in [Err("no client".to_string()), Ok(Some(2))] {
            let target = Target::Generation(2);
            let mut floors = Floors::new(&target, false).following(true);
            let now = Instant::now();
            floors.record("member-1", Ok(Some(2)), now);
            floors.record("member-2", member_2.clone(), now);
            floors.record("member-3", Ok(Some(2)), now);
            assert_eq!(
                judge(&ix, &[], &target, &floors),
                RolloutResult::Succeeded,
                "{member_2:?}"
            );
        }
    }

    #[test]
    fn a_cluster_whose_read_has_not_ended_is_not_left_out() {
        // The deadline can come while member-2's read is under way: the
        // verdict then stands on what was judged before, which must not
        // be "done on the two others".
        let ix = index(|_| {});
        let target = Target::Image("web:2".into());
        let mut floors = Floors::new(&target, false).following(true);
        let now = Instant::now();
        floors.record("member-1", Ok(Some(2)), now);
        floors.record("member-3", Ok(Some(2)), now);
        assert_eq!(judge(&ix, &[], &target, &floors), RolloutResult::InProgress);
        // A server that cannot read its members judges by its index alone.
        assert_eq!(
            judge(&ix, &[], &target, &Floors::none()),
            RolloutResult::Succeeded
        );
    }

    #[test]
    fn every_target_reads_each_cluster_once_for_presence() {
        let clusters: BTreeSet<String> = ["member-1", "member-2"].map(String::from).into();
        let now = Instant::now();
        for target in [Target::Image("web:2".into()), Target::Generation(2)] {
            let mut floors = Floors::new(&target, false).following(true);
            assert_eq!(floors.due(&clusters, now).len(), 2, "{target:?}");
            floors.record("member-1", Ok(None), now);
            floors.record("member-2", Err("refused".into()), now);
            assert!(floors.due(&clusters, now).is_empty(), "{target:?}");
            assert_eq!(
                floors.due(&clusters, now + FLOOR_RETRY),
                vec!["member-2".to_string()],
                "{target:?}"
            );
        }
        // Named clusters of an explicit generation need no read at all.
        let named = Floors::new(&Target::Generation(2), false);
        assert!(named.due(&clusters, now).is_empty());
    }
}
