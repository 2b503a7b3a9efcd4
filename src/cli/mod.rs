//! Command-line helpers: duration parsing, and the status commands'
//! output (`output`, pure) and calls (`remote`).

pub mod args;
#[cfg(test)]
mod doc_examples;
pub mod output;
pub mod remote;
pub mod rollout;
pub mod rollout_output;
pub mod wait;

use std::time::Duration;

/// Parses durations such as `300ms`, `2s`, `5m`, `1h` (a bare number is seconds).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (try 500ms, 2s, 5m)"))?;
    let secs = match unit {
        "ms" => value / 1000.0,
        "" | "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => {
            return Err(format!(
                "{s:?} has an unknown unit {unit:?} (use ms, s, m or h)"
            ));
        }
    };
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("{s:?} is not a valid duration"));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(parse_duration("300ms").unwrap(), Duration::from_millis(300));
        assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("15").unwrap(), Duration::from_secs(15));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
    }

    #[test]
    fn garbage_is_a_clear_error() {
        for bad in ["", "s", "5 parsecs", "-1s", "1d"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }
}
