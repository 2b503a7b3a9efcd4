//! How every watch in the operator starts.

use kube::runtime::watcher;

use crate::domain::desired::{LABEL_MANAGED_BY, MANAGED_BY};

/// The base watch configuration. With streaming lists, a watch (and each
/// restart of one, e.g. after a replica restarts) receives its initial state
/// as watch events, so no LIST request is sent. That needs the WatchList
/// feature (Kubernetes 1.32 and later, on by default); members older than
/// that need `--streaming-lists=false`.
pub fn config(streaming_lists: bool) -> watcher::Config {
    let config = watcher::Config::default();
    if streaming_lists {
        config.streaming_lists()
    } else {
        config
    }
}

/// The same, for the children we made: they carry our managed-by label, so
/// watching only those keeps the caches small.
pub fn managed(streaming_lists: bool) -> watcher::Config {
    config(streaming_lists).labels(&format!("{LABEL_MANAGED_BY}={MANAGED_BY}"))
}
