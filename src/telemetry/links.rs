//! The last reconcile span of each Microservice in each cluster this
//! replica leads, so that a WaitForRollout span can link to the reconciles
//! it waited on. Only spans this process made are known here.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

use opentelemetry::trace::SpanContext;

/// (cluster, namespace, name)
type Key = (String, String, String);

/// Enough for every object of a large fleet; past it, start over rather than grow.
const CAPACITY: usize = 100_000;

static LAST_RECONCILE: LazyLock<Mutex<HashMap<Key, SpanContext>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

pub fn record(cluster: &str, namespace: &str, name: &str, span: SpanContext) {
    if !span.is_valid() {
        return;
    }
    let mut map = LAST_RECONCILE.lock().unwrap_or_else(|e| e.into_inner());
    if map.len() >= CAPACITY {
        map.clear();
    }
    map.insert((cluster.into(), namespace.into(), name.into()), span);
}

pub fn last(cluster: &str, namespace: &str, name: &str) -> Option<SpanContext> {
    let map = LAST_RECONCILE.lock().unwrap_or_else(|e| e.into_inner());
    map.get(&(cluster.into(), namespace.into(), name.into()))
        .cloned()
}
