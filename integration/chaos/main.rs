//! Fleet chaos (`make chaos`; a 120 s run in `make test`): three replicas
//! over the home cluster, three members and the registry, a nemesis mixing
//! faults at random from a seed while a workload runs, then a quiet period
//! and a checker that judges what happened from the apiservers' own
//! records. `CHAOS_SECONDS` (default 120 here, 300 in `make chaos`) and
//! `CHAOS_SEED` (default: the seed of the day) choose the run; a failed run
//! prints the command that replays it and leaves the history around each
//! violation in `.fleet/chaos/`.

#[path = "../tests/support/mod.rs"]
mod support;

mod check;
mod check_tests;
mod nemesis;
mod placement;
mod proxy;
mod records;
mod registry_history;
mod report;
mod report_tests;
mod run;
mod schedule;
mod schedule_tests;
mod withdrawn;
mod workload;

use std::time::Duration;

/// Each FleetMicroservice's bake: the wave-order check demands it.
pub const BAKE: Duration = Duration::from_secs(3);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_run() {
    let seconds: u64 = std::env::var("CHAOS_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(120);
    let days = jiff::Timestamp::now().as_second() as u64 / 86_400;
    let seed: u64 = std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| schedule::seed_of_day(days));
    run::chaos(seed, Duration::from_secs(seconds)).await;
}
