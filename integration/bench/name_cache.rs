//! What the name cache costs (`cargo bench --bench name_cache`; needs the
//! local fleet). The reconciler keeps a metadata-only store of every
//! Deployment in its scope, ours or not, so that a missing child needs no
//! GET. This creates 5,000 foreign Deployments (replicas 0, each with a
//! kubectl-style last-applied annotation, as real ones have) in a namespace
//! of member-3, fills that store, and counts the heap it holds, against a
//! store of the full objects.
//!
//! FLOTILLA_BENCH_FOREIGN (5000) sets the number of Deployments.

#[path = "../tests/support/mod.rs"]
mod support;

#[path = "common/mod.rs"]
mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Duration;

use futures::{StreamExt, stream};
use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use kube::api::PostParams;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use serde_json::json;

use flotilla::reconciler::names;

/// Bytes the heap holds, as this process's allocator sees them.
struct Counting;

static HELD: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        HELD.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        HELD.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn held() -> isize {
    HELD.load(Ordering::Relaxed)
}

fn foreign(i: usize) -> Deployment {
    let labels = json!({"app": format!("legacy-{i}"), "team": "payments", "tier": "backend"});
    let spec = json!({
        "replicas": 0,
        "selector": {"matchLabels": {"app": format!("legacy-{i}")}},
        "template": {"metadata": {"labels": labels},
                     "spec": {"containers": [{"name": "app", "image": format!("ghcr.io/acme/legacy-{i}:2.1.0"),
                              "ports": [{"containerPort": 8080}],
                              "env": [{"name": "MODE", "value": "production"}]}]}},
    });
    let applied = json!({"apiVersion": "apps/v1", "kind": "Deployment",
                         "metadata": {"name": format!("legacy-{i:05}"), "labels": labels}, "spec": spec});
    support::from_json(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": format!("legacy-{i:05}"), "labels": labels,
                     "annotations": {"kubectl.kubernetes.io/last-applied-configuration": applied.to_string()}},
        "spec": spec,
    }))
}

/// Heap bytes held once `fill` has brought a store to `n` entries.
async fn held_by<F, Fut>(n: usize, fill: F) -> isize
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Box<dyn Fn() -> usize + Send>>,
{
    let before = held();
    let len = fill().await;
    let give_up = tokio::time::Instant::now() + Duration::from_secs(120);
    while len() < n {
        assert!(
            tokio::time::Instant::now() < give_up,
            "the store never filled"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Let the watch's decode buffers go.
    tokio::time::sleep(Duration::from_millis(500)).await;
    held() - before
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let n = common::env_usize("FLOTILLA_BENCH_FOREIGN", 5000);
    let client = support::client("member-3").await;
    let ns = support::TestNamespace::create(&client, "member-3", "bench-names").await;
    let api: Api<Deployment> = ns.api();
    let t0 = std::time::Instant::now();
    stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            async move {
                api.create(&PostParams::default(), &foreign(i))
                    .await
                    .expect("create");
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    println!(
        "created {n} foreign Deployments in {:.1} s",
        t0.elapsed().as_secs_f64()
    );

    let config = watcher::Config::default().streaming_lists();
    let meta_api: Api<kube::core::PartialObjectMeta<Deployment>> = ns.api();
    let meta_config = config.clone();
    let metadata = held_by(n, move || async move {
        let (store, stream) = names::watch(meta_api, meta_config);
        tokio::spawn(stream.for_each(|_| futures::future::ready(())));
        Box::new(move || store.state().len()) as Box<dyn Fn() -> usize + Send>
    })
    .await;
    let full = held_by(n, move || async move {
        let (store, writer) = reflector::store::<Deployment>();
        let stream = watcher(api, config).reflect(writer).touched_objects();
        tokio::spawn(stream.for_each(|_| futures::future::ready(())));
        Box::new(move || store.state().len()) as Box<dyn Fn() -> usize + Send>
    })
    .await;
    let per = |b: isize| b as f64 / n as f64;
    println!(
        "name cache: {:.0} bytes per Deployment ({:.2} MiB for {n}); full objects: {:.0} bytes each ({:.2} MiB)",
        per(metadata),
        metadata as f64 / 1048576.0,
        per(full),
        full as f64 / 1048576.0
    );
    common::write_json(
        "name_cache",
        &json!({"objects": n, "bytes_per_object": per(metadata), "full_bytes_per_object": per(full)}),
    );
}
