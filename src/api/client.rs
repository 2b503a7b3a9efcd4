//! A FleetStatus client for the CLI and for tests: TLS with a CA (and a
//! client certificate for mTLS), or plaintext for http:// addresses, and
//! the bearer token on every call.

use std::path::PathBuf;
use std::time::Duration;

use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Request, Status};

use super::pb::fleet_rollouts_client::FleetRolloutsClient;
use super::pb::fleet_status_client::FleetStatusClient;

#[derive(Debug, Clone, Default)]
pub struct ClientOptions {
    /// `http://host:port` (plaintext) or `https://host:port`.
    pub server: String,
    pub ca: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// The name the server certificate must carry, when not the host.
    pub tls_server_name: Option<String>,
    pub token: Option<String>,
}

#[derive(Clone)]
pub struct AttachToken(Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>);

impl Interceptor for AttachToken {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(v) = &self.0 {
            request.metadata_mut().insert("authorization", v.clone());
        }
        Ok(request)
    }
}

pub type Client = FleetStatusClient<InterceptedService<Channel, AttachToken>>;

fn read(path: &PathBuf, what: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{what} {}: {e}", path.display()))
}

async fn channel(o: &ClientOptions) -> Result<(Channel, AttachToken), String> {
    let mut endpoint = Endpoint::from_shared(o.server.clone())
        .map_err(|e| format!("server address {:?}: {e}", o.server))?
        .connect_timeout(Duration::from_secs(5))
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_while_idle(true);
    if o.server.starts_with("https://") {
        let mut tls = ClientTlsConfig::new();
        match &o.ca {
            Some(ca) => tls = tls.ca_certificate(Certificate::from_pem(read(ca, "CA")?)),
            None => return Err("an https:// server needs --ca".into()),
        }
        if let (Some(cert), Some(key)) = (&o.cert, &o.key) {
            tls = tls.identity(Identity::from_pem(
                read(cert, "client certificate")?,
                read(key, "client key")?,
            ));
        }
        if let Some(name) = &o.tls_server_name {
            tls = tls.domain_name(name.clone());
        }
        endpoint = endpoint.tls_config(tls).map_err(|e| format!("TLS: {e}"))?;
    }
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| format!("cannot reach {}: {e}", o.server))?;
    let token = match &o.token {
        Some(t) => Some(
            format!("Bearer {}", t.trim())
                .parse()
                .map_err(|_| "the token is not a valid header value".to_string())?,
        ),
        None => None,
    };
    Ok((channel, AttachToken(token)))
}

pub async fn connect(o: &ClientOptions) -> Result<Client, String> {
    let (channel, token) = channel(o).await?;
    Ok(FleetStatusClient::with_interceptor(channel, token)
        .max_decoding_message_size(64 * 1024 * 1024))
}

pub type RolloutsClient = FleetRolloutsClient<InterceptedService<Channel, AttachToken>>;

pub async fn connect_rollouts(o: &ClientOptions) -> Result<RolloutsClient, String> {
    let (channel, token) = channel(o).await?;
    Ok(FleetRolloutsClient::with_interceptor(channel, token)
        .max_decoding_message_size(64 * 1024 * 1024))
}
