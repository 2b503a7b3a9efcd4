//! Signing in to the dashboard: the token is asked for once and kept as a
//! session cookie (HttpOnly, SameSite=Strict) whose value is derived from
//! the token in force, so rotating the token ends every session.

use http::HeaderMap;
use subtle::ConstantTimeEq;

use crate::api::auth::BearerToken;

pub const COOKIE: &str = "flotilla_ui";
const PURPOSE: &str = "flotilla-ui-session/v1";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The session cookie's value for the token in force.
pub fn session_value(token: &BearerToken) -> Option<String> {
    token.derive(PURPOSE).map(|d| hex(&d))
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
/// carries the session cookie or the token as a bearer.
pub fn admitted(token: &BearerToken, headers: &HeaderMap) -> bool {
    let Some(want) = session_value(token) else {
        return true;
    };
    let by_cookie = cookie(headers, COOKIE)
        .is_some_and(|got| bool::from(got.as_bytes().ct_eq(want.as_bytes())));
    let by_bearer = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|t| token.accepts(t));
    by_cookie || by_bearer
}

/// The `Set-Cookie` that starts a session (or ends one, with `None`).
pub fn set_cookie(value: Option<&str>, secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    match value {
        Some(v) => format!("{COOKIE}={v}; Path=/; HttpOnly; SameSite=Strict{secure}"),
        None => format!("{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0{secure}"),
    }
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
        let value = session_value(&token).unwrap();
        assert!(!value.contains("s3cret") && value.len() == 64);
        let cookie = format!("a=b; {COOKIE}={value}");
        assert!(admitted(&token, &headers(&[("cookie", &cookie)])));
        assert!(!admitted(&token, &headers(&[])));
        assert!(!admitted(
            &token,
            &headers(&[("cookie", &format!("{COOKIE}=00{}", &value[2..]))])
        ));
        assert!(admitted(
            &token,
            &headers(&[("authorization", "Bearer s3cret")])
        ));
        // A rotated token ends the session.
        token.set(Some("other"));
        assert!(!admitted(&token, &headers(&[("cookie", &cookie)])));
        // No token: the page is open (TLS or --ui-insecure decide the rest).
        assert!(admitted(&BearerToken::new(None), &headers(&[])));
    }

    #[test]
    fn the_session_cookie_is_httponly_and_strict() {
        let c = set_cookie(Some("v"), true);
        for part in ["HttpOnly", "SameSite=Strict", "Secure", "Path=/"] {
            assert!(c.contains(part), "{c}");
        }
        assert!(set_cookie(None, false).contains("Max-Age=0"));
    }
}
