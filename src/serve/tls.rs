//! TLS for the status API with files that rotate: cert-manager replaces the
//! certificate, key and CA in place, and the server must pick them up with
//! no restart and no dropped connection. Each new connection is accepted
//! with the configuration current at that moment; connections already open
//! keep the one they were accepted with.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::sync::watch;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{RootCertStore, ServerConfig, crypto};

use super::ServeError;
use super::tokens::BearerToken;
use crate::telemetry::metrics::METRICS;

#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// With a client CA, clients must present a certificate it signed (mTLS).
    pub client_ca: Option<PathBuf>,
}

fn read(path: &Path, what: &str) -> Result<Vec<u8>, ServeError> {
    std::fs::read(path).map_err(|e| ServeError::Config(format!("{what} {}: {e}", path.display())))
}

/// The bytes a configuration was built from, to notice a change.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Material {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

fn material(files: &TlsFiles) -> Result<Material, ServeError> {
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

/// The protocols a port offers: gRPC speaks HTTP/2 only; the dashboard
/// also serves clients and proxies that offer only HTTP/1.1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alpn {
    H2,
    H2OrHttp11,
}

/// A rustls server configuration from PEM bytes. Errors name the file's
/// role, never its contents.
fn server_config(m: &Material, alpn: Alpn) -> Result<Arc<ServerConfig>, ServeError> {
    server_config_at(m, alpn, jiff::Timestamp::now().as_second())
}

/// `server_config` as of `now` (Unix seconds).
fn server_config_at(m: &Material, alpn: Alpn, now: i64) -> Result<Arc<ServerConfig>, ServeError> {
    let bad = |what: &str| ServeError::Config(format!("{what} is not valid PEM"));
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&m.cert)
        .collect::<Result<_, _>>()
        .map_err(|_| bad("the TLS certificate"))?;
    if certs.is_empty() {
        return Err(bad("the TLS certificate"));
    }
    if let Some(why) = out_of_date(&certs[0], now) {
        return Err(ServeError::Config(format!("the TLS certificate {why}")));
    }
    let key = PrivateKeyDer::from_pem_slice(&m.key).map_err(|_| bad("the TLS key"))?;
    let provider = Arc::new(crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| ServeError::Config(format!("TLS: {e}")))?;
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
                .map_err(|e| ServeError::Config(format!("client CA: {e}")))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| ServeError::Config(format!("TLS certificate and key: {e}")))?;
    config.alpn_protocols = match alpn {
        Alpn::H2 => vec![b"h2".to_vec()],
        Alpn::H2OrHttp11 => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
    };
    Ok(Arc::new(config))
}

/// One DER element: its tag, its content, and what follows it.
fn der(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |a, b| (a << 8) | usize::from(*b));
        (len, &rest[n..])
    };
    (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
}

/// An X.509 time (UTCTime or GeneralizedTime, in UTC) as Unix seconds.
fn x509_time(tag: u8, value: &[u8]) -> Option<i64> {
    let text = std::str::from_utf8(value).ok()?.strip_suffix('Z')?;
    let (year, rest) = match tag {
        0x17 => {
            let yy: i16 = text.get(..2)?.parse().ok()?;
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, text.get(2..)?)
        }
        0x18 => (text.get(..4)?.parse().ok()?, text.get(4..)?),
        _ => return None,
    };
    let two = |i: usize| rest.get(i..i + 2)?.parse::<i8>().ok();
    let at =
        jiff::civil::DateTime::new(year, two(0)?, two(2)?, two(4)?, two(6)?, two(8)?, 0).ok()?;
    Some(
        at.to_zoned(jiff::tz::TimeZone::UTC)
            .ok()?
            .timestamp()
            .as_second(),
    )
}

/// The certificate's notBefore and notAfter, as Unix seconds.
fn validity(cert: &[u8]) -> Option<(i64, i64)> {
    let (0x30, cert, _) = der(cert)? else {
        return None;
    };
    let (0x30, tbs, _) = der(cert)? else {
        return None;
    };
    let mut rest = tbs;
    // [0] version, when present; then serial, signature and issuer.
    if rest.first() == Some(&0xa0) {
        rest = der(rest)?.2;
    }
    for _ in 0..3 {
        rest = der(rest)?.2;
    }
    let (0x30, times, _) = der(rest)? else {
        return None;
    };
    let (t1, not_before, rest) = der(times)?;
    let (t2, not_after, _) = der(rest)?;
    Some((x509_time(t1, not_before)?, x509_time(t2, not_after)?))
}

/// When the material's serving certificate expires (Unix seconds), for the
/// expiry gauge; None when it does not parse (it then never serves).
fn expires(m: &Material) -> Option<i64> {
    let first = CertificateDer::pem_slice_iter(&m.cert).next()?.ok()?;
    validity(&first).map(|(_, until)| until)
}

/// Why a certificate cannot serve at `now`, if it cannot: rotated files
/// that hold an expired or not-yet-valid certificate keep the previous one.
fn out_of_date(cert: &[u8], now: i64) -> Option<&'static str> {
    match validity(cert) {
        None => Some("has no validity period that parses"),
        Some((from, _)) if now < from => Some("is not valid yet"),
        Some((_, until)) if now > until => Some("has expired"),
        Some(_) => None,
    }
}

/// The configuration new connections get, replaced when the files change.
#[derive(Clone)]
pub struct Rotating {
    files: TlsFiles,
    alpn: Alpn,
    current: Arc<RwLock<(Material, Arc<ServerConfig>)>>,
    /// Files that changed and were refused, so each bad set is counted once.
    refused: Arc<RwLock<Option<Material>>>,
    /// Counts new configurations: a new client CA ends what the old one admitted.
    changed: watch::Sender<u64>,
}

impl Rotating {
    /// Reads the files once: a server that cannot start with them must not start.
    pub fn load(files: TlsFiles, alpn: Alpn) -> Result<Self, ServeError> {
        let m = material(&files)?;
        let config = server_config(&m, alpn)?;
        if let Some(until) = expires(&m) {
            METRICS.tls_certificate_expiry.set(&[], until as f64);
        }
        Ok(Rotating {
            files,
            alpn,
            current: Arc::new(RwLock::new((m, config))),
            refused: Arc::new(RwLock::new(None)),
            changed: watch::Sender::new(0),
        })
    }

    /// Changes each time a new configuration takes effect.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    pub fn config(&self) -> Arc<ServerConfig> {
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
        let mut refused = self.refused.write().unwrap_or_else(|e| e.into_inner());
        if refused.as_ref() == Some(&m) {
            return false;
        }
        match server_config(&m, self.alpn) {
            Ok(config) => {
                if let Some(until) = expires(&m) {
                    METRICS.tls_certificate_expiry.set(&[], until as f64);
                }
                *self.current.write().unwrap_or_else(|e| e.into_inner()) = (m, config);
                *refused = None;
                self.changed.send_modify(|n| *n += 1);
                tracing::info!(
                    "TLS certificate, key or client CA changed; new connections use them"
                );
                true
            }
            Err(e) => {
                *refused = Some(m);
                METRICS.tls_reload_errors_total.inc(&[]);
                tracing::warn!(error = %e, "TLS files changed but do not load; keeping the previous ones");
                false
            }
        }
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

/// Puts the token in `path` in force when it differs from the one in
/// force (not from the file's last read: a file that changed between the
/// start-up read and the first check still takes effect). Returns whether
/// it changed. Mid-rotation the file may be briefly missing or empty: the
/// current token stays.
pub fn apply_token_file(path: &Path, token: &BearerToken) -> bool {
    match read_token(path) {
        Ok(t) if !token.accepts(&t) => {
            token.set(Some(&t));
            tracing::info!(file = %path.display(), "token file changed; the new token is in force");
            true
        }
        Ok(_) => false,
        Err(e) => {
            tracing::debug!(error = %e, "token file unreadable; keeping the current token");
            false
        }
    }
}

/// The token files to watch, each with the token it feeds (unset ones
/// are skipped).
pub fn token_files(pairs: [(&Option<PathBuf>, &BearerToken); 2]) -> Vec<(PathBuf, BearerToken)> {
    pairs
        .into_iter()
        .filter_map(|(file, token)| Some((file.clone()?, token.clone())))
        .collect()
}

/// What a stream is admitted under, as change signals: the tokens and
/// the TLS files (`streams::Revocation`).
pub fn changes(tokens: &[&BearerToken], tls: Option<&Rotating>) -> Vec<watch::Receiver<u64>> {
    let mut out: Vec<_> = tokens.iter().map(|t| t.subscribe()).collect();
    out.extend(tls.map(Rotating::subscribe));
    out
}

/// How often files are read again: rotations take effect within this.
pub const RELOAD_PERIOD: Duration = Duration::from_secs(2);

/// Watches the TLS files and each token file every `period` and applies
/// changes, until the task is dropped.
pub async fn watch_files(
    tls: Option<Rotating>,
    tokens: Vec<(PathBuf, BearerToken)>,
    period: Duration,
) {
    loop {
        tokio::time::sleep(period).await;
        if let Some(tls) = &tls {
            tls.reload();
        }
        for (path, token) in &tokens {
            apply_token_file(path, token);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A self-signed P-256 certificate valid 2026-12-01T22:34:53Z to
    /// 2036-11-28T22:34:53Z, and its key.
    const CERT: &str = "-----BEGIN CERTIFICATE-----\nMIIBhTCCASugAwIBAgIUDXG1cy6jE8nE/Nves3MhlBILuIwwCgYIKoZIzj0EAwIw\nGDEWMBQGA1UEAwwNZmxvdGlsbGEtdGVzdDAeFw0yNjEyMDEyMjM0NTNaFw0zNjEx\nMjgyMjM0NTNaMBgxFjAUBgNVBAMMDWZsb3RpbGxhLXRlc3QwWTATBgcqhkjOPQIB\nBggqhkjOPQMBBwNCAAQC0guYC7owq0E+/BFu0LMpe6I+zAB3LE2b6R/eq49hpl03\nmGmJkEJXD98mVMWHXxDa1dG4BcVZcenz1CUJEnobo1MwUTAdBgNVHQ4EFgQUq8et\nxfWP8jr99JUQHnBNUvSdxuEwHwYDVR0jBBgwFoAUq8etxfWP8jr99JUQHnBNUvSd\nxuEwDwYDVR0TAQH/BAUwAwEB/zAKBggqhkjOPQQDAgNIADBFAiEA2WRpxx2WSEs5\nYgqPg08+Ta1827z2EvAknePkUtp3kjcCIDrMESQLkzijK9sw/ShZoY4R1PHhivV9\n51a1+XKV/yzD\n-----END CERTIFICATE-----\n";
    const KEY: &str = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgzPziP1N/YcqHOU+Y\n+lDh44ysSKH0QbgKH8jwz0hsRBKhRANCAAQC0guYC7owq0E+/BFu0LMpe6I+zAB3\nLE2b6R/eq49hpl03mGmJkEJXD98mVMWHXxDa1dG4BcVZcenz1CUJEnob\n-----END PRIVATE KEY-----\n";

    #[test]
    fn a_certificate_serves_only_inside_its_validity_period() {
        let der = CertificateDer::pem_slice_iter(CERT.as_bytes())
            .next()
            .unwrap()
            .unwrap();
        let (from, until) = validity(&der).unwrap();
        let at = |t: &str| t.parse::<jiff::Timestamp>().unwrap().as_second();
        assert_eq!(
            (from, until),
            (at("2026-12-01T22:34:53Z"), at("2036-11-28T22:34:53Z"))
        );
        assert_eq!(out_of_date(&der, from + 1), None);
        // The expiry gauge reads the same notAfter from the PEM files.
        let pem = Material {
            cert: CERT.as_bytes().to_vec(),
            key: KEY.as_bytes().to_vec(),
            client_ca: None,
        };
        assert_eq!(expires(&pem), Some(until));
        assert_eq!(out_of_date(&der, until + 1), Some("has expired"));
        assert_eq!(out_of_date(&der, from - 1), Some("is not valid yet"));
        assert_eq!(
            out_of_date(b"not der", from),
            Some("has no validity period that parses")
        );
        // In force now: the whole configuration builds.
        let m = Material {
            cert: CERT.as_bytes().to_vec(),
            key: KEY.as_bytes().to_vec(),
            client_ca: None,
        };
        let expired = server_config_at(&m, Alpn::H2, until + 1).err().unwrap();
        assert!(expired.to_string().contains("has expired"), "{expired}");
        let page = server_config(&m, Alpn::H2OrHttp11).unwrap();
        assert_eq!(page.alpn_protocols, [b"h2".to_vec(), b"http/1.1".to_vec()]);
        assert_eq!(
            server_config(&m, Alpn::H2).unwrap().alpn_protocols,
            [b"h2".to_vec()]
        );
    }

    #[test]
    fn changed_files_that_do_not_load_keep_the_old_ones_and_are_counted_once() {
        let dir = std::env::temp_dir().join(format!("flotilla-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let files = TlsFiles {
            cert: dir.join("tls.crt"),
            key: dir.join("tls.key"),
            client_ca: None,
        };
        std::fs::write(&files.cert, CERT).unwrap();
        std::fs::write(&files.key, KEY).unwrap();
        let tls = Rotating::load(files.clone(), Alpn::H2).unwrap();
        let before = tls.config();
        let errors = || {
            METRICS
                .encode()
                .lines()
                .find_map(|l| {
                    l.strip_prefix("flotilla_tls_reload_errors_total ")?
                        .parse::<f64>()
                        .ok()
                })
                .unwrap_or(0.0)
        };
        let counted = errors();
        std::fs::write(
            &files.cert,
            "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        assert!(!tls.reload());
        assert!(!tls.reload(), "the same bad files again");
        assert!(
            Arc::ptr_eq(&before, &tls.config()),
            "the old configuration stays"
        );
        assert_eq!(errors(), counted + 1.0);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[tokio::test(start_paused = true)]
    async fn read_and_write_tokens_rotate_within_the_period_even_if_changed_before_the_watch() {
        let dir = std::env::temp_dir().join(format!("flotilla-tok-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (r, w) = (dir.join("read"), dir.join("write"));
        std::fs::write(&r, "read-1").unwrap();
        std::fs::write(&w, "write-1").unwrap();
        // Read at start-up; then both files change before the watcher runs.
        let read = BearerToken::new(Some(&read_token(&r).unwrap()));
        let write = BearerToken::new(Some(&read_token(&w).unwrap()));
        std::fs::write(&r, "read-2\n").unwrap();
        std::fs::write(&w, "write-2").unwrap();
        let task = tokio::spawn(watch_files(
            None,
            vec![(r.clone(), read.clone()), (w.clone(), write.clone())],
            RELOAD_PERIOD,
        ));
        tokio::time::sleep(RELOAD_PERIOD + Duration::from_millis(100)).await;
        assert!(read.accepts("read-2") && !read.accepts("read-1"));
        assert!(write.accepts("write-2") && !write.accepts("write-1"));
        // Emptied mid-rotation: the token in force stays.
        std::fs::write(&w, "").unwrap();
        tokio::time::sleep(RELOAD_PERIOD).await;
        assert!(write.accepts("write-2"));
        task.abort();
        std::fs::remove_dir_all(&dir).ok();
    }
}
