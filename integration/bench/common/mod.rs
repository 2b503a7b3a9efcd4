//! What the benchmarks share: statistics, process figures, JSON output and
//! the sample-controller they are measured against.
#![allow(dead_code)] // each benchmark uses a different part of this module

pub mod ghz;
pub mod latency;
pub mod sample;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::support::fleet_dir;

/// A number from the environment, or `default`.
pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Median and range of repeated runs.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    pub fn of(values: &[f64]) -> Spread {
        if values.is_empty() {
            return Spread {
                median: f64::NAN,
                min: f64::NAN,
                max: f64::NAN,
            };
        }
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let mid = v.len() / 2;
        Spread {
            // Of an even count, the mean of the middle two.
            median: if v.len().is_multiple_of(2) {
                (v[mid - 1] + v[mid]) / 2.0
            } else {
                v[mid]
            },
            min: v[0],
            max: v[v.len() - 1],
        }
    }
}

impl std::fmt::Display for Spread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = f.precision().unwrap_or(1);
        write!(
            f,
            "{:.p$} [{:.p$}, {:.p$}]",
            self.median, self.min, self.max
        )
    }
}

pub use crate::support::percentile;

/// A field of /proc/<pid>/status given in kB, in MiB.
pub fn proc_status_mib(pid: u32, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(f64::NAN)
}

pub fn rss_mib(pid: u32) -> f64 {
    proc_status_mib(pid, "VmRSS:")
}

/// utime + stime of a process, in seconds.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = fields.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0)
        + fields.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    ticks / 100.0
}

/// The pid of a fleet cluster's kube-apiserver, from `integration/fleet`'s
/// pid file ("PID<TAB>binary").
pub fn apiserver_pid(cluster: &str) -> u32 {
    let file = fleet_dir()
        .join("run")
        .join(format!("{cluster}-apiserver.pid"));
    std::fs::read_to_string(&file)
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no apiserver pid in {}", file.display()))
}

/// Waits (up to 10 minutes) until namespace `name` is gone, so that the next
/// run does not share the CPU with its garbage collection.
pub async fn namespace_gone(client: &kube::Client, name: &str) {
    let api = kube::Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone());
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(600);
    while api.get_opt(name).await.ok().flatten().is_some() && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

/// Where results go: `.fleet/bench/`.
pub fn bench_dir() -> PathBuf {
    let dir = fleet_dir().join("bench");
    std::fs::create_dir_all(&dir).expect("bench dir");
    dir
}

/// Writes `.fleet/bench/<name>.json`.
pub fn write_json(name: &str, value: &impl Serialize) {
    let path = bench_dir().join(format!("{name}.json"));
    std::fs::write(&path, serde_json::to_vec_pretty(value).expect("json")).expect("write json");
    eprintln!("wrote {}", path.display());
}
