//! Every refusal the gRPC API answers, as a stable reason (#61), here
//! with the streams that end with them (`api::errors` re-exports it). A status
//! carries `google.rpc.Status` details: `ErrorInfo` with the reason, the
//! domain and metadata; `RetryInfo` where a retry can help; `BadRequest`
//! field violations for a malformed request. Clients branch on the
//! reason, never on the message. `docs/api.md`'s error table lists each
//! reason with its code and retry advice; a test holds the two together.

use std::collections::HashMap;
use std::time::Duration;

use tonic::Code;
use tonic_types::{ErrorDetails, StatusExt};

/// `ErrorInfo.domain` of every error this API answers.
pub const DOMAIN: &str = "flotilla.platform.example.io";

/// Why a call was refused. The names are the wire's `ErrorInfo.reason`:
/// a reason is never renamed or given another code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// A field is missing or malformed; `BadRequest` names it.
    InvalidRequest,
    /// A cluster named in the request is not registered; metadata
    /// `cluster` and `registered`.
    ClusterNotRegistered,
    /// This server cannot read its members' live generations.
    LiveReadsOff,
    /// The home apiserver refused the edit as invalid.
    SpecRejected,
    /// No revision to go back to, or not the one asked for.
    UndoRefused,
    /// An approval names a wave that is not Manual, or a revision that
    /// is not stored.
    ApprovalRefused,
    MicroserviceNotFound,
    FleetMicroserviceNotFound,
    /// No bearer token, or one nobody vouches for.
    Unauthenticated,
    /// A known identity without the right.
    PermissionDenied,
    /// The FleetMicroservice changed under an edit.
    Conflict,
    /// The replica has not read its cluster registry yet.
    RegistryNotRead,
    /// A Microservice in no listed cluster while some are not listed yet.
    ClustersNotListed,
    /// The replica has not listed the home cluster's FleetMicroservices yet.
    HomeNotListed,
    /// The home apiserver did not answer.
    HomeUnreachable,
    /// The replica's view of the home cluster lags it.
    HomeViewStale,
    /// The home apiserver could not review the caller.
    ReviewUnavailable,
    /// A stream's rights could not be checked again.
    RightsUnchecked,
    /// The credentials a stream was opened with changed.
    CredentialsChanged,
    /// The replica is shutting down: ask another.
    ShuttingDown,
    /// A stream reached its maximum age: resume.
    StreamMaxAge,
    /// The replica's stream limit is reached.
    StreamLimit,
    /// The reader left a stream's events unread: resume.
    ReaderStalled,
    /// List replies not yet read hold the replica's room.
    ListRoomFull,
    /// This connection's List replies not yet read hold its share.
    ConnectionRoomFull,
    /// Too many refused tokens from this address.
    TokensThrottled,
    /// A handler panicked; the server keeps serving.
    HandlerPanicked,
}

impl Reason {
    pub const ALL: [Reason; 27] = [
        Reason::InvalidRequest,
        Reason::ClusterNotRegistered,
        Reason::LiveReadsOff,
        Reason::SpecRejected,
        Reason::UndoRefused,
        Reason::ApprovalRefused,
        Reason::MicroserviceNotFound,
        Reason::FleetMicroserviceNotFound,
        Reason::Unauthenticated,
        Reason::PermissionDenied,
        Reason::Conflict,
        Reason::RegistryNotRead,
        Reason::ClustersNotListed,
        Reason::HomeNotListed,
        Reason::HomeUnreachable,
        Reason::HomeViewStale,
        Reason::ReviewUnavailable,
        Reason::RightsUnchecked,
        Reason::CredentialsChanged,
        Reason::ShuttingDown,
        Reason::StreamMaxAge,
        Reason::StreamLimit,
        Reason::ReaderStalled,
        Reason::ListRoomFull,
        Reason::ConnectionRoomFull,
        Reason::TokensThrottled,
        Reason::HandlerPanicked,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::InvalidRequest => "INVALID_REQUEST",
            Reason::ClusterNotRegistered => "CLUSTER_NOT_REGISTERED",
            Reason::LiveReadsOff => "LIVE_READS_OFF",
            Reason::SpecRejected => "SPEC_REJECTED",
            Reason::UndoRefused => "UNDO_REFUSED",
            Reason::ApprovalRefused => "APPROVAL_REFUSED",
            Reason::MicroserviceNotFound => "MICROSERVICE_NOT_FOUND",
            Reason::FleetMicroserviceNotFound => "FLEET_MICROSERVICE_NOT_FOUND",
            Reason::Unauthenticated => "UNAUTHENTICATED",
            Reason::PermissionDenied => "PERMISSION_DENIED",
            Reason::Conflict => "CONFLICT",
            Reason::RegistryNotRead => "REGISTRY_NOT_READ",
            Reason::ClustersNotListed => "CLUSTERS_NOT_LISTED",
            Reason::HomeNotListed => "HOME_NOT_LISTED",
            Reason::HomeUnreachable => "HOME_UNREACHABLE",
            Reason::HomeViewStale => "HOME_VIEW_STALE",
            Reason::ReviewUnavailable => "REVIEW_UNAVAILABLE",
            Reason::RightsUnchecked => "RIGHTS_UNCHECKED",
            Reason::CredentialsChanged => "CREDENTIALS_CHANGED",
            Reason::ShuttingDown => "SHUTTING_DOWN",
            Reason::StreamMaxAge => "STREAM_MAX_AGE",
            Reason::StreamLimit => "STREAM_LIMIT",
            Reason::ReaderStalled => "READER_STALLED",
            Reason::ListRoomFull => "LIST_ROOM_FULL",
            Reason::ConnectionRoomFull => "CONNECTION_ROOM_FULL",
            Reason::TokensThrottled => "TOKENS_THROTTLED",
            Reason::HandlerPanicked => "HANDLER_PANICKED",
        }
    }

    pub fn code(self) -> Code {
        use Reason::*;
        match self {
            InvalidRequest | ClusterNotRegistered | LiveReadsOff | SpecRejected | UndoRefused
            | ApprovalRefused => Code::InvalidArgument,
            MicroserviceNotFound | FleetMicroserviceNotFound => Code::NotFound,
            Unauthenticated => Code::Unauthenticated,
            PermissionDenied => Code::PermissionDenied,
            Conflict => Code::Aborted,
            RegistryNotRead | ClustersNotListed | HomeNotListed | HomeUnreachable
            | HomeViewStale | ReviewUnavailable | RightsUnchecked | CredentialsChanged
            | ShuttingDown | StreamMaxAge => Code::Unavailable,
            StreamLimit | ReaderStalled | ListRoomFull | ConnectionRoomFull | TokensThrottled => {
                Code::ResourceExhausted
            }
            HandlerPanicked => Code::Internal,
        }
    }

    /// How long to wait before the same call again (`RetryInfo`); None: a
    /// retry cannot help until the request or the caller's rights change.
    /// Zero: at once (reconnect, resume, or ask another replica).
    pub fn retry_after(self) -> Option<Duration> {
        use Reason::*;
        let ms = Duration::from_millis;
        match self {
            InvalidRequest
            | ClusterNotRegistered
            | LiveReadsOff
            | SpecRejected
            | UndoRefused
            | ApprovalRefused
            | MicroserviceNotFound
            | FleetMicroserviceNotFound
            | Unauthenticated
            | PermissionDenied => None,
            Conflict | ShuttingDown | StreamMaxAge | ReaderStalled | CredentialsChanged => {
                Some(Duration::ZERO)
            }
            RegistryNotRead | ClustersNotListed | HomeNotListed | HomeViewStale
            | RightsUnchecked | ListRoomFull | ConnectionRoomFull | HandlerPanicked => {
                Some(ms(1000))
            }
            HomeUnreachable | ReviewUnavailable => Some(ms(2000)),
            StreamLimit => Some(ms(5000)),
            // The caller's own window, set per refusal (`Refusal::retry`).
            TokensThrottled => Some(ms(10_000)),
        }
    }
}

/// One refusal: a reason, a message for people, and its details.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    pub reason: Reason,
    pub message: String,
    /// `BadRequest` field violations: (field, description).
    pub fields: Vec<(String, String)>,
    pub metadata: Vec<(String, String)>,
    pub retry: Option<Duration>,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl Refusal {
    pub fn new(reason: Reason, message: impl Into<String>) -> Self {
        Refusal {
            reason,
            message: message.into(),
            fields: vec![],
            metadata: vec![],
            retry: reason.retry_after(),
        }
    }

    /// A malformed request: `field` (its proto name) is wrong.
    pub fn invalid(field: &str, message: impl Into<String>) -> Self {
        let message = message.into();
        Refusal {
            fields: vec![(field.to_string(), message.clone())],
            ..Refusal::new(Reason::InvalidRequest, message)
        }
    }

    pub fn meta(mut self, key: &str, value: impl Into<String>) -> Self {
        self.metadata.push((key.to_string(), value.into()));
        self
    }

    pub fn field(mut self, field: &str) -> Self {
        self.fields.push((field.to_string(), self.message.clone()));
        self
    }

    pub fn retry(mut self, after: Duration) -> Self {
        self.retry = Some(after);
        self
    }

    pub fn into_status(self) -> tonic::Status {
        let mut details = ErrorDetails::new();
        let metadata: HashMap<String, String> = self.metadata.into_iter().collect();
        details.set_error_info(self.reason.as_str(), DOMAIN, metadata);
        if let Some(after) = self.retry {
            details.set_retry_info(Some(after));
        }
        for (field, why) in self.fields {
            details.add_bad_request_violation(field, why);
        }
        tonic::Status::with_error_details(self.reason.code(), self.message, details)
    }
}

impl From<Refusal> for tonic::Status {
    fn from(r: Refusal) -> Self {
        r.into_status()
    }
}

/// `reason`'s status with `message`, as most refusals are.
pub fn status(reason: Reason, message: impl Into<String>) -> tonic::Status {
    Refusal::new(reason, message).into_status()
}

/// What a client reads back from a status: the reason (None for a status
/// without Flotilla's details, such as tonic's own) and the retry delay.
pub fn read(status: &tonic::Status) -> (Option<String>, Option<Duration>) {
    let details = status.get_error_details();
    let reason = details
        .error_info()
        .filter(|i| i.domain == DOMAIN)
        .map(|i| i.reason.clone());
    let retry = details.retry_info().and_then(|r| r.retry_delay);
    (reason, retry)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_unique_screaming_snake_case_and_all_listed() {
        let names: std::collections::BTreeSet<&str> =
            Reason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(names.len(), Reason::ALL.len());
        for n in names {
            assert!(n.chars().all(|c| c.is_ascii_uppercase() || c == '_'), "{n}");
        }
    }

    #[test]
    fn a_status_carries_its_reason_retry_and_field_violations() {
        let s = Refusal::invalid("page_token", "page_token is not one this server issued")
            .into_status();
        assert_eq!(s.code(), Code::InvalidArgument);
        assert_eq!(read(&s), (Some("INVALID_REQUEST".into()), None));
        let bad = s
            .get_error_details()
            .bad_request()
            .cloned()
            .expect("BadRequest");
        assert_eq!(bad.field_violations[0].field, "page_token");

        let s = Refusal::new(Reason::TokensThrottled, "too many")
            .retry(Duration::from_secs(7))
            .meta("window_seconds", "7")
            .into_status();
        assert_eq!(s.code(), Code::ResourceExhausted);
        assert_eq!(
            read(&s),
            (
                Some("TOKENS_THROTTLED".into()),
                Some(Duration::from_secs(7))
            )
        );
        let info = s.get_error_details().error_info().cloned().unwrap();
        assert_eq!(info.metadata["window_seconds"], "7");
        assert_eq!(info.domain, DOMAIN);
    }

    /// "InvalidArgument" as the wire spells it, "INVALID_ARGUMENT".
    fn code_name(code: Code) -> String {
        format!("{code:?}")
            .chars()
            .enumerate()
            .flat_map(|(i, c)| {
                let gap = (i > 0 && c.is_ascii_uppercase()).then_some('_');
                gap.into_iter().chain([c.to_ascii_uppercase()])
            })
            .collect()
    }

    fn file(path: &str) -> String {
        std::fs::read_to_string(format!("{}/{path}", env!("CARGO_MANIFEST_DIR"))).expect(path)
    }

    #[test]
    fn docs_api_lists_every_reason_with_its_code_and_retry_and_the_protos_every_code() {
        let docs = file("docs/api.md");
        // | `REASON` | `CODE` | retry | when |
        let rows: std::collections::BTreeMap<String, (String, String)> = docs
            .lines()
            .filter_map(|l| {
                let cells: Vec<&str> = l.split('|').map(str::trim).collect();
                let reason = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
                let code = cells.get(2)?.strip_prefix('`')?.strip_suffix('`')?;
                Some((
                    reason.to_string(),
                    (code.to_string(), cells.get(3)?.to_string()),
                ))
            })
            .filter(|(r, _)| Reason::ALL.iter().any(|x| x.as_str() == r))
            .collect();
        for r in Reason::ALL {
            let (code, retry) = rows
                .get(r.as_str())
                .unwrap_or_else(|| panic!("docs/api.md has no row for {}", r.as_str()));
            assert_eq!(*code, code_name(r.code()), "{}", r.as_str());
            let documented = match r.retry_after() {
                None => "no".to_string(),
                Some(d) if d.is_zero() => "at once".into(),
                Some(_) if r == Reason::TokensThrottled => "after the window".into(),
                Some(d) => format!("after {} s", d.as_secs()),
            };
            assert_eq!(*retry, documented, "{}", r.as_str());
        }
        // Every code a reason answers is in the proto's list of codes.
        let protos =
            file("proto/flotilla/v1/fleet.proto") + &file("proto/flotilla/v1/rollouts.proto");
        for r in Reason::ALL {
            let code = code_name(r.code());
            assert!(
                protos.contains(&code),
                "{code} ({}) is not in the protos' comments",
                r.as_str()
            );
        }
        // And every code the FleetStatus header lists is in docs/api.md's table of codes.
        let header: Vec<String> = file("proto/flotilla/v1/fleet.proto")
            .lines()
            .take_while(|l| l.starts_with("//"))
            .filter_map(|l| {
                let word = l.trim_start_matches("//").trim_start().split(' ').next()?;
                (word.len() > 3 && word.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
                    .then(|| word.to_string())
            })
            .collect();
        assert!(header.len() >= 8, "{header:?}");
        for code in header {
            assert!(
                docs.contains(&format!("| `{code}` |")),
                "fleet.proto documents {code}; docs/api.md's table of codes does not"
            );
        }
    }

    #[test]
    fn a_status_from_elsewhere_has_no_reason() {
        assert_eq!(read(&tonic::Status::unavailable("x")), (None, None));
    }

    #[test]
    fn only_answers_a_retry_cannot_change_lack_retry_info() {
        for r in Reason::ALL {
            let final_code = matches!(
                r.code(),
                Code::InvalidArgument
                    | Code::NotFound
                    | Code::Unauthenticated
                    | Code::PermissionDenied
            );
            assert_eq!(r.retry_after().is_none(), final_code, "{r:?}");
        }
    }
}
