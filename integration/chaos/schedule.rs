//! The nemesis's plan, pure: from a seed and a length, which fault starts
//! when, against what, for how long. The same seed gives the same plan, so a
//! failed run can be replayed (the interleavings with the workload differ).

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::time::Duration;

pub const REPLICAS: [&str; 3] = ["r1", "r2", "r3"];
pub const MEMBERS: [&str; 3] = ["member-1", "member-2", "member-3"];

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// kill -9, and a start again after `down`.
    KillReplica { replica: &'static str },
    /// SIGSTOP, and SIGCONT after `down`.
    PauseReplica { replica: &'static str },
    /// Every replica in turn: SIGTERM, wait for the exit, start again.
    RollingRestart,
    /// The member's apiserver process stopped, started after `down`.
    StopMember { member: &'static str },
    /// The operator's path to the member accepts and never answers.
    BlackHoleMember { member: &'static str },
    /// The registry's etcd stopped, started after `down`.
    StopRegistry,
    /// The `ring: canary` label moves to this member (waves move).
    MoveCanary { member: &'static str },
    /// A burst of edits in the member, then SIGSTOP of whichever replica
    /// leads it `after` the burst began (so it holds writes it has not
    /// sent), and SIGCONT after `down`, past its Lease: what the write
    /// fence is for.
    PauseLeader {
        member: &'static str,
        after: Duration,
    },
    /// The home apiserver stopped, started after `down`.
    StopHome,
    /// A Lease deleted under its holder.
    DeleteLease { lease: LeaseKind },
    /// The replicas' watches of `scope` (a member, or `home`) deliver each
    /// event `lag` late, while requests still answer at once.
    WatchLag { scope: &'static str, lag: Duration },
    /// A burst of edits in the member, then, `after` it began, the
    /// operator's path to the member holds every byte, and when it heals
    /// delivers what it held, late (past the 2 s Lease): the leader's
    /// writes for the burst land after its term has ended.
    LateMember {
        member: &'static str,
        after: Duration,
    },
}

/// Which Lease a `DeleteLease` takes away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseKind {
    /// A member's Lease, in that member.
    Member(&'static str),
    /// The rollout Lease, in home.
    Rollout,
    /// The DNS writer's Lease, in home.
    Dns,
}

impl Fault {
    pub fn kind(&self) -> &'static str {
        match self {
            Fault::KillReplica { .. } => "replica-kill",
            Fault::PauseReplica { .. } => "replica-pause",
            Fault::RollingRestart => "rolling-restart",
            Fault::StopMember { .. } => "member-stop",
            Fault::BlackHoleMember { .. } => "member-black-hole",
            Fault::StopRegistry => "registry-stop",
            Fault::MoveCanary { .. } => "label-move",
            Fault::PauseLeader { .. } => "leader-pause-mid-burst",
            Fault::StopHome => "home-stop",
            Fault::DeleteLease { .. } => "lease-delete",
            Fault::WatchLag { .. } => "watch-lag",
            Fault::LateMember { .. } => "late-delivery",
        }
    }

    /// Which resource it takes (an index): at most one fault each at a time.
    pub fn resource(&self) -> Option<usize> {
        self.takes().map(|r| r as usize)
    }

    /// What it takes away while it lasts: at most one of each at a time.
    fn takes(&self) -> Option<Resource> {
        match self {
            Fault::KillReplica { .. }
            | Fault::PauseReplica { .. }
            | Fault::RollingRestart
            | Fault::PauseLeader { .. } => Some(Resource::Replica),
            Fault::StopMember { .. } | Fault::BlackHoleMember { .. } | Fault::LateMember { .. } => {
                Some(Resource::Member)
            }
            Fault::StopRegistry => Some(Resource::Registry),
            Fault::StopHome => Some(Resource::Home),
            Fault::WatchLag { .. } => Some(Resource::Watches),
            Fault::MoveCanary { .. } | Fault::DeleteLease { .. } => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Resource {
    Replica,
    Member,
    Registry,
    Home,
    /// The one watch-lag file.
    Watches,
}

/// How many resources faults take turns on.
pub const RESOURCES: usize = 5;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    /// From the start of the run.
    pub at: Duration,
    pub fault: Fault,
    /// How long it lasts (for a rolling restart, the time it is allowed).
    pub down: Duration,
}

/// Every kind the nemesis knows, for the "K kinds" of the summary.
pub const KINDS: usize = 12;

/// The kind `home-stop`, held out of runs shorter than `HELD_OUT_BELOW`
/// (`make test`'s 120 s): there the Pod tests run beside the chaos on the
/// same home apiserver, and its stop fails them (their node's kubelet and
/// the install runbook's rollout lose it). `make chaos` and the 300 s run
/// #62 asks for inject it.
const HOME_STOP: usize = 7;
pub const HELD_OUT_BELOW: Duration = Duration::from_secs(300);

/// The kinds a run of `length` may inject.
pub fn kinds_for(length: Duration) -> Vec<usize> {
    (0..KINDS)
        .filter(|k| length >= HELD_OUT_BELOW || *k != HOME_STOP)
        .collect()
}

/// Faults over `length`, one every 3–10 s, never two replica faults, two
/// member faults, two registry or two home faults at once, each over before `length`
/// ends so the quiet period starts whole.
pub fn plan(seed: u64, length: Duration) -> Vec<Planned> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut busy_until = [Duration::ZERO; RESOURCES];
    let mut out = Vec::new();
    // Every kind once before any repeats (in a seeded order): a run of a
    // few minutes injects each, so each is known to be survived.
    let kinds = kinds_for(length);
    let mut owed = kinds.clone();
    owed.shuffle(&mut rng);
    let mut at = Duration::from_secs(rng.random_range(2..=5));
    while at < length {
        let kind = owed
            .first()
            .copied()
            .unwrap_or_else(|| kinds[rng.random_range(0..kinds.len())]);
        let fault = pick(&mut rng, kind);
        let down = match &fault {
            Fault::KillReplica { .. } => secs(&mut rng, 1, 5),
            Fault::PauseReplica { .. } => secs(&mut rng, 1, 20),
            Fault::RollingRestart => Duration::from_secs(20),
            Fault::StopMember { .. } | Fault::BlackHoleMember { .. } => secs(&mut rng, 1, 30),
            Fault::StopRegistry => secs(&mut rng, 1, 20),
            Fault::MoveCanary { .. } => Duration::ZERO,
            // Past the chaos replicas' 2 s Lease, so another takes over.
            Fault::PauseLeader { .. } => secs(&mut rng, 3, 12),
            // Past the chaos replicas' 2 s heartbeat: each then sees the
            // others' heartbeats run out, and home's writers lose their terms.
            Fault::StopHome => secs(&mut rng, 3, 15),
            Fault::DeleteLease { .. } => Duration::ZERO,
            Fault::WatchLag { .. } => secs(&mut rng, 5, 20),
            Fault::LateMember { .. } => secs(&mut rng, 5, 20),
        };
        let slot = fault.takes().map(|r| r as usize);
        let free = slot.is_none_or(|s| busy_until[s] <= at);
        if free && at + down <= length {
            if let Some(s) = slot {
                busy_until[s] = at + down;
            }
            out.push(Planned { at, fault, down });
            owed.retain(|k| *k != kind);
        }
        at += secs(&mut rng, 3, 10);
    }
    out
}

fn pick(rng: &mut StdRng, kind: usize) -> Fault {
    let replica = REPLICAS[rng.random_range(0..REPLICAS.len())];
    let member = MEMBERS[rng.random_range(0..MEMBERS.len())];
    match kind {
        0 => Fault::KillReplica { replica },
        1 => Fault::PauseReplica { replica },
        2 => Fault::RollingRestart,
        3 => Fault::StopMember { member },
        4 => Fault::BlackHoleMember { member },
        5 => Fault::StopRegistry,
        6 => Fault::MoveCanary { member },
        7 => Fault::StopHome,
        8 => Fault::DeleteLease {
            lease: match rng.random_range(0..3) {
                0 => LeaseKind::Member(member),
                1 => LeaseKind::Rollout,
                _ => LeaseKind::Dns,
            },
        },
        9 => Fault::WatchLag {
            scope: if rng.random_range(0..4) == 0 {
                "home"
            } else {
                member
            },
            lag: Duration::from_millis(rng.random_range(1000..=5000)),
        },
        10 => Fault::PauseLeader {
            member,
            after: Duration::from_millis(rng.random_range(50..=500)),
        },
        _ => Fault::LateMember {
            member,
            after: Duration::from_millis(rng.random_range(50..=400)),
        },
    }
}

/// A whole number of seconds in [lo, hi], at millisecond grain.
fn secs(rng: &mut StdRng, lo: u64, hi: u64) -> Duration {
    Duration::from_millis(rng.random_range(lo * 1000..=hi * 1000))
}

/// The seed of the day for `make test`: a fixed list, one a day in turn,
/// so CI covers several plans and any failure names a seed to replay.
pub fn seed_of_day(days_since_epoch: u64) -> u64 {
    const SEEDS: [u64; 7] = [
        0x5eed_0001,
        0x5eed_0002,
        0x5eed_0003,
        0x5eed_0004,
        0x5eed_0005,
        0x5eed_0006,
        0x5eed_0007,
    ];
    SEEDS[(days_since_epoch % SEEDS.len() as u64) as usize]
}
