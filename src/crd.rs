//! The `Microservice` custom resource (platform.example.io/v1alpha1).
//!
//! The schema rejects what it can express (types, ranges, an image without
//! whitespace); a CEL rule rejects names that cannot name a Service. The
//! reconciler rejects the rest (a full image-reference parse) as `InvalidSpec`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, CustomResourceExt, KubeSchema};
use serde::{Deserialize, Serialize};

pub const GROUP: &str = "platform.example.io";
pub const VERSION: &str = "v1alpha1";
pub const KIND: &str = "Microservice";
pub const DEFAULT_REPLICAS: i32 = 2;

/// What a team asks the platform to run: one image, listening on one port.
#[derive(CustomResource, KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[kube(
    group = "platform.example.io",
    version = "v1alpha1",
    kind = "Microservice",
    namespaced,
    shortname = "ms",
    status = "MicroserviceStatus",
    doc = "A service the platform runs as a Deployment and a Service with platform defaults",
    printcolumn(name = "Image", type_ = "string", json_path = ".spec.image"),
    printcolumn(name = "Port", type_ = "integer", json_path = ".spec.port"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.ready"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    validation = Rule::new("self.metadata.name.size() <= 63 && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')")
        .message("metadata.name must be a DNS-1035 label (at most 63 characters, starting with a letter), because it names the Service")
)]
#[serde(rename_all = "camelCase")]
pub struct MicroserviceSpec {
    /// Container image reference, e.g. `registry.example.com:5000/team/api:1.4.2` or `…@sha256:<hex>`.
    #[schemars(length(min = 1, max = 512), regex(pattern = r"^[^\s]+$"))]
    pub image: String,
    /// The port the application listens on; the Service exposes the same port.
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    /// Desired pod count.
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 0, max = 1000))]
    pub replicas: i32,
    /// Extra environment variables for the container, after the platform's
    /// own; a name the platform sets is rejected as `InvalidSpec`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub env: Vec<EnvEntry>,
}

/// One environment variable: a literal value, never a reference.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, schemars::JsonSchema)]
pub struct EnvEntry {
    #[schemars(
        length(min = 1, max = 256),
        regex(pattern = r"^[A-Za-z_][A-Za-z0-9_]*$")
    )]
    pub name: String,
    #[serde(default)]
    #[schemars(length(max = 4096))]
    pub value: String,
}

fn default_replicas() -> i32 {
    DEFAULT_REPLICAS
}

/// The observed state. Every conclusion names the generation it is about.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MicroserviceStatus {
    /// Accepted, ResourcesApplied, Available or Failed; derived from the conditions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// The generation the conditions and phase describe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Accepted, Reconciled, Available and Progressing.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The children this Microservice manages; cleared on a permanent error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub managed_resources: Option<ManagedResources>,
    /// Available over desired replicas, e.g. `2/2`, for `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<String>,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
pub enum Phase {
    Accepted,
    ResourcesApplied,
    Available,
    Failed,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Accepted => "Accepted",
            Phase::ResourcesApplied => "ResourcesApplied",
            Phase::Available => "Available",
            Phase::Failed => "Failed",
        }
    }
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
pub struct ManagedResources {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
}

/// The CRD as YAML, exactly as `flotilla crd` prints it and `deploy/crds/member/crd.yaml` holds it.
pub fn crd_yaml() -> Result<String, serde_yaml::Error> {
    serde_yaml::to_string(&Microservice::crd())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deploy_crd_matches_the_types() {
        let generated = crd_yaml().expect("serialize CRD");
        let committed = include_str!("../deploy/crds/member/crd.yaml");
        assert!(
            generated == committed,
            "deploy/crds/member/crd.yaml is stale: run `make crd` (cargo run -- crd > deploy/crds/member/crd.yaml)"
        );
    }

    #[test]
    fn crd_names_columns_and_defaults() {
        let crd = Microservice::crd();
        assert_eq!(crd.spec.group, GROUP);
        assert_eq!(crd.spec.names.kind, KIND);
        assert_eq!(crd.spec.names.short_names, Some(vec!["ms".to_string()]));
        let version = &crd.spec.versions[0];
        assert_eq!(version.name, VERSION);
        let columns: Vec<_> = version
            .additional_printer_columns
            .iter()
            .flatten()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(columns, ["Image", "Port", "Ready", "Phase", "Age"]);
        assert!(
            version
                .subresources
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some()
        );
        let yaml = crd_yaml().expect("yaml");
        assert!(yaml.contains("default: 2"), "replicas defaults to 2");
    }

    #[test]
    fn replicas_default_when_absent() {
        let spec: MicroserviceSpec =
            serde_json::from_value(serde_json::json!({"image": "a:1", "port": 80})).expect("spec");
        assert_eq!(spec.replicas, DEFAULT_REPLICAS);
    }
}
