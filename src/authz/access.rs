//! What a call needs, as a Kubernetes resource attribute, and what the
//! static credentials grant without asking anyone. Pure.

use std::collections::BTreeMap;

/// The API group the rights are granted in.
pub const GROUP: &str = "platform.example.io";

/// The verbs that change a rollout; RBAC grants them one by one, so a
/// Role can allow `pause` without `update` (#34).
pub const PAUSE: &str = "pause";
pub const RESUME: &str = "resume";
pub const UNDO: &str = "undo";
pub const APPROVE: &str = "approve";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Resource {
    Microservices,
    FleetMicroservices,
    /// Virtual: no such API exists; a Role names it to grant ListClusters.
    MemberClusters,
}

impl Resource {
    pub fn plural(self) -> &'static str {
        match self {
            Resource::Microservices => "microservices",
            Resource::FleetMicroservices => "fleetmicroservices",
            Resource::MemberClusters => "memberclusters",
        }
    }
}

/// One right, as a SubjectAccessReview asks it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Access {
    pub verb: &'static str,
    pub resource: Resource,
    /// `None`: in every namespace (or a cluster-scoped resource).
    pub namespace: Option<String>,
    pub name: Option<String>,
}

impl Access {
    pub fn new(verb: &'static str, resource: Resource) -> Self {
        Access {
            verb,
            resource,
            namespace: None,
            name: None,
        }
    }

    pub fn in_namespace(mut self, ns: &str) -> Self {
        self.namespace = Some(ns.to_string());
        self
    }

    pub fn named(mut self, name: &str) -> Self {
        self.name = Some(name.to_string());
        self
    }

    /// Whether granting this changes something; the static read token and
    /// an open server never may.
    pub fn mutates(&self) -> bool {
        matches!(self.verb, PAUSE | RESUME | UNDO | APPROVE)
    }

    /// As a denial names it: `pause fleetmicroservices.platform.example.io "web" in namespace "team-b"`.
    pub fn describe(&self) -> String {
        let mut s = format!("{} {}.{GROUP}", self.verb, self.resource.plural());
        if let Some(n) = &self.name {
            s.push_str(&format!(" {n:?}"));
        }
        match &self.namespace {
            Some(ns) => s.push_str(&format!(" in namespace {ns:?}")),
            None if self.resource != Resource::MemberClusters => s.push_str(" in every namespace"),
            None => {}
        }
        s
    }
}

/// A Kubernetes identity, as the home apiserver's TokenReview gave it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct User {
    pub username: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

/// Who a call comes from, once its door has been chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// No credential is configured at all: reads are open.
    Open,
    /// A client certificate the trusted CA signed, and no token.
    Certificate,
    /// The static read token.
    ReadToken,
    /// The static write token.
    WriteToken,
    /// A token the home cluster vouched for.
    User(User),
}

impl Caller {
    /// For logs, spans and Events (`enduser.id`): never a token.
    pub fn name(&self) -> &str {
        match self {
            Caller::Open => "anonymous",
            Caller::Certificate => "client-certificate",
            Caller::ReadToken => "read-token",
            Caller::WriteToken => "write-token",
            Caller::User(u) => &u.username,
        }
    }

    /// What the static doors grant on their own: every read, and changes
    /// only with the write token. `None`: ask the home cluster's RBAC.
    pub fn static_grant(&self, access: &Access) -> Option<bool> {
        match self {
            Caller::User(_) => None,
            Caller::WriteToken => Some(true),
            Caller::Open | Caller::Certificate | Caller::ReadToken => Some(!access.mutates()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alice() -> Caller {
        Caller::User(User {
            username: "alice".into(),
            uid: "1".into(),
            groups: vec![],
            extra: BTreeMap::new(),
        })
    }

    #[test]
    fn static_doors_read_everything_and_only_the_write_token_changes_anything() {
        let read = Access::new("get", Resource::Microservices).in_namespace("a");
        let pause = Access::new(PAUSE, Resource::FleetMicroservices)
            .in_namespace("a")
            .named("web");
        for c in [Caller::Open, Caller::Certificate, Caller::ReadToken] {
            assert_eq!(c.static_grant(&read), Some(true), "{c:?}");
            assert_eq!(c.static_grant(&pause), Some(false), "{c:?}");
        }
        assert_eq!(Caller::WriteToken.static_grant(&pause), Some(true));
        assert_eq!(alice().static_grant(&read), None, "a user is asked about");
        assert_eq!(alice().name(), "alice");
    }

    #[test]
    fn a_denial_names_the_right_it_lacked() {
        let a = Access::new(UNDO, Resource::FleetMicroservices)
            .in_namespace("team-b")
            .named("web");
        assert_eq!(
            a.describe(),
            "undo fleetmicroservices.platform.example.io \"web\" in namespace \"team-b\""
        );
        assert_eq!(
            Access::new("list", Resource::MemberClusters).describe(),
            "list memberclusters.platform.example.io"
        );
        assert!(
            Access::new("list", Resource::Microservices)
                .describe()
                .ends_with("in every namespace")
        );
    }
}
