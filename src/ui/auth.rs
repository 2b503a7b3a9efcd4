//! Signing in to the dashboard. The token is asked for once and kept as a
//! session cookie: `<issued>.<id>.<mac>`, where the MAC is keyed by the
//! token in force, so rotating the token ends every session it signed, a
//! session expires after `MAX_AGE`, and each sign-in has an id of its own
//! for the audit log and the per-client stream cap. Over TLS the cookie is
//! `__Host-` prefixed: host-only, `Secure`, and no sibling can set it.

use http::HeaderMap;
use subtle::ConstantTimeEq;

use crate::api::auth::BearerToken;

/// The cookie in plaintext (development) mode.
pub const COOKIE: &str = "flotilla_ui";
/// The cookie over TLS.
pub const TLS_COOKIE: &str = "__Host-flotilla_ui";
/// A session's life, in seconds.
pub const MAX_AGE: u64 = 12 * 60 * 60;
const PURPOSE: &str = "flotilla-ui-session/v2";
const WRITE_PURPOSE: &str = "flotilla-ui-write-session/v2";

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Access {
    Read,
    Write,
}

/// Who is asking, as far as the dashboard can tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub access: Access,
    /// A session id, a token's fingerprint, or none for an open page (the
    /// peer address stands in).
    pub id: Option<String>,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn mac(token: &BearerToken, purpose: &str, issued: u64, id: &str) -> Option<String> {
    token
        .derive(&format!("{purpose}|{issued}|{id}"))
        .map(|d| hex(&d))
}

/// A new session's cookie value for `access`, signed by its token.
pub fn issue(
    read: &BearerToken,
    write: &BearerToken,
    access: Access,
    now: u64,
    id: &str,
) -> Option<String> {
    let m = match access {
        Access::Read => mac(read, PURPOSE, now, id)?,
        Access::Write => mac(write, WRITE_PURPOSE, now, id)?,
    };
    Some(format!("{now}.{id}.{m}"))
}

/// A random session id (16 bytes, hex).
pub fn new_id() -> String {
    use ring::rand::SecureRandom;
    let mut b = [0u8; 16];
    ring::rand::SystemRandom::new()
        .fill(&mut b)
        .expect("the system's random source");
    hex(&b)
}

fn same(got: &str, want: Option<String>) -> bool {
    want.is_some_and(|w| bool::from(got.as_bytes().ct_eq(w.as_bytes())))
}

/// The session a cookie value holds, if its MAC matches a token in force
/// and it has not expired (nor was issued in the future, past a minute's
/// skew between replicas).
pub fn verify(read: &BearerToken, write: &BearerToken, value: &str, now: u64) -> Option<Caller> {
    let mut parts = value.split('.');
    let (issued, id, m) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || id.len() != 32 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let issued: u64 = issued.parse().ok()?;
    if issued.saturating_add(MAX_AGE) <= now || issued > now.saturating_add(60) {
        return None;
    }
    let access = if same(m, mac(write, WRITE_PURPOSE, issued, id)) {
        Access::Write
    } else if same(m, mac(read, PURPOSE, issued, id)) {
        Access::Read
    } else {
        return None;
    };
    Some(Caller {
        access,
        id: Some(id.to_string()),
    })
}

pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(crate::api::auth::bearer)
}

/// Every value of the cookie `name`: a tossed cookie sent first (from a
/// sibling domain or a narrower path) must not hide the real one.
pub fn cookies<'a>(headers: &'a HeaderMap, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
    headers
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .filter(move |(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// Who the request is: its best valid session or bearer token; with no
/// read token configured the page is open for reading.
pub fn caller(
    read: &BearerToken,
    write: &BearerToken,
    headers: &HeaderMap,
    cookie_name: &str,
    now: u64,
) -> Option<Caller> {
    let from_cookie = cookies(headers, cookie_name)
        .filter_map(|v| verify(read, write, v, now))
        .max_by_key(|c| c.access);
    let from_bearer = bearer(headers).and_then(|t| {
        let access = if write.accepts(t) {
            Access::Write
        } else if read.accepts(t) {
            Access::Read
        } else {
            return None;
        };
        Some(Caller {
            access,
            id: Some(format!("token-{}", BearerToken::fingerprint(t))),
        })
    });
    let open = (!read.configured()).then_some(Caller {
        access: Access::Read,
        id: None,
    });
    [from_cookie, from_bearer, open]
        .into_iter()
        .flatten()
        .max_by_key(|c| (c.access, c.id.is_some()))
}

/// A `Set-Cookie` for this page: host-only, unreadable by script, sent
/// only to this origin; `name` is the plaintext name, `__Host-` prefixed
/// (and `Secure`) over TLS.
pub fn cookie_header(name: &str, value: &str, secure: bool, max_age: u64) -> String {
    if secure {
        format!(
            "__Host-{name}={value}; Path=/; HttpOnly; SameSite=Strict; Secure; Max-Age={max_age}"
        )
    } else {
        format!("{name}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age}")
    }
}

/// The `Set-Cookie` that starts a session.
pub fn set_cookie(value: &str, secure: bool) -> String {
    cookie_header(COOKIE, value, secure, MAX_AGE)
}

/// The `Set-Cookie` that ends it in this browser.
pub fn clear_cookie(secure: bool) -> String {
    cookie_header(COOKIE, "", secure, 0)
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

    const NOW: u64 = 1_800_000_000;

    fn access(read: &BearerToken, write: &BearerToken, h: &HeaderMap) -> Option<Access> {
        caller(read, write, h, COOKIE, NOW).map(|c| c.access)
    }

    #[test]
    fn a_session_admits_only_for_the_token_in_force_and_only_until_it_expires() {
        let (read, none) = (BearerToken::new(Some("s3cret")), BearerToken::new(None));
        let id = new_id();
        let value = issue(&read, &none, Access::Read, NOW, &id).unwrap();
        assert!(!value.contains("s3cret"));
        let cookie = format!("a=b; {COOKIE}={value}");
        let c = caller(&read, &none, &headers(&[("cookie", &cookie)]), COOKIE, NOW).unwrap();
        assert_eq!(
            (c.access, c.id.as_deref()),
            (Access::Read, Some(id.as_str()))
        );
        assert_eq!(access(&read, &none, &headers(&[])), None);
        // A forged MAC, a forged time, a changed id.
        // (Another last character than the real one: a random MAC ends in
        // `0` now and then, and a "forgery" equal to it proves nothing.)
        let other = if value.ends_with('0') { '1' } else { '0' };
        let forged = format!("{COOKIE}={}{other}", &value[..value.len() - 1]);
        assert_eq!(access(&read, &none, &headers(&[("cookie", &forged)])), None);
        let later = value.replacen(&NOW.to_string(), &(NOW + 5).to_string(), 1);
        assert_eq!(
            access(
                &read,
                &none,
                &headers(&[("cookie", &format!("{COOKIE}={later}"))])
            ),
            None
        );
        // Expired, and from the future.
        let h = headers(&[("cookie", &cookie)]);
        assert!(caller(&read, &none, &h, COOKIE, NOW + MAX_AGE - 1).is_some());
        assert!(caller(&read, &none, &h, COOKIE, NOW + MAX_AGE).is_none());
        assert!(caller(&read, &none, &h, COOKIE, NOW - 120).is_none());
        // The token itself.
        assert_eq!(
            access(
                &read,
                &none,
                &headers(&[("authorization", "Bearer s3cret")])
            ),
            Some(Access::Read)
        );
        // A rotated token ends the session.
        read.set(Some("other"));
        assert_eq!(access(&read, &none, &h), None);
        // No token: the page is open (TLS or --ui-insecure decide the rest).
        let open = caller(&BearerToken::new(None), &none, &headers(&[]), COOKIE, NOW).unwrap();
        assert_eq!((open.access, open.id), (Access::Read, None));
    }

    #[test]
    fn only_the_write_session_may_write_and_it_reads_too() {
        let (read, write) = (BearerToken::new(Some("r")), BearerToken::new(Some("w")));
        let r = format!(
            "{COOKIE}={}",
            issue(&read, &write, Access::Read, NOW, &new_id()).unwrap()
        );
        let w = format!(
            "{COOKIE}={}",
            issue(&read, &write, Access::Write, NOW, &new_id()).unwrap()
        );
        assert_eq!(
            access(&read, &write, &headers(&[("cookie", &r)])),
            Some(Access::Read)
        );
        assert_eq!(
            access(&read, &write, &headers(&[("cookie", &w)])),
            Some(Access::Write)
        );
        for h in ["Bearer w", "bearer w"] {
            assert_eq!(
                access(&read, &write, &headers(&[("authorization", h)])),
                Some(Access::Write)
            );
        }
        assert_eq!(
            access(&read, &write, &headers(&[("authorization", "Bearer r")])),
            Some(Access::Read)
        );
        // No write token: a write session signed before is worth nothing.
        let off = BearerToken::new(None);
        assert_eq!(access(&read, &off, &headers(&[("cookie", &w)])), None);
    }

    #[test]
    fn a_tossed_cookie_sent_first_does_not_hide_the_real_one() {
        let (read, none) = (BearerToken::new(Some("t")), BearerToken::new(None));
        let good = issue(&read, &none, Access::Read, NOW, &new_id()).unwrap();
        let h = headers(&[(
            "cookie",
            &format!("{TLS_COOKIE}=bogus; {TLS_COOKIE}={good}"),
        )]);
        assert_eq!(
            caller(&read, &none, &h, TLS_COOKIE, NOW).map(|c| c.access),
            Some(Access::Read)
        );
        // The plaintext name is not read over TLS.
        let h = headers(&[("cookie", &format!("{COOKIE}={good}"))]);
        assert!(caller(&read, &none, &h, TLS_COOKIE, NOW).is_none());
    }

    #[test]
    fn the_session_cookie_is_httponly_strict_host_only_and_expires() {
        let c = set_cookie("v", true);
        for part in [
            "__Host-flotilla_ui=v",
            "HttpOnly",
            "SameSite=Strict",
            "Secure",
            "Path=/",
            "Max-Age=43200",
        ] {
            assert!(c.contains(part), "{c}");
        }
        assert!(!c.contains("Domain"), "{c}");
        let plain = set_cookie("v", false);
        assert!(plain.starts_with("flotilla_ui=v") && !plain.contains("Secure"));
        assert!(clear_cookie(true).contains("Max-Age=0"));
    }
}
