//! A webhook check's `headersFrom`: the request headers a Secret gives,
//! and whether the Secret may be used by the FleetMicroservice asking.
//!
//! The Secrets live in a namespace of their own that the platform team
//! fills (`--analysis-secrets-namespace`); each names the namespaces whose
//! FleetMicroservices may send it, so editing a FleetMicroservice never
//! hands out a credential of another team. No error names a value.

use std::collections::BTreeMap;

use http::{HeaderName, HeaderValue};

/// The namespaces a Secret is for, comma-separated.
pub const FOR_ANNOTATION: &str = "platform.example.io/analysis-for";

/// At most this many headers from one Secret.
const MAX_HEADERS: usize = 16;

/// Headers a Secret may not set: they frame the request, which is ours.
const RESERVED: [&str; 7] = [
    "host",
    "content-length",
    "content-type",
    "transfer-encoding",
    "connection",
    "te",
    "upgrade",
];

/// The headers Secret `name` gives a check of a FleetMicroservice in
/// `namespace`, each marked sensitive (kept out of debug output).
pub fn from_secret(
    name: &str,
    annotations: &BTreeMap<String, String>,
    data: &BTreeMap<String, Vec<u8>>,
    namespace: &str,
) -> Result<Vec<(HeaderName, HeaderValue)>, String> {
    let allowed = annotations
        .get(FOR_ANNOTATION)
        .map(|v| v.split(',').map(str::trim).any(|n| n == namespace))
        .unwrap_or(false);
    if !allowed {
        return Err(format!(
            "Secret {name} is not for namespace {namespace} (its annotation {FOR_ANNOTATION} must name it)"
        ));
    }
    if data.is_empty() {
        return Err(format!("Secret {name} has no data"));
    }
    if data.len() > MAX_HEADERS {
        return Err(format!(
            "Secret {name} has {} keys; at most {MAX_HEADERS} headers",
            data.len()
        ));
    }
    let mut headers = Vec::with_capacity(data.len());
    for (key, value) in data {
        let header = HeaderName::from_bytes(key.as_bytes())
            .map_err(|_| format!("Secret {name}: key {key:?} is not a header name"))?;
        if RESERVED.contains(&header.as_str()) {
            return Err(format!(
                "Secret {name}: header {header} is set by the request itself"
            ));
        }
        let mut value = HeaderValue::from_bytes(value)
            .map_err(|_| format!("Secret {name}: the value of {key:?} is not a header value"))?;
        value.set_sensitive(true);
        headers.push((header, value));
    }
    Ok(headers)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotations(value: &str) -> BTreeMap<String, String> {
        [(FOR_ANNOTATION.to_string(), value.to_string())].into()
    }

    fn data(pairs: &[(&str, &[u8])]) -> BTreeMap<String, Vec<u8>> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_vec()))
            .collect()
    }

    #[test]
    fn a_secret_for_the_namespace_gives_each_key_as_a_sensitive_header() {
        let h = from_secret(
            "judge",
            &annotations("payments, shop"),
            &data(&[("Authorization", b"Bearer s3cret"), ("x-team", b"shop")]),
            "shop",
        )
        .unwrap();
        assert_eq!(h.len(), 2);
        assert_eq!(h[0].0, "authorization");
        assert_eq!(h[0].1, "Bearer s3cret");
        assert!(h[0].1.is_sensitive());
        assert_eq!(h[1].0, "x-team");
    }

    #[test]
    fn a_secret_of_another_team_or_a_bad_one_is_refused_without_its_values() {
        let good = data(&[("authorization", b"Bearer s3cret")]);
        for (ann, d, reason) in [
            (BTreeMap::new(), good.clone(), "is not for namespace shop"),
            (
                annotations("payments"),
                good.clone(),
                "is not for namespace shop",
            ),
            (
                annotations("shopping"),
                good.clone(),
                "is not for namespace shop",
            ),
            (annotations("shop"), BTreeMap::new(), "has no data"),
            (
                annotations("shop"),
                data(&[("bad header", b"s3cret")]),
                "\"bad header\" is not a header name",
            ),
            (
                annotations("shop"),
                data(&[("authorization", b"s3cret\r\nx: y")]),
                "the value of \"authorization\" is not a header value",
            ),
            (
                annotations("shop"),
                data(&[("Host", b"s3cret")]),
                "header host is set by the request itself",
            ),
        ] {
            let e = from_secret("judge", &ann, &d, "shop").unwrap_err();
            assert!(e.contains(reason), "{reason}: {e}");
            assert!(!e.contains("s3cret"), "a value in an error: {e}");
        }
        let many: BTreeMap<String, Vec<u8>> =
            (0..17).map(|i| (format!("x-{i}"), b"v".to_vec())).collect();
        let e = from_secret("judge", &annotations("shop"), &many, "shop").unwrap_err();
        assert!(e.contains("at most 16"), "{e}");
    }
}
