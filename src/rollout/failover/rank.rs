//! Rendezvous (highest random weight) hashing: every FleetMicroservice
//! ranks every cluster by a hash of the pair, so a cluster that joins or
//! leaves moves only the objects for which it ranks among the first N.
//! Pure and stable across builds and replicas.

use crate::rollout::placement::digest_bytes;

/// The weight of `cluster` for the object `uid`; higher ranks first.
pub fn score(uid: &str, cluster: &str) -> u64 {
    let mut key = Vec::with_capacity(uid.len() + cluster.len() + 1);
    key.extend_from_slice(uid.as_bytes());
    key.push(0);
    key.extend_from_slice(cluster.as_bytes());
    mix(digest_bytes(&key))
}

/// splitmix64's finalizer: FNV-1a alone spreads similar keys poorly.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `names` ranked for `uid`, best first; ties (never in practice) by name.
pub fn ranked<'a>(uid: &str, names: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    let mut v: Vec<(u64, &str)> = names.into_iter().map(|n| (score(uid, n), n)).collect();
    v.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(b.1)));
    v.into_iter().map(|(_, n)| n).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(n: usize) -> Vec<String> {
        (1..=n).map(|k| format!("member-{k}")).collect()
    }

    fn top<'a>(uid: &str, names: &'a [String], n: usize) -> Vec<&'a str> {
        let mut t = ranked(uid, names.iter().map(String::as_str));
        t.truncate(n);
        t.sort();
        t
    }

    #[test]
    fn removing_a_cluster_moves_only_the_objects_placed_there() {
        let all = members(50);
        let fewer: Vec<String> = all.iter().filter(|m| *m != "member-17").cloned().collect();
        let mut moved = 0;
        let mut placed_there = 0;
        for k in 0..100 {
            let uid = format!("uid-{k}");
            let before = top(&uid, &all, 3);
            let after = top(&uid, &fewer, 3);
            if before.contains(&"member-17") {
                placed_there += 1;
            }
            if before != after {
                moved += 1;
                assert!(before.contains(&"member-17"), "{uid} moved without cause");
                let kept = before.iter().filter(|b| after.contains(b)).count();
                assert_eq!(kept, 2, "only the lost cluster is replaced");
            }
        }
        assert_eq!(moved, placed_there);
    }

    #[test]
    fn the_spread_is_even_enough() {
        let all = members(10);
        let mut count = std::collections::BTreeMap::<&str, usize>::new();
        for k in 0..2000 {
            for n in top(&format!("uid-{k}"), &all, 1) {
                *count.entry(n).or_default() += 1;
            }
        }
        // 200 each on average; a fair hash stays well inside ±30 %.
        assert_eq!(count.len(), 10);
        assert!(count.values().all(|c| (140..=260).contains(c)), "{count:?}");
    }

    #[test]
    fn the_order_is_stable_and_depends_on_the_object() {
        let all = members(5);
        let names = || all.iter().map(String::as_str);
        assert_eq!(ranked("a", names()), ranked("a", names()));
        assert_ne!(ranked("a", names()), ranked("b", names()));
    }
}
