//! Signing in to the dashboard: the token is asked for once and kept as a
//! session cookie (HttpOnly, SameSite=Strict) whose value is derived from
//! the token in force, so rotating the token ends every session.

use http::HeaderMap;
use subtle::ConstantTimeEq;

use crate::api::auth::BearerToken;

pub const COOKIE: &str = "flotilla_ui";
const PURPOSE: &str = "flotilla-ui-session/v1";
const WRITE_PURPOSE: &str = "flotilla-ui-write-session/v1";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The session cookie's value for the token in force.
pub fn session_value(token: &BearerToken) -> Option<String> {
    token.derive(PURPOSE).map(|d| hex(&d))
}

/// The session cookie's value for the rollout API's write token: it reads
/// and may pause, resume and undo.
pub fn write_session_value(write: &BearerToken) -> Option<String> {
    write.derive(WRITE_PURPOSE).map(|d| hex(&d))
}

fn same(got: Option<&str>, want: Option<String>) -> bool {
    match (got, want) {
        (Some(g), Some(w)) => bool::from(g.as_bytes().ct_eq(w.as_bytes())),
        _ => false,
    }
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(crate::api::auth::bearer)
}

/// Whether the request may change rollouts: the write token is configured
/// and the request carries its session or the token itself.
pub fn may_write(write: &BearerToken, headers: &HeaderMap) -> bool {
    same(cookie(headers, COOKIE), write_session_value(write))
        || bearer(headers).is_some_and(|t| write.accepts(t))
}

/// A cookie's value from the request's `Cookie` headers.
pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// Whether the request may read the fleet: no token is configured, or it
/// carries a session or a token, for reading or for writing.
pub fn admitted(token: &BearerToken, write: &BearerToken, headers: &HeaderMap) -> bool {
    let Some(want) = session_value(token) else {
        return true;
    };
    same(cookie(headers, COOKIE), Some(want))
        || bearer(headers).is_some_and(|t| token.accepts(t))
        || may_write(write, headers)
}

/// The `Set-Cookie` that starts a session.
pub fn set_cookie(value: &str, secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    format!("{COOKIE}={value}; Path=/; HttpOnly; SameSite=Strict{secure}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn the_cookie_admits_only_for_the_token_in_force() {
        let token = BearerToken::new(Some("s3cret"));
        let none = BearerToken::new(None);
        let value = session_value(&token).unwrap();
        assert!(!value.contains("s3cret") && value.len() == 64);
        let cookie = format!("a=b; {COOKIE}={value}");
        assert!(admitted(&token, &none, &headers(&[("cookie", &cookie)])));
        assert!(!admitted(&token, &none, &headers(&[])));
        assert!(!admitted(
            &token,
            &none,
            &headers(&[("cookie", &format!("{COOKIE}=00{}", &value[2..]))])
        ));
        assert!(admitted(
            &token,
            &none,
            &headers(&[("authorization", "Bearer s3cret")])
        ));
        // A rotated token ends the session.
        token.set(Some("other"));
        assert!(!admitted(&token, &none, &headers(&[("cookie", &cookie)])));
        // No token: the page is open (TLS or --ui-insecure decide the rest).
        assert!(admitted(&BearerToken::new(None), &none, &headers(&[])));
    }

    #[test]
    fn only_the_write_session_may_write_and_it_reads_too() {
        let (read, write) = (BearerToken::new(Some("r")), BearerToken::new(Some("w")));
        let r = format!("{COOKIE}={}", session_value(&read).unwrap());
        let w = format!("{COOKIE}={}", write_session_value(&write).unwrap());
        assert!(!may_write(&write, &headers(&[("cookie", &r)])));
        assert!(may_write(&write, &headers(&[("cookie", &w)])));
        assert!(admitted(&read, &write, &headers(&[("cookie", &w)])));
        assert!(may_write(
            &write,
            &headers(&[("authorization", "Bearer w")])
        ));
        // The scheme is case-insensitive (RFC 9110), as gRPC reads it.
        assert!(may_write(
            &write,
            &headers(&[("authorization", "bearer w")])
        ));
        assert!(!may_write(
            &write,
            &headers(&[("authorization", "Bearer r")])
        ));
        // No write token: nobody writes.
        let off = BearerToken::new(None);
        assert!(!may_write(&off, &headers(&[("cookie", &w)])));
    }

    #[test]
    fn the_session_cookie_is_httponly_and_strict() {
        let c = set_cookie("v", true);
        for part in ["HttpOnly", "SameSite=Strict", "Secure", "Path=/"] {
            assert!(c.contains(part), "{c}");
        }
        assert!(!set_cookie("v", false).contains("Secure"));
    }
}
