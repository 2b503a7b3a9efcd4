//! Critical tasks are watched: one that ends before shutdown was asked for
//! (an error, a panic or a plain return) stops the replica with an error,
//! so that Kubernetes restarts it, instead of leaving a pod Ready that no
//! longer serves or leads.

use std::future::Future;

use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A named task whose end, before shutdown, is fatal.
pub struct Critical {
    pub name: &'static str,
    pub task: JoinHandle<Result<(), String>>,
}

impl Critical {
    pub fn spawn(
        name: &'static str,
        task: impl Future<Output = Result<(), String>> + Send + 'static,
    ) -> Self {
        Critical {
            name,
            task: tokio::spawn(task),
        }
    }
}

fn outcome(name: &str, joined: Result<Result<(), String>, tokio::task::JoinError>) -> String {
    match joined {
        Ok(Ok(())) => format!("{name} stopped unexpectedly"),
        Ok(Err(e)) => format!("{name} failed: {e}"),
        Err(e) if e.is_panic() => format!("{name} panicked"),
        Err(e) => format!("{name} was cancelled: {e}"),
    }
}

/// A fault injected into the task `name`, in test builds only: with the
/// `fault-hooks` feature, `FLOTILLA_FAULT=name[,name]` makes it fail after
/// 2 s. Otherwise it never resolves.
pub async fn injected(name: &str) -> String {
    #[cfg(feature = "fault-hooks")]
    {
        let asked = std::env::var("FLOTILLA_FAULT").unwrap_or_default();
        if asked.split(',').any(|t| t.trim() == name) {
            tokio::time::sleep(std::time::Duration::from_secs(2)).await;
            return format!("injected fault in {name}");
        }
    }
    let _ = name;
    std::future::pending().await
}

/// How long the status feed of `cluster` holds each Microservice change,
/// and the end of each listing, back, in test builds only: with the `fault-hooks` feature,
/// `FLOTILLA_FEED_DELAY=cluster=millis[,…]` stages an index that lags its
/// member. Otherwise none.
pub fn feed_delay(cluster: &str) -> Option<std::time::Duration> {
    if !cfg!(feature = "fault-hooks") {
        return None;
    }
    let asked = std::env::var("FLOTILLA_FEED_DELAY").unwrap_or_default();
    asked.split(',').find_map(|item| {
        let (c, ms) = item.trim().split_once('=')?;
        (c == cluster)
            .then(|| ms.parse().ok().map(std::time::Duration::from_millis))
            .flatten()
    })
}

/// How long the rollout cache holds each FleetMicroservice and
/// ControllerRevision watch event back, in test builds only: with the `fault-hooks` feature,
/// `FLOTILLA_ROLLOUT_CACHE_DELAY=millis` stages a replica whose view of the
/// home cluster lags it. Otherwise none.
pub fn rollout_cache_delay() -> Option<std::time::Duration> {
    if !cfg!(feature = "fault-hooks") {
        return None;
    }
    std::env::var("FLOTILLA_ROLLOUT_CACHE_DELAY")
        .ok()?
        .parse()
        .ok()
        .map(std::time::Duration::from_millis)
}

/// Whether the status feed of `cluster` should drop its watch's changes,
/// as a stuck watch cache does, in test builds only: with the `fault-hooks`
/// feature, `FLOTILLA_FEED_STALL=cluster=path[,…]` stalls it while `path`
/// exists. Listings still pass, so a relist heals it.
pub fn feed_stalled(cluster: &str) -> bool {
    if !cfg!(feature = "fault-hooks") {
        return false;
    }
    let asked = std::env::var("FLOTILLA_FEED_STALL").unwrap_or_default();
    asked.split(',').any(|item| {
        item.trim()
            .split_once('=')
            .is_some_and(|(c, path)| c == cluster && std::path::Path::new(path).exists())
    })
}

/// Whether the planner should panic on the FleetMicroservice `name`: with
/// the `fault-hooks` feature (test builds) only, which is the only build
/// that has this function; `FLOTILLA_PLAN_PANIC=name[,name]` proves the
/// catch-panic boundary.
#[cfg(feature = "fault-hooks")]
pub fn plan_panic(name: &str) -> bool {
    std::env::var("FLOTILLA_PLAN_PANIC")
        .unwrap_or_default()
        .split(',')
        .any(|n| n.trim() == name)
}

/// `task`, failing if a fault is injected into it (test builds only).
pub async fn with_fault(
    name: &'static str,
    task: impl Future<Output = Result<(), String>>,
) -> Result<(), String> {
    tokio::select! {
        r = task => r,
        e = injected(name) => Err(e),
    }
}

/// Runs until shutdown is asked for through `stop` (then waits for every
/// task in order, so the first can release what the others serve), or until
/// one task ends on its own: then asks the others to stop, waits for them,
/// and returns that task's failure.
pub async fn supervise(mut tasks: Vec<Critical>, stop: watch::Sender<bool>) -> Result<(), String> {
    let mut asked = stop.subscribe();
    let first = {
        let ends = tasks.iter_mut().map(|c| Box::pin(&mut c.task));
        tokio::select! {
            biased;
            _ = asked.wait_for(|s| *s) => None,
            (joined, i, _) = futures::future::select_all(ends) => Some((i, joined)),
        }
    };
    // A task that ends because shutdown was asked for has not failed, even
    // when it ends before this loop sees the request.
    let shutting_down = *stop.borrow();
    let failure = first.and_then(|(i, joined)| {
        let c = tasks.remove(i);
        if shutting_down && matches!(joined, Ok(Ok(()))) {
            return None;
        }
        let why = outcome(c.name, joined);
        tracing::error!(task = c.name, reason = %why, "a critical task ended; stopping the replica");
        Some(why)
    });
    stop.send_replace(true);
    for c in tasks {
        match c.task.await {
            Ok(Ok(())) => {}
            other => {
                tracing::error!(task = c.name, reason = %outcome(c.name, other), "task ended badly during shutdown")
            }
        }
    }
    failure.map_or(Ok(()), Err)
}

/// A watch that lags its apiserver by what a file says, in test builds
/// only: with the `fault-hooks` feature, `FLOTILLA_WATCH_LAG_FILE=path`
/// delivers each event of the watches of `scope` (a member's name, or
/// `home`) as many milliseconds after it arrived as the file's
/// `scope=millis` line gives, read as the event arrives: the chaos
/// nemesis writes the file and removes it. Otherwise the stream as it is.
pub fn watch_lagged<U: Send + 'static, E: Send + 'static>(
    scope: &str,
    events: impl futures::Stream<Item = Result<U, E>> + Send + 'static,
) -> futures::stream::BoxStream<'static, Result<U, E>> {
    use futures::StreamExt;
    let path = cfg!(feature = "fault-hooks")
        .then(|| std::env::var_os("FLOTILLA_WATCH_LAG_FILE"))
        .flatten();
    let Some(path) = path else {
        return events.boxed();
    };
    let scope = scope.to_string();
    delayed(events, move || lag_in(&path, &scope))
}

/// Each item of `events` delivered `lag()` after it arrived, read as it
/// arrives, so a burst keeps its spacing. An error is followed by no read
/// until its reader has taken it: a watch that fails at once is then asked
/// again at its reader's pace (its backoff). Read ahead, a watch of a
/// stopped apiserver was asked about 1,500 times a second and queued its
/// errors, which the reader's backoff then took one by one for hours: the
/// rollout caches stayed stale long after a home restart (#62's chaos).
pub fn delayed<U: Send + 'static, E: Send + 'static>(
    events: impl futures::Stream<Item = Result<U, E>> + Send + 'static,
    lag: impl Fn() -> std::time::Duration + Send + 'static,
) -> futures::stream::BoxStream<'static, Result<U, E>> {
    use futures::StreamExt;
    type Taken = tokio::sync::oneshot::Sender<()>;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<(_, _, Option<Taken>)>();
    tokio::spawn(async move {
        let mut events = std::pin::pin!(events);
        loop {
            // Ends with its reader, so a watch restarted does not leave
            // the old one open.
            let e = tokio::select! {
                e = events.next() => e,
                _ = tx.closed() => return,
            };
            let Some(e) = e else { return };
            let at = tokio::time::Instant::now() + lag();
            let (taken, wait) = match e.is_err() {
                true => {
                    let (t, w) = tokio::sync::oneshot::channel();
                    (Some(t), Some(w))
                }
                false => (None, None),
            };
            if tx.send((at, e, taken)).is_err() {
                return;
            }
            if let Some(wait) = wait {
                tokio::select! {
                    _ = wait => {}
                    _ = tx.closed() => return,
                }
            }
        }
    });
    tokio_stream::wrappers::UnboundedReceiverStream::new(rx)
        .then(|(at, e, taken)| async move {
            tokio::time::sleep_until(at).await;
            if let Some(t) = taken {
                let _ = t.send(());
            }
            e
        })
        .boxed()
}

/// The lag the file at `path` gives `scope`; none without the file.
fn lag_in(path: &std::ffi::OsStr, scope: &str) -> std::time::Duration {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .find_map(|l| {
            let (s, ms) = l.trim().split_once('=')?;
            (s == scope).then(|| ms.parse().ok()).flatten()
        })
        .map_or(std::time::Duration::ZERO, std::time::Duration::from_millis)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A task that runs until stop is asked for, like the servers do.
    fn until_stopped(
        stop: &watch::Sender<bool>,
    ) -> impl Future<Output = Result<(), String>> + use<> {
        let mut rx = stop.subscribe();
        async move {
            rx.wait_for(|s| *s).await.ok();
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_task_that_ends_early_stops_the_others_and_is_named() {
        for fault in ["return", "error", "panic"] {
            let (stop, _) = watch::channel(false);
            let early = async move {
                tokio::time::sleep(Duration::from_millis(10)).await;
                match fault {
                    "return" => Ok(()),
                    "error" => Err("address in use".to_string()),
                    _ => panic!("injected"),
                }
            };
            let tasks = vec![
                Critical::spawn("fleet runtime", until_stopped(&stop)),
                Critical::spawn("gRPC server", early),
                Critical::spawn("metrics endpoint", until_stopped(&stop)),
            ];
            let err = tokio::time::timeout(Duration::from_secs(5), supervise(tasks, stop))
                .await
                .expect("the others stop too")
                .unwrap_err();
            assert!(err.starts_with("gRPC server"), "{fault}: {err}");
        }
    }

    #[tokio::test]
    async fn a_requested_shutdown_waits_for_every_task_and_succeeds() {
        let (stop, _) = watch::channel(false);
        let tasks = vec![
            Critical::spawn("fleet runtime", until_stopped(&stop)),
            Critical::spawn("gRPC server", until_stopped(&stop)),
        ];
        let asker = stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            asker.send_replace(true);
        });
        supervise(tasks, stop).await.unwrap();
    }

    /// A source failing at once (a watch of a stopped apiserver) is read
    /// again only when its reader takes the error: with a reader backing
    /// off, a handful of reads, not thousands queued ahead of it.
    #[tokio::test]
    async fn a_failing_watch_is_read_at_its_readers_pace() {
        use futures::StreamExt;
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};
        let reads = Arc::new(AtomicUsize::new(0));
        let counted = reads.clone();
        let refused = futures::stream::unfold((), move |()| {
            let counted = counted.clone();
            async move {
                tokio::task::yield_now().await;
                counted.fetch_add(1, Ordering::SeqCst);
                Some((Err::<(), &str>("connection refused"), ()))
            }
        });
        let mut lagged = delayed(refused, || Duration::from_millis(1));
        for _ in 0..3 {
            let e = tokio::time::timeout(Duration::from_secs(5), lagged.next()).await;
            assert!(matches!(e, Ok(Some(Err(_)))), "{e:?}");
            // The reader's backoff.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let n = reads.load(Ordering::SeqCst);
        assert!(n <= 4, "the source was read {n} times for 3 errors taken");
    }

    /// Events that succeed keep their spacing: each is delivered its lag
    /// after it arrived, not its lag after the one before it. On paused
    /// time, so a loaded machine cannot stretch it.
    #[tokio::test(start_paused = true)]
    async fn events_keep_their_spacing_under_a_lag() {
        use futures::StreamExt;
        let lag = Duration::from_millis(200);
        let mut lagged = delayed(
            futures::stream::iter((0..5).map(Ok::<i32, ()>)),
            move || lag,
        );
        let start = tokio::time::Instant::now();
        for i in 0..5 {
            let e = tokio::time::timeout(Duration::from_secs(5), lagged.next()).await;
            assert_eq!(e, Ok(Some(Ok(i))));
        }
        let took = start.elapsed();
        assert!(took >= lag && took < lag * 2, "{took:?}");
    }

    #[test]
    fn the_watch_lag_file_gives_each_scope_its_own_lag() {
        let dir = std::env::temp_dir().join(format!("flotilla-lag-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("watch-lag");
        assert_eq!(lag_in(path.as_os_str(), "home"), Duration::ZERO, "no file");
        std::fs::write(&path, "member-2=2500\nhome=700\n").unwrap();
        assert_eq!(
            lag_in(path.as_os_str(), "member-2"),
            Duration::from_millis(2500)
        );
        assert_eq!(lag_in(path.as_os_str(), "home"), Duration::from_millis(700));
        assert_eq!(lag_in(path.as_os_str(), "member-1"), Duration::ZERO);
        std::fs::write(&path, "member-2=soon\n").unwrap();
        assert_eq!(
            lag_in(path.as_os_str(), "member-2"),
            Duration::ZERO,
            "unreadable"
        );
        std::fs::remove_dir_all(&dir).ok();
    }
}
