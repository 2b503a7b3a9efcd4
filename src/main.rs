#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use flotilla::api::client::ClientOptions;
use flotilla::api::server::{ServerOptions, TlsFiles};
use flotilla::cli::parse_duration;
use flotilla::cli::remote::{self, Format};
use flotilla::domain::desired::PlatformDefaults;
use flotilla::fleet::client_budget::Budget;
use flotilla::fleet::cluster::ReplicaSettings;
use flotilla::fleet::election::Timings;
use flotilla::fleet::runtime::FleetOptions;
use flotilla::reconciler::{self, Hooks, Settings, WriterIdentity};
use flotilla::status::hub::Hub;
use flotilla::telemetry;

#[derive(Parser)]
#[command(
    name = "flotilla",
    version,
    about = "Multi-cluster fleet operator for Microservices"
)]
struct Cli {
    /// Log format.
    #[arg(
        long,
        value_enum,
        default_value = "text",
        env = "FLOTILLA_LOG_FORMAT",
        global = true
    )]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Print the Microservice CRD as YAML.
    Crd,
    /// Run the operator.
    Run(Box<RunArgs>),
    /// List the member clusters, as a replica sees them.
    Clusters(RemoteArgs),
    /// Show Microservices across the fleet: one (NAMESPACE/NAME) or all.
    Status(StatusArgs),
    /// Wait until a rollout is done in every cluster. Exit codes: 0 done,
    /// 1 failed in some cluster, 2 timed out, 3 could not ask.
    Wait(WaitArgs),
}

#[derive(clap::Args)]
struct RemoteArgs {
    /// A replica's gRPC address: http://HOST:PORT (plaintext) or https://HOST:PORT.
    #[arg(
        long,
        env = "FLOTILLA_SERVER",
        default_value = "http://127.0.0.1:50051"
    )]
    server: String,
    /// CA that signed the server's certificate (https).
    #[arg(long, env = "FLOTILLA_CA")]
    ca: Option<PathBuf>,
    /// Client certificate and key, for servers that require mTLS.
    #[arg(long, env = "FLOTILLA_CERT", requires = "key")]
    cert: Option<PathBuf>,
    #[arg(long, env = "FLOTILLA_KEY", requires = "cert")]
    key: Option<PathBuf>,
    /// The name the server certificate carries, when it is not the host.
    #[arg(long, env = "FLOTILLA_TLS_SERVER_NAME")]
    tls_server_name: Option<String>,
    /// A file holding the bearer token.
    #[arg(long, env = "FLOTILLA_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    output: OutputFormat,
}

#[derive(Clone, Copy, ValueEnum)]
enum OutputFormat {
    Table,
    Json,
}

#[derive(clap::Args)]
struct StatusArgs {
    /// NAMESPACE/NAME; all Microservices when omitted.
    target: Option<String>,
    /// Only this namespace (when listing).
    #[arg(short = 'n', long)]
    namespace: Option<String>,
    /// Only Microservices matching this label selector (when listing).
    #[arg(short = 'l', long)]
    selector: Option<String>,
    #[command(flatten)]
    remote: RemoteArgs,
}

#[derive(clap::Args)]
struct WaitArgs {
    /// NAMESPACE/NAME
    target: String,
    /// Done when this image is in the spec and that generation is Available.
    #[arg(
        long,
        conflicts_with = "generation",
        required_unless_present = "generation"
    )]
    image: Option<String>,
    /// Done when the generation is at least this, observed and Available.
    #[arg(long)]
    generation: Option<i64>,
    /// Only these clusters (repeatable); every cluster that has it by default.
    #[arg(long = "cluster")]
    clusters: Vec<String>,
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    timeout: Duration,
    #[command(flatten)]
    remote: RemoteArgs,
}

#[derive(clap::Args)]
struct RunArgs {
    /// Fleet mode with member clusters from labelled Secrets only (no directory).
    #[arg(long, env = "FLOTILLA_FLEET")]
    fleet: bool,
    /// Fleet mode: a directory of member kubeconfigs, one file per cluster, watched live.
    /// Secrets labelled platform.example.io/member-cluster=true in the home namespace are read too.
    #[arg(long, env = "FLOTILLA_KUBECONFIG_DIR", conflicts_with = "kubeconfig")]
    kubeconfig_dir: Option<PathBuf>,
    /// Fleet mode: kubeconfig of the home cluster (heartbeats); in-cluster or $KUBECONFIG when omitted.
    #[arg(long, env = "FLOTILLA_HOME_KUBECONFIG")]
    home_kubeconfig: Option<PathBuf>,
    /// Fleet mode: the operator's namespace in the home cluster.
    #[arg(
        long,
        env = "FLOTILLA_HOME_NAMESPACE",
        default_value = "flotilla-system"
    )]
    home_namespace: String,
    /// Fleet mode: names the per-cluster Lease `flotilla-<fleet-name>`.
    #[arg(long, env = "FLOTILLA_FLEET_NAME", default_value = "default")]
    fleet_name: String,
    /// Fleet mode: where each member cluster's Lease lives.
    #[arg(
        long,
        env = "FLOTILLA_LEASE_NAMESPACE",
        default_value = "flotilla-system"
    )]
    lease_namespace: String,
    #[arg(long, env = "FLOTILLA_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    lease_duration: Duration,
    #[arg(long, env = "FLOTILLA_RENEW_DEADLINE", default_value = "10s", value_parser = parse_duration)]
    renew_deadline: Duration,
    #[arg(long, env = "FLOTILLA_RETRY_PERIOD", default_value = "2s", value_parser = parse_duration)]
    retry_period: Duration,
    /// A replica that does not own a cluster contests it once its Lease has been free this long.
    #[arg(long, env = "FLOTILLA_TAKEOVER_GRACE", default_value = "5s", value_parser = parse_duration)]
    takeover_grace: Duration,
    /// Single-cluster mode: kubeconfig of the cluster to reconcile; in-cluster or $KUBECONFIG when omitted.
    #[arg(long, env = "FLOTILLA_KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Name of the cluster, for logs and spans.
    #[arg(long, env = "FLOTILLA_CLUSTER_NAME", default_value = "default")]
    cluster_name: String,
    /// Reconcile one namespace only.
    #[arg(long, env = "FLOTILLA_NAMESPACE")]
    namespace: Option<String>,
    /// Safety-net resync period; watches repair drift long before it.
    #[arg(long, env = "FLOTILLA_RESYNC", default_value = "5m", value_parser = parse_duration)]
    resync: Duration,
    /// The platform's OTLP collector, set on every workload.
    #[arg(
        long,
        env = "FLOTILLA_WORKLOAD_OTLP_ENDPOINT",
        default_value = "http://otel-collector.observability.svc:4317"
    )]
    workload_otlp_endpoint: String,
    /// Start watches with streaming lists (WatchList, Kubernetes 1.32+), so
    /// starting or restarting sends no LIST requests. Set false for older clusters.
    #[arg(long, env = "FLOTILLA_STREAMING_LISTS", default_value_t = true, action = clap::ArgAction::Set)]
    streaming_lists: bool,
    /// Fleet mode: average requests per second to each member cluster.
    #[arg(long, env = "FLOTILLA_CLUSTER_QPS", default_value_t = Budget::default().qps)]
    cluster_qps: f64,
    /// Fleet mode: requests each member cluster may get at once after a quiet spell.
    #[arg(long, env = "FLOTILLA_CLUSTER_BURST", default_value_t = Budget::default().burst)]
    cluster_burst: u32,
    /// Fleet mode: where the gRPC status API listens.
    #[arg(long, env = "FLOTILLA_GRPC_ADDR", default_value = "0.0.0.0:50051")]
    grpc_addr: std::net::SocketAddr,
    /// The server certificate and key (PEM) for gRPC over TLS.
    #[arg(long, env = "FLOTILLA_GRPC_TLS_CERT", requires = "grpc_tls_key")]
    grpc_tls_cert: Option<PathBuf>,
    #[arg(long, env = "FLOTILLA_GRPC_TLS_KEY", requires = "grpc_tls_cert")]
    grpc_tls_key: Option<PathBuf>,
    /// Require client certificates signed by this CA (mTLS).
    #[arg(long, env = "FLOTILLA_GRPC_CLIENT_CA", requires = "grpc_tls_cert")]
    grpc_client_ca: Option<PathBuf>,
    /// Require `authorization: Bearer <token>` with the token in this file.
    #[arg(long, env = "FLOTILLA_GRPC_TOKEN_FILE")]
    grpc_token_file: Option<PathBuf>,
    /// Serve gRPC in plaintext (local development only).
    #[arg(long, env = "FLOTILLA_GRPC_INSECURE")]
    grpc_insecure: bool,
    /// Serve gRPC server reflection.
    #[arg(long, env = "FLOTILLA_GRPC_REFLECTION")]
    grpc_reflection: bool,
    /// The longest a WaitForRollout call may run.
    #[arg(long, env = "FLOTILLA_GRPC_MAX_WAIT", default_value = "1h", value_parser = parse_duration)]
    grpc_max_wait: Duration,
    /// Fleet mode: where /metrics, /healthz and /readyz are served.
    #[arg(long, env = "FLOTILLA_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    metrics_addr: std::net::SocketAddr,
    /// This replica's identity, stamped on every write.
    #[arg(long, env = "FLOTILLA_REPLICA_ID")]
    replica_id: Option<String>,
}

async fn client_for(kubeconfig: Option<&PathBuf>) -> Result<Client, String> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path)
                .map_err(|e| format!("kubeconfig {}: {e}", path.display()))?;
            Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(|e| format!("kubeconfig {}: {e}", path.display()))?
        }
        None => Config::infer()
            .await
            .map_err(|e| format!("no cluster configuration: {e}"))?,
    };
    Client::try_from(config).map_err(|e| format!("client: {e}"))
}

async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot listen for SIGTERM");
            return std::future::pending().await;
        }
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = tokio::signal::ctrl_c() => tracing::info!("interrupt received"),
    }
}

async fn run_fleet(args: RunArgs, dir: Option<PathBuf>, replica_id: String) -> Result<(), String> {
    let timings = Timings {
        lease_duration: args.lease_duration,
        renew_deadline: args.renew_deadline,
        retry_period: args.retry_period,
    }
    .validate()
    .map_err(|e| format!("lease timings: {e}"))?;
    let budget = Budget {
        qps: args.cluster_qps,
        burst: args.cluster_burst,
    };
    budget.validate()?;
    if let Some(dir) = &dir
        && !dir.is_dir()
    {
        return Err(format!(
            "--kubeconfig-dir {} is not a directory",
            dir.display()
        ));
    }
    let grpc = grpc_options(&args)?;
    let listener = flotilla::api::server::bind(&grpc)
        .await
        .map_err(|e| e.to_string())?;
    let metrics_listener = telemetry::http::bind(args.metrics_addr)
        .await
        .map_err(|e| e.to_string())?;
    let home = client_for(args.home_kubeconfig.as_ref()).await?;
    let hub = Hub::new(&replica_id);
    let options = FleetOptions {
        home,
        home_namespace: args.home_namespace,
        kubeconfig_dir: dir,
        replica: ReplicaSettings {
            replica_id,
            fleet_name: args.fleet_name,
            lease_namespace: args.lease_namespace,
            timings,
            takeover_grace: args.takeover_grace,
            resync: args.resync,
            namespace: args.namespace.clone(),
            budget,
            streaming_lists: args.streaming_lists,
            defaults: PlatformDefaults {
                otlp_endpoint: args.workload_otlp_endpoint,
                ..PlatformDefaults::default()
            },
        },
        rescan: Duration::from_secs(2),
        hub: hub.clone(),
    };
    tracing::info!(replica = %options.replica.replica_id, grpc = %grpc.addr, "starting fleet replica");
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        stop_tx.send(true).ok();
    });
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        rx.wait_for(|s| *s).await.ok();
    };
    let http = tokio::spawn(telemetry::http::serve(
        metrics_listener,
        hub.readiness(),
        stopped(stop_rx.clone()),
    ));
    let server = tokio::spawn(flotilla::api::server::serve(
        hub,
        grpc,
        listener,
        stopped(stop_rx.clone()),
    ));
    flotilla::fleet::runtime::run(options, stopped(stop_rx)).await;
    match server.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::error!(error = %e, "gRPC server failed"),
        Err(e) => tracing::error!(error = %e, "gRPC server task failed"),
    }
    match http.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::error!(error = %e, "metrics endpoint failed"),
        Err(e) => tracing::error!(error = %e, "metrics endpoint task failed"),
    }
    tracing::info!("stopped");
    Ok(())
}

fn read_token(path: &PathBuf, flag: &str) -> Result<String, String> {
    let token =
        std::fs::read_to_string(path).map_err(|e| format!("{flag} {}: {e}", path.display()))?;
    let token = token.trim().to_string();
    if token.is_empty() {
        return Err(format!("{flag} {} is empty", path.display()));
    }
    Ok(token)
}

fn grpc_options(args: &RunArgs) -> Result<ServerOptions, String> {
    let mut o = ServerOptions::new(args.grpc_addr);
    o.insecure = args.grpc_insecure;
    o.reflection = args.grpc_reflection;
    o.max_wait = args.grpc_max_wait;
    o.token = match &args.grpc_token_file {
        Some(p) => Some(read_token(p, "--grpc-token-file")?),
        None => None,
    };
    if let (Some(cert), Some(key)) = (&args.grpc_tls_cert, &args.grpc_tls_key) {
        o.tls = Some(TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
            client_ca: args.grpc_client_ca.clone(),
        });
    }
    o.validate().map_err(|e| e.to_string())?;
    Ok(o)
}

fn client_options(r: &RemoteArgs) -> Result<(ClientOptions, Format), String> {
    let token = match &r.token_file {
        Some(p) => Some(read_token(p, "--token-file")?),
        None => None,
    };
    let format = match r.output {
        OutputFormat::Table => Format::Table,
        OutputFormat::Json => Format::Json,
    };
    Ok((
        ClientOptions {
            server: r.server.clone(),
            ca: r.ca.clone(),
            cert: r.cert.clone(),
            key: r.key.clone(),
            tls_server_name: r.tls_server_name.clone(),
            token,
        },
        format,
    ))
}

/// The status commands; returns the process exit code.
async fn remote(command: Command) -> u8 {
    let outcome: Result<u8, String> = async {
        match command {
            Command::Clusters(r) => {
                let (o, f) = client_options(&r)?;
                remote::clusters(&o, f).await.map(|()| 0)
            }
            Command::Status(a) => {
                let (o, f) = client_options(&a.remote)?;
                let key = a.target.as_deref().map(remote::split_key).transpose()?;
                remote::status(&o, f, key, a.namespace, a.selector)
                    .await
                    .map(|()| 0)
            }
            Command::Wait(a) => {
                let (o, f) = client_options(&a.remote)?;
                let (namespace, name) = remote::split_key(&a.target)?;
                use flotilla::api::pb::wait_for_rollout_request::Target;
                let target = match (a.image, a.generation) {
                    (Some(i), _) => Target::Image(i),
                    (None, Some(g)) => Target::Generation(g),
                    (None, None) => return Err("--image or --generation is required".into()),
                };
                let w = remote::WaitFor {
                    namespace,
                    name,
                    target,
                    clusters: a.clusters,
                    timeout: a.timeout,
                };
                remote::wait(&o, f, w).await
            }
            _ => Err("not a status command".into()),
        }
    }
    .await;
    outcome.unwrap_or_else(|e| {
        eprintln!("error: {e}");
        remote::exit::ERROR
    })
}

fn replica_id(args: &RunArgs) -> String {
    args.replica_id
        .clone()
        .unwrap_or_else(|| format!("flotilla-{}", std::process::id()))
}

async fn run(args: RunArgs) -> Result<(), String> {
    let holder = replica_id(&args);
    if args.kubeconfig_dir.is_some() || args.fleet {
        let dir = args.kubeconfig_dir.clone();
        return run_fleet(args, dir, holder).await;
    }
    let client = client_for(args.kubeconfig.as_ref()).await?;
    let mut settings = Settings::new(
        args.cluster_name,
        WriterIdentity {
            holder,
            epoch: None,
        },
    );
    settings.namespace = args.namespace;
    settings.resync = args.resync;
    settings.streaming_lists = args.streaming_lists;
    settings.defaults = PlatformDefaults {
        otlp_endpoint: args.workload_otlp_endpoint,
        ..PlatformDefaults::default()
    };
    tracing::info!(cluster = %settings.cluster, "starting controller");
    reconciler::run(client, settings, Hooks::default(), shutdown_signal()).await;
    tracing::info!("stopped");
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Crd => match flotilla::crd::crd_yaml() {
            Ok(yaml) => {
                print!("{yaml}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
        command @ (Command::Clusters(_) | Command::Status(_) | Command::Wait(_)) => {
            let runtime = match tokio::runtime::Runtime::new() {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("error: tokio runtime: {e}");
                    return ExitCode::from(remote::exit::ERROR);
                }
            };
            ExitCode::from(runtime.block_on(remote(command)))
        }
        Command::Run(args) => {
            let runtime = match tokio::runtime::Runtime::new() {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("error: tokio runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let format = match cli.log_format {
                LogFormat::Text => telemetry::LogFormat::Text,
                LogFormat::Json => telemetry::LogFormat::Json,
            };
            let outcome = runtime.block_on(async move {
                let fleet_mode = args.kubeconfig_dir.is_some() || args.fleet;
                let who = telemetry::Identity {
                    replica_id: replica_id(&args),
                    fleet_name: fleet_mode.then(|| args.fleet_name.clone()),
                };
                let telemetry = telemetry::init(format, &who).map_err(|e| e.to_string())?;
                let result = run(*args).await;
                // Flushing blocks on the exporter, which needs the runtime's other workers.
                tokio::task::spawn_blocking(move || telemetry.shutdown())
                    .await
                    .ok();
                result
            });
            match outcome {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
