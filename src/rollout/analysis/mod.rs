//! Analysis at wave boundaries (#35): which checks to run, and what their
//! runs prove. Pure: the calls are `run::analysis`.
//!
//! Every run is bound to the evidence it judged: the update revision, the
//! wave, and the generation of each of the wave's member objects when it
//! started. A run of other evidence, or one that started before the wave's
//! clusters were all done, is never counted (the stale-evidence failure of
//! argo-cd#29410). Runs live in the rollout leader's memory for its term:
//! a successor runs the checks again.

pub mod condition;
pub mod headers;
pub mod promql;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use jiff::Timestamp;

use super::gate::stamp;
use super::spec::{AnalysisCheck, CheckState, CheckStatus};
use crate::domain::duration::parse_bounded;
use crate::domain::egress::Egress;

/// What a run judged.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Evidence {
    pub revision: String,
    pub wave: String,
    /// Each cluster of the wave, and its member object's generation.
    pub generations: BTreeMap<String, i64>,
}

/// One ended run of one check.
#[derive(Clone, Debug, PartialEq)]
pub struct Run {
    pub check: String,
    /// The digest of the definition it ran ([`definition`]): a run of an
    /// earlier definition of the check proves nothing (#59).
    pub definition: String,
    pub evidence: Evidence,
    /// On the rollout leader's clock, as the planner's `now`.
    pub started: Timestamp,
    pub passed: bool,
    /// The answer, short: `HTTP 200`, `HTTP 503: …`, `no answer within 5s`.
    pub answer: String,
}

/// A check the planner asks to run now, on this evidence.
#[derive(Clone, Debug, PartialEq)]
pub struct Due {
    pub check: AnalysisCheck,
    /// The digest of its definition, which the run records.
    pub definition: String,
    /// Its settings, as the spec check parsed them.
    pub settings: Settings,
    pub evidence: Evidence,
}

/// The checked settings of one check.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    pub interval: Duration,
    pub failure_limit: usize,
    pub timeout: Duration,
    pub provider: Provider,
}

/// Whom a check asks, checked.
#[derive(Clone, Debug, PartialEq)]
pub enum Provider {
    Webhook {
        url: String,
        /// The Secret its headers come from (`headersFrom`).
        headers_from: Option<String>,
    },
    Prometheus {
        address: String,
        query: String,
        condition: condition::Condition,
    },
}

const MIN_INTERVAL: Duration = Duration::from_secs(1);
const MAX_INTERVAL: Duration = Duration::from_secs(3600);
const MAX_TIMEOUT: Duration = Duration::from_secs(60);

pub fn settings(c: &AnalysisCheck) -> Result<Settings, String> {
    let at = format!("rollout.analysis[{}]", c.name);
    let duration = |what: &str, v: &Option<String>, default: Duration, max: Duration| match v {
        None => Ok(default),
        Some(s) => parse_bounded(s, max).map_err(|e| format!("{at}.{what}: {e}")),
    };
    let interval = duration(
        "interval",
        &c.interval,
        Duration::from_secs(10),
        MAX_INTERVAL,
    )?;
    if interval < MIN_INTERVAL {
        return Err(format!("{at}.interval: at least 1s"));
    }
    let failure_limit = match c.failure_limit {
        None => 1,
        Some(n @ 1..=100) => n as usize,
        Some(n) => return Err(format!("{at}.failureLimit: {n} is not within 1..=100")),
    };
    let (url_at, url, timeout, provider) = match (&c.webhook, &c.prometheus) {
        (Some(hook), None) => (
            "webhook.url",
            &hook.url,
            &hook.timeout,
            Provider::Webhook {
                url: hook.url.clone(),
                headers_from: hook.headers_from.as_ref().map(|h| h.secret_name.clone()),
            },
        ),
        (None, Some(p)) => {
            promql::check_query(&p.query).map_err(|e| format!("{at}.prometheus.query: {e}"))?;
            let condition = condition::parse(&p.success_condition)
                .map_err(|e| format!("{at}.prometheus.successCondition: {e}"))?;
            (
                "prometheus.address",
                &p.address,
                &p.timeout,
                Provider::Prometheus {
                    address: p.address.clone(),
                    query: p.query.clone(),
                    condition,
                },
            )
        }
        (None, None) => return Err(format!("{at}: name a provider (webhook or prometheus)")),
        (Some(_), Some(_)) => {
            return Err(format!(
                "{at}: name one provider, not webhook and prometheus"
            ));
        }
    };
    let scheme_ok = url.starts_with("http://") || url.starts_with("https://");
    let Some(uri) = url.parse::<http::Uri>().ok().filter(|_| scheme_ok) else {
        return Err(format!(
            "{at}.{url_at}: {url:?} is not an http:// or https:// URL"
        ));
    };
    // The API path is Flotilla's: an address is a base, whose query or
    // fragment would rewrite it (#59).
    if url_at == "prometheus.address" && (uri.query().is_some() || url.contains('#')) {
        return Err(format!(
            "{at}.{url_at}: {url:?} has a query or fragment; name the server (and a path prefix) only"
        ));
    }
    let kind = url_at.split('.').next().unwrap_or_default();
    let timeout = duration(
        &format!("{kind}.timeout"),
        timeout,
        Duration::from_secs(5),
        MAX_TIMEOUT,
    )?;
    Ok(Settings {
        interval,
        failure_limit,
        timeout,
        provider,
    })
}

/// The URL a Prometheus check queries: its address, a base, and the
/// instant-query path.
pub fn query_url(address: &str) -> String {
    format!("{}/api/v1/query", address.trim_end_matches('/'))
}

/// A check with its settings, checked once with the spec (#58).
#[derive(Clone, Debug, PartialEq)]
pub struct Checked {
    pub check: AnalysisCheck,
    pub settings: Settings,
    /// The digest of its definition ([`definition`]).
    pub definition: String,
}

/// The digest of what a check asks and whom: its provider with every
/// field (URL, headers' Secret, address, query, successCondition,
/// timeout). Its interval and failureLimit say when to ask and how many
/// failures count, not what a run proves, and are left out.
pub fn definition(c: &AnalysisCheck) -> String {
    let what = serde_json::to_vec(&(&c.webhook, &c.prometheus)).expect("a check serializes");
    format!("{:016x}", crate::domain::digest::digest_bytes(&what))
}

/// Every check with its settings, names unique, each calling only what
/// `egress` allows (#59).
pub fn check_all(checks: &[AnalysisCheck], egress: &Egress) -> Result<Vec<Checked>, String> {
    let mut names = BTreeSet::new();
    checks
        .iter()
        .map(|c| {
            if !names.insert(c.name.as_str()) {
                return Err(format!("rollout.analysis: {:?} is named twice", c.name));
            }
            let settings = settings(c)?;
            let (at, url) = match &settings.provider {
                Provider::Webhook { url, .. } => ("webhook.url", url.clone()),
                Provider::Prometheus { address, .. } => ("prometheus.address", query_url(address)),
            };
            egress
                .check(&url)
                .map_err(|e| format!("rollout.analysis[{}].{at}: {e}", c.name))?;
            Ok(Checked {
                settings,
                definition: definition(c),
                check: c.clone(),
            })
        })
        .collect()
}

/// What a wave's checks say.
#[derive(Clone, Debug, PartialEq)]
pub enum Judgement {
    /// Each check's latest counted run passed, and started once the bake was over.
    Passed,
    /// A check failed `failureLimit` times in a row: the wave failed.
    Failed { check: String, answer: String },
    /// Not proven yet: plan again this soon at the latest.
    Waiting(Duration),
}

/// One wave's judgement, each check's status, and the checks to run now.
/// `settled`: since when every cluster of the wave has been done at the
/// update revision (runs that started before prove nothing); `bake_end`:
/// when its bake is over (a pass must start no earlier).
pub fn judge(
    checks: &[Checked],
    runs: &[Run],
    evidence: &Evidence,
    (settled, bake_end): (Timestamp, Timestamp),
    now: Timestamp,
) -> (Judgement, Vec<CheckStatus>, Vec<Due>) {
    let mut statuses = Vec::new();
    let mut due = Vec::new();
    let mut failed = None;
    let mut all_passed = true;
    let mut wait = bake_end.duration_since(now).max(jiff::SignedDuration::ZERO);
    for Checked {
        check: c,
        settings: s,
        definition,
    } in checks
    {
        let mut counted: Vec<&Run> = runs
            .iter()
            .filter(|r| {
                r.check == c.name
                    && &r.definition == definition
                    && &r.evidence == evidence
                    && r.started >= settled
            })
            .collect();
        // Runs end in any order; they count in the order they started.
        counted.sort_by_key(|r| r.started);
        let failures = counted.iter().rev().take_while(|r| !r.passed).count();
        let last = counted.last().copied();
        let state = if failures >= s.failure_limit {
            CheckState::Failed
        } else if last.is_some_and(|r| r.passed) {
            CheckState::Passed
        } else {
            CheckState::Running
        };
        let passed_at_end = last.is_some_and(|r| r.passed && r.started >= bake_end);
        all_passed &= passed_at_end && state != CheckState::Failed;
        if state == CheckState::Failed {
            let r = last.expect("a failure is a run");
            failed.get_or_insert_with(|| (c.name.clone(), r.answer.clone()));
        } else if !passed_at_end {
            // Again after the interval, or at once once the bake is over.
            let next = match last {
                None => Some(now),
                Some(r) if r.started < bake_end && now >= bake_end => Some(now),
                Some(r) => r.started.checked_add(s.interval).ok(),
            };
            match next {
                Some(t) if t <= now => due.push(Due {
                    check: c.clone(),
                    definition: definition.clone(),
                    settings: s.clone(),
                    evidence: evidence.clone(),
                }),
                Some(t) => wait = wait.min(t.duration_since(now)),
                None => {}
            }
        }
        statuses.push(CheckStatus {
            name: c.name.clone(),
            definition: definition.clone(),
            state,
            failures: failures as i32,
            answer: last.map(|r| r.answer.clone()).unwrap_or_default(),
            failed_at: (state == CheckState::Failed)
                .then(|| last.map(|r| stamp(r.started)))
                .flatten(),
        });
    }
    let judgement = match failed {
        Some((check, answer)) => Judgement::Failed { check, answer },
        None if all_passed => Judgement::Passed,
        None => Judgement::Waiting(
            Duration::try_from(wait)
                .unwrap_or_default()
                .max(Duration::from_millis(200)),
        ),
    };
    (judgement, statuses, due)
}

/// How many runs are kept per FleetMicroservice: enough for every check of
/// every wave of a release, with their recent failures.
pub const RUNS_KEPT: usize = 128;

/// The rollout leader's runs of this term, per FleetMicroservice uid, and
/// the checks under way (one at a time per wave and check).
#[derive(Debug, Default)]
pub struct Log {
    runs: BTreeMap<String, Vec<Run>>,
    running: BTreeSet<(String, String, String)>,
}

impl Log {
    /// A new term judges on its own runs only.
    pub fn new_term(&mut self) {
        self.runs.clear();
        self.running.clear();
    }

    pub fn retain(&mut self, alive: &BTreeSet<String>) {
        self.runs.retain(|uid, _| alive.contains(uid));
        self.running.retain(|(uid, _, _)| alive.contains(uid));
    }

    pub fn runs(&self, uid: &str) -> &[Run] {
        self.runs.get(uid).map_or(&[], Vec::as_slice)
    }

    /// Marks a run as started; false when one is already under way.
    pub fn start(&mut self, uid: &str, due: &Due) -> bool {
        let key = (
            uid.to_string(),
            due.evidence.wave.clone(),
            due.check.name.clone(),
        );
        self.running.insert(key)
    }

    pub fn record(&mut self, uid: &str, run: Run) {
        let key = (
            uid.to_string(),
            run.evidence.wave.clone(),
            run.check.clone(),
        );
        self.running.remove(&key);
        let all = self.runs.entry(uid.to_string()).or_default();
        all.push(run);
        let extra = all.len().saturating_sub(RUNS_KEPT);
        all.drain(..extra);
    }

    /// A run that ended without an outcome (its term ended).
    pub fn abandon(&mut self, uid: &str, due: &Due) {
        let key = (
            uid.to_string(),
            due.evidence.wave.clone(),
            due.check.name.clone(),
        );
        self.running.remove(&key);
    }
}

/// What one run of a check sends, computed before any call.
#[derive(Clone, Debug, PartialEq)]
pub enum Job {
    Webhook {
        url: String,
        timeout: Duration,
        body: serde_json::Value,
        /// The Secret its headers come from (`headersFrom`).
        headers_from: Option<String>,
    },
    Prometheus {
        address: String,
        timeout: Duration,
        /// Each query, with the cluster it asks about when it names one.
        queries: Vec<(Option<String>, String)>,
        condition: condition::Condition,
    },
}

/// The job for a due check of FleetMicroservice `namespace/name`, from
/// the settings its spec check parsed.
pub fn job(namespace: &str, name: &str, due: &Due) -> Job {
    let timeout = due.settings.timeout;
    let (address, query, condition) = match &due.settings.provider {
        Provider::Webhook { url, headers_from } => {
            return Job::Webhook {
                url: url.clone(),
                timeout,
                body: body(namespace, name, due),
                headers_from: headers_from.clone(),
            };
        }
        Provider::Prometheus {
            address,
            query,
            condition,
        } => (address, query, condition),
    };
    let vars = |cluster| promql::Vars {
        cluster,
        namespace,
        name,
        revision: &due.evidence.revision,
    };
    let queries = match promql::per_cluster(query) {
        true => due
            .evidence
            .generations
            .keys()
            .map(|c| (Some(c.clone()), promql::render(query, &vars(Some(c)))))
            .collect(),
        false => vec![(None, promql::render(query, &vars(None)))],
    };
    Job::Prometheus {
        address: address.clone(),
        timeout,
        queries,
        condition: condition.clone(),
    }
}

/// The JSON a webhook receives.
pub fn body(namespace: &str, name: &str, due: &Due) -> serde_json::Value {
    serde_json::json!({
        "fleetMicroservice": {"namespace": namespace, "name": name},
        "check": due.check.name,
        "revision": due.evidence.revision,
        "wave": due.evidence.wave,
        "clusters": due.evidence.generations.iter()
            .map(|(cluster, generation)| serde_json::json!({"name": cluster, "generation": generation}))
            .collect::<Vec<_>>(),
    })
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
