//! The member manifests `cluster add` applies, as shipped in `deploy/`:
//! compiled in, so the command applies exactly what `kubectl apply -k
//! deploy/crds/member` and `-k deploy/member` would for this version.

use serde::Deserialize;

use super::JoinError;

/// In apply order: the namespace and CRD before what lives in or refers to them.
const FILES: [(&str, &str); 4] = [
    (
        "deploy/member/namespace.yaml",
        include_str!("../../deploy/member/namespace.yaml"),
    ),
    (
        "deploy/crds/member/crd.yaml",
        include_str!("../../deploy/crds/member/crd.yaml"),
    ),
    (
        "deploy/member/rbac.yaml",
        include_str!("../../deploy/member/rbac.yaml"),
    ),
    (
        "deploy/member/admission.yaml",
        include_str!("../../deploy/member/admission.yaml"),
    ),
];

/// One object of the manifests.
#[derive(Debug, Clone)]
pub struct Manifest {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    pub namespace: Option<String>,
    pub object: serde_json::Value,
}

impl Manifest {
    /// `Kind/namespace/name`, as printed.
    pub fn describe(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{}/{ns}/{}", self.kind, self.name),
            None => format!("{}/{}", self.kind, self.name),
        }
    }

    /// RBAC and the ServiceAccount: what `remove --purge` deletes.
    pub fn is_access(&self) -> bool {
        matches!(
            self.kind.as_str(),
            "ServiceAccount" | "Role" | "RoleBinding" | "ClusterRole" | "ClusterRoleBinding"
        )
    }
}

/// Every object of the member manifests, in apply order.
pub fn member() -> Result<Vec<Manifest>, JoinError> {
    let mut out = Vec::new();
    for (file, text) in FILES {
        for doc in serde_yaml::Deserializer::from_str(text) {
            let value = serde_json::Value::deserialize(doc)
                .map_err(|e| JoinError::Kubeconfig(format!("{file}: {e}")))?;
            if value.is_null() {
                continue;
            }
            let field = |path: &[&str]| {
                path.iter()
                    .try_fold(&value, |v, k| v.get(k))
                    .and_then(|v| v.as_str())
                    .map(str::to_string)
            };
            let (Some(api_version), Some(kind), Some(name)) = (
                field(&["apiVersion"]),
                field(&["kind"]),
                field(&["metadata", "name"]),
            ) else {
                return Err(JoinError::Kubeconfig(format!(
                    "{file}: an object without apiVersion, kind or name"
                )));
            };
            out.push(Manifest {
                api_version,
                kind,
                name,
                namespace: field(&["metadata", "namespace"]),
                object: value,
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_member_manifests_parse_in_order_with_the_crd_and_the_access_they_grant() {
        let all = member().unwrap();
        let kinds: Vec<_> = all.iter().map(|m| m.kind.as_str()).collect();
        assert_eq!(kinds[0], "Namespace", "{kinds:?}");
        assert_eq!(kinds[1], "CustomResourceDefinition", "{kinds:?}");
        assert!(all.iter().any(|m| m.kind == "ServiceAccount"
            && m.name == super::super::plan::SERVICE_ACCOUNT
            && m.namespace.as_deref() == Some(super::super::plan::SYSTEM_NAMESPACE)));
        assert!(
            all.iter()
                .any(|m| m.kind == "ClusterRoleBinding" && m.is_access())
        );
        // Purge never deletes the CRD (and with it every workload) or the namespace.
        assert!(
            all.iter()
                .filter(|m| m.is_access())
                .all(|m| m.kind != "CustomResourceDefinition" && m.kind != "Namespace")
        );
    }
}
