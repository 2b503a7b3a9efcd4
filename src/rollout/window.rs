//! Time windows for starting waves (#35): cron schedules, each opening a
//! window of a duration, that allow or deny a wave's start. Pure.
//!
//! Schedules are the five fields of cron (minute, hour, day of month,
//! month, day of week; numbers, `*`, lists, ranges and steps), read in UTC.
//! When both day fields are restricted, either may match, as in cron.

use std::time::Duration;

use jiff::tz::TimeZone;
use jiff::{SignedDuration, Timestamp};

use super::spec::{Window, WindowKind};
use crate::domain::duration::parse_bounded;

/// Every minute, hour, day and month a schedule fires at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cron {
    minutes: u64,
    hours: u32,
    days: u32,
    months: u16,
    weekdays: u8,
    days_any: bool,
    weekdays_any: bool,
}

/// One field's allowed values as a bit set, from `lo` to `hi`.
fn field(text: &str, lo: u32, hi: u32, what: &str) -> Result<(u64, bool), String> {
    let mut bits = 0u64;
    for item in text.split(',') {
        let (range, step) = match item.split_once('/') {
            Some((r, s)) => {
                let step: u32 = s
                    .parse()
                    .ok()
                    .filter(|s| *s > 0)
                    .ok_or_else(|| format!("{what}: bad step {s:?}"))?;
                (r, step)
            }
            None => (item, 1),
        };
        let number = |s: &str| -> Result<u32, String> {
            s.parse::<u32>()
                .ok()
                .filter(|n| (lo..=hi).contains(n))
                .ok_or_else(|| format!("{what}: {s:?} is not a number within {lo}-{hi}"))
        };
        let (from, to) = match range {
            "*" => (lo, hi),
            r => match r.split_once('-') {
                Some((a, b)) => (number(a)?, number(b)?),
                // `5/15` means from 5 to the end, every 15.
                None if step > 1 => (number(r)?, hi),
                None => (number(r)?, number(r)?),
            },
        };
        if from > to {
            return Err(format!("{what}: {range:?} runs backwards"));
        }
        for v in (from..=to).step_by(step as usize) {
            bits |= 1 << v;
        }
    }
    Ok((bits, text == "*"))
}

impl Cron {
    pub fn parse(text: &str) -> Result<Cron, String> {
        let fields: Vec<&str> = text.split_whitespace().collect();
        let [m, h, dom, mon, dow] = fields[..] else {
            return Err(format!(
                "{text:?}: a schedule has five fields (minute hour day-of-month month day-of-week)"
            ));
        };
        let (minutes, _) = field(m, 0, 59, "minute")?;
        let (hours, _) = field(h, 0, 23, "hour")?;
        let (days, days_any) = field(dom, 1, 31, "day of month")?;
        let (months, _) = field(mon, 1, 12, "month")?;
        let (mut weekdays, weekdays_any) = field(dow, 0, 7, "day of week")?;
        // 7 is Sunday too.
        if weekdays & (1 << 7) != 0 {
            weekdays |= 1;
        }
        Ok(Cron {
            minutes,
            hours: hours as u32,
            days: days as u32,
            months: months as u16,
            weekdays: (weekdays & 0x7f) as u8,
            days_any,
            weekdays_any,
        })
    }

    fn day_matches(&self, t: &jiff::Zoned) -> bool {
        let dom = self.days & (1 << t.day()) != 0;
        let dow = self.weekdays & (1 << t.weekday().to_sunday_zero_offset()) != 0;
        let day = match (self.days_any, self.weekdays_any) {
            (false, false) => dom || dow,
            _ => dom && dow,
        };
        day && self.months & (1 << t.month()) != 0
    }

    fn hour_matches(&self, t: &jiff::Zoned) -> bool {
        self.hours & (1 << t.hour()) != 0
    }

    fn minute_matches(&self, t: &jiff::Zoned) -> bool {
        self.minutes & (1 << t.minute()) != 0
    }

    /// Whether it fires at the minute `t` falls in.
    pub fn fires_at(&self, t: Timestamp) -> bool {
        let z = t.to_zoned(TimeZone::UTC);
        self.day_matches(&z) && self.hour_matches(&z) && self.minute_matches(&z)
    }

    /// The first minute at or after `from` that it fires at, within a
    /// year (after that: never, as `0 0 30 2 *` does).
    pub fn next(&self, from: Timestamp) -> Option<Timestamp> {
        let minute = SignedDuration::from_secs(60);
        let mut t = ceil_minute(from);
        let limit = from
            .checked_add(SignedDuration::from_hours(24 * 366))
            .ok()?;
        while t < limit {
            let z = t.to_zoned(TimeZone::UTC);
            // Skip whole days and hours that cannot match.
            let skip = if !self.day_matches(&z) {
                Some(SignedDuration::from_secs(
                    86_400 - (z.hour() as i64 * 3600 + z.minute() as i64 * 60),
                ))
            } else if !self.hour_matches(&z) {
                Some(SignedDuration::from_secs(3600 - z.minute() as i64 * 60))
            } else if !self.minute_matches(&z) {
                Some(minute)
            } else {
                None
            };
            match skip {
                Some(d) => t = t.checked_add(d).ok()?,
                None => return Some(t),
            }
        }
        None
    }

    /// The latest minute at or before `t`, and no earlier than `since`,
    /// that it fires at.
    fn last(&self, t: Timestamp, since: Timestamp) -> Option<Timestamp> {
        let minute = SignedDuration::from_secs(60);
        let mut m = floor_minute(t);
        while m >= floor_minute(since) {
            if self.fires_at(m) {
                return Some(m);
            }
            m = m.checked_sub(minute).ok()?;
        }
        None
    }
}

fn floor_minute(t: Timestamp) -> Timestamp {
    Timestamp::from_second(t.as_second().div_euclid(60) * 60).unwrap_or(t)
}

fn ceil_minute(t: Timestamp) -> Timestamp {
    let f = floor_minute(t);
    if f == t {
        t
    } else {
        f.checked_add(SignedDuration::from_secs(60)).unwrap_or(t)
    }
}

/// The longest window: a week, as every other span of a rollout.
pub const MAX_WINDOW: Duration = Duration::from_secs(7 * 24 * 3600);

/// A window, checked.
#[derive(Clone, Debug, PartialEq)]
pub struct Checked {
    pub kind: WindowKind,
    pub cron: Cron,
    pub duration: Duration,
}

pub fn check(windows: &[Window]) -> Result<Vec<Checked>, String> {
    windows
        .iter()
        .enumerate()
        .map(|(n, w)| {
            let at = format!("rollout.windows[{n}]");
            let cron = Cron::parse(&w.schedule).map_err(|e| format!("{at}.schedule: {e}"))?;
            let duration = parse_bounded(&w.duration, MAX_WINDOW)
                .map_err(|e| format!("{at}.duration: {e}"))?;
            if duration < Duration::from_secs(60) {
                return Err(format!("{at}.duration: at least 1m"));
            }
            Ok(Checked {
                kind: w.kind,
                cron,
                duration,
            })
        })
        .collect()
}

/// Why a wave may not start now, and when to look again.
#[derive(Clone, Debug, PartialEq)]
pub struct Closed {
    pub reason: &'static str,
    pub message: String,
    /// When the hold ends at the earliest, if known.
    pub until: Option<Timestamp>,
}

/// The window a schedule opened that `now` is inside, as (opened, closes).
fn open_at(w: &Checked, now: Timestamp) -> Option<(Timestamp, Timestamp)> {
    let span = SignedDuration::try_from(w.duration).ok()?;
    let since = now.checked_sub(span).ok()?;
    let opened = w.cron.last(now, since)?;
    let closes = opened.checked_add(span).ok()?;
    (now < closes).then_some((opened, closes))
}

/// Whether a wave may start at `now`: inside no deny window, and inside an
/// allow window when any is declared.
pub fn may_start(windows: &[Checked], now: Timestamp) -> Result<(), Closed> {
    let denied = windows
        .iter()
        .filter(|w| w.kind == WindowKind::Deny)
        .filter_map(|w| open_at(w, now))
        .map(|(_, closes)| closes)
        .max();
    if let Some(closes) = denied {
        return Err(Closed {
            reason: "DenyWindow",
            message: format!("a deny window is open until {closes}; no wave starts inside it"),
            until: Some(closes),
        });
    }
    let allows: Vec<&Checked> = windows
        .iter()
        .filter(|w| w.kind == WindowKind::Allow)
        .collect();
    if allows.is_empty() || allows.iter().any(|w| open_at(w, now).is_some()) {
        return Ok(());
    }
    let next = allows.iter().filter_map(|w| w.cron.next(now)).min();
    Err(Closed {
        reason: "OutsideAllowWindow",
        message: match next {
            Some(t) => format!("no allow window is open; the next opens at {t}"),
            None => "no allow window is open, and none opens within a year".to_string(),
        },
        until: next,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn window(kind: WindowKind, schedule: &str, duration: &str) -> Checked {
        check(&[Window {
            kind,
            schedule: schedule.into(),
            duration: duration.into(),
        }])
        .unwrap()
        .remove(0)
    }

    #[test]
    fn schedules_parse_like_cron_and_bad_ones_say_why() {
        let c = Cron::parse("*/15 9-17 * * 1-5").unwrap();
        // 2026-12-04 is a Friday.
        assert!(c.fires_at(at("2026-12-04T09:30:10Z")));
        assert!(!c.fires_at(at("2026-12-04T09:31:00Z")));
        assert!(!c.fires_at(at("2026-12-04T18:00:00Z")));
        assert!(!c.fires_at(at("2026-12-05T09:30:00Z")), "Saturday");
        assert!(
            Cron::parse("0 0 * * 7")
                .unwrap()
                .fires_at(at("2026-12-06T00:00:00Z")),
            "7 is Sunday"
        );
        // Both day fields restricted: either matches.
        let either = Cron::parse("0 0 1 * 5").unwrap();
        assert!(either.fires_at(at("2026-12-04T00:00:00Z")));
        assert!(either.fires_at(at("2027-01-01T00:00:00Z")));
        for bad in [
            "* * * *",
            "60 * * * *",
            "*/0 * * * *",
            "5-1 * * * *",
            "a * * * *",
            "* * 0 * *",
        ] {
            assert!(Cron::parse(bad).is_err(), "{bad}");
        }
        let e = check(&[Window {
            kind: WindowKind::Deny,
            schedule: "0 0 * * *".into(),
            duration: "30s".into(),
        }])
        .unwrap_err();
        assert!(e.contains("at least 1m"), "{e}");
    }

    #[test]
    fn the_next_firing_skips_what_cannot_match_and_an_impossible_date_never_comes() {
        let c = Cron::parse("30 6 * * 1").unwrap();
        assert_eq!(
            c.next(at("2026-12-04T10:00:00Z")),
            Some(at("2026-12-07T06:30:00Z"))
        );
        assert_eq!(
            c.next(at("2026-12-07T06:30:00Z")),
            Some(at("2026-12-07T06:30:00Z"))
        );
        assert_eq!(
            Cron::parse("0 0 30 2 *")
                .unwrap()
                .next(at("2026-12-04T10:00:00Z")),
            None
        );
    }

    #[test]
    fn a_deny_window_holds_until_it_closes_and_an_allow_window_opens_the_way() {
        let deny = window(WindowKind::Deny, "0 22 * * *", "10h");
        let closed =
            may_start(std::slice::from_ref(&deny), at("2026-12-05T03:00:00Z")).unwrap_err();
        assert_eq!(closed.reason, "DenyWindow");
        assert_eq!(closed.until, Some(at("2026-12-05T08:00:00Z")));
        assert!(may_start(std::slice::from_ref(&deny), at("2026-12-05T08:00:00Z")).is_ok());
        let allow = window(WindowKind::Allow, "0 9 * * 1-5", "8h");
        let both = [deny, allow];
        assert!(may_start(&both, at("2026-12-04T10:00:00Z")).is_ok());
        let closed = may_start(&both, at("2026-12-04T18:00:00Z")).unwrap_err();
        assert_eq!(closed.reason, "OutsideAllowWindow");
        assert_eq!(closed.until, Some(at("2026-12-07T09:00:00Z")), "Monday");
    }
}
