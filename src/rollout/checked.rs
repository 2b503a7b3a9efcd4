//! A FleetMicroservice's spec, checked once per generation (#58): every
//! selector, duration, wave, analysis check, window, failover and DNS
//! setting parsed and bounded. Pure.
//!
//! The planner, the analysis runner and the window logic take a
//! [`Checked`] and never parse the spec again, so nothing that fails to
//! parse can be skipped silently at evaluation time: a spec either checks
//! whole, or it is an `InvalidSpec` and nothing is written.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::analysis;
use super::failover::choose;
use super::placement;
use super::spec::{Approval, DnsStrategy, FleetMicroserviceSpec, OnFailure, Placement};
use super::window;
use crate::domain::duration::parse_bounded;
use crate::domain::egress::Egress;

/// The progress deadline when the spec names none.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(600);
/// The longest bake or progress deadline a spec may ask for: a week keeps
/// every sum of stamps and spans far from overflow.
pub const MAX_SPAN: Duration = Duration::from_secs(7 * 24 * 3600);

/// The rollout settings of one generation, checked.
#[derive(Clone, Debug, PartialEq)]
pub struct Checked {
    /// spec.paused: nothing is written.
    pub paused: bool,
    /// placement.clusterSelector (checked).
    pub selector: LabelSelector,
    /// The declared waves, in order; the implicit last one is not here.
    pub waves: Vec<Wave>,
    /// The first declared wave must pass, not be skipped, before any other starts.
    pub require_canary: bool,
    pub bake: Duration,
    pub deadline: Duration,
    pub max_failed: usize,
    pub on_failure: OnFailure,
    /// With `numberOfClusters`.
    pub counted: Option<choose::Settings>,
    pub windows: Vec<window::Checked>,
    pub analysis: Vec<analysis::Checked>,
}

/// One declared wave, checked.
#[derive(Clone, Debug, PartialEq)]
pub struct Wave {
    pub name: String,
    pub selector: LabelSelector,
    pub approval: Approval,
    pub parallel: Parallel,
}

/// A wave's maxParallel, checked: evaluating it cannot fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Parallel {
    /// Unset: the whole wave at once.
    All,
    Count(usize),
    /// A percentage of the wave, rounded up.
    Percent(u32),
}

impl Parallel {
    fn parse(value: Option<&IntOrString>) -> Result<Parallel, String> {
        // The one parser, asked with a size that shows the shape.
        placement::max_parallel(value, 1)?;
        Ok(match value {
            None => Parallel::All,
            Some(IntOrString::Int(n)) => Parallel::Count(*n as usize),
            Some(IntOrString::String(s)) => Parallel::Percent(
                s.trim_end_matches('%')
                    .parse()
                    .map_err(|_| format!("maxParallel {s:?} is not a percentage"))?,
            ),
        })
    }

    /// How many of `size` clusters may update at once; at least one.
    pub fn of(self, size: usize) -> usize {
        match self {
            Parallel::All => size,
            Parallel::Count(n) => n,
            Parallel::Percent(p) => (size * p as usize).div_ceil(100),
        }
        .max(1)
    }
}

impl placement::Declared for Wave {
    fn name(&self) -> &str {
        &self.name
    }
    fn selector(&self) -> &LabelSelector {
        &self.selector
    }
    fn parallel(&self, size: usize) -> usize {
        self.parallel.of(size)
    }
}

impl Checked {
    /// The declared wave of this name, if any (not the implicit last one).
    pub fn wave(&self, name: &str) -> Option<&Wave> {
        // At most 32 (the CRD's bound): a scan is as quick as a map.
        self.waves.iter().find(|w| w.name == name)
    }

    /// The first declared wave: the canary.
    pub fn canary(&self) -> Option<&str> {
        self.waves.first().map(|w| w.name.as_str())
    }
}

/// Checks a whole spec: `Err` names the first problem, as `InvalidSpec`
/// shows it. Analysis checks may call only what `egress` allows.
pub fn check(name: &str, spec: &FleetMicroserviceSpec, egress: &Egress) -> Result<Checked, String> {
    let r = &spec.rollout;
    let duration = |what: &str, v: &Option<String>, default: Duration| match v {
        None => Ok(default),
        Some(s) => parse_bounded(s, MAX_SPAN).map_err(|e| format!("rollout.{what}: {e}")),
    };
    placement::check_selector(
        "placement.clusterSelector",
        &spec.placement.cluster_selector,
    )?;
    let analysis = analysis::check_all(&r.analysis, egress)?;
    let windows = window::check(&r.windows)?;
    for (i, o) in spec.overrides.iter().enumerate() {
        placement::check_selector(
            &format!("overrides[{i}].clusterSelector"),
            &o.cluster_selector,
        )?;
    }
    check_dns(spec)?;
    let waves = waves(&r.waves)?;
    check_templates(name, spec)?;
    if r.max_failed_clusters < 0 {
        return Err("rollout.maxFailedClusters must not be negative".into());
    }
    let counted = counted(&spec.placement)?;
    Ok(Checked {
        paused: spec.paused,
        selector: spec.placement.cluster_selector.clone(),
        waves,
        counted,
        require_canary: r.require_canary.unwrap_or(!r.waves.is_empty()),
        bake: duration("bake", &r.bake, Duration::ZERO)?,
        deadline: duration("progressDeadline", &r.progress_deadline, DEFAULT_DEADLINE)?,
        max_failed: r.max_failed_clusters as usize,
        on_failure: r.on_failure,
        windows,
        analysis,
    })
}

/// Waves: selectors, maxParallel, and names unique and not reserved.
fn waves(declared: &[super::spec::Wave]) -> Result<Vec<Wave>, String> {
    let mut names = BTreeSet::new();
    declared
        .iter()
        .map(|w| {
            placement::check_selector(&format!("wave {}", w.name), &w.cluster_selector)?;
            let parallel = Parallel::parse(w.max_parallel.as_ref())
                .map_err(|e| format!("wave {}: {e}", w.name))?;
            if !names.insert(w.name.as_str()) || w.name == placement::REMAINING {
                return Err(format!(
                    "wave name {:?} is repeated or reserved ({:?} is the implicit last wave)",
                    w.name,
                    placement::REMAINING
                ));
            }
            Ok(Wave {
                name: w.name.clone(),
                selector: w.cluster_selector.clone(),
                approval: w.approval,
                parallel,
            })
        })
        .collect()
}

/// The template, each override as the spec it makes, and all of them at
/// once: a reserved env name or a bad replica count is an InvalidSpec now,
/// not a canary that fails later (review L8); a cluster may be selected by
/// every override.
fn check_templates(name: &str, spec: &FleetMicroserviceSpec) -> Result<(), String> {
    crate::domain::validate::validate(name, &spec.template)
        .map_err(|e| format!("template: {e}"))?;
    let mut all = spec.template.clone();
    for (i, o) in spec.overrides.iter().enumerate() {
        let mut one = spec.template.clone();
        placement::apply(&mut one, o);
        crate::domain::validate::validate(name, &one)
            .map_err(|e| format!("overrides[{i}]: {e}"))?;
        placement::apply(&mut all, o);
    }
    crate::domain::validate::validate(name, &all).map_err(|e| format!("overrides: {e}"))
}

/// `numberOfClusters` and its failover timers, checked.
fn counted(p: &Placement) -> Result<Option<choose::Settings>, String> {
    let Some(count) = p.number_of_clusters else {
        return match p.failover {
            Some(_) => Err("placement.failover needs placement.numberOfClusters".into()),
            None => Ok(None),
        };
    };
    if !(1..=1000).contains(&count) {
        return Err(format!(
            "placement.numberOfClusters must be 1 to 1000, not {count}"
        ));
    }
    let f = p.failover.clone().unwrap_or_default();
    let duration = |what: &str, v: &Option<String>, default: Duration| match v {
        None => Ok(default),
        Some(s) => {
            parse_bounded(s, MAX_SPAN).map_err(|e| format!("placement.failover.{what}: {e}"))
        }
    };
    Ok(Some(choose::Settings {
        count: count as usize,
        unreachable_after: duration(
            "unreachableAfter",
            &f.unreachable_after,
            choose::UNREACHABLE_AFTER,
        )?,
        unavailable_after: duration(
            "unavailableAfter",
            &f.unavailable_after,
            choose::UNAVAILABLE_AFTER,
        )?,
        failback: f.failback,
        failback_after: duration("failbackAfter", &f.failback_after, choose::FAILBACK_AFTER)?,
    }))
}

/// `Failover` needs its primaries, and only it has them.
fn check_dns(spec: &FleetMicroserviceSpec) -> Result<(), String> {
    let Some(dns) = &spec.dns else { return Ok(()) };
    match (dns.strategy, &dns.primary) {
        (DnsStrategy::Failover, None) => {
            Err("dns.strategy Failover needs dns.primary.clusterSelector".into())
        }
        (DnsStrategy::RoundRobin, Some(_)) => {
            Err("dns.primary applies only to dns.strategy Failover".into())
        }
        (_, Some(p)) => {
            placement::check_selector("dns.primary.clusterSelector", &p.cluster_selector)
        }
        (_, None) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_parallel_evaluates_as_the_parser_counts() {
        let table: [(Option<IntOrString>, usize, usize); 6] = [
            (None, 5, 5),
            (None, 0, 1),
            (Some(IntOrString::Int(2)), 5, 2),
            (Some(IntOrString::String("50%".into())), 5, 3),
            (Some(IntOrString::String("1%".into())), 5, 1),
            (Some(IntOrString::String("100%".into())), 3, 3),
        ];
        for (value, size, want) in table {
            let p = Parallel::parse(value.as_ref()).unwrap();
            assert_eq!(p.of(size), want, "{value:?} of {size}");
            assert_eq!(
                placement::max_parallel(value.as_ref(), size).unwrap(),
                want,
                "{value:?} of {size}"
            );
        }
    }

    #[test]
    fn a_bad_max_parallel_is_refused_by_name() {
        for bad in [
            IntOrString::Int(0),
            IntOrString::String("0%".into()),
            IntOrString::String("abc".into()),
            IntOrString::String("150%".into()),
        ] {
            assert!(Parallel::parse(Some(&bad)).is_err(), "{bad:?}");
        }
    }
}
