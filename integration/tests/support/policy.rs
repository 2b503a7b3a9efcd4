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
                    "expression": "!request.userInfo.username.startsWith('system:')",
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
        let _ = std::process::Command::new(super::kubectl())
            .arg("--kubeconfig")
            .arg(super::kubeconfig_path(&self.cluster))
            .args([
                "delete",
                "validatingadmissionpolicybinding,validatingadmissionpolicy",
                &self.name,
                "--ignore-not-found",
                "--wait=false",
            ])
            .output();
    }
}
