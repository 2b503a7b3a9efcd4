//! The `FleetMicroservice` custom resource (platform.example.io/v1alpha1),
//! in the home cluster: one Microservice template, placed on member
//! clusters by their labels and rolled out in waves.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{CustomResource, CustomResourceExt, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::crd::{EnvEntry, MicroserviceSpec};
pub use crate::rollout::failover::types::{
    Failback, Failover, PlacedCluster, PlacementChange, PlacementStatus, Role,
};

pub use crate::domain::names::{CLUSTER_NAME_LABEL, REVISION_ANNOTATION};

pub const KIND: &str = "FleetMicroservice";
/// Names the FleetMicroservice on every member object it writes.
pub const FLEET_LABEL: &str = "platform.example.io/fleet-microservice";
/// Holds member objects until they are deleted from every cluster.
pub const FINALIZER: &str = "platform.example.io/fleet-cleanup";
/// On a ControllerRevision: the last good revision when it was created.
pub const GOOD_BEFORE_ANNOTATION: &str = "platform.example.io/good-before";
/// On a ControllerRevision: the number it had when it failed.
pub const FAILED_ANNOTATION: &str = "platform.example.io/failed-number";
pub const DEFAULT_HISTORY: i32 = 10;

/// One Microservice for many clusters: where it goes, how each cluster
/// differs, and in what order a change reaches them.
// Printer columns repeat `type_ = "string"`, which clippy takes for a
// duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[kube(
    group = "platform.example.io",
    version = "v1alpha1",
    kind = "FleetMicroservice",
    namespaced,
    shortname = "fms",
    status = "FleetMicroserviceStatus",
    doc = "A Microservice placed on member clusters by label and rolled out in waves",
    printcolumn(
        name = "Revision",
        type_ = "integer",
        json_path = ".status.updateRevisionNumber"
    ),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Wave", type_ = "string", json_path = ".status.wave"),
    printcolumn(name = "Updated", type_ = "string", json_path = ".status.updated"),
    printcolumn(name = "Available", type_ = "string", json_path = ".status.available"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct FleetMicroserviceSpec {
    /// The Microservice every placed cluster runs, before overrides.
    pub template: MicroserviceSpec,
    /// Which member clusters run it; an empty selector places it everywhere.
    #[serde(default)]
    pub placement: Placement,
    /// Per-cluster differences, applied in order; later entries win. At
    /// most 64.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub overrides: Vec<Override>,
    #[serde(default)]
    pub rollout: Rollout,
    /// How the fleet-wide DNS name chooses among the healthy clusters;
    /// every healthy cluster (`RoundRobin`) when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns: Option<Dns>,
    /// Write nothing to any member until this is false again.
    #[serde(default)]
    pub paused: bool,
    /// How many old revisions to keep as ControllerRevisions.
    #[serde(default = "default_history")]
    #[schemars(range(min = 1, max = 100))]
    pub revision_history_limit: i32,
}

fn default_history() -> i32 {
    DEFAULT_HISTORY
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Placement {
    #[serde(default)]
    pub cluster_selector: LabelSelector,
    /// Run it on this many of the selected clusters, chosen by rank and
    /// replaced when one fails; every selected cluster when absent. (A
    /// `spread` over a label may join it later.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub number_of_clusters: Option<i32>,
    /// When a chosen cluster is replaced; only with `numberOfClusters`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failover: Option<Failover>,
}

/// The fleet-wide name `NAME.NAMESPACE.ZONE` (#31).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Dns {
    #[serde(default)]
    pub strategy: DnsStrategy,
    /// The clusters `Failover` prefers; required by it, refused otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary: Option<DnsPrimary>,
}

#[derive(
    Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema,
)]
pub enum DnsStrategy {
    /// Every healthy cluster answers.
    #[default]
    RoundRobin,
    /// Only the healthy primaries answer; the others only when none is healthy.
    Failover,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DnsPrimary {
    pub cluster_selector: LabelSelector,
}

impl FleetMicroserviceSpec {
    /// The primary clusters' selector when the strategy is `Failover`.
    pub fn dns_primaries(&self) -> Option<&LabelSelector> {
        let dns = self.dns.as_ref()?;
        match dns.strategy {
            DnsStrategy::Failover => dns.primary.as_ref().map(|p| &p.cluster_selector),
            DnsStrategy::RoundRobin => None,
        }
    }
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Override {
    /// The clusters this override applies to.
    pub cluster_selector: LabelSelector,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000))]
    pub replicas: Option<i32>,
    /// Added to the template's env; an entry with the same name replaces
    /// it. At most 64.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub env: Vec<EnvEntry>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Rollout {
    /// A cluster joins the first wave that selects it; the clusters no wave
    /// selects form a last wave, `remaining`. At most 32.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub waves: Vec<Wave>,
    /// How long every cluster of a wave must stay done before the next wave
    /// starts, e.g. `30s`; none by default, at most `168h`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        regex(pattern = r"^[0-9]{1,9}(\.[0-9]{1,9})?(ms|s|m|h)$"),
        length(max = 24)
    )]
    pub bake: Option<String>,
    /// How long one cluster may take to be done after it is written; 10m by
    /// default, at most `168h`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        regex(pattern = r"^[0-9]{1,9}(\.[0-9]{1,9})?(ms|s|m|h)$"),
        length(max = 24)
    )]
    pub progress_deadline: Option<String>,
    /// Whether the other waves wait for the first wave to pass, and hold
    /// when it selects no cluster. On by default when waves are declared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub require_canary: Option<bool>,
    /// Failed clusters tolerated before the release counts as failed. The
    /// first wave, the canary, tolerates none.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub max_failed_clusters: i32,
    #[serde(default)]
    pub on_failure: OnFailure,
    /// Checks run during each wave's bake and once at its end (#35): a
    /// wave passes only when each one passed for the update revision, at
    /// the member generations the wave has now; `failureLimit` failures in
    /// a row fail the wave, which then follows `onFailure`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub analysis: Vec<AnalysisCheck>,
    /// When waves may start (cron schedules in UTC, each opening a window
    /// of `duration`): inside no `Deny` window, and inside an `Allow` window
    /// when any is declared. A wave already started finishes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub windows: Vec<Window>,
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Window {
    pub kind: WindowKind,
    /// Five cron fields, in UTC, e.g. `0 9 * * 1-5`.
    #[schemars(length(min = 9, max = 100))]
    pub schedule: String,
    /// How long each window stays open, e.g. `8h`; 1m to 168h.
    #[schemars(
        regex(pattern = r"^[0-9]{1,9}(\.[0-9]{1,9})?(ms|s|m|h)$"),
        length(max = 24)
    )]
    pub duration: String,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
pub enum WindowKind {
    Allow,
    Deny,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AnalysisCheck {
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub name: String,
    /// POST the wave's evidence as JSON; a 2xx answer passes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook: Option<WebhookCheck>,
    /// An instant query whose every sample must meet `successCondition`.
    /// Exactly one of `webhook` and `prometheus`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prometheus: Option<PrometheusCheck>,
    /// How often it runs during a bake; 10s by default, 1s to 1h.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        regex(pattern = r"^[0-9]{1,9}(\.[0-9]{1,9})?(ms|s|m|h)$"),
        length(max = 24)
    )]
    pub interval: Option<String>,
    /// Failures in a row that fail the wave; 1 by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub failure_limit: Option<i32>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WebhookCheck {
    /// An `http://` or `https://` URL.
    #[schemars(length(min = 1, max = 2048))]
    pub url: String,
    /// How long an answer may take; 5s by default, at most 60s. No answer
    /// in time is a failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        regex(pattern = r"^[0-9]{1,9}(\.[0-9]{1,9})?(ms|s|m|h)$"),
        length(max = 24)
    )]
    pub timeout: Option<String>,
    /// Request headers (credentials) from a Secret the platform team keeps
    /// in the operator's analysis namespace (`--analysis-secrets-namespace`):
    /// each data key is a header. The Secret must name this
    /// FleetMicroservice's namespace in its annotation
    /// `platform.example.io/analysis-for`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers_from: Option<HeadersFrom>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HeadersFrom {
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    )]
    pub secret_name: String,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PrometheusCheck {
    /// The server's `http://` or `https://` base URL; `/api/v1/query` is
    /// appended.
    #[schemars(length(min = 1, max = 2048))]
    pub address: String,
    /// PromQL. `$cluster`, `$namespace`, `$name` and `$revision` are
    /// replaced (as label values, quoted); a query naming `$cluster` runs
    /// once per cluster of the wave, and each must pass.
    #[schemars(length(min = 1, max = 4096))]
    pub query: String,
    /// What every sample must satisfy, e.g. `result < 0.01`: comparisons of
    /// `result` with a number, joined by `&&` and `||`, with parentheses.
    /// No sample, or NaN, fails.
    #[schemars(length(min = 1, max = 256))]
    pub success_condition: String,
    /// How long the query may take; 5s by default, at most 60s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        regex(pattern = r"^[0-9]{1,9}(\.[0-9]{1,9})?(ms|s|m|h)$"),
        length(max = 24)
    )]
    pub timeout: Option<String>,
}

/// One check of one wave, as its last runs for the update revision found it.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CheckStatus {
    pub name: String,
    /// The digest of the check definition its verdict ran (#59): a changed
    /// check runs again.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub definition: String,
    pub state: CheckState,
    /// Failures in a row, on the current evidence.
    #[serde(default)]
    pub failures: i32,
    /// What the last run that counted answered (for a failure: its reason).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub answer: String,
    /// When the run that failed the wave started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_at: Option<Time>,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
pub enum CheckState {
    /// No run on the current evidence has ended yet.
    Running,
    /// Passed on the current evidence (after the bake, for a wave that passed).
    Passed,
    /// Failed `failureLimit` times in a row: the wave failed.
    Failed,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Wave {
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub name: String,
    pub cluster_selector: LabelSelector,
    /// How many of the wave's clusters may be updating at once: a count or
    /// a percentage such as `50%`; all of them by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_parallel: Option<IntOrString>,
    /// `Manual`: the wave starts only once someone approved it for the
    /// revision being released (`flotilla rollout approve`); `Auto` by default.
    #[serde(default, skip_serializing_if = "Approval::is_auto")]
    pub approval: Approval,
}

/// Whether a wave starts on its own once the waves before it passed (#35).
#[derive(
    Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema,
)]
pub enum Approval {
    #[default]
    Auto,
    /// Held until approved for the update revision.
    Manual,
}

impl Approval {
    pub fn is_auto(&self) -> bool {
        *self == Approval::Auto
    }
}

/// Someone's approval of one wave for one revision (#35). It is kept in
/// the FleetMicroservice's annotation `platform.example.io/approvals`, so
/// it survives every replica; the wave's status shows the one it used.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WaveApproval {
    pub wave: String,
    /// The revision's name: an approval of one revision opens no other's wave.
    pub revision: String,
    /// The revision's number when it was approved: its attempt (#59). A
    /// revision re-applied later is renumbered, a new attempt the old
    /// approval does not open. Without one (written before #59), nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<i64>,
    /// Who approved: the authenticated identity that held the `approve` verb.
    pub by: String,
    pub at: Time,
}

#[derive(
    Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema,
)]
pub enum OnFailure {
    /// Put every cluster that got the failed revision back on the last good one.
    #[default]
    Rollback,
    /// Stop writing until the failures clear or someone acts.
    Pause,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FleetMicroserviceStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The revision every placed cluster runs, when they agree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_revision: Option<String>,
    /// The revision of the spec as it is now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_revision: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_revision_number: Option<i64>,
    /// The newest revision that completed; the target of a rollback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_good_revision: Option<String>,
    /// The number of an update revision that failed; it is not retried until
    /// the spec names another revision (a new or re-applied one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_revision_number: Option<i64>,
    /// The clusters whose failure failed that revision.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed_clusters: Vec<String>,
    /// Every cluster that may hold this object's Microservice: written to,
    /// or seen holding it, and not yet seen without it. Deletion waits on
    /// each of them, registered or not.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reached_clusters: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<RolloutPhase>,
    /// The wave being rolled out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wave: Option<String>,
    /// Placed clusters on the update revision, e.g. `2/3`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated: Option<String>,
    /// Placed clusters done at the revision they run, e.g. `3/3`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waves: Vec<WaveStatus>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clusters: Vec<ClusterStatus>,
    /// With `numberOfClusters`: the chosen clusters, the replaced ones and
    /// the last failovers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<PlacementStatus>,
    /// Progressing, Available, RolledBack and, while deletion waits, CleanupBlocked.
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
pub enum RolloutPhase {
    Progressing,
    Paused,
    /// Every placed cluster runs the update revision, done.
    Complete,
    /// Every wave passed, but some placed cluster failed within the budget,
    /// is in the way, is gone, or nothing is placed.
    Degraded,
    RolledBack,
    Failed,
}

impl RolloutPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            RolloutPhase::Progressing => "Progressing",
            RolloutPhase::Paused => "Paused",
            RolloutPhase::Complete => "Complete",
            RolloutPhase::Degraded => "Degraded",
            RolloutPhase::RolledBack => "RolledBack",
            RolloutPhase::Failed => "Failed",
        }
    }
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WaveStatus {
    pub name: String,
    pub clusters: Vec<String>,
    pub state: WaveState,
    /// When the update revision was first written to one of its clusters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<Time>,
    /// When every cluster had been done for the bake time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished: Option<Time>,
    /// For a `Manual` wave, the approval that opened it for the update revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<WaveApproval>,
    /// The analysis checks, once the wave's clusters are done.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub analysis: Vec<CheckStatus>,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
pub enum WaveState {
    Pending,
    Progressing,
    Baking,
    Done,
    /// It selects no cluster: it proves nothing.
    Skipped,
    /// Its canary failed, or every cluster of it did.
    Failed,
    /// A `Manual` wave whose turn came: nothing is written to its clusters
    /// until it is approved for the update revision.
    AwaitingApproval,
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStatus {
    pub name: String,
    /// The revision the member object was written from, as observed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// The revision this cluster is being given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    pub state: ClusterState,
    pub reason: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// When the cluster entered this state for this target.
    pub since: Time,
    /// When the target was first chosen; the progress deadline counts from here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub targeted: Option<Time>,
}

/// The reason of a placed cluster that does not answer, pending or targeted.
pub const CLUSTER_UNREACHABLE: &str = "ClusterUnreachable";

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
pub enum ClusterState {
    /// Placed, waiting for its wave.
    Pending,
    /// Written; not yet done.
    Updating,
    /// Observed at its generation and Available at its target.
    Done,
    Failed,
    /// Not answering, or its labels cannot be read.
    Unknown,
    /// Left the placement; its member object is being deleted.
    Removing,
}

/// The CRD, with what the derived schema cannot say: a selector
/// requirement's operator is one of four (review H1), so the apiserver
/// refuses a typo before any planner sees it.
pub fn crd() -> CustomResourceDefinition {
    fn operators(v: &mut serde_json::Value) {
        if let Some(props) = v.get_mut("properties").and_then(|p| p.as_object_mut())
            && props.contains_key("key")
            && props.contains_key("values")
            && let Some(op) = props.get_mut("operator").and_then(|o| o.as_object_mut())
        {
            op.insert(
                "enum".into(),
                serde_json::json!(["In", "NotIn", "Exists", "DoesNotExist"]),
            );
        }
        match v {
            serde_json::Value::Object(m) => m.values_mut().for_each(operators),
            serde_json::Value::Array(a) => a.iter_mut().for_each(operators),
            _ => {}
        }
    }
    let mut value = serde_json::to_value(FleetMicroservice::crd()).expect("a CRD serializes");
    operators(&mut value);
    serde_json::from_value(value).expect("the same CRD, with enums")
}

/// The CRD as YAML, as `flotilla crd fleet` prints it and `deploy/crds/home/crd.yaml` holds it.
pub fn crd_yaml() -> Result<String, serde_yaml::Error> {
    serde_yaml::to_string(&crd())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deploy_crd_matches_the_types() {
        let generated = crd_yaml().expect("serialize CRD");
        let committed = include_str!("../../deploy/crds/home/crd.yaml");
        assert!(
            generated == committed,
            "deploy/crds/home/crd.yaml is stale: run `make crd`"
        );
    }

    #[test]
    fn every_selector_operator_is_an_enum() {
        let yaml = crd_yaml().expect("yaml");
        let selectors = yaml.matches("matchExpressions:").count();
        assert_eq!(selectors, 4, "placement, waves, overrides, dns primaries");
        assert_eq!(yaml.matches("- DoesNotExist").count(), selectors);
    }

    #[test]
    fn names_and_columns() {
        let crd = crd();
        assert_eq!(crd.spec.names.kind, KIND);
        assert_eq!(crd.spec.names.short_names, Some(vec!["fms".to_string()]));
        let columns: Vec<_> = crd.spec.versions[0]
            .additional_printer_columns
            .iter()
            .flatten()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(
            columns,
            ["Revision", "Phase", "Wave", "Updated", "Available", "Age"]
        );
    }

    #[test]
    fn defaults_when_absent() {
        let spec: FleetMicroserviceSpec = serde_json::from_value(serde_json::json!({
            "template": {"image": "a:1", "port": 80}
        }))
        .expect("spec");
        assert_eq!(spec.revision_history_limit, DEFAULT_HISTORY);
        assert_eq!(spec.rollout.on_failure, OnFailure::Rollback);
        assert!(!spec.paused);
        assert_eq!(spec.placement.cluster_selector, LabelSelector::default());
    }
}
