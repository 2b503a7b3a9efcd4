//! Whether a live child belongs to this Microservice. A child we do not
//! control is never modified.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::OwnerIdentity;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ownership {
    /// Controlled by this very CR: same uid, kind and API group, at any
    /// version, so that serving a new version of the CRD orphans nothing.
    Ours,
    /// Controlled by an earlier Microservice of the same name (another uid):
    /// that owner is gone, since a name holds one object at a time, so the
    /// child is garbage the cluster's garbage collector has not collected
    /// yet. It can lag for minutes after an apiserver restart.
    Leftover { uid: String },
    /// Exists but is someone else's: unowned, or owned by another
    /// controller (another kind, group or name).
    Foreign { controller: Option<String> },
}

/// The group of an apiVersion: `platform.example.io` of
/// `platform.example.io/v1alpha1`, and empty for the core group (`v1`).
fn group(api_version: &str) -> &str {
    api_version.rsplit_once('/').map_or("", |(g, _)| g)
}

pub fn ownership(child: &ObjectMeta, owner: &OwnerIdentity) -> Ownership {
    let refs = child.owner_references.as_deref().unwrap_or_default();
    let controller = refs.iter().find(|r| r.controller == Some(true));
    match controller {
        Some(r)
            if r.uid == owner.uid
                && r.kind == owner.kind
                && group(&r.api_version) == group(&owner.api_version) =>
        {
            Ownership::Ours
        }
        Some(r)
            if r.kind == owner.kind
                && r.name == owner.name
                && group(&r.api_version) == group(&owner.api_version) =>
        {
            Ownership::Leftover { uid: r.uid.clone() }
        }
        Some(r) => Ownership::Foreign {
            controller: Some(format!("{} {} (uid {})", r.kind, r.name, r.uid)),
        },
        None => Ownership::Foreign { controller: None },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn owner() -> OwnerIdentity {
        OwnerIdentity {
            api_version: "platform.example.io/v1alpha1".into(),
            kind: "Microservice".into(),
            name: "api".into(),
            namespace: "ns".into(),
            uid: "u1".into(),
        }
    }

    fn meta(refs: Vec<OwnerReference>) -> ObjectMeta {
        ObjectMeta {
            owner_references: Some(refs),
            ..ObjectMeta::default()
        }
    }

    fn oref(api_version: &str, kind: &str, uid: &str, controller: Option<bool>) -> OwnerReference {
        OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: "api".into(),
            uid: uid.into(),
            controller,
            block_owner_deletion: None,
        }
    }

    #[test]
    fn controller_reference_with_our_uid_is_ours() {
        let m = meta(vec![oref(
            "platform.example.io/v1alpha1",
            "Microservice",
            "u1",
            Some(true),
        )]);
        assert_eq!(ownership(&m, &owner()), Ownership::Ours);
    }

    #[test]
    fn unowned_child_is_foreign() {
        assert_eq!(
            ownership(&ObjectMeta::default(), &owner()),
            Ownership::Foreign { controller: None }
        );
    }

    #[test]
    fn another_version_of_the_same_group_is_still_ours() {
        for v in ["platform.example.io/v1beta1", "platform.example.io/v1"] {
            let m = meta(vec![oref(v, "Microservice", "u1", Some(true))]);
            assert_eq!(ownership(&m, &owner()), Ownership::Ours, "{v}");
        }
    }

    #[test]
    fn an_earlier_microservice_of_the_same_name_left_it() {
        for v in ["platform.example.io/v1alpha1", "platform.example.io/v9"] {
            let m = meta(vec![oref(v, "Microservice", "old-uid", Some(true))]);
            assert_eq!(
                ownership(&m, &owner()),
                Ownership::Leftover {
                    uid: "old-uid".into()
                },
                "{v}"
            );
        }
        // Another name's child is never garbage of ours.
        let mut r = oref(
            "platform.example.io/v1alpha1",
            "Microservice",
            "old-uid",
            Some(true),
        );
        r.name = "other".into();
        assert!(matches!(
            ownership(&meta(vec![r]), &owner()),
            Ownership::Foreign { .. }
        ));
    }

    #[test]
    fn other_kind_or_group_is_foreign() {
        for r in [
            oref("platform.example.io/v1alpha1", "Other", "u1", Some(true)),
            oref(
                "other.example.io/v1alpha1",
                "Microservice",
                "u1",
                Some(true),
            ),
            oref("v1", "Microservice", "u1", Some(true)),
        ] {
            assert!(matches!(
                ownership(&meta(vec![r]), &owner()),
                Ownership::Foreign {
                    controller: Some(_)
                }
            ));
        }
    }

    #[test]
    fn non_controller_reference_does_not_make_it_ours() {
        let m = meta(vec![oref(
            "platform.example.io/v1alpha1",
            "Microservice",
            "u1",
            None,
        )]);
        assert_eq!(
            ownership(&m, &owner()),
            Ownership::Foreign { controller: None }
        );
    }
}
