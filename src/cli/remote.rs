//! The status commands: `clusters`, `status` and `wait`, as gRPC calls to
//! any replica.

use std::time::Duration;

use futures::StreamExt;
use tokio::time::Instant;

use super::output;
use crate::api::client::{ClientOptions, connect};
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
    let mut client = connect(o).await?;
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

pub async fn status(
    o: &ClientOptions,
    format: Format,
    key: Option<(String, String)>,
    namespace: Option<String>,
    selector: Option<String>,
) -> Result<(), String> {
    let mut client = connect(o).await?;
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
        let r = client
            .list_microservices(pb::ListMicroservicesRequest {
                namespace: namespace.clone().unwrap_or_default(),
                label_selector: selector.clone().unwrap_or_default(),
                cluster: String::new(),
                page_size: 500,
                page_token,
            })
            .await
            .map_err(status_error)?
            .into_inner();
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
    pub target: pb::wait_for_rollout_request::Target,
    pub clusters: Vec<String>,
    pub timeout: Duration,
}

/// Streams progress until the rollout ends; returns the exit code.
pub async fn wait(o: &ClientOptions, format: Format, w: WaitFor) -> Result<u8, String> {
    let mut client = connect(o).await?;
    let mut request = tonic::Request::new(pb::WaitForRolloutRequest {
        namespace: w.namespace,
        name: w.name,
        target: Some(w.target),
        clusters: w.clusters,
        timeout: prost_types::Duration::try_from(w.timeout).ok(),
    });
    // The server ends the stream at the deadline itself; this is the backstop.
    request.set_timeout(w.timeout + Duration::from_secs(10));
    let started = Instant::now();
    let mut stream = client
        .wait_for_rollout(request)
        .await
        .map_err(status_error)?
        .into_inner();
    let mut last = None;
    let mut printed = None;
    while let Some(item) = stream.next().await {
        let p = match item {
            Ok(p) => p,
            Err(s) if s.code() == tonic::Code::DeadlineExceeded => return Ok(exit::TIMED_OUT),
            Err(s) => return Err(status_error(s)),
        };
        match format {
            // People see a line per change of state, not per replica count.
            Format::Table => {
                let now = output::progress_signature(&p);
                if printed.as_ref() != Some(&now) {
                    print!(
                        "{}",
                        output::progress_text(&p, started.elapsed().as_secs_f64())
                    );
                    printed = Some(now);
                }
            }
            Format::Json => println!("{}", output::progress_json(&p)),
        }
        last = pb::RolloutResult::try_from(p.result).ok();
    }
    Ok(match last {
        Some(pb::RolloutResult::Succeeded) => exit::DONE,
        Some(pb::RolloutResult::Failed) => exit::FAILED,
        Some(pb::RolloutResult::DeadlineExceeded) => exit::TIMED_OUT,
        _ => return Err("the server ended the stream before the rollout ended".into()),
    })
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
