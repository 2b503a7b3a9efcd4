//! Manual approval of a wave, bound to the revision it was given for (#35).
//! Pure: reading and adding approvals, and choosing what an approve
//! request names. The edge (`edits::approve`) writes them, the planner
//! reads them.
//!
//! Approvals live in an annotation of the FleetMicroservice, not in its
//! spec (an approval is not a new desired state, and must not bump the
//! generation the status is judged at) nor in its status (written only by
//! the fleet controller, behind its term's fence).

use std::collections::BTreeMap;

use super::revision::Revision;
use super::spec::{Approval, Wave, WaveApproval};

pub const ANNOTATION: &str = "platform.example.io/approvals";

/// How many approvals the annotation keeps, newest last: enough for every
/// wave of several releases, and far below the annotation size limit.
pub const KEPT: usize = 64;

/// The approvals an object carries.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Approvals {
    pub given: Vec<WaveApproval>,
    /// Why the annotation could not be read: then nothing is approved.
    pub unreadable: Option<String>,
}

/// The approvals in `annotations`; an unreadable annotation approves nothing.
pub fn read(annotations: Option<&BTreeMap<String, String>>) -> Approvals {
    let Some(raw) = annotations.and_then(|a| a.get(ANNOTATION)) else {
        return Approvals::default();
    };
    match serde_json::from_str::<Vec<WaveApproval>>(raw) {
        Ok(given) => Approvals {
            given,
            unreadable: None,
        },
        Err(e) => Approvals {
            given: Vec::new(),
            unreadable: Some(format!(
                "the annotation {ANNOTATION} is not a list of approvals ({e}); it approves nothing"
            )),
        },
    }
}

/// One attempt at a revision: its name and the number it has now (a
/// revision re-applied later is renumbered, a new attempt).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attempt<'a> {
    pub revision: &'a str,
    pub number: i64,
}

impl WaveApproval {
    /// Whether this approval was given for `attempt`.
    pub fn opens(&self, attempt: Attempt) -> bool {
        self.revision == attempt.revision && self.attempt == Some(attempt.number)
    }
}

/// The approval of `wave` for `attempt`, if one was given.
pub fn granted<'a>(
    given: &'a [WaveApproval],
    wave: &str,
    attempt: Attempt,
) -> Option<&'a WaveApproval> {
    given.iter().find(|a| a.wave == wave && a.opens(attempt))
}

/// The list with `new` added (the oldest dropped past `KEPT`), or the
/// approval already given for the same wave and attempt.
pub fn add(given: &[WaveApproval], new: WaveApproval) -> Result<Vec<WaveApproval>, WaveApproval> {
    if let Some(before) = given
        .iter()
        .find(|a| a.wave == new.wave && a.revision == new.revision && a.attempt == new.attempt)
    {
        return Err(before.clone());
    }
    let mut all = given.to_vec();
    all.push(new);
    let extra = all.len().saturating_sub(KEPT);
    all.drain(..extra);
    Ok(all)
}

/// Which attempt an approve request means: `requested` by name or number,
/// or, when empty, the update revision the status shows (the one whose
/// waves are being released now), each at the number it has now.
pub fn revision_named(
    requested: &str,
    update: Option<&str>,
    history: &[Revision],
) -> Result<(String, i64), String> {
    let requested = requested.trim();
    let found = if requested.is_empty() {
        let update = update.ok_or_else(|| {
            "nothing to approve yet: the rollout has no update revision; name one with --revision"
                .to_string()
        })?;
        history
            .iter()
            .find(|r| r.name == update)
            .ok_or_else(|| format!("the update revision {update:?} is not stored yet"))?
    } else {
        match requested.parse::<i64>() {
            Ok(n) => history.iter().find(|r| r.number == n),
            Err(_) => history.iter().find(|r| r.name == requested),
        }
        .ok_or_else(|| format!("no stored revision {requested:?}"))?
    };
    Ok((found.name.clone(), found.number))
}

/// Whether `wave` is one of `waves` that waits for approval.
pub fn check_wave(waves: &[Wave], wave: &str) -> Result<(), String> {
    match waves.iter().find(|w| w.name == wave) {
        Some(w) if w.approval == Approval::Manual => Ok(()),
        Some(_) => Err(format!(
            "wave {wave:?} starts on its own (approval: Auto); there is nothing to approve"
        )),
        None => Err(format!(
            "no wave {wave:?}; the waves are: {}",
            waves
                .iter()
                .map(|w| w.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::MicroserviceSpec;
    use crate::rollout::revision::RevisionData;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn approval(wave: &str, revision: &str) -> WaveApproval {
        WaveApproval {
            wave: wave.into(),
            revision: revision.into(),
            attempt: Some(3),
            by: "alice".into(),
            at: Time("2026-12-04T05:00:00Z".parse().unwrap()),
        }
    }

    #[test]
    fn an_approval_opens_only_its_own_wave_and_attempt() {
        let at = |revision, number| Attempt { revision, number };
        let given = vec![approval("early", "api-3")];
        assert!(granted(&given, "early", at("api-3", 3)).is_some());
        assert!(granted(&given, "early", at("api-4", 3)).is_none());
        assert!(granted(&given, "rest", at("api-3", 3)).is_none());
        // The same content applied again is renumbered: a new attempt.
        assert!(granted(&given, "early", at("api-3", 5)).is_none());
        // One written before attempts were recorded opens nothing.
        let mut old = approval("early", "api-3");
        old.attempt = None;
        assert!(granted(&[old], "early", at("api-3", 3)).is_none());
    }

    #[test]
    fn approvals_round_trip_through_the_annotation_and_a_bad_one_approves_nothing() {
        let given = vec![approval("early", "api-3")];
        let raw = serde_json::to_string(&given).unwrap();
        let annotations = BTreeMap::from([(ANNOTATION.to_string(), raw)]);
        assert_eq!(read(Some(&annotations)).given, given);
        assert_eq!(read(None), Approvals::default());
        let bad = BTreeMap::from([(ANNOTATION.to_string(), "{\"wave\":1}".to_string())]);
        let read_bad = read(Some(&bad));
        assert!(read_bad.given.is_empty());
        assert!(read_bad.unreadable.unwrap().contains(ANNOTATION));
    }

    #[test]
    fn adding_twice_returns_the_first_and_the_list_stays_bounded() {
        let first = approval("early", "api-3");
        let once = add(&[], first.clone()).unwrap();
        let mut again = approval("early", "api-3");
        again.by = "bob".into();
        assert_eq!(add(&once, again), Err(first));
        let mut all = Vec::new();
        for n in 0..(KEPT + 5) {
            all = add(&all, approval("early", &format!("api-{n}"))).unwrap();
        }
        assert_eq!(all.len(), KEPT);
        assert_eq!(
            all.first().unwrap().revision,
            "api-5",
            "the oldest go first"
        );
        assert_eq!(all.last().unwrap().revision, format!("api-{}", KEPT + 4));
    }

    #[test]
    fn an_approve_request_names_a_stored_revision_or_the_update_one() {
        let history: Vec<Revision> = [(2, "api-2"), (3, "api-3")]
            .into_iter()
            .map(|(number, name)| Revision {
                name: name.into(),
                number,
                data: RevisionData {
                    template: MicroserviceSpec {
                        image: "app:1".into(),
                        port: 8080,
                        replicas: 1,
                        env: vec![],
                    },
                    overrides: vec![],
                },
                memory: Default::default(),
            })
            .collect();
        assert_eq!(
            revision_named("", Some("api-3"), &history).unwrap(),
            ("api-3".to_string(), 3)
        );
        assert_eq!(
            revision_named("2", Some("api-3"), &history).unwrap(),
            ("api-2".to_string(), 2)
        );
        assert_eq!(
            revision_named("api-2", None, &history).unwrap(),
            ("api-2".to_string(), 2)
        );
        assert!(
            revision_named("", None, &history)
                .unwrap_err()
                .contains("--revision")
        );
        assert!(
            revision_named("7", Some("api-3"), &history)
                .unwrap_err()
                .contains("\"7\"")
        );
        assert!(revision_named("api-9", None, &history).is_err());
    }

    #[test]
    fn only_a_manual_wave_of_the_spec_can_be_approved() {
        let waves = vec![
            Wave {
                name: "canary".into(),
                ..Wave::default()
            },
            Wave {
                name: "early".into(),
                approval: Approval::Manual,
                ..Wave::default()
            },
        ];
        assert!(check_wave(&waves, "early").is_ok());
        assert!(check_wave(&waves, "canary").unwrap_err().contains("Auto"));
        let e = check_wave(&waves, "late").unwrap_err();
        assert!(e.contains("canary, early"), "{e}");
    }
}
