//! Admission policies that make a member's apiserver refuse chosen
//! writes in one test namespace: real 403s and 422s from a real apiserver.

use kube::Api;
use kube::api::PostParams;
use serde_json::json;

/// A ValidatingAdmissionPolicy (and its binding) for one test namespace,
/// removed on drop.
pub struct Policy {
    cluster: String,
    name: String,
}

impl Policy {
    /// Refuses `operation` on `resource` in `ns` when `expression` is false,
    /// with `reason` (Invalid is a 422, Forbidden a 403). Requests from the
    /// cluster's own controllers pass.
    pub async fn apply(
        client: &kube::Client,
        cluster: &str,
        ns: &str,
        operation: &str,
        resource: &str,
        expression: &str,
        reason: &str,
    ) -> Self {
        Self::made(
            client,
            cluster,
            ns,
            [operation, resource, expression, reason],
            false,
        )
        .await
    }

    /// The same for every requester, the cluster's own controllers too
    /// (a ReplicaSet whose pods can no longer be created).
    pub async fn apply_to_all(
        client: &kube::Client,
        cluster: &str,
        ns: &str,
        operation: &str,
        resource: &str,
        reason: &str,
    ) -> Self {
        Self::made(
            client,
            cluster,
            ns,
            [operation, resource, "false", reason],
            true,
        )
        .await
    }

    async fn made(
        client: &kube::Client,
        cluster: &str,
        ns: &str,
        [operation, resource, expression, reason]: [&str; 4],
        everyone: bool,
    ) -> Self {
        use k8s_openapi::api::admissionregistration::v1::{
            ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
        };
        let name = format!("{ns}-{}", operation.to_lowercase());
        let group = match resource {
            "deployments" => "apps",
            "microservices" => "platform.example.io",
            _ => "",
        };
        let policy: ValidatingAdmissionPolicy = super::from_json(json!({
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [{
                        "apiGroups": [group], "apiVersions": ["*"],
                        "operations": [operation], "resources": [resource],
                    }],
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                },
                "matchConditions": [{
                    "name": "not-the-cluster",
                    "expression": if everyone {
                        "true"
                    } else {
                        "!request.userInfo.username.startsWith('system:')"
                    },
                }],
                "validations": [{
                    "expression": expression,
                    "message": format!("refused by the test's admission policy ({expression})"),
                    "reason": reason,
                }],
            },
        }));
        let binding: ValidatingAdmissionPolicyBinding = super::from_json(json!({
            "metadata": {"name": name},
            "spec": {"policyName": name, "validationActions": ["Deny"]},
        }));
        Api::<ValidatingAdmissionPolicy>::all(client.clone())
            .create(&PostParams::default(), &policy)
            .await
            .expect("policy");
        Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
            .create(&PostParams::default(), &binding)
            .await
            .expect("binding");
        Policy {
            cluster: cluster.to_string(),
            name,
        }
    }
}

impl Drop for Policy {
    fn drop(&mut self) {
        delete(
            &self.cluster,
            "validatingadmissionpolicybinding,validatingadmissionpolicy",
            &self.name,
        );
    }
}

/// Deletes a policy and its binding (`kinds`), bounded by `timeout`.
fn delete(cluster: &str, kinds: &str, name: &str) {
    let _ = std::process::Command::new("timeout")
        .arg("30")
        .arg(super::kubectl())
        .arg("--kubeconfig")
        .arg(super::kubeconfig_path(cluster))
        .args(["delete", kinds, name, "--ignore-not-found", "--wait=false"])
        .output();
}

/// A MutatingAdmissionPolicy (and its binding) for one test namespace,
/// removed on drop: the member stores something other than what was
/// written, as an old CRD or a mutating webhook would make it.
pub struct Mutation {
    cluster: String,
    name: String,
}

impl Mutation {
    /// Applies `apply_configuration` (a CEL `Object{...}` expression) to
    /// every create and update of Microservices in `ns`, except the
    /// cluster's own controllers' writes.
    pub async fn apply(
        client: &kube::Client,
        cluster: &str,
        ns: &str,
        apply_configuration: &str,
    ) -> Self {
        use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
        let name = format!("{ns}-mutate");
        let policy = json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "reinvocationPolicy": "Never",
                "matchConstraints": {
                    "resourceRules": [{
                        "apiGroups": ["platform.example.io"], "apiVersions": ["*"],
                        "operations": ["CREATE", "UPDATE"], "resources": ["microservices"],
                    }],
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                },
                "matchConditions": [{
                    "name": "not-the-cluster",
                    "expression": "!request.userInfo.username.startsWith('system:')",
                }],
                "mutations": [{
                    "patchType": "ApplyConfiguration",
                    "applyConfiguration": {"expression": apply_configuration},
                }],
            },
        });
        let binding = json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {"policyName": name},
        });
        for (kind, plural, object) in [
            (
                "MutatingAdmissionPolicy",
                "mutatingadmissionpolicies",
                policy,
            ),
            (
                "MutatingAdmissionPolicyBinding",
                "mutatingadmissionpolicybindings",
                binding,
            ),
        ] {
            let gvk = GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind);
            let api: Api<DynamicObject> = Api::all_with(
                client.clone(),
                &ApiResource::from_gvk_with_plural(&gvk, plural),
            );
            let obj: DynamicObject = super::from_json(object);
            api.create(&PostParams::default(), &obj)
                .await
                .unwrap_or_else(|e| panic!("create {kind}: {e}"));
        }
        Mutation {
            cluster: cluster.to_string(),
            name,
        }
    }
}

impl Drop for Mutation {
    fn drop(&mut self) {
        delete(
            &self.cluster,
            "mutatingadmissionpolicybinding,mutatingadmissionpolicy",
            &self.name,
        );
    }
}
