//! The Prometheus provider: each query of a run goes to `/api/v1/query`
//! as an instant query, all of them within the check's timeout.

use std::time::Duration;

use super::client::Http;
use crate::rollout::analysis::condition::Condition;
use crate::rollout::analysis::promql;

/// Whether every query's every sample met the condition, and the answer.
pub async fn run(
    http: &Http,
    address: &str,
    timeout: Duration,
    queries: &[(Option<String>, String)],
    condition: &Condition,
) -> (bool, String) {
    let url = crate::rollout::analysis::query_url(address);
    let all = async {
        let mut results = Vec::with_capacity(queries.len());
        for (cluster, query) in queries {
            let form = form_urlencoded::Serializer::new(String::new())
                .append_pair("query", query)
                .finish();
            let content_type = "application/x-www-form-urlencoded";
            let verdict = match http
                .post(&url, content_type, &[], form.into_bytes(), timeout)
                .await
            {
                Ok(a) => promql::verdict(a.status.as_u16(), &a.body, condition),
                Err(no_answer) => Err(no_answer),
            };
            let failed = verdict.is_err();
            results.push((cluster.clone(), verdict));
            // The first failure decides: the rest would not change the verdict.
            if failed {
                break;
            }
        }
        promql::combine(results)
    };
    tokio::time::timeout(timeout, all)
        .await
        .unwrap_or_else(|_| (false, format!("no answer within {timeout:?}")))
}
