//! The status commands: `clusters`, `status` and `wait`, as gRPC calls to
//! any replica.

use std::time::Duration;

use futures::StreamExt;
use tokio::time::Instant;

use super::output;
use super::wait::{GenerationArg, Generations, retry_after, servers};
use crate::api::client::{Client, ClientOptions, connect};
use crate::api::pb;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Table,
    Json,
}

/// Exit codes of `flotilla wait`, for scripts.
pub mod exit {
    pub const DONE: u8 = 0;
    pub const FAILED: u8 = 1;
    pub const TIMED_OUT: u8 = 2;
    /// The question could not be asked: bad arguments, no server, no such object.
    pub const ERROR: u8 = 3;
    /// The command line does not parse (EX_USAGE).
    pub const USAGE: u8 = 64;
}

fn status_error(s: tonic::Status) -> String {
    format!("{:?}: {}", s.code(), s.message())
}

pub async fn clusters(o: &ClientOptions, format: Format) -> Result<(), String> {
    let mut client = connect_first(o).await?;
    let r = client
        .list_clusters(pb::ListClustersRequest {})
        .await
        .map_err(status_error)?
        .into_inner();
    match format {
        Format::Table => print!("{}", output::clusters_table(&r)),
        Format::Json => println!(
            "{}",
            serde_json::json!({
                "replica": r.replica_id,
                "clusters": r.clusters.iter().map(output::cluster_json).collect::<Vec<_>>(),
            })
        ),
    }
    Ok(())
}

/// `ns/name`, as the commands take it.
pub fn split_key(s: &str) -> Result<(String, String), String> {
    match s.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((ns.to_string(), name.to_string()))
        }
        _ => Err(format!("{s:?}: expected NAMESPACE/NAME")),
    }
}

/// `flotilla dns NS/NAME`: the fleet-wide name as etcd holds it.
pub async fn dns(
    o: &ClientOptions,
    format: Format,
    namespace: String,
    name: String,
) -> Result<(), String> {
    let mut client = connect_first(o).await?;
    let m = client
        .get_microservice(pb::GetMicroserviceRequest { namespace, name })
        .await
        .map_err(status_error)?
        .into_inner();
    let Some(dns) = m.dns else {
        return Err(
            "this replica keeps no fleet-wide names (no registry, or --fleet-dns=false)".into(),
        );
    };
    if !dns.error.is_empty() {
        return Err(dns.error);
    }
    match format {
        Format::Table => print!("{}", output::dns_table(&dns)),
        Format::Json => println!("{}", output::dns_json(&dns)),
    }
    Ok(())
}

pub async fn status(
    o: &ClientOptions,
    format: Format,
    key: Option<(String, String)>,
    namespace: Option<String>,
    selector: Option<String>,
) -> Result<(), String> {
    let mut client = connect_first(o).await?;
    if let Some((namespace, name)) = key {
        let m = client
            .get_microservice(pb::GetMicroserviceRequest { namespace, name })
            .await
            .map_err(status_error)?
            .into_inner();
        match format {
            Format::Table => print!("{}", output::microservice_table(&m)),
            Format::Json => println!("{}", output::microservice_json(&m)),
        }
        return Ok(());
    }
    let mut items = Vec::new();
    let mut page_token = String::new();
    loop {
        let ask = pb::ListMicroservicesRequest {
            namespace: namespace.clone().unwrap_or_default(),
            label_selector: selector.clone().unwrap_or_default(),
            cluster: String::new(),
            page_size: 500,
            page_token,
            view: pb::MicroserviceView::Full as i32,
        };
        // No room for the page yet (replies other clients have not read):
        // the server waited 5 s; ask again a few times before giving up.
        let mut tries = 0;
        let r = loop {
            match client.list_microservices(ask.clone()).await {
                Err(s) if s.code() == tonic::Code::ResourceExhausted && tries < 3 => {
                    tries += 1;
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                }
                answer => break answer.map_err(status_error)?.into_inner(),
            }
        };
        items.extend(r.items);
        if r.next_page_token.is_empty() {
            break;
        }
        page_token = r.next_page_token;
    }
    match format {
        Format::Table => {
            for m in &items {
                println!("{}", output::microservice_table(m));
            }
            if items.is_empty() {
                println!("no Microservices");
            }
        }
        Format::Json => println!(
            "{}",
            serde_json::Value::Array(items.iter().map(output::microservice_json).collect())
        ),
    }
    Ok(())
}

pub struct WaitFor {
    pub namespace: String,
    pub name: String,
    pub target: WaitTarget,
    pub clusters: Vec<String>,
    pub timeout: Duration,
}

pub enum WaitTarget {
    Image(String),
    Generations(Vec<GenerationArg>),
}

/// What one connection's attempt came to.
enum Attempt {
    Verdict(u8),
    /// Worth another try, on this replica or the next.
    Lost(String),
}

/// Asks each server in turn until one connects.
async fn connect_first(o: &ClientOptions) -> Result<Client, String> {
    first_of(o, |o| async move { connect(&o).await }).await
}

/// The first server of `--server` that `dial` connects to.
pub async fn first_of<C, F, Fut>(o: &ClientOptions, dial: F) -> Result<C, String>
where
    F: Fn(ClientOptions) -> Fut,
    Fut: std::future::Future<Output = Result<C, String>>,
{
    let mut last = String::new();
    for server in servers(&o.server)? {
        match dial(ClientOptions {
            server,
            ..o.clone()
        })
        .await
        {
            Ok(c) => return Ok(c),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// Follows the rollout until it ends, across replicas: a dropped stream or
/// an unreachable replica is retried on the next server with backoff until
/// the timeout. The verdict is always the server's, recomputed from its
/// index, so nothing is lost across a reconnect. Returns the exit code.
pub async fn wait(o: &ClientOptions, format: Format, w: WaitFor) -> Result<u8, String> {
    let servers = servers(&o.server)?;
    let started = Instant::now();
    let deadline = started + w.timeout;
    // "Current" is resolved by the server, from the members themselves.
    let (target, needs_floors) = match &w.target {
        WaitTarget::Image(i) => (
            pb::wait_for_rollout_request::Target::Image(i.clone()),
            false,
        ),
        WaitTarget::Generations(args) => {
            let g = Generations::resolve(args)?;
            let current = g.current;
            (generations(g), current)
        }
    };
    let mut printer = Printer::new(format, started);
    let mut backoff = FIRST_RETRY;
    let mut lost_at: Option<Instant> = None;
    // Whether any replica ever took the question: if none did, the timeout
    // says nothing about the rollout.
    let mut answered = false;
    for attempt in 0.. {
        let server = &servers[attempt % servers.len()];
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return timed_out(answered);
        }
        let o = ClientOptions {
            server: server.clone(),
            ..o.clone()
        };
        // The grpc-timeout header bounds the server, not this client: a
        // replica that hangs mid-stream must not keep the wait past its time.
        let attempt = async {
            let mut client = connect(&o).await.map_err(Lost::Connect)?;
            if let Some(at) = lost_at.take() {
                eprintln!(
                    "reconnected to {} after {} ms",
                    o.server,
                    at.elapsed().as_millis()
                );
            }
            let mut request = tonic::Request::new(pb::WaitForRolloutRequest {
                namespace: w.namespace.clone(),
                name: w.name.clone(),
                target: Some(target.clone()),
                clusters: w.clusters.clone(),
                timeout: prost_types::Duration::try_from(remaining).ok(),
            });
            // The server ends the stream at the deadline itself; this is the backstop.
            request.set_timeout(remaining + Duration::from_secs(10));
            let mut stream = client
                .wait_for_rollout(request)
                .await
                .map_err(Lost::Status)?
                .into_inner();
            // Connected: the next loss starts its backoff afresh.
            backoff = FIRST_RETRY;
            answered = true;
            while let Some(item) = stream.next().await {
                let p = item.map_err(Lost::Status)?;
                if needs_floors && !p.floors {
                    // An older server ignored `current`: its verdict would
                    // judge the index, which may not have seen our apply.
                    return Ok(Attempt::Lost(format!(
                        "{} does not read live generations (an older version)",
                        o.server
                    )));
                }
                printer.show(&p);
                match pb::RolloutResult::try_from(p.result) {
                    Ok(pb::RolloutResult::Succeeded) => return Ok(Attempt::Verdict(exit::DONE)),
                    Ok(pb::RolloutResult::Failed) => return Ok(Attempt::Verdict(exit::FAILED)),
                    Ok(pb::RolloutResult::DeadlineExceeded) => {
                        return Ok(Attempt::Verdict(exit::TIMED_OUT));
                    }
                    _ => {}
                }
            }
            Ok(Attempt::Lost(
                "the stream ended before the rollout did".to_string(),
            ))
        };
        let outcome =
            match tokio::time::timeout_at(deadline + Duration::from_secs(2), attempt).await {
                Ok(outcome) => outcome,
                Err(_) => return timed_out(answered),
            };
        let (why, pause) = match outcome {
            Ok(Attempt::Verdict(code)) => return Ok(code),
            Ok(Attempt::Lost(why)) => (why, backoff),
            Err(Lost::Connect(e)) => (e, backoff),
            Err(Lost::Status(s)) => match retry_after(&s, backoff) {
                Some(pause) => (status_error(s), pause),
                // A question that cannot be asked as put: an unknown cluster.
                None if s.code() == tonic::Code::InvalidArgument => {
                    eprintln!("error: {}", s.message());
                    return Ok(exit::USAGE);
                }
                None => return Err(status_error(s)),
            },
        };
        if Instant::now() >= deadline {
            return timed_out(answered);
        }
        eprintln!("lost {server}: {why}; retrying");
        lost_at.get_or_insert_with(Instant::now);
        tokio::time::sleep(pause.min(deadline.saturating_duration_since(Instant::now()))).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
    unreachable!("the attempts loop ends only by returning")
}

/// The deadline passed: a verdict (2) if some replica followed the
/// rollout, otherwise the question was never asked (3).
fn timed_out(answered: bool) -> Result<u8, String> {
    if answered {
        Ok(exit::TIMED_OUT)
    } else {
        Err("no replica in --server answered before the timeout".into())
    }
}

const FIRST_RETRY: Duration = Duration::from_millis(200);

enum Lost {
    Connect(String),
    Status(tonic::Status),
}

fn generations(g: Generations) -> pb::wait_for_rollout_request::Target {
    pb::wait_for_rollout_request::Target::Generations(pb::GenerationTargets {
        at_least: g.at_least.into_iter().collect(),
        otherwise: g.otherwise,
        current: g.current,
    })
}

/// Prints progress: for people, a line per change of state, not per
/// replica count, even across reconnects; for machines, every message.
struct Printer {
    format: Format,
    started: Instant,
    printed: Option<Vec<String>>,
}

impl Printer {
    fn new(format: Format, started: Instant) -> Self {
        Printer {
            format,
            started,
            printed: None,
        }
    }

    fn show(&mut self, p: &pb::RolloutProgress) {
        match self.format {
            Format::Table => {
                let now = output::progress_signature(p);
                if self.printed.as_ref() != Some(&now) {
                    print!(
                        "{}",
                        output::progress_text(p, self.started.elapsed().as_secs_f64())
                    );
                    self.printed = Some(now);
                }
            }
            Format::Json => println!("{}", output::progress_json(p)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_namespace_slash_name() {
        assert_eq!(
            split_key("shop/todo-api").unwrap(),
            ("shop".into(), "todo-api".into())
        );
        for bad in ["todo-api", "/x", "x/", "a/b/c"] {
            assert!(split_key(bad).is_err(), "{bad}");
        }
    }
}
