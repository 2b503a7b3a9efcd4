//! The fleet service registry of the test bed (`integration/fleet registry
//! up`): its etcd, its CoreDNS, and DNS questions asked with dig.

use std::collections::BTreeMap;
use std::process::Command;

use flotilla::registry::{Registration, RegistryConfig};

use super::fleet_dir;

/// `.fleet/registry.env`, written by `integration/fleet registry up`.
pub fn env() -> BTreeMap<String, String> {
    let path = fleet_dir().join("registry.env");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{} ({e}): is the registry up? integration/fleet registry up",
            path.display()
        )
    });
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

pub fn config() -> RegistryConfig {
    let env = env();
    RegistryConfig {
        endpoints: vec![env["FLOTILLA_REGISTRY_ETCD_ENDPOINTS"].clone()],
        zone: env["FLOTILLA_REGISTRY_ZONE"].clone(),
        path: flotilla::registry::records::DEFAULT_PATH.into(),
        ca: None,
        cert: None,
        key: None,
        // The test bed's etcd is plaintext on loopback.
        insecure: true,
    }
}

pub async fn registration() -> Registration {
    Registration::connect(&config()).await
}

pub fn zone() -> String {
    env()["FLOTILLA_REGISTRY_ZONE"].clone()
}

fn run_dig(name: &str, qtype: &str, short: bool) -> String {
    let env = env();
    let (host, port) = env["REGISTRY_DNS_ADDR"]
        .split_once(':')
        .expect("REGISTRY_DNS_ADDR is host:port");
    let mut cmd = Command::new("dig");
    cmd.args([
        &format!("@{host}"),
        "-p",
        port,
        "+time=1",
        "+tries=1",
        name,
        qtype,
    ]);
    if short {
        cmd.arg("+short");
    }
    let out = cmd
        .output()
        .expect("dig (integration/install-deps installs dnsutils)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The response code CoreDNS gives: NOERROR, NXDOMAIN (no such name),
/// SERVFAIL (e.g. its etcd is down), or "" when nothing answered.
pub fn rcode(name: &str, qtype: &str) -> String {
    run_dig(name, qtype, false)
        .lines()
        .find_map(|l| l.split("status: ").nth(1))
        .map(|s| s.split(',').next().unwrap_or_default().trim().to_string())
        .unwrap_or_default()
}

/// `dig +short` against the registry's CoreDNS: the answers, one a line.
pub fn dig(name: &str, qtype: &str) -> Vec<String> {
    let mut lines: Vec<String> = run_dig(name, qtype, true)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with(';'))
        .map(str::to_string)
        .collect();
    lines.sort();
    lines
}

/// Waits (up to 30 s) until `dig +short` gives `want`: a CoreDNS whose
/// etcd client is still reconnecting times out now and then, which must not
/// read as a missing record. A record that is really gone still fails.
pub async fn resolves(name: &str, qtype: &str, want: &[String]) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let got = dig(name, qtype);
        if got == want {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{name} {qtype}: {got:?}, not {want:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// `integration/fleet registry stop|start`: the registry etcd alone.
pub fn registry_etcd(action: &str) {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("integration/fleet");
    let status = super::wait_within(
        Command::new(script).args(["registry", action]),
        std::time::Duration::from_secs(180),
    );
    assert!(status.success(), "fleet registry {action}");
}

/// Waits (up to 2 minutes) until CoreDNS answers the sentinel record that
/// `registry up` wrote: after an etcd outage, its etcd client reconnects
/// with gRPC's backoff, and answers SERVFAIL until then.
pub fn wait_dns_ready() {
    let sentinel = env()["REGISTRY_SENTINEL"].clone();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while rcode(&sentinel, "A") != "NOERROR" {
        assert!(
            std::time::Instant::now() < deadline,
            "CoreDNS never answered {sentinel} again"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// The registry etcd, stopped. `start` brings it back; dropping starts it
/// if needed and waits until CoreDNS reads it again, so a failed test
/// never leaves the next with a stopped or unread registry.
pub struct StoppedEtcd {
    started: bool,
}

impl StoppedEtcd {
    pub fn stop() -> StoppedEtcd {
        registry_etcd("stop");
        StoppedEtcd { started: false }
    }

    pub fn start(&mut self) {
        registry_etcd("start");
        self.started = true;
    }
}

impl Drop for StoppedEtcd {
    fn drop(&mut self) {
        if !self.started {
            registry_etcd("start");
        }
        wait_dns_ready();
    }
}
