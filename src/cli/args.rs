//! The command line: every command and flag, parsed by clap.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

use super::parse_duration;

/// Whole seconds, at least one, as Kubernetes takes progressDeadlineSeconds.
fn parse_progress_deadline(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < Duration::from_secs(1) || d.subsec_nanos() != 0 || d.as_secs() > i32::MAX as u64 {
        return Err(format!(
            "{s:?}: the progress deadline is whole seconds, at least 1s"
        ));
    }
    Ok(d)
}

/// A probe path: absolute, printable ASCII, no spaces, as an HTTP request
/// line needs it.
fn parse_probe_path(s: &str) -> Result<String, String> {
    let ok = s.starts_with('/') && s.len() <= 256 && s.bytes().all(|b| b.is_ascii_graphic());
    if ok {
        Ok(s.to_string())
    } else {
        Err(format!(
            "{s:?}: a probe path starts with '/' and has no spaces or control characters"
        ))
    }
}

/// A resource quantity as requests take it: a decimal number and an
/// optional suffix (m, k, M, G, T, Ki, Mi, Gi, Ti).
fn parse_quantity(s: &str) -> Result<String, String> {
    let digits = s.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let suffix = &s[digits.len()..];
    let number_ok = !digits.is_empty()
        && digits.split('.').count() <= 2
        && digits
            .split('.')
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    let suffix_ok = ["", "m", "k", "M", "G", "T", "Ki", "Mi", "Gi", "Ti"].contains(&suffix);
    if number_ok && suffix_ok {
        Ok(s.to_string())
    } else {
        Err(format!(
            "{s:?} is not a resource quantity (e.g. 25m, 128Mi)"
        ))
    }
}

/// An address, or none when empty: a server the environment can turn off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OptionalAddr(pub Option<std::net::SocketAddr>);

fn parse_optional_addr(s: &str) -> Result<OptionalAddr, String> {
    let s = s.trim();
    if s.is_empty() {
        return Ok(OptionalAddr(None));
    }
    s.parse()
        .map(|a| OptionalAddr(Some(a)))
        .map_err(|e| format!("{s:?}: {e}"))
}

use crate::fleet::client_budget::Budget;

#[derive(Parser)]
#[command(
    name = "flotilla",
    version,
    about = "Multi-cluster fleet operator for Microservices"
)]
pub struct Cli {
    /// Log format.
    #[arg(
        long,
        value_enum,
        default_value = "text",
        env = "FLOTILLA_LOG_FORMAT",
        global = true
    )]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum CrdKind {
    Microservice,
    Fleet,
}

#[derive(Subcommand)]
pub enum Command {
    /// Print a CRD as YAML: the member clusters' Microservice (the default)
    /// or the home cluster's FleetMicroservice (`flotilla crd fleet`).
    Crd {
        #[arg(value_enum, default_value = "microservice")]
        kind: CrdKind,
        /// A markdown field reference instead (docs/crd-*.md).
        #[arg(long)]
        reference: bool,
    },
    /// Run the operator.
    Run(Box<RunArgs>),
    /// List the member clusters, as a replica sees them.
    Clusters(RemoteArgs),
    /// Show Microservices across the fleet: one (NAMESPACE/NAME) or all.
    Status(StatusArgs),
    /// Wait until a rollout is done in every cluster. Exit codes: 0 done,
    /// 1 failed in some cluster, 2 timed out, 3 could not ask, 64 usage error.
    Wait(WaitArgs),
    /// FleetMicroservice rollouts: status, history, wait, pause, resume,
    /// undo, approve. `rollout wait` exits 0 Complete, 1 RolledBack or Failed,
    /// 2 timed out, 3 could not ask.
    Rollout(RolloutArgs),
    /// Show a Microservice's fleet-wide DNS name: the clusters it answers
    /// and why each is in or out. Exit codes: 0 shown, 3 could not ask.
    Dns(ObjectArgs),
    /// Show where a FleetMicroservice with numberOfClusters runs: each
    /// cluster's role and why, and the last failovers. Exit codes: 0
    /// shown, 3 could not ask.
    Placement(ObjectArgs),
    /// Register or deregister a member cluster (`cluster add`, `cluster
    /// remove`), writing to the member and the home cluster directly.
    Cluster(super::cluster::ClusterArgs),
}

/// A command about one object of the fleet.
#[derive(clap::Args)]
pub struct ObjectArgs {
    /// NAMESPACE/NAME.
    pub target: String,
    #[command(flatten)]
    pub remote: RemoteArgs,
}

#[derive(clap::Args)]
pub struct RemoteArgs {
    /// A replica's gRPC address: http://HOST:PORT (plaintext) or
    /// https://HOST:PORT; several, comma-separated, are tried in turn.
    #[arg(
        long,
        env = "FLOTILLA_SERVER",
        default_value = "http://127.0.0.1:50051"
    )]
    pub server: String,
    /// CA that signed the server's certificate (https).
    #[arg(long, env = "FLOTILLA_CA")]
    pub ca: Option<PathBuf>,
    /// Client certificate and key, for servers that require mTLS.
    #[arg(long, env = "FLOTILLA_CERT", requires = "key")]
    pub cert: Option<PathBuf>,
    #[arg(long, env = "FLOTILLA_KEY", requires = "cert")]
    pub key: Option<PathBuf>,
    /// The name the server certificate carries, when it is not the host.
    #[arg(long, env = "FLOTILLA_TLS_SERVER_NAME")]
    pub tls_server_name: Option<String>,
    /// A file holding the bearer token.
    #[arg(long, env = "FLOTILLA_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    pub output: OutputFormat,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum OutputFormat {
    Table,
    Json,
}

#[derive(clap::Args)]
pub struct StatusArgs {
    /// NAMESPACE/NAME; all Microservices when omitted.
    pub target: Option<String>,
    /// Only this namespace (when listing).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// Only Microservices matching this label selector (when listing).
    #[arg(short = 'l', long)]
    pub selector: Option<String>,
    #[command(flatten)]
    pub remote: RemoteArgs,
}

#[derive(clap::Args)]
pub struct RolloutArgs {
    #[command(subcommand)]
    pub action: RolloutAction,
}

#[derive(Subcommand)]
pub enum RolloutAction {
    /// Phase, waves and each cluster's state.
    Status(RolloutTarget),
    /// The stored revisions, newest first.
    History(RolloutTarget),
    /// Wait until the rollout of the current spec ends.
    Wait(RolloutWaitArgs),
    /// Stop writing to members (spec.paused); needs the write token.
    Pause(RolloutTarget),
    /// Continue a paused rollout; needs the write token.
    Resume(RolloutTarget),
    /// Put a stored revision back into the spec; needs the write token.
    Undo(RolloutUndoArgs),
    /// Let a Manual wave start for one revision; needs the write token (or
    /// the RBAC verb `approve`).
    Approve(RolloutApproveArgs),
}

#[derive(clap::Args)]
pub struct RolloutTarget {
    /// NAMESPACE/NAME of the FleetMicroservice.
    pub target: String,
    #[command(flatten)]
    pub remote: RemoteArgs,
}

#[derive(clap::Args)]
pub struct RolloutWaitArgs {
    /// NAMESPACE/NAME of the FleetMicroservice.
    pub target: String,
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub timeout: Duration,
    #[command(flatten)]
    pub remote: RemoteArgs,
}

#[derive(clap::Args)]
pub struct RolloutUndoArgs {
    /// NAMESPACE/NAME of the FleetMicroservice.
    pub target: String,
    /// The revision number; by default the last good one (or the one
    /// before the current one).
    #[arg(long, default_value_t = 0)]
    pub to_revision: i64,
    #[command(flatten)]
    pub remote: RemoteArgs,
}

#[derive(clap::Args)]
pub struct RolloutApproveArgs {
    /// NAMESPACE/NAME of the FleetMicroservice.
    pub target: String,
    /// The wave to approve.
    #[arg(long)]
    pub wave: String,
    /// The revision (name or number) it is approved for; by default the
    /// update revision the status shows now. An approval opens that
    /// revision's wave only.
    #[arg(long, default_value = "")]
    pub revision: String,
    #[command(flatten)]
    pub remote: RemoteArgs,
}

#[derive(clap::Args)]
pub struct WaitArgs {
    /// NAMESPACE/NAME
    pub target: String,
    /// Done when this image is in the spec and that generation is Available.
    #[arg(
        long,
        conflicts_with = "generation",
        required_unless_present = "generation"
    )]
    pub image: Option<String>,
    /// Done when each cluster's generation is observed and Available:
    /// alone, the generation each cluster has when the wait starts; N, at
    /// least N everywhere; CLUSTER=N (repeatable), at least N there.
    #[arg(
        long,
        num_args = 0..=1,
        default_missing_value = "current",
        action = clap::ArgAction::Append,
        value_parser = super::wait::parse_generation
    )]
    pub generation: Vec<super::wait::GenerationArg>,
    /// Only these clusters (repeatable); every cluster that has it by default.
    #[arg(long = "cluster")]
    pub clusters: Vec<String>,
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub timeout: Duration,
    #[command(flatten)]
    pub remote: RemoteArgs,
}

#[derive(clap::Args)]
pub struct RunArgs {
    /// Fleet mode with member clusters from labelled Secrets only (no directory).
    #[arg(long, env = "FLOTILLA_FLEET")]
    pub fleet: bool,
    /// Fleet mode: a directory of member kubeconfigs, one file per cluster, watched live.
    /// Secrets labelled platform.example.io/member-cluster=true in the home namespace are read too.
    #[arg(long, env = "FLOTILLA_KUBECONFIG_DIR", conflicts_with = "kubeconfig")]
    pub kubeconfig_dir: Option<PathBuf>,
    /// Fleet mode: kubeconfig of the home cluster (heartbeats); in-cluster or $KUBECONFIG when omitted.
    #[arg(long, env = "FLOTILLA_HOME_KUBECONFIG")]
    pub home_kubeconfig: Option<PathBuf>,
    /// Fleet mode: the operator's namespace in the home cluster.
    #[arg(
        long,
        env = "FLOTILLA_HOME_NAMESPACE",
        default_value = "flotilla-system"
    )]
    pub home_namespace: String,
    /// Fleet mode: where labelled member Secrets are read in the home
    /// cluster; empty: --home-namespace. Give them a namespace of their own
    /// (the manifests use flotilla-members), so the operator's right to list
    /// them reaches no other Secret.
    #[arg(long, env = "FLOTILLA_MEMBER_SECRETS_NAMESPACE", default_value = "")]
    pub member_secrets_namespace: String,
    /// Fleet mode: names the per-cluster Lease `flotilla-<fleet-name>`.
    #[arg(long, env = "FLOTILLA_FLEET_NAME", default_value = "default")]
    pub fleet_name: String,
    /// Fleet mode: where each member cluster's Lease lives.
    #[arg(
        long,
        env = "FLOTILLA_LEASE_NAMESPACE",
        default_value = "flotilla-system"
    )]
    pub lease_namespace: String,
    #[arg(long, env = "FLOTILLA_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    pub lease_duration: Duration,
    #[arg(long, env = "FLOTILLA_RENEW_DEADLINE", default_value = "10s", value_parser = parse_duration)]
    pub renew_deadline: Duration,
    #[arg(long, env = "FLOTILLA_RETRY_PERIOD", default_value = "2s", value_parser = parse_duration)]
    pub retry_period: Duration,
    /// A replica that does not own a cluster contests it once its Lease has been free this long.
    #[arg(long, env = "FLOTILLA_TAKEOVER_GRACE", default_value = "5s", value_parser = parse_duration)]
    pub takeover_grace: Duration,
    /// Fleet rollouts: the longest one member call of the rollout writer may
    /// take (a read before a write included); a member that does not answer
    /// fails that write, and only its own rollouts wait on it.
    #[arg(long, env = "FLOTILLA_MEMBER_WRITE_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub member_write_timeout: Duration,
    /// Fleet rollouts: where webhook checks' `headersFrom` Secrets are read
    /// in the home cluster (the manifests use flotilla-analysis); empty:
    /// `headersFrom` is refused. Each Secret names the namespaces it is for
    /// (annotation platform.example.io/analysis-for).
    #[arg(long, env = "FLOTILLA_ANALYSIS_SECRETS_NAMESPACE", default_value = "")]
    pub analysis_secrets_namespace: String,
    /// Where analysis checks (webhooks, Prometheus) may call, repeatable: a
    /// host, host:port or URL prefix (https://host/path). Any other
    /// destination is an InvalidSpec and is never called; none: no check
    /// may call anywhere.
    #[arg(
        long = "egress-allow",
        env = "FLOTILLA_EGRESS_ALLOW",
        value_delimiter = ','
    )]
    pub egress_allow: Vec<String>,
    /// Single-cluster mode: kubeconfig of the cluster to reconcile; in-cluster or $KUBECONFIG when omitted.
    #[arg(long, env = "FLOTILLA_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Name of the cluster, for logs and spans.
    #[arg(long, env = "FLOTILLA_CLUSTER_NAME", default_value = "default")]
    pub cluster_name: String,
    /// Reconcile one namespace only.
    #[arg(long, env = "FLOTILLA_NAMESPACE")]
    pub namespace: Option<String>,
    /// Safety-net resync period; watches repair drift long before it.
    #[arg(long, env = "FLOTILLA_RESYNC", default_value = "5m", value_parser = parse_duration)]
    pub resync: Duration,
    /// The platform's OTLP collector, set on every workload.
    #[arg(
        long,
        env = "FLOTILLA_WORKLOAD_OTLP_ENDPOINT",
        default_value = "http://otel-collector.observability.svc:4317"
    )]
    pub workload_otlp_endpoint: String,
    /// The readiness probe's HTTP path on every workload's port (the
    /// workload contract, docs/reference.md).
    #[arg(long, env = "FLOTILLA_WORKLOAD_READINESS_PATH", default_value = "/health/ready", value_parser = parse_probe_path)]
    pub workload_readiness_path: String,
    /// The liveness probe's HTTP path on every workload's port.
    #[arg(long, env = "FLOTILLA_WORKLOAD_LIVENESS_PATH", default_value = "/health/live", value_parser = parse_probe_path)]
    pub workload_liveness_path: String,
    /// Every workload container's CPU request.
    #[arg(long, env = "FLOTILLA_WORKLOAD_CPU_REQUEST", default_value = "25m", value_parser = parse_quantity)]
    pub workload_cpu_request: String,
    /// Every workload container's memory request.
    #[arg(long, env = "FLOTILLA_WORKLOAD_MEMORY_REQUEST", default_value = "128Mi", value_parser = parse_quantity)]
    pub workload_memory_request: String,
    /// The Deployments' progressDeadlineSeconds: a rollout that makes no
    /// progress for this long is Failed (ProgressDeadlineExceeded).
    #[arg(long, env = "FLOTILLA_PROGRESS_DEADLINE", default_value = "10m", value_parser = parse_progress_deadline)]
    pub progress_deadline: Duration,
    /// Start watches with streaming lists (WatchList, Kubernetes 1.32+), so
    /// starting or restarting sends no LIST requests. Set false for older clusters.
    #[arg(long, env = "FLOTILLA_STREAMING_LISTS", default_value_t = true, action = clap::ArgAction::Set)]
    pub streaming_lists: bool,
    /// Wait until a Microservice's triggers have been quiet this long before
    /// reconciling it, so a burst of child events is one reconcile. Every
    /// change waits this much longer to be applied.
    #[arg(long, env = "FLOTILLA_DEBOUNCE", default_value = "200ms", value_parser = parse_duration)]
    pub debounce: Duration,
    /// The longest a storm of child events may keep deferring a
    /// Microservice's reconcile (the debounce restarts on every event).
    #[arg(long, env = "FLOTILLA_DEBOUNCE_MAX", default_value = "1s", value_parser = parse_duration)]
    pub debounce_max: Duration,
    /// Fleet mode: average requests per second to each member cluster.
    #[arg(long, env = "FLOTILLA_CLUSTER_QPS", default_value_t = Budget::default().qps)]
    pub cluster_qps: f64,
    /// Fleet mode: requests each member cluster may get at once after a quiet spell.
    #[arg(long, env = "FLOTILLA_CLUSTER_BURST", default_value_t = Budget::default().burst)]
    pub cluster_burst: u32,
    /// Fleet mode: where the gRPC status API listens.
    #[arg(long, env = "FLOTILLA_GRPC_ADDR", default_value = "0.0.0.0:50051")]
    pub grpc_addr: std::net::SocketAddr,
    /// The server certificate and key (PEM) for gRPC over TLS.
    #[arg(long, env = "FLOTILLA_GRPC_TLS_CERT", requires = "grpc_tls_key")]
    pub grpc_tls_cert: Option<PathBuf>,
    #[arg(long, env = "FLOTILLA_GRPC_TLS_KEY", requires = "grpc_tls_cert")]
    pub grpc_tls_key: Option<PathBuf>,
    /// Require client certificates signed by this CA (mTLS).
    #[arg(long, env = "FLOTILLA_GRPC_CLIENT_CA", requires = "grpc_tls_cert")]
    pub grpc_client_ca: Option<PathBuf>,
    /// Require `authorization: Bearer <token>` with the token in this file.
    #[arg(long, env = "FLOTILLA_GRPC_TOKEN_FILE")]
    pub grpc_token_file: Option<PathBuf>,
    /// Rollout mutations (pause, resume, undo) need this token; without
    /// it they are refused. Reads accept it too.
    #[arg(long, env = "FLOTILLA_GRPC_WRITE_TOKEN_FILE")]
    pub grpc_write_token_file: Option<PathBuf>,
    /// Serve gRPC in plaintext (local development only).
    #[arg(long, env = "FLOTILLA_GRPC_INSECURE")]
    pub grpc_insecure: bool,
    /// Serve gRPC server reflection.
    #[arg(long, env = "FLOTILLA_GRPC_REFLECTION")]
    pub grpc_reflection: bool,
    /// Bearer tokens other than --grpc-token-file's and
    /// --grpc-write-token-file's are Kubernetes tokens (ServiceAccount,
    /// OIDC): each is checked with a TokenReview, and every call with a
    /// SubjectAccessReview, against the home cluster's RBAC.
    #[arg(long, env = "FLOTILLA_GRPC_KUBE_AUTH")]
    pub grpc_kube_auth: bool,
    /// The longest a WaitForRollout call may run.
    #[arg(long, env = "FLOTILLA_GRPC_MAX_WAIT", default_value = "1h", value_parser = parse_duration)]
    pub grpc_max_wait: Duration,
    /// Watch and wait streams this replica serves at once; more are refused
    /// with RESOURCE_EXHAUSTED.
    #[arg(long, env = "FLOTILLA_GRPC_MAX_STREAMS", default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    pub grpc_max_streams: u32,
    /// The most one ListMicroservices page holds, encoded: a page then has
    /// fewer items than asked, and a next_page_token. At least one item.
    #[arg(long, env = "FLOTILLA_GRPC_MAX_PAGE_BYTES", default_value_t = 256 * 1024, value_parser = clap::value_parser!(u32).range(1024..))]
    pub grpc_max_page_bytes: u32,
    /// The most every List reply not yet read by its client holds at once,
    /// encoded: each call reserves --grpc-max-page-bytes of it before it
    /// builds its page, keeps what the built page holds until it is sent,
    /// and one that finds no room within 5 s is refused with
    /// RESOURCE_EXHAUSTED.
    #[arg(long, env = "FLOTILLA_GRPC_MAX_LIST_BYTES_IN_FLIGHT", default_value_t = 16 * 1024 * 1024, value_parser = clap::value_parser!(u32).range(1024..))]
    pub grpc_max_list_bytes_in_flight: u32,
    /// The most of that the replies of one client connection hold at once,
    /// so that a client that leaves its replies unread holds at most this
    /// much; its next List waits, then is refused, while others' answer.
    #[arg(long, env = "FLOTILLA_GRPC_MAX_LIST_BYTES_PER_CONNECTION", default_value_t = 2 * 1024 * 1024, value_parser = clap::value_parser!(u32).range(1024..))]
    pub grpc_max_list_bytes_per_connection: u32,
    /// A watch stream's longest life: it then ends UNAVAILABLE and the client
    /// resumes, so long-lived streams spread over replicas.
    #[arg(long, env = "FLOTILLA_GRPC_MAX_STREAM_AGE", default_value = "30m", value_parser = parse_duration)]
    pub grpc_max_stream_age: Duration,
    /// Fleet mode: where the dashboard is served (HTTP, or HTTPS with
    /// --grpc-tls-cert); empty turns it off. Its token is --grpc-token-file's,
    /// and --grpc-max-streams caps its open event streams too.
    #[arg(long, env = "FLOTILLA_UI_ADDR", default_value = "", value_parser = parse_optional_addr)]
    pub ui_addr: OptionalAddr,
    /// Serve the dashboard in plaintext without a token (local development
    /// only). Such a page answers only to localhost, 127.0.0.1 and
    /// --ui-allowed-hosts.
    #[arg(long, env = "FLOTILLA_UI_INSECURE")]
    pub ui_insecure: bool,
    /// Host names (no port) an open dashboard answers to besides loopback
    /// ones; comma-separated.
    #[arg(long, env = "FLOTILLA_UI_ALLOWED_HOSTS", value_delimiter = ',')]
    pub ui_allowed_hosts: Vec<String>,
    /// Dashboard event streams one session, token or (open page) address
    /// may hold at once; more are refused with 429.
    #[arg(long, env = "FLOTILLA_UI_MAX_STREAMS_PER_CLIENT", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
    pub ui_max_streams_per_client: u32,
    /// Open connections per port (gRPC, dashboard) before authentication;
    /// further clients wait in the listen backlog.
    #[arg(long, env = "FLOTILLA_MAX_CONNECTIONS", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,
    /// Fleet mode: where /metrics, /healthz and /readyz are served.
    #[arg(long, env = "FLOTILLA_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub metrics_addr: std::net::SocketAddr,
    /// This replica's identity, stamped on every write and used as the
    /// Lease holder. Fleet mode requires it, here or as POD_NAME, since
    /// replicas that share an identity would each take a Lease as their own.
    #[arg(long, env = "FLOTILLA_REPLICA_ID")]
    pub replica_id: Option<String>,
    /// Fleet mode: where member apiservers may be, as CIDRs (10.0.0.0/8),
    /// addresses or DNS names (each admits the names below it),
    /// comma-separated; a kubeconfig (file or Secret) whose server is
    /// elsewhere is Invalid and never contacted. Empty: anywhere.
    #[arg(long, env = "FLOTILLA_MEMBER_SERVER_ALLOW", value_delimiter = ',')]
    pub member_server_allow: Vec<String>,
    /// Fleet mode: let kubeconfig files (never Secrets) run exec and
    /// auth-provider credential plugins.
    #[arg(long, env = "FLOTILLA_ALLOW_EXEC_KUBECONFIGS")]
    pub allow_exec_kubeconfigs: bool,
    #[command(flatten)]
    pub registry: RegistryArgs,
}

/// The fleet service registry (etcd, served by CoreDNS's etcd plugin).
/// Off unless endpoints are given; turning it off releases every
/// Microservice's registry finalizer, and the sweep removes the records
/// left behind once it is on again.
#[derive(clap::Args, Debug, Clone)]
pub struct RegistryArgs {
    /// etcd endpoints of the registry, comma-separated (http:// or https://).
    #[arg(
        long = "registry-etcd-endpoints",
        env = "FLOTILLA_REGISTRY_ETCD_ENDPOINTS",
        value_delimiter = ','
    )]
    pub endpoints: Vec<String>,
    /// The DNS zone the registry serves: names are NAME.NAMESPACE.CLUSTER.cluster.ZONE
    /// and NAME.NAMESPACE.ZONE.
    #[arg(
        long = "registry-zone",
        env = "FLOTILLA_REGISTRY_ZONE",
        default_value = "fleet.example"
    )]
    pub zone: String,
    /// CoreDNS's etcd `path`.
    #[arg(long = "registry-path", env = "FLOTILLA_REGISTRY_PATH", default_value = crate::registry::records::DEFAULT_PATH)]
    pub path: String,
    /// The CA (PEM) that signs the registry etcd's certificate.
    #[arg(long = "registry-ca", env = "FLOTILLA_REGISTRY_CA")]
    pub ca: Option<PathBuf>,
    /// A client certificate and key (PEM) for the registry etcd.
    #[arg(
        long = "registry-cert",
        env = "FLOTILLA_REGISTRY_CERT",
        requires = "key"
    )]
    pub cert: Option<PathBuf>,
    #[arg(
        long = "registry-key",
        env = "FLOTILLA_REGISTRY_KEY",
        requires = "cert"
    )]
    pub key: Option<PathBuf>,
    /// How often the sweep removes records whose Microservice is gone.
    #[arg(long = "registry-sweep-period", env = "FLOTILLA_REGISTRY_SWEEP_PERIOD", default_value = "60s", value_parser = parse_duration)]
    pub sweep_period: Duration,
    /// Reach the registry's etcd in plaintext, unauthenticated (local
    /// development only); without it, --registry-ca and https:// endpoints
    /// are required.
    #[arg(long = "registry-insecure", env = "FLOTILLA_REGISTRY_INSECURE")]
    pub insecure: bool,
    /// Fleet mode: one replica (holding the home Lease flotilla-FLEET-dns)
    /// keeps each fleet-wide name listing only the clusters where the
    /// Microservice is Available. False: every member leader lists its own
    /// cluster there, whatever its state.
    #[arg(long = "fleet-dns", env = "FLOTILLA_FLEET_DNS", default_value_t = true, action = clap::ArgAction::Set)]
    pub fleet_dns: bool,
    /// Fleet mode: the TTL of fleet-wide answers (NAME.NAMESPACE.ZONE). A
    /// client may keep sending traffic to a withdrawn cluster this long.
    #[arg(long = "registry-ttl", env = "FLOTILLA_REGISTRY_TTL", default_value = "10s", value_parser = parse_ttl)]
    pub ttl: Duration,
    /// Fleet mode: a cluster leaves a fleet-wide answer once its
    /// Microservice has been unavailable (or its cluster unreachable) this long.
    #[arg(long = "dns-withdraw-after", env = "FLOTILLA_DNS_WITHDRAW_AFTER", default_value = "5s", value_parser = parse_duration)]
    pub withdraw_after: Duration,
    /// Fleet mode: it comes back once healthy again this long.
    #[arg(long = "dns-restore-after", env = "FLOTILLA_DNS_RESTORE_AFTER", default_value = "5s", value_parser = parse_duration)]
    pub restore_after: Duration,
    /// Fleet mode: an unreachable cluster is withdrawn like an unhealthy one,
    /// or kept as it was (its control plane may be down while it serves).
    #[arg(
        long = "dns-unreachable",
        env = "FLOTILLA_DNS_UNREACHABLE",
        value_enum,
        default_value = "withdraw"
    )]
    pub unreachable: crate::dns::health::OnUnreachable,
}

/// A TTL in whole seconds, from 1 s to an hour.
fn parse_ttl(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < Duration::from_secs(1) || d > Duration::from_secs(3600) || d.subsec_nanos() != 0 {
        return Err("a TTL is whole seconds, from 1s to 1h".into());
    }
    Ok(d)
}

impl RegistryArgs {
    /// `None` when the registry is off.
    pub fn config(&self) -> Option<crate::registry::RegistryConfig> {
        (!self.endpoints.is_empty()).then(|| crate::registry::RegistryConfig {
            endpoints: self.endpoints.clone(),
            zone: self.zone.clone(),
            path: self.path.clone(),
            ca: self.ca.clone(),
            cert: self.cert.clone(),
            key: self.key.clone(),
            insecure: self.insecure,
        })
    }

    /// When a cluster enters and leaves a fleet-wide answer.
    pub fn rule(&self) -> crate::dns::health::Rule {
        crate::dns::health::Rule {
            withdraw_after: self.withdraw_after,
            restore_after: self.restore_after,
            unreachable: self.unreachable,
        }
    }
}

impl RunArgs {
    /// Fleet mode: members from a kubeconfig directory, from Secrets, or both.
    /// The platform defaults every Deployment gets, from the flags.
    pub fn platform_defaults(&self) -> crate::domain::desired::PlatformDefaults {
        crate::domain::desired::PlatformDefaults {
            otlp_endpoint: self.workload_otlp_endpoint.clone(),
            readiness_path: self.workload_readiness_path.clone(),
            liveness_path: self.workload_liveness_path.clone(),
            cpu_request: self.workload_cpu_request.clone(),
            memory_request: self.workload_memory_request.clone(),
            progress_deadline_seconds: self.progress_deadline.as_secs() as i32,
        }
    }

    pub fn fleet_mode(&self) -> bool {
        self.kubeconfig_dir.is_some() || self.fleet
    }
}

/// This replica's identity: `--replica-id`, else `POD_NAME`. Fleet mode has
/// no default, because every container's pid is 1 and replicas that share an
/// identity each treat the Lease as their own. A single-cluster controller
/// holds no Lease and may fall back to `flotilla-<pid>`.
pub fn replica_id(
    flag: Option<&str>,
    pod_name: Option<&str>,
    fleet: bool,
    pid: u32,
) -> Result<String, String> {
    let given = [flag, pod_name]
        .into_iter()
        .flatten()
        .map(str::trim)
        .find(|s| !s.is_empty());
    let id = match given {
        Some(id) => id.to_string(),
        None if fleet => {
            return Err(
                "fleet mode needs a replica id unique to this replica: set --replica-id \
                 (FLOTILLA_REPLICA_ID) or POD_NAME (the manifests pass the pod's name)"
                    .into(),
            );
        }
        None => format!("flotilla-{pid}"),
    };
    let ok = id.len() <= 253
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
    if !ok {
        return Err(format!(
            "replica id {id:?} must be at most 253 letters, digits, '-', '.' or '_'"
        ));
    }
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workload_contract_is_configurable_and_checked() {
        let cli = Cli::try_parse_from([
            "flotilla",
            "run",
            "--workload-readiness-path=/readyz",
            "--workload-liveness-path=/healthz",
            "--workload-cpu-request=0.5",
            "--workload-memory-request=64Mi",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        let Command::Run(run) = cli.command else {
            panic!("not run")
        };
        let d = run.platform_defaults();
        assert_eq!(
            (d.readiness_path.as_str(), d.liveness_path.as_str()),
            ("/readyz", "/healthz")
        );
        assert_eq!(
            (d.cpu_request.as_str(), d.memory_request.as_str()),
            ("0.5", "64Mi")
        );
        let defaults = Cli::try_parse_from(["flotilla", "run"]).unwrap();
        let Command::Run(run) = defaults.command else {
            panic!("not run")
        };
        let d = run.platform_defaults();
        // The flags' defaults are the domain's, today's contract.
        assert_eq!(d, crate::domain::desired::PlatformDefaults::default());
        for bad in [
            "--workload-readiness-path=health",
            "--workload-liveness-path=/a b",
            "--workload-cpu-request=25x",
            "--workload-memory-request=Mi",
            "--workload-memory-request=1.2.3Mi",
        ] {
            assert!(
                Cli::try_parse_from(["flotilla", "run", bad]).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn fleet_mode_refuses_to_start_without_an_identity() {
        let err = replica_id(None, None, true, 1).unwrap_err();
        assert!(
            err.contains("--replica-id") && err.contains("POD_NAME"),
            "{err}"
        );
        assert!(replica_id(Some(" "), Some(""), true, 1).is_err());
        assert_eq!(
            replica_id(None, Some("flotilla-7d9f"), true, 1).unwrap(),
            "flotilla-7d9f"
        );
        assert_eq!(replica_id(Some("a"), Some("b"), true, 1).unwrap(), "a");
        assert_eq!(replica_id(None, None, false, 42).unwrap(), "flotilla-42");
        assert!(replica_id(Some("a b"), None, true, 1).is_err());
    }

    #[test]
    fn a_page_budget_a_list_room_or_a_share_under_a_kibibyte_is_refused() {
        for flag in [
            "--grpc-max-page-bytes",
            "--grpc-max-list-bytes-in-flight",
            "--grpc-max-list-bytes-per-connection",
        ] {
            let run = |bytes: &str| Cli::try_parse_from(["flotilla", "run", flag, bytes]);
            let err = run("100").err().expect("refused").to_string();
            assert!(err.contains(flag) && err.contains("1024"), "{err}");
            assert!(run("-1").is_err(), "{flag}");
            assert!(run("lots").is_err(), "{flag}");
            assert!(run("1024").is_ok(), "{flag}");
        }
    }
}
