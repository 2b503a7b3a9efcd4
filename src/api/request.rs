//! Request checking: every malformed request is refused with a reason
//! before it touches the index.

use std::time::Duration;

use super::ApiError;
use super::pb;
use crate::status::index::{Filter, Key};
use crate::status::selector::Selector;
use crate::status::view::Target;

const MAX_PAGE: usize = 1000;
const DEFAULT_PAGE: usize = 100;

/// A DNS-1123 label, as namespaces, names and cluster names are.
fn dns_label(what: &str, s: &str) -> Result<(), ApiError> {
    if s.is_empty() {
        return Err(ApiError::invalid(what, format!("{what} is required")));
    }
    let ok = s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !s.starts_with('-')
        && !s.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid(
            what,
            format!(
                "{what} {s:?} is not a valid name (lowercase letters, digits and '-', at most 63)"
            ),
        ))
    }
}

pub fn key(namespace: &str, name: &str) -> Result<Key, ApiError> {
    dns_label("namespace", namespace)?;
    dns_label("name", name)?;
    Ok((namespace.to_string(), name.to_string()))
}

pub fn filter(namespace: &str, selector: &str, cluster: &str) -> Result<Filter, ApiError> {
    if !namespace.is_empty() {
        dns_label("namespace", namespace)?;
    }
    if !cluster.is_empty() {
        dns_label("cluster", cluster)?;
    }
    Ok(Filter {
        namespace: (!namespace.is_empty()).then(|| namespace.to_string()),
        selector: Selector::parse(selector).map_err(|m| ApiError::invalid("label_selector", m))?,
        cluster: (!cluster.is_empty()).then(|| cluster.to_string()),
        visible: None,
    })
}

pub fn page_size(requested: u32) -> usize {
    match requested as usize {
        0 => DEFAULT_PAGE,
        n => n.min(MAX_PAGE),
    }
}

/// A page of `items`, in order: at most `size` of them, and no more than fit
/// in `budget` bytes encoded as a repeated field, but never none, so that
/// paging always moves on. Tonic encodes a unary reply whole, so the
/// budget bounds what each call holds until it is sent. Says whether
/// items were left.
pub fn take_page<M: prost::Message>(
    items: impl IntoIterator<Item = M>,
    size: usize,
    budget: usize,
) -> (Vec<M>, bool) {
    let mut page = Vec::new();
    let mut used = 0usize;
    for m in items {
        if page.len() == size {
            return (page, true);
        }
        let len = m.encoded_len();
        // A one-byte tag (the items are field 1), the length, the item.
        let framed = 1 + prost::length_delimiter_len(len) + len;
        if !page.is_empty() && used.saturating_add(framed) > budget {
            return (page, true);
        }
        used = used.saturating_add(framed);
        page.push(m);
    }
    (page, false)
}

/// Whether a list returns basic items; unspecified means full, as before
/// views existed. A value this server does not know is refused, not
/// guessed at.
pub fn basic_view(view: i32) -> Result<bool, ApiError> {
    match pb::MicroserviceView::try_from(view) {
        Ok(pb::MicroserviceView::Basic) => Ok(true),
        Ok(pb::MicroserviceView::Unspecified | pb::MicroserviceView::Full) => Ok(false),
        Err(_) => Err(ApiError::invalid(
            "view",
            format!("view {view} is not a MicroserviceView this server knows"),
        )),
    }
}

/// Page tokens name the last item returned; opaque to clients.
pub fn page_token(last: &Key) -> String {
    format!("{}/{}", last.0, last.1)
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The token of the page after one that ended at `last` (namespace, name),
/// or none when nothing is left.
fn next_page_token(more: bool, last: Option<(&str, &str)>) -> String {
    match (more, last) {
        (true, Some((ns, name))) => page_token(&(ns.to_string(), name.to_string())),
        _ => String::new(),
    }
}

/// A page of `items` (`take_page`) and the token of the next one, from
/// the last item's (namespace, name): what every List answers.
pub fn page<M: prost::Message>(
    items: impl IntoIterator<Item = M>,
    size: usize,
    budget: usize,
    key: impl Fn(&M) -> (&str, &str),
) -> (Vec<M>, String) {
    let (page, more) = take_page(items, size, budget);
    let token = next_page_token(more, page.last().map(key));
    (page, token)
}

pub fn after(token: &str) -> Result<Option<Key>, ApiError> {
    if token.is_empty() {
        return Ok(None);
    }
    let bad = || ApiError::invalid("page_token", "page_token is not one this server issued");
    if !token.len().is_multiple_of(2) || token.len() > 512 {
        return Err(bad());
    }
    // Bytes, not str slices: a multi-byte character must be refused, not
    // split (slicing a str inside a character panics).
    let nibble = |b: u8| char::from(b).to_digit(16).ok_or_else(bad);
    let bytes: Vec<u8> = token
        .as_bytes()
        .chunks(2)
        .map(|pair| Ok(((nibble(pair[0])? << 4) | nibble(pair[1])?) as u8))
        .collect::<Result<_, ApiError>>()?;
    let text = String::from_utf8(bytes).map_err(|_| bad())?;
    let (ns, name) = text.split_once('/').ok_or_else(bad)?;
    key(ns, name).map(Some).map_err(|_| bad())
}

pub fn target(t: Option<&pb::wait_for_rollout_request::Target>) -> Result<Target, ApiError> {
    use pb::wait_for_rollout_request::Target as T;
    match t {
        None => Err(ApiError::invalid(
            "target",
            "a target is required: image or generation",
        )),
        Some(T::Image(i))
            if i.trim().is_empty() || i.len() > 512 || i.contains(char::is_whitespace) =>
        {
            Err(ApiError::invalid(
                "image",
                format!("image {i:?} is not an image reference"),
            ))
        }
        Some(T::Image(i)) => Ok(Target::Image(i.clone())),
        Some(T::Generation(g)) if *g < 1 => Err(ApiError::invalid(
            "generation",
            format!("generation must be at least 1, got {g}"),
        )),
        Some(T::Generation(g)) => Ok(Target::Generation(*g)),
        Some(T::Generations(g)) => {
            if g.otherwise < 1 {
                return Err(ApiError::invalid(
                    "generations.otherwise",
                    format!(
                        "generations.otherwise must be at least 1, got {}",
                        g.otherwise
                    ),
                ));
            }
            for (cluster, n) in &g.at_least {
                dns_label("cluster", cluster)?;
                if *n < 1 {
                    return Err(ApiError::invalid(
                        "generations.at_least",
                        format!("the generation for {cluster} must be at least 1, got {n}"),
                    ));
                }
            }
            Ok(Target::Generations {
                at_least: g.at_least.iter().map(|(c, n)| (c.clone(), *n)).collect(),
                otherwise: g.otherwise,
            })
        }
    }
}

/// `generations.current`: each cluster's live generation when the wait starts.
pub fn wants_current(t: Option<&pb::wait_for_rollout_request::Target>) -> bool {
    matches!(t, Some(pb::wait_for_rollout_request::Target::Generations(g)) if g.current)
}

pub fn timeout(t: Option<&prost_types::Duration>) -> Result<Option<Duration>, ApiError> {
    match t {
        None => Ok(None),
        Some(d) if d.seconds < 0 || d.nanos < 0 || (d.seconds == 0 && d.nanos == 0) => {
            Err(ApiError::invalid("timeout", "timeout must be positive"))
        }
        Some(d) if d.nanos >= 1_000_000_000 => Err(ApiError::invalid(
            "timeout",
            "timeout nanos must be below one second",
        )),
        Some(d) => Ok(Some(
            Duration::from_secs(d.seconds as u64) + Duration::from_nanos(d.nanos as u64),
        )),
    }
}

pub fn clusters(names: &[String]) -> Result<Vec<String>, ApiError> {
    for n in names {
        dns_label("cluster", n)?;
    }
    let mut out = names.to_vec();
    out.sort();
    out.dedup();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn invalid(r: Result<impl std::fmt::Debug, ApiError>) -> String {
        match r {
            Err(ApiError::Refused(r))
                if r.reason == super::super::errors::Reason::InvalidRequest =>
            {
                r.message
            }
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }

    fn item(name_len: usize) -> pb::Microservice {
        pb::Microservice {
            name: "n".repeat(name_len),
            ..Default::default()
        }
    }

    fn encoded(items: &[pb::Microservice]) -> usize {
        use prost::Message;
        pb::ListMicroservicesResponse {
            items: items.to_vec(),
            ..Default::default()
        }
        .encoded_len()
    }

    #[test]
    fn a_page_holds_what_fits_its_byte_budget_and_never_nothing() {
        let items: Vec<_> = (0..10).map(|_| item(1000)).collect();
        let budget = 3500;
        let (page, more) = take_page(items.clone(), 1000, budget);
        assert_eq!(page.len(), 3);
        assert!(more);
        assert!(encoded(&page) <= budget, "{} > {budget}", encoded(&page));
        assert!(encoded(&items[..4]) > budget);
        // One item over the budget still makes a page, so paging moves on.
        let (page, more) = take_page(vec![item(5000), item(1)], 1000, budget);
        assert_eq!((page.len(), more), (1, true));
        let (page, more) = take_page(vec![item(5000)], 1000, budget);
        assert_eq!((page.len(), more), (1, false));
        assert_eq!(
            take_page(Vec::<pb::Microservice>::new(), 10, budget),
            (vec![], false)
        );
    }

    #[test]
    fn a_page_holds_at_most_its_size_and_says_when_items_are_left() {
        let items = || (0..5).map(|_| item(3));
        assert_eq!(take_page(items(), 5, usize::MAX).0.len(), 5);
        assert!(!take_page(items(), 5, usize::MAX).1);
        let (page, more) = take_page(items(), 4, usize::MAX);
        assert_eq!((page.len(), more), (4, true));
    }

    #[test]
    fn names_must_be_present_and_valid() {
        assert_eq!(
            key("ns", "todo-api").unwrap(),
            ("ns".into(), "todo-api".into())
        );
        assert!(invalid(key("ns", "")).contains("name is required"));
        assert!(invalid(key("", "x")).contains("namespace is required"));
        assert!(invalid(key("ns", "Bad_Name")).contains("not a valid name"));
        assert!(invalid(key("ns", &"a".repeat(64))).contains("not a valid name"));
    }

    #[test]
    fn filters_reject_bad_selectors_and_cluster_names() {
        assert!(filter("", "", "").unwrap().namespace.is_none());
        assert!(invalid(filter("", "team in pay", "")).contains("label selector"));
        assert!(invalid(filter("", "", "Member 1")).contains("cluster"));
    }

    #[test]
    fn page_tokens_round_trip_and_forgeries_are_refused() {
        let k: Key = ("ns".into(), "web".into());
        assert_eq!(after(&page_token(&k)).unwrap(), Some(k.clone()));
        assert_eq!(after("").unwrap(), None);
        // The last page carries no token; another page, the last key's.
        assert_eq!(next_page_token(false, Some(("ns", "web"))), "");
        assert_eq!(next_page_token(true, None), "");
        assert_eq!(next_page_token(true, Some(("ns", "web"))), page_token(&k));
        for bad in ["zz", "abc", "6e73", &"00".repeat(300), "aé0", "éé", "+1"] {
            assert!(invalid(after(bad)).contains("page_token"), "{bad}");
        }
        assert_eq!(page_size(0), 100);
        assert_eq!(page_size(5), 5);
        assert_eq!(page_size(1_000_000), 1000);
    }

    #[test]
    fn views_default_to_full_and_unknown_ones_are_refused() {
        assert!(!basic_view(0).unwrap());
        assert!(basic_view(pb::MicroserviceView::Basic as i32).unwrap());
        assert!(!basic_view(pb::MicroserviceView::Full as i32).unwrap());
        assert!(invalid(basic_view(7)).contains("view 7"));
    }

    #[test]
    fn rollout_targets_and_timeouts_are_checked() {
        use pb::wait_for_rollout_request::Target as T;
        assert!(invalid(target(None)).contains("target is required"));
        assert!(invalid(target(Some(&T::Image(" ".into())))).contains("image"));
        assert!(invalid(target(Some(&T::Generation(0)))).contains("at least 1"));
        assert_eq!(
            target(Some(&T::Generation(7))).unwrap(),
            Target::Generation(7)
        );
        let neg = prost_types::Duration {
            seconds: -1,
            nanos: 0,
        };
        assert!(invalid(timeout(Some(&neg))).contains("positive"));
        let ok = prost_types::Duration {
            seconds: 2,
            nanos: 0,
        };
        assert_eq!(timeout(Some(&ok)).unwrap(), Some(Duration::from_secs(2)));
        assert_eq!(
            clusters(&["m2".into(), "m1".into(), "m2".into()]).unwrap(),
            ["m1", "m2"]
        );
    }

    /// Any input is answered Ok or INVALID_ARGUMENT; none may panic.
    mod never_panic {
        use super::super::*;
        use proptest::prelude::*;

        fn refused_cleanly<T>(r: Result<T, ApiError>) -> bool {
            matches!(r, Ok(_) | Err(ApiError::Refused(_)))
        }

        /// Text that stresses byte/char boundaries: ASCII around the
        /// grammar's punctuation, multi-byte characters and controls.
        fn hostile() -> impl Strategy<Value = String> {
            prop_oneof![
                any::<String>(),
                "[a-f0-9éß€😀\\x00 ,=!()/.-]{0,64}",
                "[a-z0-9=!,() -]{0,80}",
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(2000))]

            #[test]
            fn page_tokens(token in hostile()) {
                prop_assert!(refused_cleanly(after(&token)));
            }

            #[test]
            fn selectors_namespaces_and_clusters(ns in hostile(), sel in hostile(), cluster in hostile()) {
                prop_assert!(refused_cleanly(filter(&ns, &sel, &cluster)));
            }

            #[test]
            fn names(ns in hostile(), name in hostile()) {
                prop_assert!(refused_cleanly(key(&ns, &name)));
            }

            #[test]
            fn rollout_targets(image in hostile(), generation in any::<i64>(), secs in any::<i64>(), nanos in any::<i32>()) {
                use pb::wait_for_rollout_request::Target as T;
                prop_assert!(refused_cleanly(target(Some(&T::Image(image)))));
                prop_assert!(refused_cleanly(target(Some(&T::Generation(generation)))));
                let d = prost_types::Duration { seconds: secs, nanos };
                prop_assert!(refused_cleanly(timeout(Some(&d))));
            }

            #[test]
            fn cluster_lists(names in proptest::collection::vec(hostile(), 0..8)) {
                prop_assert!(refused_cleanly(clusters(&names)));
            }

            #[test]
            fn issued_tokens_round_trip(ns in "[a-z][a-z0-9-]{0,20}[a-z0-9]", name in "[a-z][a-z0-9-]{0,20}[a-z0-9]") {
                let k: Key = (ns, name);
                prop_assert_eq!(after(&page_token(&k)).unwrap(), Some(k));
            }
        }
    }
}
