//! Names that more than one floor reads: the fleet writes them, the status
//! feed and the rollout planner read them.

/// The revision (a ControllerRevision's name) a member object was written from.
pub const REVISION_ANNOTATION: &str = "platform.example.io/fleet-revision";
/// Every cluster carries its own name as a label, so waves can name clusters.
pub const CLUSTER_NAME_LABEL: &str = "platform.example.io/cluster-name";
