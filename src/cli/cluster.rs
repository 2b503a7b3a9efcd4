//! `flotilla cluster add` and `remove`: the flags, and the call into
//! `crate::join`, which does the work.

use std::path::PathBuf;
use std::time::Duration;

use clap::Subcommand;

use super::parse_duration;
use crate::join::apply::{self, KubeconfigRef};

#[derive(clap::Args)]
pub struct ClusterArgs {
    #[command(subcommand)]
    pub action: ClusterAction,
}

#[derive(Subcommand)]
pub enum ClusterAction {
    /// Register a member: apply the member manifests (CRD, namespace,
    /// ServiceAccount, RBAC, admission policy), issue a token for the
    /// operator's ServiceAccount, and write the labelled member Secret in
    /// the home cluster with only that token and the member's CA.
    /// Idempotent. Exit codes: 0 done, 1 refused or failed, 64 usage error.
    Add(ClusterAddArgs),
    /// Deregister a member (its Secret in the home cluster); with --purge,
    /// delete the member's token and RBAC too. The CRD, the namespace and
    /// every workload stay.
    Remove(ClusterRemoveArgs),
}

#[derive(clap::Args)]
pub struct HomeArgs {
    /// The management cluster's kubeconfig (the identity that writes the
    /// member Secret).
    #[arg(long, env = "FLOTILLA_HOME_KUBECONFIG")]
    pub home_kubeconfig: PathBuf,
    /// A context of --home-kubeconfig other than its current one.
    #[arg(long)]
    pub home_context: Option<String>,
    /// Where member Secrets live (the operator's --member-secrets-namespace).
    #[arg(long, default_value = "flotilla-members")]
    pub members_namespace: String,
    /// How long the whole command may take.
    #[arg(long, default_value = "2m", value_parser = parse_duration)]
    pub timeout: Duration,
}

#[derive(clap::Args)]
pub struct ClusterAddArgs {
    /// The member's name in the fleet (a DNS label).
    pub name: String,
    /// A kubeconfig that may create the member manifests (an admin's); it
    /// is used here and never stored.
    #[arg(long)]
    pub member_kubeconfig: PathBuf,
    /// A context of --member-kubeconfig other than its current one.
    #[arg(long)]
    pub context: Option<String>,
    /// The https URL the operator dials for this member, when it is not the
    /// member kubeconfig's server (a private address, say). It must be
    /// inside the operator's --member-server-allow, and the member's
    /// serving certificate must carry its host.
    #[arg(long)]
    pub member_server: Option<String>,
    /// A cluster label KEY=VALUE, for placement and waves (repeat).
    #[arg(long = "label")]
    pub labels: Vec<String>,
    #[command(flatten)]
    pub home: HomeArgs,
}

#[derive(clap::Args)]
pub struct ClusterRemoveArgs {
    /// The member's name in the fleet.
    pub name: String,
    /// Also delete the member's token Secret, ServiceAccount and RBAC.
    #[arg(long, requires = "member_kubeconfig")]
    pub purge: bool,
    /// The member, for --purge.
    #[arg(long, requires = "purge")]
    pub member_kubeconfig: Option<PathBuf>,
    /// A context of --member-kubeconfig other than its current one.
    #[arg(long)]
    pub context: Option<String>,
    #[command(flatten)]
    pub home: HomeArgs,
}

fn home(h: &HomeArgs) -> KubeconfigRef {
    KubeconfigRef {
        path: h.home_kubeconfig.clone(),
        context: h.home_context.clone(),
    }
}

/// Runs the command; the process exit code.
pub async fn run(args: ClusterArgs) -> u8 {
    let outcome = match args.action {
        ClusterAction::Add(a) => {
            apply::add(&apply::Add {
                name: a.name,
                member: KubeconfigRef {
                    path: a.member_kubeconfig,
                    context: a.context,
                },
                member_server: a.member_server,
                labels: a.labels,
                home: home(&a.home),
                members_namespace: a.home.members_namespace,
                timeout: a.home.timeout,
            })
            .await
        }
        ClusterAction::Remove(r) => {
            let purge = match (r.purge, r.member_kubeconfig) {
                (true, Some(path)) => Some(KubeconfigRef {
                    path,
                    context: r.context,
                }),
                _ => None,
            };
            apply::remove(&apply::Remove {
                name: r.name,
                home: home(&r.home),
                members_namespace: r.home.members_namespace,
                purge,
                timeout: r.home.timeout,
            })
            .await
        }
    };
    match outcome {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    }
}
