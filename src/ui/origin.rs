//! Where a request comes from. A cookie marked `SameSite=Strict` still goes
//! with requests from other origins of the same site (a sibling subdomain,
//! another port on the host), so every write checks `Sec-Fetch-Site` or
//! `Origin` and takes JSON only (a cross-origin `fetch` of JSON needs a
//! preflight, which this server never answers). An open development page
//! answers only to loopback host names, so DNS rebinding reads nothing.

use http::HeaderMap;

/// Why a write was refused, for the 403 body.
pub fn cross_origin(headers: &HeaderMap, secure: bool, host: Option<&str>) -> Option<&'static str> {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(site) = get("sec-fetch-site") {
        // Browsers send it on every request; only this origin may write.
        return (site != "same-origin").then_some("writes are taken only from this page's origin");
    }
    match get("origin") {
        // Browsers send Origin on every POST; tools send neither.
        None => None,
        Some(origin) => {
            let scheme = if secure { "https" } else { "http" };
            let ours =
                host.is_some_and(|h| origin.eq_ignore_ascii_case(&format!("{scheme}://{h}")));
            (!ours).then_some("writes are taken only from this page's origin")
        }
    }
}

/// Whether the body is declared JSON (`application/json`, any parameters).
pub fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
}

/// Whether `host` (a Host header or h2 authority) names this machine, or
/// one of `allowed` (exact names, without the port).
pub fn allowed_host(host: Option<&str>, allowed: &[String]) -> bool {
    let Some(host) = host else {
        return false;
    };
    let name = match host.rsplit_once(':') {
        // `[::1]:8081`, `localhost:8081`; but not the colons of a bare IPv6.
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) && !name.ends_with(':') => {
            name
        }
        _ => host,
    };
    let name = name.to_ascii_lowercase();
    name == "localhost"
        || name == "[::1]"
        || name
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|ip| ip.is_loopback())
        || allowed.iter().any(|a| a.eq_ignore_ascii_case(&name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.insert(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        m
    }

    #[test]
    fn only_this_origin_may_write() {
        let host = Some("flotilla.apps.example:8443");
        assert!(cross_origin(&h(&[("sec-fetch-site", "same-origin")]), true, host).is_none());
        for site in ["same-site", "cross-site", "none"] {
            assert!(
                cross_origin(&h(&[("sec-fetch-site", site)]), true, host).is_some(),
                "{site}"
            );
        }
        // No Sec-Fetch-Site: Origin must be this scheme, host and port.
        assert!(
            cross_origin(
                &h(&[("origin", "https://flotilla.apps.example:8443")]),
                true,
                host
            )
            .is_none()
        );
        for other in [
            "https://evil.apps.example:8443",
            "https://flotilla.apps.example:9443",
            "http://flotilla.apps.example:8443",
            "null",
        ] {
            assert!(
                cross_origin(&h(&[("origin", other)]), true, host).is_some(),
                "{other}"
            );
        }
        // Sec-Fetch-Site decides over a matching Origin.
        assert!(
            cross_origin(
                &h(&[
                    ("sec-fetch-site", "same-site"),
                    ("origin", "https://flotilla.apps.example:8443")
                ]),
                true,
                host
            )
            .is_some()
        );
        // A tool (curl, scripts) sends neither.
        assert!(cross_origin(&h(&[]), true, host).is_none());
    }

    #[test]
    fn writes_take_json_only() {
        assert!(is_json(&h(&[("content-type", "application/json")])));
        assert!(is_json(&h(&[(
            "content-type",
            "Application/JSON; charset=utf-8"
        )])));
        for t in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
        ] {
            assert!(!is_json(&h(&[("content-type", t)])), "{t}");
        }
        assert!(!is_json(&h(&[])));
    }

    #[test]
    fn an_open_page_answers_only_to_loopback_names() {
        for ok in [
            "127.0.0.1:8081",
            "localhost:8081",
            "LOCALHOST",
            "[::1]:8081",
            "127.1.2.3",
        ] {
            assert!(allowed_host(Some(ok), &[]), "{ok}");
        }
        for bad in [
            "evil.example:8081",
            "127.0.0.1.evil.example:8081",
            "10.0.0.1:8081",
            "",
        ] {
            assert!(!allowed_host(Some(bad), &[]), "{bad}");
        }
        assert!(!allowed_host(None, &[]));
        assert!(allowed_host(
            Some("flotilla.local:8081"),
            &["flotilla.local".into()]
        ));
    }
}
