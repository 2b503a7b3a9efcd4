//! What `flotilla cluster add` writes, decided without I/O: the member
//! kubeconfig the operator will use (the member's CA and a token bound to
//! the operator's ServiceAccount, nothing of the caller's), the
//! registration's labels, and whether a registration may be written at all.

use std::collections::BTreeMap;

use base64::Engine;

use super::JoinError;
use crate::domain::names::CLUSTER_NAME_LABEL;
use crate::fleet::labels::{self, Labels};
use crate::fleet::registry::SECRET_LABEL;

/// The member Secret's annotation naming the cluster it registers: the UID
/// of the member's kube-system namespace, which lives as long as the
/// cluster does and is the cluster ID that KEP-2149 (ClusterProperty
/// `cluster.clusterset.k8s.io`) recommends.
pub const CLUSTER_ID_ANNOTATION: &str = "platform.example.io/cluster-id";

/// The token Secret in each member, bound to the operator's ServiceAccount.
pub const TOKEN_SECRET: &str = "flotilla-member-token";
/// The operator's ServiceAccount in each member (deploy/member/rbac.yaml).
pub const SERVICE_ACCOUNT: &str = "flotilla";
/// Where that ServiceAccount, its token and the member Lease live.
pub const SYSTEM_NAMESPACE: &str = "flotilla-system";

/// A registration already in the members' namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Existing {
    /// Labelled as a member cluster.
    pub labelled: bool,
    /// The cluster it registers, when `cluster add` wrote it.
    pub cluster_id: Option<String>,
    /// The server its kubeconfig names, when it has one that parses: how
    /// a registration written by hand is told apart.
    pub server: Option<String>,
}

/// What writing the registration `name` for the cluster `cluster_id` does
/// to the registrations there are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Registering {
    /// No registration by that name yet.
    New,
    /// The same cluster under the same name: written again, to the same end.
    Again,
}

/// A cluster is registered once, under one name, and a name registers one
/// cluster. A Secret of that name that `cluster add` did not write (made by
/// hand, or not a registration at all) is never overwritten.
pub fn check_registration(
    name: &str,
    cluster_id: &str,
    server: &str,
    existing: &BTreeMap<String, Existing>,
) -> Result<Registering, JoinError> {
    if let Some(other) = registered_as(cluster_id, server, existing).find(|o| *o != name) {
        return Err(JoinError::RegisteredAs {
            cluster: name.to_string(),
            other: other.to_string(),
        });
    }
    match existing.get(name) {
        None => Ok(Registering::New),
        Some(e) => match e.cluster_id.as_deref() {
            Some(id) if id == cluster_id => Ok(Registering::Again),
            Some(id) => Err(JoinError::NameTaken {
                name: name.to_string(),
                cluster_id: id.to_string(),
            }),
            None => Err(JoinError::NotWrittenByAdd {
                name: name.to_string(),
            }),
        },
    }
}

/// The names that register this cluster: by its ID, or, for a
/// registration written by hand (no ID), by the server its kubeconfig names.
fn registered_as<'a>(
    cluster_id: &'a str,
    server: &'a str,
    existing: &'a BTreeMap<String, Existing>,
) -> impl Iterator<Item = &'a str> + 'a {
    existing
        .iter()
        .filter(|(_, e)| e.labelled)
        .filter(move |(_, e)| match &e.cluster_id {
            Some(id) => id == cluster_id,
            None => e.server.as_deref().map(same_server) == Some(same_server(server)),
        })
        .map(|(n, _)| n.as_str())
}

/// Servers compared as URLs are written: without a trailing slash.
fn same_server(s: &str) -> &str {
    s.trim_end_matches('/')
}

/// `remove NAME --purge` deletes the token and RBAC of the cluster the
/// member kubeconfig reaches; that must be the cluster NAME registers, or,
/// once NAME is gone, a cluster no registration uses.
pub fn check_purge(
    name: &str,
    found_id: &str,
    found_server: &str,
    existing: &BTreeMap<String, Existing>,
) -> Result<(), JoinError> {
    if let Some(e) = existing.get(name) {
        return match &e.cluster_id {
            Some(id) if id == found_id => Ok(()),
            Some(id) => Err(JoinError::WrongCluster {
                name: name.to_string(),
                found: found_id.to_string(),
                registered: id.clone(),
            }),
            None => Err(JoinError::UncheckedPurge {
                name: name.to_string(),
            }),
        };
    }
    match registered_as(found_id, found_server, existing).next() {
        Some(other) => Err(JoinError::WrongCluster {
            name: name.to_string(),
            found: found_id.to_string(),
            registered: format!("{other} (registered under that name)"),
        }),
        None => Ok(()),
    }
}

/// The server a registration's kubeconfig names (its current context's
/// cluster, else its only cluster), if it parses.
pub fn kubeconfig_server(bytes: &[u8]) -> Option<String> {
    let v: serde_yaml::Value = serde_yaml::from_slice(bytes).ok()?;
    let clusters = v["clusters"].as_sequence()?;
    let by_context = v["current-context"].as_str().and_then(|ctx| {
        let contexts = v["contexts"].as_sequence()?;
        let c = contexts.iter().find(|c| c["name"].as_str() == Some(ctx))?;
        let name = c["context"]["cluster"].as_str()?;
        clusters.iter().find(|c| c["name"].as_str() == Some(name))
    });
    let cluster = match by_context {
        Some(c) => c,
        None if clusters.len() == 1 => &clusters[0],
        None => return None,
    };
    cluster["cluster"]["server"].as_str().map(str::to_string)
}

/// A cluster name: a DNS label, as Secret names and label values take it.
pub fn check_name(name: &str) -> Result<(), JoinError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(JoinError::InvalidName(name.to_string()))
    }
}

/// `--label k=v` flags as the registration's labels: Kubernetes' label
/// rules, and neither the label that registers a Secret nor the cluster's
/// name label, which Flotilla sets itself.
pub fn parse_labels(given: &[String]) -> Result<Labels, JoinError> {
    let mut out = Labels::new();
    for item in given {
        let Some((k, v)) = item.split_once('=') else {
            return Err(JoinError::InvalidLabel(format!(
                "{item:?} is not KEY=VALUE"
            )));
        };
        if k == SECRET_LABEL || k == CLUSTER_NAME_LABEL {
            return Err(JoinError::InvalidLabel(format!(
                "{k:?} is set by Flotilla, not by --label"
            )));
        }
        if out.insert(k.to_string(), v.to_string()).is_some() {
            return Err(JoinError::InvalidLabel(format!("{k:?} is given twice")));
        }
    }
    labels::check(&out).map_err(JoinError::InvalidLabel)?;
    Ok(out)
}

/// The member Secret's labels: the registration label and the given ones.
pub fn secret_labels(given: &Labels) -> Labels {
    let mut out = given.clone();
    out.insert(SECRET_LABEL.to_string(), "true".to_string());
    out
}

/// The operator reaches a member over https only, and the URL is all a
/// kubeconfig from a Secret may say about where.
pub fn check_server(server: &str) -> Result<(), JoinError> {
    let rest = server
        .strip_prefix("https://")
        .ok_or_else(|| JoinError::Server(format!("{server:?} is not an https:// URL")))?;
    let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if host.is_empty() || host.contains('@') {
        return Err(JoinError::Server(format!(
            "{server:?} names no host (or carries credentials)"
        )));
    }
    Ok(())
}

/// The kubeconfig the operator uses for the member: its server, its CA and
/// the ServiceAccount's token, inline, as kubeconfigs from Secrets must be.
pub fn member_kubeconfig(
    name: &str,
    server: &str,
    ca_pem: &[u8],
    token: &str,
) -> Result<String, JoinError> {
    check_server(server)?;
    if !String::from_utf8_lossy(ca_pem).contains("-----BEGIN CERTIFICATE-----") {
        return Err(JoinError::NoCa);
    }
    let token = token.trim();
    if token.is_empty() {
        return Err(JoinError::TokenNotIssued);
    }
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let user = format!("{SYSTEM_NAMESPACE}-{SERVICE_ACCOUNT}");
    let config = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": server, "certificate-authority-data": ca}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": user}}],
        "current-context": name,
    });
    serde_yaml::to_string(&config).map_err(|e| JoinError::Kubeconfig(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::registry::{self, Entry};
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::Secret;

    const CA: &[u8] = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

    fn reg(labelled: bool, id: Option<&str>) -> Existing {
        Existing {
            labelled,
            cluster_id: id.map(str::to_string),
            server: None,
        }
    }

    const SERVER: &str = "https://10.0.1.10:6443";

    fn existing(items: &[(&str, Existing)]) -> BTreeMap<String, Existing> {
        items
            .iter()
            .map(|(n, e)| (n.to_string(), e.clone()))
            .collect()
    }

    #[test]
    fn a_new_name_for_a_new_cluster_is_registered() {
        let there = existing(&[("member-2", reg(true, Some("uid-2")))]);
        assert_eq!(
            check_registration("member-1", "uid-1", SERVER, &there).unwrap(),
            Registering::New
        );
    }

    #[test]
    fn the_same_cluster_under_the_same_name_is_registered_again() {
        let there = existing(&[("member-1", reg(true, Some("uid-1")))]);
        assert_eq!(
            check_registration("member-1", "uid-1", SERVER, &there).unwrap(),
            Registering::Again
        );
    }

    #[test]
    fn a_cluster_registered_under_another_name_is_refused() {
        let there = existing(&[("eu-1", reg(true, Some("uid-1")))]);
        let err = check_registration("member-1", "uid-1", SERVER, &there).unwrap_err();
        assert!(matches!(&err, JoinError::RegisteredAs { other, .. } if other == "eu-1"));
        assert!(err.to_string().contains("eu-1"), "{err}");
    }

    #[test]
    fn a_name_that_registers_another_cluster_is_refused() {
        let there = existing(&[("member-1", reg(true, Some("uid-9")))]);
        let err = check_registration("member-1", "uid-1", SERVER, &there).unwrap_err();
        assert!(matches!(err, JoinError::NameTaken { .. }), "{err}");
    }

    #[test]
    fn a_secret_written_by_hand_is_never_overwritten() {
        for e in [reg(true, None), reg(false, None)] {
            let there = existing(&[("member-1", e)]);
            let err = check_registration("member-1", "uid-1", SERVER, &there).unwrap_err();
            assert!(matches!(err, JoinError::NotWrittenByAdd { .. }), "{err}");
        }
    }

    #[test]
    fn an_unlabelled_secret_naming_the_cluster_is_no_registration() {
        // A leftover that the operator ignores does not make the cluster taken.
        let there = existing(&[("old", reg(false, Some("uid-1")))]);
        assert_eq!(
            check_registration("member-1", "uid-1", SERVER, &there).unwrap(),
            Registering::New
        );
    }

    #[test]
    fn a_cluster_registered_by_hand_under_another_name_is_refused_by_its_server() {
        let by_hand = Existing {
            server: Some(format!("{SERVER}/")),
            ..reg(true, None)
        };
        let there = existing(&[("old-name", by_hand)]);
        let err = check_registration("member-1", "uid-1", SERVER, &there).unwrap_err();
        assert!(matches!(&err, JoinError::RegisteredAs { other, .. } if other == "old-name"));
        // Another server is another cluster.
        assert_eq!(
            check_registration("member-1", "uid-1", "https://10.0.9.9:6443", &there).unwrap(),
            Registering::New
        );
    }

    #[test]
    fn a_purge_reaches_only_the_registered_cluster_or_an_unused_one() {
        let there = existing(&[
            ("member-1", reg(true, Some("uid-1"))),
            ("member-2", reg(true, Some("uid-2"))),
            ("by-hand", reg(true, None)),
        ]);
        check_purge("member-1", "uid-1", SERVER, &there).unwrap();
        // The name registers another cluster than the kubeconfig reaches.
        let wrong = check_purge("member-1", "uid-2", SERVER, &there).unwrap_err();
        assert!(matches!(wrong, JoinError::WrongCluster { .. }), "{wrong}");
        // A misspelt name, with a kubeconfig of a cluster still registered.
        let typo = check_purge("memebr-1", "uid-2", SERVER, &there).unwrap_err();
        assert!(typo.to_string().contains("member-2"), "{typo}");
        // Written by hand: no ID to compare, so no purge.
        let unchecked = check_purge("by-hand", "uid-3", SERVER, &there).unwrap_err();
        assert!(
            matches!(unchecked, JoinError::UncheckedPurge { .. }),
            "{unchecked}"
        );
        // Gone already (a purge run again), and no registration uses it.
        check_purge("member-3", "uid-3", "https://10.0.3.10:6443", &there).unwrap();
    }

    #[test]
    fn a_registrations_server_is_read_from_its_kubeconfig() {
        let text = member_kubeconfig("m", SERVER, CA, "t").unwrap();
        assert_eq!(kubeconfig_server(text.as_bytes()).as_deref(), Some(SERVER));
        let two = "clusters: [{name: a, cluster: {server: 'https://a'}}, {name: b, cluster: {server: 'https://b'}}]\ncontexts: [{name: x, context: {cluster: b}}]\ncurrent-context: x\n";
        assert_eq!(
            kubeconfig_server(two.as_bytes()).as_deref(),
            Some("https://b")
        );
        let ambiguous = "clusters: [{name: a, cluster: {server: 'https://a'}}, {name: b, cluster: {server: 'https://b'}}]\n";
        assert_eq!(kubeconfig_server(ambiguous.as_bytes()), None);
        assert_eq!(kubeconfig_server(b"\x00 not yaml ["), None);
    }

    #[test]
    fn names_are_dns_labels() {
        for ok in ["member-1", "eu", "a1"] {
            check_name(ok).unwrap();
        }
        for bad in ["", "Member", "-a", "a-", "a_b", "a.b", &"a".repeat(64)] {
            assert!(
                matches!(check_name(bad), Err(JoinError::InvalidName(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn labels_follow_kubernetes_rules_and_flotillas_own_are_refused() {
        let l = parse_labels(&["ring=canary".into(), "region=eu".into()]).unwrap();
        assert_eq!(l["ring"], "canary");
        let with = secret_labels(&l);
        assert_eq!(with[SECRET_LABEL], "true");
        assert_eq!(with.len(), 3);
        for bad in [
            "ring",
            "ring=a b",
            "Bad Key=x",
            "platform.example.io/member-cluster=false",
            "platform.example.io/cluster-name=x",
        ] {
            let err = parse_labels(&[bad.to_string()]).unwrap_err();
            assert!(matches!(err, JoinError::InvalidLabel(_)), "{bad}: {err}");
        }
        let twice = parse_labels(&["a=1".into(), "a=2".into()]).unwrap_err();
        assert!(twice.to_string().contains("twice"), "{twice}");
    }

    #[test]
    fn servers_are_https_with_a_host() {
        check_server("https://10.0.0.1:6443").unwrap();
        check_server("https://api.member-1.example").unwrap();
        for bad in [
            "http://10.0.0.1",
            "10.0.0.1:6443",
            "https://",
            "https://u:p@h",
        ] {
            assert!(
                matches!(check_server(bad), Err(JoinError::Server(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn the_kubeconfig_is_what_a_member_secret_may_carry() {
        let text = member_kubeconfig("member-1", "https://10.88.0.1:17010", CA, "tok\n").unwrap();
        assert!(text.contains("token: tok\n"), "{text}");
        assert!(!text.contains("client-key"), "{text}");
        // The operator reads it as it reads every member Secret.
        let secret = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some("member-1".into()),
                namespace: Some("flotilla-members".into()),
                labels: Some(secret_labels(&Labels::new())),
                ..Default::default()
            },
            data: Some(
                [(
                    registry::SECRET_KEY.to_string(),
                    ByteString(text.into_bytes()),
                )]
                .into(),
            ),
            ..Default::default()
        };
        let found = registry::from_secrets(&[secret]);
        assert!(
            matches!(found["member-1"].entry, Entry::Valid { .. }),
            "{:?}",
            found["member-1"].entry
        );
    }

    #[test]
    fn no_kubeconfig_without_a_ca_or_a_token() {
        let no_ca = member_kubeconfig("m", "https://h", b"", "t").unwrap_err();
        assert!(matches!(no_ca, JoinError::NoCa));
        let no_token = member_kubeconfig("m", "https://h", CA, " ").unwrap_err();
        assert!(matches!(no_token, JoinError::TokenNotIssued));
        let http = member_kubeconfig("m", "http://h", CA, "t").unwrap_err();
        assert!(matches!(http, JoinError::Server(_)));
    }
}
