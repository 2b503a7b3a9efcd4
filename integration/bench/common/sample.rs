//! client-go's sample-controller: built from its Go module, run as a process
//! of its own against one member.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use kube::api::{ApiResource, DynamicObject, PostParams};
use kube::{Api, Client};
use serde_json::json;

use crate::support::{fleet_dir, kubeconfig_path, kubectl};

/// The two controllers measured side by side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Who {
    Flotilla,
    Sample,
}

impl Who {
    pub fn name(self) -> &'static str {
        match self {
            Who::Flotilla => "flotilla",
            Who::Sample => "sample-controller",
        }
    }

    /// How the apiserver's audit log names its requests.
    pub fn user_agent(self) -> &'static str {
        match self {
            Who::Flotilla => "flotilla/",
            Who::Sample => "sample-controller/",
        }
    }
}

/// A controller process, stopped when dropped: SIGTERM first (so Flotilla
/// releases its Lease), then SIGKILL after 5 s.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        for _ in 0..50 {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.0.kill().ok();
        self.0.wait().ok();
    }
}

/// The directory holding the built `sample-controller` and its `crd.yaml`.
pub fn sample_dir() -> PathBuf {
    let out = Command::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/integration/bench/build-sample-controller.sh"
    ))
    .output()
    .expect("build sample-controller");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// Installs the Foo CRD in `cluster`.
pub fn install_foo_crd(sample: &Path, cluster: &str) {
    let status = Command::new(kubectl())
        .arg("--kubeconfig")
        .arg(kubeconfig_path(cluster))
        .args(["apply", "--server-side", "-f"])
        .arg(sample.join("crd.yaml"))
        .stdout(Stdio::null())
        .status()
        .expect("kubectl");
    assert!(status.success(), "Foo CRD in {cluster}");
}

/// sample-controller against `cluster`, at client-go's default limits (5/10).
pub fn start_sample(sample: &Path, cluster: &str, tag: &str) -> Proc {
    let log = std::fs::File::create(
        fleet_dir()
            .join("logs")
            .join(format!("bench-sample-controller-{tag}.log")),
    )
    .expect("log");
    let child = Command::new(sample.join("sample-controller"))
        .arg("-kubeconfig")
        .arg(kubeconfig_path(cluster))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start sample-controller");
    Proc(child)
}

pub fn foo_resource() -> ApiResource {
    ApiResource {
        group: "samplecontroller.k8s.io".into(),
        version: "v1alpha1".into(),
        api_version: "samplecontroller.k8s.io/v1alpha1".into(),
        kind: "Foo".into(),
        plural: "foos".into(),
    }
}

pub fn microservice_resource() -> ApiResource {
    ApiResource::erase::<flotilla::crd::Microservice>(&())
}

/// Creates a Foo whose Deployment has the same name.
pub async fn create_foo(client: Client, ns: &str, name: &str, replicas: i64) {
    let object = DynamicObject::new(name, &foo_resource())
        .data(json!({"spec": {"deploymentName": name, "replicas": replicas}}));
    Api::<DynamicObject>::namespaced_with(client, ns, &foo_resource())
        .create(&PostParams::default(), &object)
        .await
        .expect("create Foo");
}
