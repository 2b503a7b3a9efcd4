//! A real headless Chromium, driven over WebDriver (Debian's chromium and
//! chromium-driver, installed by integration/install-deps).
#![allow(dead_code)]

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder};
use serde_json::{Value, json};

use super::replicas::free_port;
use super::{eventually, fleet_dir};

/// Milliseconds since the epoch: the clock `Date.now()` reads in the page,
/// so a time taken here and one taken there can be subtracted.
pub fn wall_ms() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs_f64()
        * 1000.0
}

/// One chromedriver and one browser session; both end when dropped.
pub struct Browser {
    pub client: Client,
    driver: Child,
    /// Where this test's screenshots go.
    pub out: PathBuf,
}

impl Browser {
    /// A 1280×800 headless window (`width` × `height` when given).
    pub async fn start(test: &str, size: Option<(u32, u32)>) -> Browser {
        Browser::start_with(test, size, &[]).await
    }

    /// With further Chromium flags, e.g. `--force-dark-mode`.
    pub async fn start_with(test: &str, size: Option<(u32, u32)>, flags: &[&str]) -> Browser {
        let port = free_port();
        std::fs::create_dir_all(fleet_dir().join("logs")).expect("log dir");
        let log = std::fs::File::create(
            fleet_dir()
                .join("logs")
                .join(format!("chromedriver-{test}.log")),
        )
        .expect("chromedriver log");
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(log)
            // Its own process group, so the browsers it starts end with it.
            .process_group(0)
            .spawn()
            .expect("start chromedriver: is chromium-driver installed? integration/install-deps");
        let (w, h) = size.unwrap_or((1280, 800));
        let mut args: Vec<String> = [
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--enable-precise-memory-info",
        ]
        .map(String::from)
        .to_vec();
        args.push(format!("--window-size={w},{h}"));
        args.extend(flags.iter().map(|f| f.to_string()));
        let caps = json!({
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": args,
            },
            "goog:loggingPrefs": {"browser": "ALL"},
        });
        let caps = caps.as_object().unwrap().clone();
        let url = format!("http://127.0.0.1:{port}");
        let client = eventually("chromedriver", Duration::from_secs(30), || {
            let (caps, url) = (caps.clone(), url.clone());
            async move {
                let connector = hyper_util::client::legacy::connect::HttpConnector::new();
                ClientBuilder::new(connector)
                    .capabilities(caps)
                    .connect(&url)
                    .await
                    .ok()
            }
        })
        .await;
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dashboard");
        std::fs::create_dir_all(&out).expect("screenshot dir");
        Browser {
            client,
            driver,
            out,
        }
    }

    /// Runs `script` (a function body; `arguments` are `args`) in the page.
    pub async fn js(&self, script: &str, args: Vec<Value>) -> Value {
        self.client.execute(script, args).await.expect("script")
    }

    /// Polls `script` until it returns something other than null/false.
    pub async fn until(&self, what: &str, limit: Duration, script: &str) -> Value {
        eventually(what, limit, || async move {
            let v = self.client.execute(script, vec![]).await.ok()?;
            (!v.is_null() && v != Value::Bool(false)).then_some(v)
        })
        .await
    }

    /// The text of the matrix cell for `key` (ns/name) in `cluster`.
    pub async fn cell(&self, key: &str, cluster: &str) -> Option<String> {
        let v = self
            .js(
                "const c = document.querySelector(`td[data-key=\"${arguments[0]}\"][data-cluster=\"${arguments[1]}\"]`); return c ? c.innerText : null;",
                vec![json!(key), json!(cluster)],
            )
            .await;
        v.as_str().map(String::from)
    }

    /// Waits until `url` answers 200 (the replica serves the page), then opens it.
    pub async fn open(&self, url: &str) {
        let page = match url.split_once('?') {
            Some((page, _)) => page.to_string(),
            None => url.to_string(),
        };
        eventually(
            "the dashboard answering",
            Duration::from_secs(90),
            || async { super::http_get(&page).await.filter(|(c, _)| *c == 200) },
        )
        .await;
        self.client.goto(url).await.expect("open the page");
    }

    /// Types `token` into the sign-in form and submits it.
    pub async fn sign_in(&self, token: &str) {
        let field = self
            .client
            .find(fantoccini::Locator::Id("token"))
            .await
            .expect("the token field");
        field.send_keys(token).await.expect("type the token");
        self.client
            .find(fantoccini::Locator::Css("#login-form button"))
            .await
            .expect("the sign-in button")
            .click()
            .await
            .expect("sign in");
    }

    pub async fn screenshot(&self, name: &str) -> PathBuf {
        let png = self.client.screenshot().await.expect("screenshot");
        let path = self.out.join(format!("{name}.png"));
        std::fs::write(&path, png).expect("write screenshot");
        path
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // chromedriver and every browser process it started, by group.
        let group = format!("-{}", self.driver.id());
        Command::new("kill")
            .args(["-KILL", "--", &group])
            .status()
            .ok();
        self.driver.wait().ok();
    }
}
