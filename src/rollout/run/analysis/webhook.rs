//! The webhook provider: POST the evidence as JSON; a 2xx answer passes,
//! anything else, no answer in time or no connection fails.

use std::time::Duration;

use super::client::Http;

/// Whether the webhook passed, and its answer in a few words: the status
/// code and its standard reason, never the body (#59: an answer's text
/// would carry whatever the called address says into the status).
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
        Ok(a) => (a.status.is_success(), answer(a.status)),
    }
}

/// `HTTP 503 Service Unavailable`: fixed text for each code.
pub fn answer(status: http::StatusCode) -> String {
    match status.canonical_reason() {
        Some(reason) => format!("HTTP {} {reason}", status.as_u16()),
        None => format!("HTTP {}", status.as_u16()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_is_its_code_and_standard_reason_only() {
        assert_eq!(answer(http::StatusCode::OK), "HTTP 200 OK");
        assert_eq!(
            answer(http::StatusCode::SERVICE_UNAVAILABLE),
            "HTTP 503 Service Unavailable"
        );
        assert_eq!(answer(http::StatusCode::from_u16(599).unwrap()), "HTTP 599");
    }
}
