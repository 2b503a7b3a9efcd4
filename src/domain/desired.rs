//! The children a Microservice should have: a Deployment and a Service with
//! the platform's defaults. Pure: the same inputs always give the same objects.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EnvVar, HTTPGetAction, PodSpec, PodTemplateSpec, Probe,
    ResourceRequirements, Service, ServicePort, ServiceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::validate::validate;
use super::{DomainError, OwnerIdentity};
use crate::crd::Microservice;

pub const MANAGED_BY: &str = "flotilla";
pub const LABEL_APP: &str = "app";
pub const LABEL_NAME: &str = "app.kubernetes.io/name";
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const PORT_NAME: &str = "http";
pub const READINESS_PATH: &str = "/health/ready";
pub const LIVENESS_PATH: &str = "/health/live";

/// Defaults that come from operator configuration, never from the CR.
#[derive(Debug, Clone, PartialEq)]
pub struct PlatformDefaults {
    /// The platform's OTLP collector, given to every workload.
    pub otlp_endpoint: String,
    pub cpu_request: String,
    pub memory_request: String,
    /// The HTTP paths of the readiness and liveness probes, on the
    /// Microservice's port.
    pub readiness_path: String,
    pub liveness_path: String,
    /// The Deployment's progressDeadlineSeconds.
    pub progress_deadline_seconds: i32,
}

impl Default for PlatformDefaults {
    fn default() -> Self {
        PlatformDefaults {
            otlp_endpoint: "http://otel-collector.observability.svc:4317".into(),
            cpu_request: "25m".into(),
            memory_request: "128Mi".into(),
            readiness_path: READINESS_PATH.into(),
            liveness_path: LIVENESS_PATH.into(),
            progress_deadline_seconds: 600,
        }
    }
}

/// Both children, built together so that they always agree on labels and ports.
#[derive(Debug, Clone, PartialEq)]
pub struct Children {
    pub deployment: Deployment,
    pub service: Service,
}

/// Labels on every child and pod. They derive from the name only, so they never change.
pub fn labels(name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_APP.to_string(), name.to_string()),
        (LABEL_NAME.to_string(), name.to_string()),
        (LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string()),
    ])
}

/// The selector: a subset of the labels that never changes for a given name.
pub fn selector(name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_NAME.to_string(), name.to_string()),
        (LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string()),
    ])
}

fn owner_reference(owner: &OwnerIdentity) -> OwnerReference {
    OwnerReference {
        api_version: owner.api_version.clone(),
        kind: owner.kind.clone(),
        name: owner.name.clone(),
        uid: owner.uid.clone(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

fn child_meta(owner: &OwnerIdentity) -> ObjectMeta {
    ObjectMeta {
        name: Some(owner.name.clone()),
        namespace: Some(owner.namespace.clone()),
        labels: Some(labels(&owner.name)),
        owner_references: Some(vec![owner_reference(owner)]),
        ..ObjectMeta::default()
    }
}

fn env(name: &str, value: String) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value),
        value_from: None,
    }
}

fn http_probe(path: &str, port: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::Int(port),
            scheme: Some("HTTP".into()),
            ..HTTPGetAction::default()
        }),
        ..Probe::default()
    }
}

/// The Deployment and Service for `ms`, or `InvalidSpec` when the spec cannot
/// be turned into valid children.
pub fn desired(ms: &Microservice, defaults: &PlatformDefaults) -> Result<Children, DomainError> {
    let owner = OwnerIdentity::of(ms)?;
    validate(&owner.name, &ms.spec)?;
    let name = owner.name.as_str();
    let spec = &ms.spec;

    let container = Container {
        name: name.into(),
        image: Some(spec.image.clone()),
        ports: Some(vec![ContainerPort {
            name: Some(PORT_NAME.into()),
            container_port: spec.port,
            protocol: Some("TCP".into()),
            ..ContainerPort::default()
        }]),
        env: Some(
            [
                // The app must listen where the probes and the Service point.
                env("ASPNETCORE_URLS", format!("http://+:{}", spec.port)),
                env("OTEL_SERVICE_NAME", name.into()),
                env("OTEL_SERVICE_VERSION", spec.image.clone()),
                env(
                    "OTEL_EXPORTER_OTLP_ENDPOINT",
                    defaults.otlp_endpoint.clone(),
                ),
            ]
            .into_iter()
            .chain(spec.env.iter().map(|e| env(&e.name, e.value.clone())))
            .collect(),
        ),
        readiness_probe: Some(http_probe(&defaults.readiness_path, spec.port)),
        liveness_probe: Some(http_probe(&defaults.liveness_path, spec.port)),
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".to_string(), Quantity(defaults.cpu_request.clone())),
                (
                    "memory".to_string(),
                    Quantity(defaults.memory_request.clone()),
                ),
            ])),
            ..ResourceRequirements::default()
        }),
        ..Container::default()
    };

    let deployment = Deployment {
        metadata: child_meta(&owner),
        spec: Some(DeploymentSpec {
            replicas: Some(spec.replicas),
            selector: LabelSelector {
                match_labels: Some(selector(name)),
                match_expressions: None,
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels(name)),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![container],
                    ..PodSpec::default()
                }),
            },
            progress_deadline_seconds: Some(defaults.progress_deadline_seconds),
            ..DeploymentSpec::default()
        }),
        status: None,
    };

    let service = Service {
        metadata: child_meta(&owner),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            selector: Some(selector(name)),
            ports: Some(vec![ServicePort {
                name: Some(PORT_NAME.into()),
                port: spec.port,
                target_port: Some(IntOrString::Int(spec.port)),
                protocol: Some("TCP".into()),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        status: None,
    };

    Ok(Children {
        deployment,
        service,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::fixtures::ms;

    #[test]
    fn user_env_follows_the_platform_env() {
        let m = ms("todo-api").env("REGION", "eu").build();
        let d = desired(&m, &PlatformDefaults::default())
            .unwrap()
            .deployment;
        let c = &d.spec.unwrap().template.spec.unwrap().containers[0];
        let names: Vec<_> = c.env.iter().flatten().map(|e| e.name.as_str()).collect();
        assert_eq!(names.len(), 5);
        assert_eq!(names[4], "REGION");
    }

    fn env_of(d: &Deployment) -> BTreeMap<String, String> {
        let c = &d
            .spec
            .as_ref()
            .unwrap()
            .template
            .spec
            .as_ref()
            .unwrap()
            .containers[0];
        c.env
            .iter()
            .flatten()
            .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
            .collect()
    }

    #[test]
    fn deployment_carries_platform_defaults() {
        let m = ms("todo-api")
            .image("ghcr.io/acme/todo:1.2")
            .port(8080)
            .build();
        let c = desired(&m, &PlatformDefaults::default()).unwrap();
        let d = &c.deployment;
        assert_eq!(d.metadata.name.as_deref(), Some("todo-api"));
        assert_eq!(d.metadata.namespace.as_deref(), Some("default"));
        let spec = d.spec.as_ref().unwrap();
        assert_eq!(spec.replicas, Some(2));
        assert_eq!(
            spec.selector.match_labels.as_ref(),
            Some(&selector("todo-api"))
        );
        let pod = spec.template.spec.as_ref().unwrap();
        let container = &pod.containers[0];
        assert_eq!(container.image.as_deref(), Some("ghcr.io/acme/todo:1.2"));
        assert_eq!(container.ports.as_ref().unwrap()[0].container_port, 8080);
        let env = env_of(d);
        assert_eq!(env["ASPNETCORE_URLS"], "http://+:8080");
        assert_eq!(env["OTEL_SERVICE_NAME"], "todo-api");
        assert_eq!(env["OTEL_SERVICE_VERSION"], "ghcr.io/acme/todo:1.2");
        assert_eq!(
            env["OTEL_EXPORTER_OTLP_ENDPOINT"],
            PlatformDefaults::default().otlp_endpoint
        );
        let ready = container.readiness_probe.as_ref().unwrap();
        assert_eq!(
            ready.http_get.as_ref().unwrap().port,
            IntOrString::Int(8080)
        );
        assert_eq!(
            contract(container),
            [READINESS_PATH, LIVENESS_PATH, "25m", "128Mi"]
        );
    }

    /// The workload contract a container got: readiness and liveness
    /// paths, CPU and memory requests.
    fn contract(container: &Container) -> [&str; 4] {
        fn path(p: &Option<Probe>) -> &str {
            p.as_ref()
                .and_then(|p| p.http_get.as_ref())
                .and_then(|h| h.path.as_deref())
                .unwrap_or_default()
        }
        let requests = container
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .unwrap();
        [
            path(&container.readiness_probe),
            path(&container.liveness_probe),
            requests["cpu"].0.as_str(),
            requests["memory"].0.as_str(),
        ]
    }

    #[test]
    fn pod_labels_satisfy_the_selector() {
        let c = desired(&ms("a").build(), &PlatformDefaults::default()).unwrap();
        let spec = c.deployment.spec.unwrap();
        let pod_labels = spec.template.metadata.unwrap().labels.unwrap();
        for (k, v) in spec.selector.match_labels.unwrap() {
            assert_eq!(pod_labels.get(&k), Some(&v));
        }
        for (k, v) in c.service.spec.unwrap().selector.unwrap() {
            assert_eq!(pod_labels.get(&k), Some(&v));
        }
    }

    #[test]
    fn service_exposes_the_spec_port_and_keeps_allocations_open() {
        let m = ms("api").port(65535).build();
        let svc = desired(&m, &PlatformDefaults::default()).unwrap().service;
        let spec = svc.spec.unwrap();
        assert_eq!(
            spec.cluster_ip, None,
            "clusterIP is the server's to allocate"
        );
        let port = &spec.ports.unwrap()[0];
        assert_eq!(port.port, 65535);
        assert_eq!(port.target_port, Some(IntOrString::Int(65535)));
    }

    #[test]
    fn both_children_are_controlled_by_the_cr() {
        let m = ms("api").uid("u-1").build();
        let c = desired(&m, &PlatformDefaults::default()).unwrap();
        for meta in [&c.deployment.metadata, &c.service.metadata] {
            let refs = meta.owner_references.as_ref().unwrap();
            assert_eq!(refs.len(), 1);
            assert_eq!(refs[0].uid, "u-1");
            assert_eq!(refs[0].kind, "Microservice");
            assert_eq!(refs[0].api_version, "platform.example.io/v1alpha1");
            assert_eq!(refs[0].controller, Some(true));
            assert_eq!(meta.labels.as_ref(), Some(&labels("api")));
        }
    }

    #[test]
    fn collector_endpoint_comes_from_configuration() {
        let defaults = PlatformDefaults {
            otlp_endpoint: "http://collector.platform:4317".into(),
            ..PlatformDefaults::default()
        };
        let c = desired(&ms("a").build(), &defaults).unwrap();
        assert_eq!(
            env_of(&c.deployment)["OTEL_EXPORTER_OTLP_ENDPOINT"],
            "http://collector.platform:4317"
        );
    }

    #[test]
    fn probes_and_requests_come_from_configuration() {
        let defaults = PlatformDefaults {
            readiness_path: "/readyz".into(),
            liveness_path: "/healthz".into(),
            cpu_request: "50m".into(),
            memory_request: "64Mi".into(),
            ..PlatformDefaults::default()
        };
        let c = desired(&ms("a").build(), &defaults).unwrap();
        let pod = c.deployment.spec.unwrap().template.spec.unwrap();
        assert_eq!(
            contract(&pod.containers[0]),
            ["/readyz", "/healthz", "50m", "64Mi"]
        );
    }

    #[test]
    fn digest_image_is_the_service_version() {
        let image = "registry.example.com:5000/api@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        let c = desired(&ms("a").image(image).build(), &PlatformDefaults::default()).unwrap();
        assert_eq!(env_of(&c.deployment)["OTEL_SERVICE_VERSION"], image);
    }

    #[test]
    fn invalid_spec_is_refused() {
        let bad = ms("a").image("Nope:1").build();
        assert!(matches!(
            desired(&bad, &PlatformDefaults::default()),
            Err(DomainError::InvalidSpec(_))
        ));
        let bad_port = ms("a").port(0).build();
        assert!(matches!(
            desired(&bad_port, &PlatformDefaults::default()),
            Err(DomainError::InvalidSpec(_))
        ));
    }

    #[test]
    fn missing_uid_is_a_typed_error() {
        let mut m = ms("a").build();
        m.metadata.uid = None;
        assert!(matches!(
            desired(&m, &PlatformDefaults::default()),
            Err(DomainError::MissingMetadata("uid"))
        ));
    }
}
