//! Durations as people write them (`300ms`, `2s`, `5m`, `1h`), for flags
//! and for specs. A spec's text reaches arithmetic, so parsing never panics
//! and callers bound what they accept.

use std::time::Duration;

/// Parses durations such as `300ms`, `2s`, `5m`, `1h` (a bare number is
/// seconds). A value too large for a `Duration` is an error, not a panic.
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
    Duration::try_from_secs_f64(secs).map_err(|_| format!("{s:?} is too long a duration"))
}

/// Parses a duration and holds it to `max`, naming both in the error.
pub fn parse_bounded(s: &str, max: Duration) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d > max {
        return Err(format!("{s:?} is longer than the maximum {}", human(max)));
    }
    Ok(d)
}

/// `168h`, `90s`, `250ms`: the largest whole unit.
fn human(d: Duration) -> String {
    let s = d.as_secs();
    if d.subsec_millis() != 0 || s == 0 {
        format!("{}ms", d.as_millis())
    } else if s.is_multiple_of(3600) {
        format!("{}h", s / 3600)
    } else if s.is_multiple_of(60) {
        format!("{}m", s / 60)
    } else {
        format!("{s}s")
    }
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

    /// Review H2: these matched the CRD pattern and panicked the planner.
    #[test]
    fn an_enormous_duration_is_an_error_not_a_panic() {
        for huge in ["20000000000000000000s", "5124095576030432h"] {
            let e = parse_duration(huge).unwrap_err();
            assert!(e.contains("too long"), "{huge}: {e}");
        }
        let week = Duration::from_secs(7 * 24 * 3600);
        assert_eq!(parse_bounded("168h", week).unwrap(), week);
        let e = parse_bounded("10000000000000000s", week).unwrap_err();
        assert!(e.contains("maximum 168h"), "{e}");
        assert!(parse_bounded("169h", week).is_err());
    }
}
