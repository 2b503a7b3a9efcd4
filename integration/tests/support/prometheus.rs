//! A real Prometheus (built from its Go module by
//! `integration/toolchain/prometheus.sh`, cached) scraping an exporter the
//! test controls, for the rollout analysis tests (#35).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::eventually;
use super::replicas::free_port;

/// The path of the Prometheus binary: `FLOTILLA_PROMETHEUS`, or the cached
/// build (`make test` builds it before the tests; run alone, a test builds
/// it, waiting at most 20 minutes).
pub async fn binary() -> PathBuf {
    if let Some(p) = std::env::var_os("FLOTILLA_PROMETHEUS") {
        return PathBuf::from(p);
    }
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("integration/toolchain/prometheus.sh");
    let child = Command::new(&script)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run integration/toolchain/prometheus.sh");
    let (code, path, log) = super::rollout::finish(child, Duration::from_secs(20 * 60)).await;
    assert_eq!(
        code, 0,
        "integration/toolchain/prometheus.sh failed:\n{log}"
    );
    PathBuf::from(path.trim())
}

/// Metrics the test sets, in the text exposition format, on `/metrics`.
#[derive(Clone, Default)]
pub struct Exporter {
    text: Arc<Mutex<String>>,
}

impl Exporter {
    pub fn set(&self, text: &str) {
        *self.text.lock().unwrap() = text.to_string();
    }

    /// Serves on a loopback port of its own; returns `host:port`.
    pub async fn serve(&self) -> String {
        let text = self.text.clone();
        let app = axum::Router::new().route(
            "/metrics",
            axum::routing::get(move || {
                let text = text.clone();
                async move {
                    let body = text.lock().unwrap().clone();
                    let format = "text/plain; version=0.0.4; charset=utf-8";
                    ([(http::header::CONTENT_TYPE, format)], body)
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move { axum::serve(listener, app).await.ok() });
        addr
    }
}

/// One Prometheus process, stopped (by pid) when dropped.
pub struct Prometheus {
    child: Option<Child>,
    dir: PathBuf,
    pub address: String,
}

impl Prometheus {
    /// Starts one scraping `target` every second, and waits until it is
    /// ready.
    pub async fn start(target: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("flotilla-prom-{:08x}", rand::random::<u32>()));
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: app\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let port = free_port();
        let address = format!("http://127.0.0.1:{port}");
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = Command::new(binary().await)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start prometheus");
        let p = Prometheus {
            child: Some(child),
            dir,
            address,
        };
        let ready = format!("{}/-/ready", p.address);
        eventually("prometheus ready", Duration::from_secs(60), || async {
            let got = tokio::time::timeout(Duration::from_secs(2), super::http_get(&ready)).await;
            matches!(got, Ok(Some((200, _)))).then_some(())
        })
        .await;
        p
    }

    /// The value of a one-sample instant query, once there is one.
    pub async fn value(&self, query: &str) -> Option<f64> {
        let q = form_urlencoded::Serializer::new(String::new())
            .append_pair("query", query)
            .finish();
        let url = format!("{}/api/v1/query?{q}", self.address);
        let (code, body) = tokio::time::timeout(Duration::from_secs(5), super::http_get(&url))
            .await
            .ok()??;
        if code != 200 {
            return None;
        }
        let json: serde_json::Value = serde_json::from_str(&body).ok()?;
        json["data"]["result"][0]["value"][1].as_str()?.parse().ok()
    }

    /// Waits until `query` gives `want`: the scrapes have caught up.
    pub async fn wait_value(&self, query: &str, want: f64) {
        eventually(
            &format!("prometheus: {query} == {want}"),
            Duration::from_secs(30),
            || async { (self.value(query).await == Some(want)).then_some(()) },
        )
        .await;
    }

    /// SIGKILL, as a crashed server: its port then refuses connections.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().ok();
            c.wait().ok();
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        self.kill();
        std::fs::remove_dir_all(&self.dir).ok();
    }
}
