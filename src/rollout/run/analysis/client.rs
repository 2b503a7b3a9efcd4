//! The HTTP client every analysis provider calls through: one per term, so
//! connections are reused; every call is bounded in time and in the bytes
//! read back. The edge of `analysis`.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

type Https = hyper_rustls::HttpsConnector<HttpConnector>;

/// The most of an answer's body that is read: a verdict needs little, and
/// a hostile or broken server must not grow the leader.
const BODY_LIMIT: usize = 1 << 20;

#[derive(Clone)]
pub struct Http {
    client: Client<Https, Full<Bytes>>,
}

/// An answer: its status code and (at most `BODY_LIMIT` of) its body.
pub struct Answer {
    pub status: http::StatusCode,
    pub body: Bytes,
}

impl Http {
    pub fn new() -> Self {
        let builder = hyper_rustls::HttpsConnectorBuilder::new();
        // No system roots (a bare container): https checks fail with the
        // TLS error in their answer; http ones still work.
        let builder = builder.with_native_roots().unwrap_or_else(|e| {
            tracing::warn!(error = %e, "no system CA roots: https analysis checks will fail");
            let empty = rustls_config();
            hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(empty)
        });
        let https = builder.https_or_http().enable_http1().build();
        Http {
            client: Client::builder(TokioExecutor::new()).build(https),
        }
    }

    /// POSTs `body` with `headers`; `Err` says in a few words why no
    /// answer came in time.
    pub async fn post(
        &self,
        url: &str,
        content_type: &str,
        headers: &[(http::HeaderName, http::HeaderValue)],
        body: Vec<u8>,
        timeout: Duration,
    ) -> Result<Answer, String> {
        let mut request = http::Request::post(url)
            .header(http::header::CONTENT_TYPE, content_type)
            .header(http::header::USER_AGENT, "flotilla-analysis")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| format!("bad request: {e}"))?;
        for (name, value) in headers {
            request.headers_mut().insert(name.clone(), value.clone());
        }
        let call = async {
            let response = self.client.request(request).await.map_err(|e| {
                let mut text = e.to_string();
                if let Some(cause) = std::error::Error::source(&e) {
                    text = format!("{text}: {cause}");
                }
                format!("no connection: {text}")
            })?;
            let status = response.status();
            let body = Limited::new(response.into_body(), BODY_LIMIT)
                .collect()
                .await
                .map_err(|e| format!("HTTP {}: body unread: {e}", status.as_u16()))?;
            Ok(Answer {
                status,
                body: body.to_bytes(),
            })
        };
        match tokio::time::timeout(timeout, call).await {
            Ok(answer) => answer,
            Err(_) => Err(format!("no answer within {timeout:?}")),
        }
    }
}

impl Default for Http {
    fn default() -> Self {
        Http::new()
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
