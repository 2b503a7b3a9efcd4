//! ghz, the gRPC load client
//! (`go install github.com/bojand/ghz/cmd/ghz@v0.121.0`), over the status
//! API's FleetStatus service. GHZ overrides the binary.

use std::process::Command;

use serde_json::Value;

fn ghz_bin() -> String {
    std::env::var("GHZ").unwrap_or_else(|_| {
        let gopath = std::env::var("GOPATH")
            .unwrap_or_else(|_| format!("{}/go", std::env::var("HOME").unwrap_or_default()));
        format!("{gopath}/bin/ghz")
    })
}

/// One ghz run of 16 clients, as fast as they go; returns (p50 ms, p99 ms,
/// requests/s, errors).
pub fn ghz(addr: &str, method: &str, data: Value, seconds: u64) -> (f64, f64, f64, u64) {
    ghz_with(addr, method, data, seconds, None, None)
}

/// One ghz run of 16 clients, limited to `rps` requests/s in all when given
/// (open loop: the latency of a load below saturation, not queueing behind
/// the load client's own CPU).
pub fn ghz_at(
    addr: &str,
    method: &str,
    data: Value,
    seconds: u64,
    rps: Option<u32>,
) -> (f64, f64, f64, u64) {
    ghz_with(addr, method, data, seconds, rps, None)
}

/// The same, with request metadata (`{"authorization": "Bearer ..."}`).
pub fn ghz_with(
    addr: &str,
    method: &str,
    data: Value,
    seconds: u64,
    rps: Option<u32>,
    metadata: Option<Value>,
) -> (f64, f64, f64, u64) {
    let proto = concat!(env!("CARGO_MANIFEST_DIR"), "/proto/flotilla/v1/fleet.proto");
    let include = concat!(env!("CARGO_MANIFEST_DIR"), "/proto");
    // Under /usr/bin/time, when there is one, to see what the load client
    // itself costs: on 2 cores it competes with the server it measures.
    let timed = std::path::Path::new("/usr/bin/time").exists();
    let mut cmd = if timed {
        let mut c = Command::new("/usr/bin/time");
        c.args(["-f", "ghz-cpu %U %S", &ghz_bin()]);
        c
    } else {
        Command::new(ghz_bin())
    };
    let out = cmd
        .args(["--insecure", "--proto", proto, "--import-paths", include])
        .args(["--call", &format!("flotilla.v1.FleetStatus/{method}")])
        .args([
            "-c",
            "16",
            "-z",
            &format!("{seconds}s"),
            "--connections",
            "4",
        ])
        .args(rps.map(|r| format!("--rps={r}")))
        .args(metadata.map(|m| format!("--metadata={m}")))
        .args(["-d", &data.to_string(), "-O", "json", addr])
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e}; install it with `go install github.com/bojand/ghz/cmd/ghz@v0.121.0`",
                ghz_bin()
            )
        });
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("ghz output: {e}\n{}", String::from_utf8_lossy(&out.stderr)));
    let pct = |p: u64| {
        report["latencyDistribution"]
            .as_array()
            .and_then(|d| d.iter().find(|x| x["percentage"] == p))
            .and_then(|x| x["latency"].as_f64())
            .map(|ns| ns / 1e6)
            .unwrap_or(f64::NAN)
    };
    let errors = report["statusCodeDistribution"]
        .as_object()
        .map(|m| {
            m.iter()
                .filter(|(k, _)| *k != "OK")
                .map(|(_, v)| v.as_u64().unwrap_or(0))
                .sum()
        })
        .unwrap_or(0);
    let count = report["count"].as_f64().unwrap_or(0.0);
    if let Some(line) = String::from_utf8_lossy(&out.stderr)
        .lines()
        .find(|l| l.starts_with("ghz-cpu "))
    {
        let cpu: f64 = line
            .split_whitespace()
            .skip(1)
            .filter_map(|x| x.parse::<f64>().ok())
            .sum();
        println!(
            "  (ghz itself used {:.1} ms of CPU per {method} call)",
            cpu * 1e3 / count.max(1.0)
        );
    }
    if errors > 0 {
        eprintln!("ghz {method}: errors {}", report["errorDistribution"]);
    }
    (
        pct(50),
        pct(99),
        report["rps"].as_f64().unwrap_or(0.0),
        errors,
    )
}
