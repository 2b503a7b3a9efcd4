//! The pure parts of `flotilla wait`: which generation each cluster must
//! reach, which servers to ask, and which failures a reconnect can cure.

use std::collections::BTreeMap;
use std::time::Duration;

/// One `--generation` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GenerationArg {
    /// `--generation` alone: each cluster's generation when the wait starts.
    Current,
    /// `--generation N`: every cluster at least N.
    All(i64),
    /// `--generation CLUSTER=N`: this cluster at least N.
    Cluster(String, i64),
}

pub fn parse_generation(s: &str) -> Result<GenerationArg, String> {
    let number = |n: &str| -> Result<i64, String> {
        match n.trim().parse::<i64>() {
            Ok(g) if g >= 1 => Ok(g),
            _ => Err(format!("{n:?} is not a generation (a whole number from 1)")),
        }
    };
    match s.split_once('=') {
        _ if s == "current" => Ok(GenerationArg::Current),
        Some((cluster, n)) if !cluster.trim().is_empty() => Ok(GenerationArg::Cluster(
            cluster.trim().to_string(),
            number(n)?,
        )),
        Some(_) => Err(format!("{s:?}: expected CLUSTER=N")),
        None => number(s).map(GenerationArg::All),
    }
}

/// Per-cluster minimums, and the one for clusters not listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generations {
    pub at_least: BTreeMap<String, i64>,
    pub otherwise: i64,
    /// Each cluster not in `at_least` waits for its live generation when
    /// the wait starts, which the server reads from the member itself: an
    /// index that has not seen the caller's last write cannot answer it.
    pub current: bool,
}

impl Generations {
    /// An explicit CLUSTER=N wins over "current".
    pub fn resolve(args: &[GenerationArg]) -> Result<Self, String> {
        let all: Vec<i64> = args
            .iter()
            .filter_map(|a| match a {
                GenerationArg::All(n) => Some(*n),
                _ => None,
            })
            .collect();
        if all.len() > 1 || (!all.is_empty() && args.contains(&GenerationArg::Current)) {
            return Err(
                "give one of --generation (each cluster's current), --generation N, plus any CLUSTER=N"
                    .into(),
            );
        }
        let at_least = args
            .iter()
            .filter_map(|a| match a {
                GenerationArg::Cluster(c, n) => Some((c.clone(), *n)),
                _ => None,
            })
            .collect();
        Ok(Generations {
            at_least,
            otherwise: all.first().copied().unwrap_or(1),
            current: all.is_empty(),
        })
    }
}

/// `--server`: one address or several, comma-separated. A DNS name that
/// resolves to several replicas is re-resolved on each connection.
pub fn servers(s: &str) -> Result<Vec<String>, String> {
    let list: Vec<String> = s
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    if list.is_empty() {
        return Err("--server names no address".into());
    }
    Ok(list)
}

/// Whether to ask again, and after how long. A status with Flotilla's
/// details says so itself: its `RetryInfo` (never less than `backoff`, so
/// "at once" still backs off), and none means a retry cannot help. A
/// status without them (a proxy's, a transport's, an older server's) is
/// judged by its code, after `backoff`.
pub fn retry_after(s: &tonic::Status, backoff: Duration) -> Option<Duration> {
    match crate::api::errors::read(s) {
        (Some(_), retry) => retry.map(|after| after.max(backoff)),
        (None, _) => retryable(s.code()).then_some(backoff),
    }
}

/// Failures another attempt, on this replica or another, may get past.
/// The rest are answers: a bad request, a refused token, an unknown cluster.
pub fn retryable(code: tonic::Code) -> bool {
    use tonic::Code::*;
    matches!(
        code,
        Unavailable
            | Unknown
            | Internal
            | Cancelled
            | Aborted
            | ResourceExhausted
            | DeadlineExceeded
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_info_decides_over_the_code_when_the_server_sent_it() {
        use crate::api::errors::{Reason, Refusal, status};
        let backoff = Duration::from_millis(200);
        // Throttled: the server's window, not the client's backoff.
        let throttled = Refusal::new(Reason::TokensThrottled, "too many refused tokens")
            .retry(Duration::from_secs(7))
            .into_status();
        assert_eq!(
            retry_after(&throttled, backoff),
            Some(Duration::from_secs(7))
        );
        // "At once" still waits the backoff.
        let shutting = status(Reason::ShuttingDown, "bye");
        assert_eq!(retry_after(&shutting, backoff), Some(backoff));
        // A reason without RetryInfo is final, whatever its code.
        let not_found = status(Reason::FleetMicroserviceNotFound, "no such");
        assert_eq!(retry_after(&not_found, backoff), None);
        // Without details, the code decides.
        assert_eq!(
            retry_after(&tonic::Status::unavailable("proxy"), backoff),
            Some(backoff)
        );
        assert_eq!(
            retry_after(&tonic::Status::not_found("proxy"), backoff),
            None
        );
    }

    #[test]
    fn generation_values_parse_or_say_why_not() {
        assert_eq!(parse_generation("current").unwrap(), GenerationArg::Current);
        assert_eq!(parse_generation("7").unwrap(), GenerationArg::All(7));
        assert_eq!(
            parse_generation("member-1=4").unwrap(),
            GenerationArg::Cluster("member-1".into(), 4)
        );
        for bad in ["0", "-2", "x", "=3", "member-1=", "member-1=0"] {
            assert!(parse_generation(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn each_cluster_waits_for_its_own_generation_unless_told_otherwise() {
        let g = Generations::resolve(&[GenerationArg::Current]).unwrap();
        assert_eq!(g.at_least, BTreeMap::new());
        assert_eq!((g.otherwise, g.current), (1, true));
        let g = Generations::resolve(&[
            GenerationArg::Current,
            GenerationArg::Cluster("m2".into(), 11),
        ])
        .unwrap();
        assert_eq!(g.at_least, BTreeMap::from([("m2".to_string(), 11)]));
        assert!(g.current);
        // CLUSTER=N alone: the rest at their current generation.
        assert!(
            Generations::resolve(&[GenerationArg::Cluster("m1".into(), 6)])
                .unwrap()
                .current
        );
        // A bare number is for every cluster; overrides still apply.
        let g = Generations::resolve(&[
            GenerationArg::All(5),
            GenerationArg::Cluster("m1".into(), 6),
        ])
        .unwrap();
        assert_eq!(g.at_least, BTreeMap::from([("m1".to_string(), 6)]));
        assert_eq!((g.otherwise, g.current), (5, false));
        assert!(Generations::resolve(&[GenerationArg::All(5), GenerationArg::All(6)]).is_err());
        assert!(Generations::resolve(&[GenerationArg::All(5), GenerationArg::Current]).is_err());
    }

    #[test]
    fn servers_are_a_comma_separated_list() {
        assert_eq!(
            servers("http://a:1, http://b:2,").unwrap(),
            ["http://a:1", "http://b:2"]
        );
        assert!(servers(" , ").is_err());
    }

    #[test]
    fn only_failures_of_the_connection_are_retried() {
        assert!(retryable(tonic::Code::Unavailable));
        assert!(retryable(tonic::Code::ResourceExhausted));
        for answer in [
            tonic::Code::InvalidArgument,
            tonic::Code::NotFound,
            tonic::Code::Unauthenticated,
            tonic::Code::PermissionDenied,
        ] {
            assert!(!retryable(answer), "{answer:?}");
        }
    }
}
