//! The webhook provider: POST the evidence as JSON; a 2xx answer passes,
//! anything else, no answer in time or no connection fails.

use std::time::Duration;

use super::client::Http;

/// How much of a refusing answer's body is kept for the status.
const ANSWER_CHARS: usize = 200;

/// Whether the webhook passed, and its answer in a few words.
pub async fn run(
    http: &Http,
    url: &str,
    timeout: Duration,
    headers: &[(http::HeaderName, http::HeaderValue)],
    body: &serde_json::Value,
) -> (bool, String) {
    let body = body.to_string().into_bytes();
    match http
        .post(url, "application/json", headers, body, timeout)
        .await
    {
        Err(answer) => (false, answer),
        Ok(a) if a.status.is_success() => (true, format!("HTTP {}", a.status.as_u16())),
        Ok(a) => {
            let text = String::from_utf8_lossy(&a.body);
            let text: String = text.trim().chars().take(ANSWER_CHARS).collect();
            let code = a.status.as_u16();
            match text.is_empty() {
                true => (false, format!("HTTP {code}")),
                false => (false, format!("HTTP {code}: {text}")),
            }
        }
    }
}
