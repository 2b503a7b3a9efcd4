//! How long a streaming call may run: the request's own timeout, the
//! caller's `grpc-timeout`, and the server's cap, whichever is shortest.

use std::time::Duration;

/// Parses the `grpc-timeout` header: up to 8 digits and a unit.
pub fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    if value.len() < 2 || value.len() > 9 {
        return None;
    }
    let (digits, unit) = value.split_at(value.len() - 1);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.checked_mul(3600)?),
        "M" => Duration::from_secs(n.checked_mul(60)?),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

pub fn effective(requested: Option<Duration>, header: Option<Duration>, cap: Duration) -> Duration {
    [requested, header]
        .into_iter()
        .flatten()
        .fold(cap, Duration::min)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_parse_in_every_unit() {
        assert_eq!(parse_grpc_timeout("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(parse_grpc_timeout("3M"), Some(Duration::from_secs(180)));
        assert_eq!(parse_grpc_timeout("10S"), Some(Duration::from_secs(10)));
        assert_eq!(parse_grpc_timeout("250m"), Some(Duration::from_millis(250)));
        assert_eq!(parse_grpc_timeout("7u"), Some(Duration::from_micros(7)));
        assert_eq!(parse_grpc_timeout("9n"), Some(Duration::from_nanos(9)));
        for bad in ["", "S", "10", "10x", "123456789S", "-1S"] {
            assert_eq!(parse_grpc_timeout(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_shortest_limit_wins_and_the_cap_always_applies() {
        let cap = Duration::from_secs(3600);
        let s = Duration::from_secs;
        assert_eq!(effective(None, None, cap), cap);
        assert_eq!(effective(Some(s(5)), None, cap), s(5));
        assert_eq!(effective(Some(s(50)), Some(s(7)), cap), s(7));
        assert_eq!(effective(Some(s(99_999)), None, cap), cap);
    }
}
