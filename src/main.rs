#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use flotilla::cli::parse_duration;
use flotilla::domain::desired::PlatformDefaults;
use flotilla::fleet::client_budget::Budget;
use flotilla::fleet::cluster::ReplicaSettings;
use flotilla::fleet::election::Timings;
use flotilla::fleet::runtime::FleetOptions;
use flotilla::reconciler::{self, Hooks, Settings, WriterIdentity};

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
    /// Fleet mode: average requests per second to each member cluster.
    #[arg(long, env = "FLOTILLA_CLUSTER_QPS", default_value_t = Budget::default().qps)]
    cluster_qps: f64,
    /// Fleet mode: requests each member cluster may get at once after a quiet spell.
    #[arg(long, env = "FLOTILLA_CLUSTER_BURST", default_value_t = Budget::default().burst)]
    cluster_burst: u32,
    /// This replica's identity, stamped on every write.
    #[arg(long, env = "FLOTILLA_REPLICA_ID")]
    replica_id: Option<String>,
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,kube=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
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
    let home = client_for(args.home_kubeconfig.as_ref()).await?;
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
            defaults: PlatformDefaults {
                otlp_endpoint: args.workload_otlp_endpoint,
                ..PlatformDefaults::default()
            },
        },
        rescan: Duration::from_secs(2),
    };
    tracing::info!(replica = %options.replica.replica_id, "starting fleet replica");
    flotilla::fleet::runtime::run(options, shutdown_signal()).await;
    tracing::info!("stopped");
    Ok(())
}

async fn run(args: RunArgs) -> Result<(), String> {
    let holder = args
        .replica_id
        .clone()
        .unwrap_or_else(|| format!("flotilla-{}", std::process::id()));
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
        Command::Run(args) => {
            init_logging(cli.log_format);
            let runtime = match tokio::runtime::Runtime::new() {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("error: tokio runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            match runtime.block_on(run(*args)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
