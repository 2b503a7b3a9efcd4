//! TLS for the status API with files that rotate: cert-manager replaces the
//! certificate, key and CA in place, and the server must pick them up with
//! no restart and no dropped connection. Each new connection is accepted
//! with the configuration current at that moment; connections already open
//! keep the one they were accepted with.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::{Stream, StreamExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{RootCertStore, ServerConfig, crypto};
use tokio_rustls::server::TlsStream;

use super::ApiError;
use super::auth::BearerToken;

#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// With a client CA, clients must present a certificate it signed (mTLS).
    pub client_ca: Option<PathBuf>,
}

fn read(path: &Path, what: &str) -> Result<Vec<u8>, ApiError> {
    std::fs::read(path).map_err(|e| ApiError::Config(format!("{what} {}: {e}", path.display())))
}

/// The bytes a configuration was built from, to notice a change.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Material {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

fn material(files: &TlsFiles) -> Result<Material, ApiError> {
    Ok(Material {
        cert: read(&files.cert, "TLS certificate")?,
        key: read(&files.key, "TLS key")?,
        client_ca: files
            .client_ca
            .as_ref()
            .map(|p| read(p, "client CA"))
            .transpose()?,
    })
}

/// A rustls server configuration for HTTP/2, from PEM bytes. Errors name
/// the file's role, never its contents.
fn server_config(m: &Material) -> Result<Arc<ServerConfig>, ApiError> {
    let bad = |what: &str| ApiError::Config(format!("{what} is not valid PEM"));
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&m.cert)
        .collect::<Result<_, _>>()
        .map_err(|_| bad("the TLS certificate"))?;
    if certs.is_empty() {
        return Err(bad("the TLS certificate"));
    }
    let key = PrivateKeyDer::from_pem_slice(&m.key).map_err(|_| bad("the TLS key"))?;
    let provider = Arc::new(crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| ApiError::Config(format!("TLS: {e}")))?;
    let builder = match &m.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for c in CertificateDer::pem_slice_iter(ca) {
                roots
                    .add(c.map_err(|_| bad("the client CA"))?)
                    .map_err(|_| bad("the client CA"))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| ApiError::Config(format!("client CA: {e}")))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| ApiError::Config(format!("TLS certificate and key: {e}")))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// The configuration new connections get, replaced when the files change.
#[derive(Clone)]
pub struct Rotating {
    files: TlsFiles,
    current: Arc<RwLock<(Material, Arc<ServerConfig>)>>,
}

impl Rotating {
    /// Reads the files once: a server that cannot start with them must not start.
    pub fn load(files: TlsFiles) -> Result<Self, ApiError> {
        let m = material(&files)?;
        let config = server_config(&m)?;
        Ok(Rotating {
            files,
            current: Arc::new(RwLock::new((m, config))),
        })
    }

    fn config(&self) -> Arc<ServerConfig> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .1
            .clone()
    }

    /// Reads the files again; returns true when a new configuration took
    /// effect. A half-written set of files keeps the old one until it parses.
    pub fn reload(&self) -> bool {
        let Ok(m) = material(&self.files) else {
            return false;
        };
        if self.current.read().unwrap_or_else(|e| e.into_inner()).0 == m {
            return false;
        }
        match server_config(&m) {
            Ok(config) => {
                *self.current.write().unwrap_or_else(|e| e.into_inner()) = (m, config);
                tracing::info!(
                    "TLS certificate, key or client CA changed; new connections use them"
                );
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "TLS files changed but do not load; keeping the previous ones");
                false
            }
        }
    }

    /// TLS connections from accepted TCP connections. Handshakes run
    /// concurrently, each bounded, so a slow client holds up nobody else.
    pub fn accept<S>(self, tcp: S) -> impl Stream<Item = io::Result<TlsStream<TcpStream>>>
    where
        S: Stream<Item = io::Result<TcpStream>> + Send + 'static,
    {
        const HANDSHAKE: Duration = Duration::from_secs(10);
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        tokio::spawn(async move {
            let mut tcp = std::pin::pin!(tcp);
            while let Some(conn) = tcp.next().await {
                let Ok(conn) = conn else { continue };
                let acceptor = TlsAcceptor::from(self.config());
                let tx = tx.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE, acceptor.accept(conn)).await {
                        Ok(Ok(tls)) => {
                            tx.send(Ok(tls)).await.ok();
                        }
                        Ok(Err(e)) => tracing::debug!(error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!("TLS handshake timed out"),
                    }
                });
            }
        });
        tokio_stream::wrappers::ReceiverStream::new(rx)
    }
}

/// Reads a token file: trimmed, and never empty.
pub fn read_token(path: &Path) -> Result<String, String> {
    let token = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let token = token.trim().to_string();
    if token.is_empty() {
        return Err(format!("{} is empty", path.display()));
    }
    Ok(token)
}

/// Watches the TLS files and the token file every `period` and applies
/// changes, until the server stops.
pub async fn watch_files(
    tls: Option<Rotating>,
    token_file: Option<PathBuf>,
    token: BearerToken,
    period: Duration,
) {
    let mut last_token = token_file.as_deref().and_then(|p| read_token(p).ok());
    loop {
        tokio::time::sleep(period).await;
        if let Some(tls) = &tls {
            tls.reload();
        }
        if let Some(path) = &token_file {
            match read_token(path) {
                Ok(t) if Some(&t) != last_token.as_ref() => {
                    token.set(Some(&t));
                    last_token = Some(t);
                    tracing::info!("bearer token file changed; the new token is in force");
                }
                Ok(_) => {}
                // Mid-rotation the file may be briefly missing or empty.
                Err(e) => {
                    tracing::debug!(error = %e, "token file unreadable; keeping the current token")
                }
            }
        }
    }
}
