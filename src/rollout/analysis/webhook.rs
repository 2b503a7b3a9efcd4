//! The webhook provider: POST the evidence as JSON; a 2xx answer passes,
//! anything else, no answer in time or no connection fails. The edge of
//! `analysis`.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

type Https = hyper_rustls::HttpsConnector<HttpConnector>;

/// How much of a refusing answer's body is kept for the status.
const ANSWER_BYTES: usize = 200;

/// One client for every check of the term: connections are reused.
#[derive(Clone)]
pub struct Hooks {
    client: Client<Https, Full<Bytes>>,
}

impl Hooks {
    pub fn new() -> Self {
        let builder = hyper_rustls::HttpsConnectorBuilder::new();
        // No system roots (a bare container): https webhooks fail with the
        // TLS error in their answer; http ones still work.
        let builder = builder.with_native_roots().unwrap_or_else(|e| {
            tracing::warn!(error = %e, "no system CA roots: https analysis webhooks will fail");
            let empty = rustls_config();
            hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(empty)
        });
        let https = builder.https_or_http().enable_http1().build();
        Hooks {
            client: Client::builder(TokioExecutor::new()).build(https),
        }
    }

    /// Whether the webhook passed, and its answer in a few words.
    pub async fn post(
        &self,
        url: &str,
        timeout: Duration,
        body: &serde_json::Value,
    ) -> (bool, String) {
        let request = http::Request::post(url)
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(http::header::USER_AGENT, "flotilla-analysis")
            .body(Full::new(Bytes::from(body.to_string())));
        let request = match request {
            Ok(r) => r,
            Err(e) => return (false, format!("bad request: {e}")),
        };
        let call = async {
            let response = self.client.request(request).await.map_err(|e| {
                let mut text = e.to_string();
                if let Some(cause) = std::error::Error::source(&e) {
                    text = format!("{text}: {cause}");
                }
                format!("no connection: {text}")
            })?;
            let status = response.status();
            if status.is_success() {
                return Ok(format!("HTTP {}", status.as_u16()));
            }
            let body = Limited::new(response.into_body(), 4096).collect().await;
            let text = body
                .map(|b| String::from_utf8_lossy(&b.to_bytes()).trim().to_string())
                .unwrap_or_default();
            let text: String = text.chars().take(ANSWER_BYTES).collect();
            Err(match text.is_empty() {
                true => format!("HTTP {}", status.as_u16()),
                false => format!("HTTP {}: {text}", status.as_u16()),
            })
        };
        match tokio::time::timeout(timeout, call).await {
            Ok(Ok(answer)) => (true, answer),
            Ok(Err(answer)) => (false, answer),
            Err(_) => (false, format!("no answer within {timeout:?}")),
        }
    }
}

impl Default for Hooks {
    fn default() -> Self {
        Hooks::new()
    }
}

fn rustls_config() -> tokio_rustls::rustls::ClientConfig {
    use tokio_rustls::rustls;
    rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("ring supports the default versions")
    .with_root_certificates(rustls::RootCertStore::empty())
    .with_no_client_auth()
}
