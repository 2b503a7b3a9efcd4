//! How every watch in the operator starts.

use kube::runtime::watcher;

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
