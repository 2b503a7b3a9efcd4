//! Which clusters that left the placement lose their member object now.
//! Pure. A deletion is a change like a release: it goes wave by wave, at
//! most a wave's `maxParallel` at a time, so a placement or label edit can
//! never empty the fleet in one round.

use std::collections::BTreeMap;

use super::placement::{self, Declared, Labels};

/// A cluster whose member object is ours but which is no longer placed.
#[derive(Clone, Copy)]
pub struct Leaver<'a> {
    pub name: &'a str,
    pub labels: &'a Labels,
    /// Reachable now: only these can be deleted this round.
    pub reachable: bool,
}

/// The decision for each leaving cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Leave {
    /// Delete it now.
    Now,
    /// It waits for the clusters of this earlier (or the same) wave to go.
    Waits(String),
}

/// Leaving clusters are grouped by the wave their labels select; the first
/// wave with any of them goes first, at most its `maxParallel` at once, and
/// every later one waits until it is empty. The same clusters are chosen
/// every round until they are gone, so the bound holds while the status
/// index lags the deletes.
pub fn removals<'a, W: Declared>(
    declared: &[W],
    leavers: &[Leaver<'a>],
) -> BTreeMap<&'a str, Leave> {
    let by_name: BTreeMap<&str, &Leaver> = leavers.iter().map(|l| (l.name, l)).collect();
    let mut out = BTreeMap::new();
    let mut first: Option<String> = None;
    for (wave, members) in placement::waves(declared, leavers.iter().map(|l| (l.name, l.labels))) {
        if members.is_empty() {
            continue;
        }
        let Some(holding) = &first else {
            let limit = declared
                .iter()
                .find(|w| w.name() == wave)
                .map_or(members.len(), |w| w.parallel(members.len()))
                .max(1);
            // Reachable ones first: an unreachable one cannot use a slot.
            let mut order: Vec<&str> = members.iter().map(|m| by_name[m.as_str()].name).collect();
            order.sort_by_key(|n| (!by_name[n].reachable, *n));
            for (k, name) in order.into_iter().enumerate() {
                let leave = if k < limit && by_name[name].reachable {
                    Leave::Now
                } else {
                    Leave::Waits(wave.clone())
                };
                out.insert(name, leave);
            }
            first = Some(wave);
            continue;
        };
        for m in members {
            out.insert(by_name[m.as_str()].name, Leave::Waits(holding.clone()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

    use super::*;
    use crate::rollout::spec::Wave;

    fn labels(ring: &str) -> Labels {
        Labels::from([("ring".to_string(), ring.to_string())])
    }

    fn canary(max: Option<i32>) -> Vec<Wave> {
        vec![Wave {
            name: "canary".into(),
            cluster_selector: LabelSelector {
                match_labels: Some([("ring".to_string(), "canary".to_string())].into()),
                ..Default::default()
            },
            max_parallel: max.map(IntOrString::Int),
            approval: Default::default(),
        }]
    }

    #[test]
    fn the_canary_leaves_first_then_the_rest() {
        let (c, m) = (labels("canary"), labels("main"));
        let leavers = [
            Leaver {
                name: "a",
                labels: &m,
                reachable: true,
            },
            Leaver {
                name: "b",
                labels: &c,
                reachable: true,
            },
            Leaver {
                name: "c",
                labels: &m,
                reachable: true,
            },
        ];
        let r = removals(&canary(None), &leavers);
        assert_eq!(r["b"], Leave::Now);
        assert_eq!(r["a"], Leave::Waits("canary".into()));
        assert_eq!(r["c"], Leave::Waits("canary".into()));
        // The canary gone: the rest go together (no maxParallel).
        let r = removals(&canary(None), &[leavers[0], leavers[2]]);
        assert_eq!((r["a"].clone(), r["c"].clone()), (Leave::Now, Leave::Now));
    }

    #[test]
    fn at_most_max_parallel_at_once_and_unreachable_ones_take_no_slot() {
        let c = labels("canary");
        let leavers = [
            Leaver {
                name: "a",
                labels: &c,
                reachable: false,
            },
            Leaver {
                name: "b",
                labels: &c,
                reachable: true,
            },
            Leaver {
                name: "c",
                labels: &c,
                reachable: true,
            },
        ];
        let r = removals(&canary(Some(1)), &leavers);
        assert_eq!(r["b"], Leave::Now);
        assert_eq!(r["a"], Leave::Waits("canary".into()));
        assert_eq!(r["c"], Leave::Waits("canary".into()));
    }
}
