use super::*;

const T0: i64 = 1_800_000_000;

fn at(s: i64) -> Timestamp {
    Timestamp::from_second(T0 + s).unwrap()
}

fn settings(count: usize, failback: Failback) -> Settings {
    Settings {
        count,
        unreachable_after: Duration::from_secs(60),
        unavailable_after: Duration::from_secs(300),
        failback,
        failback_after: Duration::from_secs(120),
    }
}

/// A cluster's health, in a world where a cluster that holds the object
/// and answers runs it Available.
#[derive(Clone, Copy)]
struct Health {
    answering: bool,
    holds: bool,
    available: bool,
}

const UP: Health = Health {
    answering: true,
    holds: true,
    available: true,
};
const EMPTY: Health = Health {
    answering: true,
    holds: false,
    available: false,
};
const DOWN: Health = Health {
    answering: false,
    holds: true,
    available: false,
};
const BROKEN: Health = Health {
    answering: true,
    holds: true,
    available: false,
};

struct World {
    settings: Settings,
    names: Vec<String>,
    health: BTreeMap<String, Health>,
    status: PlacementStatus,
    paused: bool,
    /// Clusters where it never becomes available.
    broken: BTreeSet<String>,
}

impl World {
    fn new(n: usize, clusters: usize, failback: Failback) -> World {
        let names: Vec<String> = (1..=clusters).map(|k| format!("member-{k}")).collect();
        let health = names.iter().map(|n| (n.clone(), EMPTY)).collect();
        World {
            settings: settings(n, failback),
            names,
            health,
            status: PlacementStatus::default(),
            paused: false,
            broken: BTreeSet::new(),
        }
    }

    fn set(&mut self, name: &str, h: Health) {
        self.health.insert(name.to_string(), h);
    }

    fn step(&mut self, s: i64) -> Placed {
        let clusters: Vec<Candidate> = self
            .names
            .iter()
            .map(|n| {
                let h = self.health[n];
                Candidate {
                    name: n,
                    matches: true,
                    known: true,
                    answering: h.answering,
                    holds: h.holds,
                    foreign: false,
                    available: h.available,
                }
            })
            .collect();
        let placed = place(&Inputs {
            uid: "uid-1",
            settings: &self.settings,
            clusters: &clusters,
            previous: &self.status,
            running: true,
            steady: true,
            paused: self.paused,
            now: at(s),
            term_started: at(0),
        });
        self.status = placed.status.clone();
        placed
    }

    /// The planner's writes: every chosen cluster that answers gets it, and
    /// every answering holder that is neither chosen nor kept loses it.
    fn apply(&mut self, p: &Placed) {
        for n in self.names.clone() {
            let h = self.health[&n];
            if !h.answering {
                continue;
            }
            if p.chosen.contains(&n) {
                let available = !self.broken.contains(&n);
                self.set(&n, Health { available, ..UP });
            } else if !p.kept.contains(&n) {
                self.set(&n, EMPTY);
            }
        }
    }

    fn chosen(&self) -> Vec<&str> {
        self.status
            .clusters
            .iter()
            .filter(|c| c.role == Role::Chosen)
            .map(|c| c.name.as_str())
            .collect()
    }
}

fn settled(n: usize, clusters: usize) -> World {
    let mut w = World::new(n, clusters, Failback::Never);
    let p = w.step(0);
    w.apply(&p);
    w.step(1);
    w
}

#[test]
fn n_clusters_are_chosen_by_rank_and_each_says_why() {
    let w = settled(2, 3);
    assert_eq!(w.chosen().len(), 2);
    let expected: BTreeSet<&str> = rank::ranked("uid-1", ["member-1", "member-2", "member-3"])
        .into_iter()
        .take(2)
        .collect();
    assert_eq!(w.chosen().into_iter().collect::<BTreeSet<_>>(), expected);
    assert!(w.status.clusters.iter().all(|c| c.reason == "Ranked"));
    assert!(w.status.clusters[0].message.contains("rank"));
}

#[test]
fn a_cluster_that_holds_it_already_is_kept_when_a_count_is_set() {
    let mut w = World::new(1, 3, Failback::Never);
    // The lowest ranked cluster already runs it (a placement without a count).
    let last = rank::ranked("uid-1", ["member-1", "member-2", "member-3"])[2].to_string();
    w.set(&last, UP);
    w.step(0);
    assert_eq!(w.chosen(), vec![last.as_str()]);
}

fn victim_and_spare(w: &World) -> (String, String) {
    let chosen = w.chosen();
    let victim = chosen[0].to_string();
    let spare = w
        .names
        .iter()
        .find(|n| !chosen.contains(&n.as_str()))
        .unwrap()
        .clone();
    (victim, spare)
}

#[test]
fn an_unreachable_cluster_is_replaced_after_unreachable_after_and_kept_until_the_replacement_is_available()
 {
    let mut w = settled(2, 3);
    let (victim, spare) = victim_and_spare(&w);
    w.set(&victim, DOWN);
    let p = w.step(10);
    assert!(p.chosen.contains(&victim), "not yet");
    assert!(p.requeue.is_some_and(|r| r <= Duration::from_secs(61)));
    let p = w.step(69);
    assert!(p.chosen.contains(&victim), "59 s is not 60 s");
    let p = w.step(71);
    assert!(!p.chosen.contains(&victim));
    assert!(p.chosen.contains(&spare));
    assert_eq!(p.chosen.len(), 2);
    assert!(
        p.replacements.contains(&spare),
        "the replacement is written at once"
    );
    assert!(
        p.kept.contains(&victim),
        "kept: the replacement is not available"
    );
    let gone = p.status.clusters.iter().find(|c| c.name == victim).unwrap();
    assert_eq!(gone.role, Role::Replaced);
    assert_eq!(gone.reason, "Unreachable");
    assert_eq!(gone.replaced_by.as_deref(), Some(spare.as_str()));
    assert_eq!(p.status.history.len(), 1);
    assert_eq!(p.status.history[0].reason, "Unreachable");

    // The replacement runs it: the replaced one may go, once it answers.
    w.apply(&p);
    let p = w.step(80);
    assert!(p.kept.contains(&victim), "kept while it does not answer");
    assert!(p.replacements.is_empty());
    w.set(&victim, UP);
    let p = w.step(90);
    assert!(
        !p.kept.contains(&victim),
        "it answers and its replacement serves"
    );
    assert!(!p.chosen.contains(&victim), "failback Never");
    w.apply(&p);
    assert!(!w.health[&victim].holds, "removed once it answers");
    let p = w.step(100);
    assert!(p.status.clusters.iter().all(|c| c.name != victim));
    assert_eq!(p.chosen.len(), 2);
}

#[test]
fn blips_shorter_than_unreachable_after_move_nothing() {
    let mut w = settled(2, 3);
    let (victim, _) = victim_and_spare(&w);
    let before = w.chosen().join(",");
    for k in 0..10 {
        w.set(&victim, DOWN);
        w.step(10 + k * 100);
        w.set(&victim, UP);
        let p = w.step(10 + k * 100 + 59);
        assert!(p.chosen.contains(&victim));
    }
    assert_eq!(w.chosen().join(","), before);
    assert!(w.status.history.is_empty());
}

#[test]
fn unknown_does_not_reset_the_unavailable_timer() {
    let mut w = settled(2, 3);
    let (victim, spare) = victim_and_spare(&w);
    w.set(&victim, BROKEN);
    w.step(10);
    // Unreachable for a while (less than unreachableAfter), then broken again.
    w.set(&victim, DOWN);
    w.step(200);
    w.set(&victim, BROKEN);
    let p = w.step(250);
    assert!(p.chosen.contains(&victim));
    let p = w.step(311);
    assert!(
        p.chosen.contains(&spare),
        "300 s after it first stopped being available"
    );
    let gone = p.status.clusters.iter().find(|c| c.name == victim).unwrap();
    assert_eq!(gone.reason, "Unavailable");
    assert!(
        p.kept.contains(&victim),
        "it answers, but its replacement is not available yet"
    );
}

#[test]
fn one_failover_per_gap() {
    let mut w = settled(2, 4);
    let chosen: Vec<String> = w.chosen().iter().map(|s| s.to_string()).collect();
    for c in &chosen {
        w.set(c, DOWN);
    }
    w.step(10);
    let p = w.step(71);
    assert_eq!(p.status.history.len(), 1, "one at a time");
    assert!(p.requeue.is_some_and(|r| r <= Duration::from_secs(61)));
    w.apply(&p);
    let p = w.step(100);
    assert_eq!(p.status.history.len(), 1, "the gap holds the second");
    let p = w.step(132);
    assert_eq!(p.status.history.len(), 2);
    assert!(chosen.iter().all(|c| !p.chosen.contains(c)));
}

#[test]
fn nothing_moves_when_paused_without_a_running_revision_or_without_a_spare() {
    let mut w = settled(2, 2);
    let (victim, _) = (w.chosen()[0].to_string(), ());
    w.set(&victim, DOWN);
    w.step(10);
    let p = w.step(200);
    assert!(p.chosen.contains(&victim), "no spare");
    let me = p.status.clusters.iter().find(|c| c.name == victim).unwrap();
    assert!(me.message.contains("no other selected cluster"), "{me:?}");

    let mut w = settled(2, 3);
    let (victim, _) = victim_and_spare(&w);
    w.paused = true;
    w.set(&victim, DOWN);
    w.step(10);
    assert!(w.step(200).chosen.contains(&victim), "paused");
}

#[test]
fn failback_when_healthy_moves_back_after_failback_after() {
    let mut w = World::new(2, 3, Failback::WhenHealthy);
    let p = w.step(0);
    w.apply(&p);
    w.step(1);
    let (victim, spare) = victim_and_spare(&w);
    w.set(&victim, DOWN);
    w.step(10);
    let p = w.step(71);
    w.apply(&p);
    assert!(p.chosen.contains(&spare));
    // Back: its Microservice goes (N + 1 at most), but the placement
    // remembers it, to move back.
    w.set(&victim, UP);
    let p = w.step(100);
    assert!(!p.kept.contains(&victim));
    w.apply(&p);
    assert!(!w.health[&victim].holds);
    let p = w.step(110);
    let me = p.status.clusters.iter().find(|c| c.name == victim).unwrap();
    assert_eq!(me.role, Role::Replaced);
    let p = w.step(219);
    assert!(
        !p.chosen.contains(&victim),
        "120 s of health not yet reached"
    );
    let p = w.step(222);
    assert!(p.chosen.contains(&victim), "{:?}", p.status);
    assert!(
        p.replacements.contains(&victim),
        "given the running revision at once"
    );
    assert!(!p.chosen.contains(&spare));
    assert!(
        p.kept.contains(&spare),
        "kept until the original is available"
    );
    assert_eq!(p.status.history.last().unwrap().reason, "FailedBack");
    w.apply(&p);
    let p = w.step(230);
    assert!(!p.kept.contains(&spare));
    w.apply(&p);
    assert!(!w.health[&spare].holds);
}

#[test]
fn a_smaller_count_drops_the_lowest_ranked_and_a_larger_one_adds() {
    let mut w = settled(3, 4);
    w.settings.count = 1;
    let p = w.step(5);
    assert_eq!(p.chosen.len(), 1);
    let best = rank::ranked("uid-1", w.names.iter().map(String::as_str))[0];
    assert!(p.chosen.contains(best));
    w.settings.count = 4;
    assert_eq!(w.step(6).chosen.len(), 4);
}

/// For random health timelines: never more than N + 1 answering clusters
/// hold it, and once the health stays put, min(N, answering) clusters run it.
#[test]
fn property_random_health_timelines() {
    let mut seed: u64 = 0x5eed;
    let mut next = |m: u64| {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (seed >> 33) % m
    };
    for run in 0..200 {
        let n = 1 + next(3) as usize;
        let clusters = n + next(3) as usize;
        let failback = if run % 2 == 0 {
            Failback::Never
        } else {
            Failback::WhenHealthy
        };
        let mut w = World::new(n, clusters, failback);
        let mut t = 0;
        for _ in 0..40 {
            if next(8) == 0 {
                let who = w.names[next(clusters as u64) as usize].clone();
                if !w.broken.remove(&who) {
                    w.broken.insert(who);
                }
            }
            if next(3) == 0 {
                let who = w.names[next(clusters as u64) as usize].clone();
                let h = w.health[&who];
                let flipped = if h.answering {
                    Health {
                        answering: false,
                        available: false,
                        ..h
                    }
                } else {
                    Health {
                        answering: true,
                        available: h.holds && !w.broken.contains(&who),
                        ..h
                    }
                };
                w.set(&who, flipped);
            }
            t += 1 + next(90) as i64;
            let p = w.step(t);
            assert!(p.chosen.len() <= n);
            w.apply(&p);
            let running = w
                .names
                .iter()
                .filter(|c| w.health[*c].answering && w.health[*c].holds)
                .count();
            assert!(
                running <= n + 1,
                "run {run} at {t}: {running} > {n} + 1: {:?}",
                w.status
            );
        }
        // Quiet: the health stays put long enough for every timer and gap.
        for _ in 0..40 {
            t += 200;
            let p = w.step(t);
            w.apply(&p);
        }
        let answering = w
            .names
            .iter()
            .filter(|c| w.health[*c].answering && !w.broken.contains(*c))
            .count();
        let serving = w
            .chosen()
            .iter()
            .filter(|c| w.health[**c].answering && w.health[**c].available)
            .count();
        assert_eq!(serving, n.min(answering), "run {run}: {:?}", w.status);
    }
}

/// A replaced cluster that came back and serves while its replacement
/// does not is the first choice for the next place that frees up: no new
/// cluster, never more than N + 1 running.
#[test]
fn a_replaced_cluster_that_serves_takes_the_next_place() {
    let mut w = settled(2, 4);
    let (a, b) = (w.chosen()[0].to_string(), w.chosen()[1].to_string());
    for n in w.names.clone() {
        if n != a && n != b {
            w.broken.insert(n);
        }
    }
    w.set(&a, DOWN);
    w.step(10);
    let p = w.step(71);
    w.apply(&p);
    w.set(&a, UP);
    let p = w.step(80);
    assert!(p.kept.contains(&a), "it serves, its replacement does not");
    w.apply(&p);
    w.broken.insert(b.clone());
    w.set(&b, BROKEN);
    w.step(100);
    let p = w.step(401);
    assert_eq!(p.status.history.len(), 2, "{:?}", p.status);
    assert!(p.chosen.contains(&a), "back in: {:?}", p.status);
    w.apply(&p);
    let running = w
        .names
        .iter()
        .filter(|n| w.health[*n].answering && w.health[*n].holds)
        .count();
    assert!(running <= 3, "never more than N + 1");
}

/// A cluster that does not answer is replaced by unreachableAfter alone,
/// as Unreachable, even when unavailableAfter is shorter (review).
#[test]
fn a_dark_cluster_fails_over_as_unreachable_by_its_own_timer() {
    let mut w = settled(2, 3);
    w.settings.unreachable_after = Duration::from_secs(600);
    let (victim, spare) = victim_and_spare(&w);
    w.set(&victim, DOWN);
    w.step(10);
    let p = w.step(320);
    assert!(
        p.chosen.contains(&victim),
        "300 s unavailable, but dark: not yet"
    );
    let p = w.step(611);
    assert!(p.chosen.contains(&spare));
    assert_eq!(p.status.history[0].reason, "Unreachable");
}

/// A replaced cluster that serves nothing holds up no failover: with two
/// clusters where the service cannot run, the third is tried (review).
#[test]
fn a_replaced_cluster_that_serves_nothing_does_not_block_the_next_failover() {
    let mut w = settled(1, 3);
    let ranked = rank::ranked("uid-1", ["member-1", "member-2", "member-3"]);
    let (a, b, e) = (
        ranked[0].to_string(),
        ranked[1].to_string(),
        ranked[2].to_string(),
    );
    w.broken.insert(a.clone());
    w.broken.insert(b.clone());
    w.set(&a, BROKEN);
    w.step(10);
    let p = w.step(311);
    assert!(p.chosen.contains(&b), "{:?}", p.status);
    w.apply(&p);
    w.step(320);
    let p = w.step(700);
    assert!(p.chosen.contains(&e), "the third is tried: {:?}", p.status);
    w.apply(&p);
    let running = w
        .names
        .iter()
        .filter(|n| w.health[*n].answering && w.health[*n].holds)
        .count();
    assert!(running <= 2, "never more than N + 1");
}
