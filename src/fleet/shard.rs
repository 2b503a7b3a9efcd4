//! Which replica owns each cluster: rendezvous (highest random
//! weight) hashing over the live replicas, with a load bound so that every
//! replica gets ⌊C/R⌋ or ⌈C/R⌉ clusters. Pure and deterministic: every
//! replica that sees the same replicas and clusters computes the same map.

use std::collections::{BTreeMap, BTreeSet};

/// FNV-1a, 64 bit: stable across builds and versions, unlike std's hasher,
/// so replicas of different releases agree during a rollout.
fn fnv1a(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for b in part.bytes().chain(std::iter::once(0xff)) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

fn weight(replica: &str, cluster: &str) -> u64 {
    // A final avalanche step spreads FNV's weak low bits.
    let mut x = fnv1a(&[replica, cluster]);
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x
}

/// Assigns every cluster to one replica. Clusters are placed in a fixed
/// order; each goes to its highest-weight replica that still has room
/// under the ⌊C/R⌋ / ⌈C/R⌉ bound.
pub fn assign<'a>(
    clusters: &BTreeSet<String>,
    replicas: &'a BTreeSet<String>,
) -> BTreeMap<String, &'a str> {
    let mut out = BTreeMap::new();
    if replicas.is_empty() {
        return out;
    }
    // ⌊C/R⌋ each, and C mod R replicas may take one more.
    let floor = clusters.len() / replicas.len();
    let mut extra_left = clusters.len() % replicas.len();
    let mut load: BTreeMap<&str, usize> = replicas.iter().map(|r| (r.as_str(), 0)).collect();
    // Place the clusters with the strongest preference first, so that the
    // load bound displaces the weakest preferences.
    let mut order: Vec<(&String, u64)> = clusters
        .iter()
        .map(|c| (c, replicas.iter().map(|r| weight(r, c)).max().unwrap_or(0)))
        .collect();
    order.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    for (cluster, _) in order {
        let mut ranked: Vec<&str> = replicas.iter().map(String::as_str).collect();
        ranked.sort_by(|a, b| weight(b, cluster).cmp(&weight(a, cluster)).then(a.cmp(b)));
        let fits =
            |r: &&str, extra_left: usize| load[r] < floor || (load[r] == floor && extra_left > 0);
        if let Some(r) = ranked.into_iter().find(|r| fits(r, extra_left)) {
            if load[r] == floor {
                extra_left -= 1;
            }
            *load.get_mut(r).expect("known replica") += 1;
            out.insert(cluster.clone(), r);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(items: &[&str]) -> BTreeSet<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    fn names(prefix: &str, n: usize) -> BTreeSet<String> {
        (0..n).map(|i| format!("{prefix}-{i}")).collect()
    }

    fn spread(a: &BTreeMap<String, &str>, replicas: &BTreeSet<String>) -> (usize, usize) {
        let counts: Vec<usize> = replicas
            .iter()
            .map(|r| a.values().filter(|v| **v == r.as_str()).count())
            .collect();
        (*counts.iter().min().unwrap(), *counts.iter().max().unwrap())
    }

    #[test]
    fn every_cluster_has_exactly_one_owner_and_the_spread_is_at_most_one() {
        for r in 1..=7 {
            for c in 0..=40 {
                let replicas = names("replica", r);
                let clusters = names("member", c);
                let a = assign(&clusters, &replicas);
                assert_eq!(a.len(), c);
                let (min, max) = spread(&a, &replicas);
                assert!(
                    max - min <= 1,
                    "{r} replicas, {c} clusters: spread {min}..{max}"
                );
            }
        }
    }

    #[test]
    fn assignment_is_deterministic_whatever_the_insertion_order() {
        let replicas = set(&["c", "a", "b"]);
        let clusters = set(&["member-3", "member-1", "member-2", "home"]);
        assert_eq!(
            assign(&clusters, &replicas),
            assign(&clusters.clone(), &replicas.clone())
        );
    }

    #[test]
    fn losing_a_replica_moves_only_what_must_move_or_rebalance() {
        let replicas = names("replica", 4);
        let clusters = names("member", 40);
        let before = assign(&clusters, &replicas);
        let mut fewer = replicas.clone();
        fewer.remove("replica-3");
        let after = assign(&clusters, &fewer);
        let moved = clusters.iter().filter(|c| before[*c] != after[*c]).count();
        let orphaned = before.values().filter(|r| **r == "replica-3").count();
        // Orphans must move; a few more may shift to keep the spread at most one.
        assert!(
            moved >= orphaned && moved <= orphaned * 2 + 2,
            "moved {moved}, orphaned {orphaned}"
        );
    }

    #[test]
    fn no_replicas_means_no_owners() {
        assert!(assign(&names("member", 3), &BTreeSet::new()).is_empty());
    }
}
