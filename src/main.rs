#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use flotilla::api::client::ClientOptions;
use flotilla::api::server::{ServerOptions, TlsFiles};
use flotilla::cli::args::{self, Cli, Command, LogFormat, OutputFormat, RemoteArgs, RunArgs};
use flotilla::cli::remote::{self, Format};
use flotilla::fleet::client_budget::Budget;
use flotilla::fleet::cluster::ReplicaSettings;
use flotilla::fleet::runtime::FleetOptions;
use flotilla::lease::election::Timings;
use flotilla::lease::home_lease::HomeLease;
use flotilla::reconciler::{self, Hooks, Settings, WriterIdentity};
use flotilla::registry::Registration;
use flotilla::status::hub::Hub;
use flotilla::supervise::{Critical, supervise, with_fault};
use flotilla::telemetry;

/// A client with the user agent `flotilla/<replica-id>`, so that an audit
/// log names this replica in every mode.
async fn client_for(kubeconfig: Option<&PathBuf>, replica_id: &str) -> Result<Client, String> {
    let config = config_for(kubeconfig, replica_id).await?;
    Client::try_from(config).map_err(|e| format!("client: {e}"))
}

async fn config_for(kubeconfig: Option<&PathBuf>, replica_id: &str) -> Result<Config, String> {
    let mut config = match kubeconfig {
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
    config.headers.push((
        http::header::USER_AGENT,
        flotilla::fleet::cluster::user_agent(replica_id)?,
    ));
    Ok(config)
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
    let (timings, budget) = prepare(&args, dir.as_deref())?;
    let mut grpc = grpc_options(&args)?;
    let listener = flotilla::api::server::bind(&grpc)
        .await
        .map_err(|e| e.to_string())?;
    let metrics_listener = telemetry::http::bind(args.metrics_addr)
        .await
        .map_err(|e| e.to_string())?;
    let ui = match ui_options(&args, &grpc) {
        Some(o) => {
            let l = flotilla::ui::server::bind(&o)
                .await
                .map_err(|e| e.to_string())?;
            Some((o, l))
        }
        None => None,
    };
    let home_config = config_for(args.home_kubeconfig.as_ref(), &replica_id).await?;
    let home = Client::try_from(home_config.clone()).map_err(|e| format!("client: {e}"))?;
    let hub = Hub::new(&replica_id);
    let (credentials, credentials_rx) = tokio::sync::watch::channel(Default::default());
    let ui_warnings = flotilla::ui::warnings::Warnings::new(&replica_id, credentials_rx.clone())?;
    grpc.live = Some(flotilla::status::live::Live(std::sync::Arc::new(
        flotilla::fleet::live_reads::MemberReads::new(&replica_id, credentials_rx.clone())?,
    )));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let (rollout_cache, rollout_watches) = flotilla::rollout::run::cache::RolloutCache::start(
        home.clone(),
        args.namespace.as_deref(),
        &replica_id,
        stopped(stop_rx.clone()),
    );
    let home_lease = HomeLease {
        home: home_config.clone(),
        namespace: args.home_namespace.clone(),
        fleet_name: args.fleet_name.clone(),
        replica_id: replica_id.clone(),
        timings,
    };
    let rollouts = flotilla::rollout::run::controller::Options {
        lease: home_lease.clone(),
        hub: hub.clone(),
        credentials: credentials_rx,
        cache: rollout_cache.clone(),
        write_timeout: args.member_write_timeout,
        analysis_secrets_namespace: Some(args.analysis_secrets_namespace.clone())
            .filter(|ns| !ns.is_empty()),
        egress: flotilla::domain::egress::Egress::parse(&args.egress_allow)?,
    };
    let rollout_source = flotilla::api::server::RolloutSource {
        cache: rollout_cache.clone(),
        home: home.clone(),
    };
    let registration = match args.registry.config() {
        Some(config) => Some(Registration::connect(&config).await),
        None => None,
    };
    let departed_sweep = departed_sweep(&args, &registration, &hub, stop_rx.clone());
    let fleet_dns = registration
        .as_ref()
        .and_then(|r| fleet_dns(&args, r, home_lease, &hub, &rollout_cache));
    if let (Some(Registration::Ready(registry)), Some(_)) = (&registration, &fleet_dns) {
        grpc.dns = Some(flotilla::dns::lookup::DnsLookup {
            registry: registry.as_ref().clone(),
            fleet: Some(rollout_cache.clone()),
        });
    }
    let ui_dns = grpc.dns.clone();
    let replica = Replica {
        replica_id,
        dir,
        timings,
        budget,
        registration,
        fleet_dns: fleet_dns.is_some(),
    };
    let options = fleet_options(args, replica, home, hub.clone(), credentials);
    tracing::info!(replica = %options.replica.replica_id, grpc = %grpc.addr, "starting fleet replica");
    let signalled = stop_tx.clone();
    tokio::spawn(async move {
        shutdown_signal().await;
        signalled.send(true).ok();
    });
    // The fleet first: on shutdown it stops writers and releases Leases
    // while the API still answers.
    let mut tasks = vec![
        Critical::spawn(
            "fleet runtime",
            flotilla::fleet::runtime::run(options, stopped(stop_rx.clone())),
        ),
        Critical::spawn("rollout caches", rollout_watches),
        Critical::spawn(
            "fleet rollouts",
            flotilla::rollout::run::controller::run(rollouts, stopped(stop_rx.clone())),
        ),
        Critical::spawn("gRPC server", {
            let serve = flotilla::api::server::serve(
                hub.clone(),
                Some(rollout_source.clone()),
                grpc,
                listener,
                stopped(stop_rx.clone()),
            );
            with_fault(
                "grpc",
                async move { serve.await.map_err(|e| e.to_string()) },
            )
        }),
        Critical::spawn("metrics endpoint", {
            let serve =
                telemetry::http::serve(metrics_listener, hub.readiness(), stopped(stop_rx.clone()));
            with_fault(
                "metrics",
                async move { serve.await.map_err(|e| e.to_string()) },
            )
        }),
    ];
    if let Some((mut o, l)) = ui {
        o.dns = ui_dns;
        let (warnings, rollouts) = (Some(ui_warnings), Some(rollout_source));
        let serve =
            flotilla::ui::server::serve(hub.clone(), o, l, warnings, rollouts, stop_rx.clone());
        tasks.push(Critical::spawn("dashboard", async move {
            serve.await.map_err(|e| e.to_string())
        }));
    }
    if let Some(dns) = fleet_dns {
        let writer = flotilla::dns::writer::run(dns, stopped(stop_rx.clone()));
        tasks.push(Critical::spawn("fleet DNS", writer));
    }
    if let Some(sweep) = departed_sweep {
        tasks.push(Critical::spawn("registry sweep", async move {
            sweep.await;
            Ok(())
        }));
    }
    supervise(tasks, stop_tx).await?;
    tracing::info!("stopped");
    Ok(())
}

/// Resolves once `rx` turns true.
async fn stopped(mut rx: tokio::sync::watch::Receiver<bool>) {
    rx.wait_for(|s| *s).await.ok();
}

/// What a replica checks and sets before anything starts: the member
/// apiserver allow-list, the open-files limit, the Lease timings, the
/// member request budget and the kubeconfig directory.
fn prepare(args: &RunArgs, dir: Option<&std::path::Path>) -> Result<(Timings, Budget), String> {
    // Before any member client exists: every one is checked against it.
    let allow = flotilla::fleet::credentials::ServerAllow::parse(&args.member_server_allow)?;
    if allow.is_empty() {
        tracing::info!("member apiservers may be anywhere (--member-server-allow is empty)");
    }
    flotilla::fleet::credentials::set_server_allow(allow)?;
    match flotilla::limits::raise_open_files() {
        Ok((before, after)) if before != after => {
            tracing::info!(
                ?before,
                ?after,
                "open-files soft limit raised to the hard limit"
            )
        }
        Ok(_) => {}
        // Fewer members fit, nothing else changes: warn and go on.
        Err(e) => tracing::warn!(error = %e, "open-files limit"),
    }
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
    if let Some(dir) = dir
        && !dir.is_dir()
    {
        return Err(format!(
            "--kubeconfig-dir {} is not a directory",
            dir.display()
        ));
    }
    Ok((timings, budget))
}

/// The sweep of records whose cluster left the registry, when the
/// registry is on and answers.
fn departed_sweep(
    args: &RunArgs,
    registration: &Option<Registration>,
    hub: &std::sync::Arc<Hub>,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Option<impl std::future::Future<Output = ()> + use<>> {
    let Some(Registration::Ready(registry)) = registration else {
        return None;
    };
    let (registry, hub, period) = (
        registry.as_ref().clone(),
        hub.clone(),
        args.registry.sweep_period,
    );
    let members = move || {
        hub.read(|ix| {
            ix.registry_was_read().then(|| {
                ix.clusters()
                    .keys()
                    .cloned()
                    .collect::<std::collections::BTreeSet<String>>()
            })
        })
    };
    Some(flotilla::registry::sweep::sweep_departed(
        registry,
        members,
        period,
        stopped(stop),
    ))
}

/// The fleet-wide names: one writer for the fleet, on the replica that
/// leads its home Lease (#31), when the registry answers and they are on.
fn fleet_dns(
    args: &RunArgs,
    registration: &Registration,
    lease: HomeLease,
    hub: &std::sync::Arc<Hub>,
    fleet: &std::sync::Arc<flotilla::rollout::run::cache::RolloutCache>,
) -> Option<flotilla::dns::writer::Options> {
    let Registration::Ready(registry) = registration else {
        return None;
    };
    args.registry
        .fleet_dns
        .then(|| flotilla::dns::writer::Options {
            lease,
            hub: hub.clone(),
            registry: registry.as_ref().clone(),
            rule: args.registry.rule(),
            ttl: args.registry.ttl.as_secs() as u32,
            fleet: fleet.clone(),
        })
}

/// What `fleet_options` takes besides the arguments.
struct Replica {
    replica_id: String,
    dir: Option<PathBuf>,
    timings: Timings,
    budget: Budget,
    registration: Option<Registration>,
    fleet_dns: bool,
}

fn fleet_options(
    args: RunArgs,
    r: Replica,
    home: Client,
    hub: std::sync::Arc<Hub>,
    credentials: tokio::sync::watch::Sender<
        std::collections::BTreeMap<String, flotilla::fleet::runtime::Credentials>,
    >,
) -> FleetOptions {
    let defaults = args.platform_defaults();
    FleetOptions {
        home,
        member_secrets_namespace: if args.member_secrets_namespace.is_empty() {
            args.home_namespace.clone()
        } else {
            args.member_secrets_namespace
        },
        home_namespace: args.home_namespace,
        kubeconfig_dir: r.dir,
        allow_exec_kubeconfigs: args.allow_exec_kubeconfigs,
        replica: ReplicaSettings {
            replica_id: r.replica_id,
            fleet_name: args.fleet_name,
            lease_namespace: args.lease_namespace,
            timings: r.timings,
            takeover_grace: args.takeover_grace,
            resync: args.resync,
            namespace: args.namespace.clone(),
            budget: r.budget,
            streaming_lists: args.streaming_lists,
            debounce: args.debounce,
            debounce_max: args.debounce_max,
            defaults,
            registry: r.registration,
            registry_sweep: args.registry.sweep_period,
            fleet_dns: r.fleet_dns,
        },
        rescan: Duration::from_secs(2),
        hub,
        credentials,
    }
}

/// A token file named by `flag`: trimmed, and never empty.
fn read_token(path: &std::path::Path, flag: &str) -> Result<String, String> {
    flotilla::serve::tls::read_token(path).map_err(|e| format!("{flag} {e}"))
}

fn grpc_options(args: &RunArgs) -> Result<ServerOptions, String> {
    let mut o = ServerOptions::new(args.grpc_addr);
    o.insecure = args.grpc_insecure;
    o.reflection = args.grpc_reflection;
    o.kube_auth = args.grpc_kube_auth;
    o.max_wait = args.grpc_max_wait;
    o.max_streams = args.grpc_max_streams as usize;
    o.max_page_bytes = args.grpc_max_page_bytes as usize;
    o.max_list_bytes_in_flight = args.grpc_max_list_bytes_in_flight as usize;
    o.max_list_bytes_per_connection = args.grpc_max_list_bytes_per_connection as usize;
    o.max_stream_age = args.grpc_max_stream_age;
    o.token = match &args.grpc_token_file {
        Some(p) => Some(read_token(p, "--grpc-token-file")?),
        None => None,
    };
    o.token_file = args.grpc_token_file.clone();
    o.write_token = match &args.grpc_write_token_file {
        Some(p) => Some(read_token(p, "--grpc-write-token-file")?),
        None => None,
    };
    o.write_token_file = args.grpc_write_token_file.clone();
    o.conns.max_connections = args.max_connections as usize;
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

/// The dashboard shares the gRPC server's certificate, client CA and
/// tokens: one policy for every door.
fn ui_options(args: &RunArgs, grpc: &ServerOptions) -> Option<flotilla::ui::server::UiOptions> {
    let mut o = flotilla::ui::server::UiOptions::new(args.ui_addr.0?);
    o.tls = grpc.tls.clone();
    o.insecure = args.ui_insecure;
    o.token = grpc.token.clone();
    o.token_file = grpc.token_file.clone();
    o.write_token = grpc.write_token.clone();
    o.write_token_file = grpc.write_token_file.clone();
    o.kube_auth = grpc.kube_auth;
    o.max_streams = grpc.max_streams;
    o.max_streams_per_client = args.ui_max_streams_per_client as usize;
    o.allowed_hosts = args.ui_allowed_hosts.clone();
    o.limits.stall = grpc.stream_stall;
    o.limits.max_age = grpc.max_stream_age;
    o.conns = flotilla::serve::conns::ConnLimits {
        send_buffer: Some(flotilla::ui::server::SEND_BUFFER),
        ..grpc.conns
    };
    Some(o)
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

async fn rollout_command(action: args::RolloutAction) -> Result<u8, String> {
    use args::RolloutAction as A;
    use flotilla::cli::rollout::{self, Change, View};
    let (target, remote_args) = match &action {
        A::Status(t) | A::History(t) | A::Pause(t) | A::Resume(t) => (&t.target, &t.remote),
        A::Wait(w) => (&w.target, &w.remote),
        A::Undo(u) => (&u.target, &u.remote),
        A::Approve(a) => (&a.target, &a.remote),
    };
    let (o, f) = client_options(remote_args)?;
    let (ns, name) = remote::split_key(target)?;
    match &action {
        A::Status(_) => rollout::status(&o, f, &ns, &name, View::Status).await,
        A::History(_) => rollout::status(&o, f, &ns, &name, View::History).await,
        A::Wait(w) => rollout::wait(&o, f, &ns, &name, w.timeout).await,
        A::Pause(_) => rollout::change(&o, f, &ns, &name, Change::Pause).await,
        A::Resume(_) => rollout::change(&o, f, &ns, &name, Change::Resume).await,
        A::Undo(u) => rollout::change(&o, f, &ns, &name, Change::Undo(u.to_revision)).await,
        A::Approve(a) => {
            let (wave, revision) = (a.wave.clone(), a.revision.clone());
            let change = Change::Approve { wave, revision };
            rollout::change(&o, f, &ns, &name, change).await
        }
    }
}

/// `flotilla crd`: a CRD as YAML, or its field reference.
fn crd_text(kind: args::CrdKind, reference: bool) -> Result<String, String> {
    use flotilla::crd_reference::{FLEET, MICROSERVICE, markdown};
    use kube::CustomResourceExt;
    let to_json = |c| serde_json::to_value(c).map_err(|e: serde_json::Error| e.to_string());
    match (kind, reference) {
        (args::CrdKind::Microservice, false) => {
            flotilla::crd::crd_yaml().map_err(|e| e.to_string())
        }
        (args::CrdKind::Fleet, false) => {
            flotilla::rollout::spec::crd_yaml().map_err(|e| e.to_string())
        }
        (args::CrdKind::Microservice, true) => Ok(markdown(
            &to_json(flotilla::crd::Microservice::crd())?,
            MICROSERVICE,
        )),
        (args::CrdKind::Fleet, true) => {
            Ok(markdown(&to_json(flotilla::rollout::spec::crd())?, FLEET))
        }
    }
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
                let target = match a.image {
                    Some(i) => remote::WaitTarget::Image(i),
                    None if a.generation.is_empty() => {
                        return Err("--image or --generation is required".into());
                    }
                    None => remote::WaitTarget::Generations(a.generation),
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
            Command::Rollout(a) => rollout_command(a.action).await,
            Command::Dns(a) => {
                let (o, f) = client_options(&a.remote)?;
                let (ns, name) = remote::split_key(&a.target)?;
                remote::dns(&o, f, ns, name).await.map(|()| 0)
            }
            Command::Placement(a) => {
                use flotilla::cli::rollout::{self, View};
                let (o, f) = client_options(&a.remote)?;
                let (ns, name) = remote::split_key(&a.target)?;
                rollout::status(&o, f, &ns, &name, View::Placement).await
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

async fn run(args: RunArgs, holder: String) -> Result<(), String> {
    if args.fleet_mode() {
        let dir = args.kubeconfig_dir.clone();
        return run_fleet(args, dir, holder).await;
    }
    let client = client_for(args.kubeconfig.as_ref(), &holder).await?;
    let defaults = args.platform_defaults();
    let mut settings = Settings::new(
        args.cluster_name,
        WriterIdentity {
            holder,
            epoch: None,
            lease: None,
        },
    );
    settings.defaults = defaults;
    settings.namespace = args.namespace;
    settings.resync = args.resync;
    settings.streaming_lists = args.streaming_lists;
    settings.debounce = args.debounce;
    settings.debounce_max = args.debounce_max;
    if let Some(config) = args.registry.config() {
        settings.registry = Some(Registration::connect(&config).await);
        settings.registry_sweep = args.registry.sweep_period;
    }
    tracing::info!(cluster = %settings.cluster, "starting controller");
    reconciler::run(client, settings, Hooks::default(), shutdown_signal()).await;
    tracing::info!("stopped");
    Ok(())
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // Help and version go to stdout with 0; a usage error is EX_USAGE
        // (64), never a code that `wait` gives a verdict with.
        Err(e) => {
            e.print().ok();
            return if e.use_stderr() {
                ExitCode::from(remote::exit::USAGE)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    match cli.command {
        Command::Crd { kind, reference } => match crd_text(kind, reference) {
            Ok(yaml) => {
                print!("{yaml}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
        command @ (Command::Clusters(_)
        | Command::Status(_)
        | Command::Wait(_)
        | Command::Rollout(_)
        | Command::Dns(_)
        | Command::Placement(_)) => {
            let runtime = match tokio::runtime::Runtime::new() {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("error: tokio runtime: {e}");
                    return ExitCode::from(remote::exit::ERROR);
                }
            };
            ExitCode::from(runtime.block_on(remote(command)))
        }
        Command::Cluster(args) => match tokio::runtime::Runtime::new() {
            Ok(rt) => ExitCode::from(rt.block_on(flotilla::cli::cluster::run(args))),
            Err(e) => {
                eprintln!("error: tokio runtime: {e}");
                ExitCode::FAILURE
            }
        },
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
                let fleet_mode = args.fleet_mode();
                let pod_name = std::env::var("POD_NAME").ok();
                let id = args::replica_id(
                    args.replica_id.as_deref(),
                    pod_name.as_deref(),
                    fleet_mode,
                    std::process::id(),
                )?;
                let who = telemetry::Identity {
                    replica_id: id.clone(),
                    fleet_name: fleet_mode.then(|| args.fleet_name.clone()),
                };
                let telemetry = telemetry::init(format, &who).map_err(|e| e.to_string())?;
                let result = run(*args, id).await;
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
