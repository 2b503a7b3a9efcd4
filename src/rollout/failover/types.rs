//! The spec and status of a counted placement (#32), as the CRD carries them.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::{Deserialize, Serialize};

/// How a counted placement replaces a cluster that stopped serving.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Failover {
    /// How long a placed cluster may be unreachable before it is replaced;
    /// `60s` by default, at most `168h`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        regex(pattern = r"^[0-9]{1,9}(\.[0-9]{1,9})?(ms|s|m|h)$"),
        length(max = 24)
    )]
    pub unreachable_after: Option<String>,
    /// How long a placed cluster's Microservice may be other than Available
    /// at the running revision before it is replaced; `5m` by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        regex(pattern = r"^[0-9]{1,9}(\.[0-9]{1,9})?(ms|s|m|h)$"),
        length(max = 24)
    )]
    pub unavailable_after: Option<String>,
    #[serde(default)]
    pub failback: Failback,
    /// With `WhenHealthy`: how long a replaced cluster must answer before
    /// the placement moves back to it; `5m` by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        regex(pattern = r"^[0-9]{1,9}(\.[0-9]{1,9})?(ms|s|m|h)$"),
        length(max = 24)
    )]
    pub failback_after: Option<String>,
}

#[derive(
    Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema,
)]
pub enum Failback {
    /// The replacement stays; the replaced cluster's Microservice is
    /// removed once the replacement is Available and the cluster answers.
    #[default]
    Never,
    /// The placement moves back to a cluster replaced as unreachable once
    /// it has answered for `failbackAfter`; the replacement is then
    /// removed the same way. (One replaced as unavailable is not retried.)
    WhenHealthy,
}

/// Where a counted placement runs, and why.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlacementStatus {
    /// The chosen clusters, then the replaced ones still holding it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clusters: Vec<PlacedCluster>,
    /// The last failovers and failbacks, newest last (at most ten).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<PlacementChange>,
    /// When the last failover or failback was decided: the next waits
    /// `unreachableAfter` from it, so a flapping cluster makes no storm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failover: Option<Time>,
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlacedCluster {
    pub name: String,
    pub role: Role,
    /// Why it was chosen or replaced: `Ranked`, `Kept`, `Replacement`,
    /// `FailedBack`, `Unreachable`, `Unavailable`.
    pub reason: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// When it took this role.
    pub since: Time,
    /// Chosen: unreachable since then, as observed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unreachable_since: Option<Time>,
    /// Chosen: not Available at the running revision since then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unavailable_since: Option<Time>,
    /// Replaced: answering since then (for `WhenHealthy`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub healthy_since: Option<Time>,
    /// Replaced: the cluster that took its place.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replaced_by: Option<String>,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
pub enum Role {
    /// Runs it.
    Chosen,
    /// Failed over; keeps its Microservice until it may be removed.
    Replaced,
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlacementChange {
    pub time: Time,
    /// Why it moved: `Unreachable` or `Unavailable` (a failover), or
    /// `FailedBack`.
    pub reason: String,
    pub from: String,
    pub to: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}
