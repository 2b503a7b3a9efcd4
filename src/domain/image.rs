//! Container image references, checked against the distribution reference
//! grammar: `[domain[:port]/]path[:tag][@algorithm:hex]`.
//!
//! The CRD schema only rejects whitespace; everything else about a reference
//! is checked here so that the reconciler can report `InvalidSpec` with a
//! precise reason instead of handing kubelets an image they cannot pull.

use std::fmt;

const MAX_NAME_LEN: usize = 255;
const MAX_TAG_LEN: usize = 128;

/// A parsed, valid image reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRef<'a> {
    pub domain: Option<&'a str>,
    pub path: &'a str,
    pub tag: Option<&'a str>,
    pub digest: Option<&'a str>,
}

/// Why a reference is not valid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageError(pub String);

impl fmt::Display for ImageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn err(msg: impl Into<String>) -> ImageError {
    ImageError(msg.into())
}

pub fn parse(reference: &str) -> Result<ImageRef<'_>, ImageError> {
    if reference.is_empty() {
        return Err(err("image is empty"));
    }
    let (rest, digest) = match reference.split_once('@') {
        Some((rest, digest)) => {
            check_digest(digest)?;
            (rest, Some(digest))
        }
        None => (reference, None),
    };
    // A tag follows the last ':' that comes after the last '/', so that a
    // registry port (`host:5000/app`) is not mistaken for a tag.
    let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match rest[last_slash..].rfind(':') {
        Some(i) => {
            let at = last_slash + i;
            (&rest[..at], Some(&rest[at + 1..]))
        }
        None => (rest, None),
    };
    if let Some(tag) = tag {
        check_tag(tag)?;
    }
    if name.len() > MAX_NAME_LEN {
        return Err(err(format!(
            "image name is {} characters long; at most {MAX_NAME_LEN} are allowed",
            name.len()
        )));
    }
    let (domain, path) = split_domain(name);
    if let Some(domain) = domain {
        check_domain(domain)?;
    }
    check_path(path)?;
    Ok(ImageRef {
        domain,
        path,
        tag,
        digest,
    })
}

/// The first component is a registry when it looks like a host: it has a
/// dot or a port, or is `localhost`. Otherwise it is part of the path
/// (`library/nginx`).
fn split_domain(name: &str) -> (Option<&str>, &str) {
    match name.split_once('/') {
        Some((first, rest))
            if first.contains('.') || first.contains(':') || first == "localhost" =>
        {
            (Some(first), rest)
        }
        Some((first, _)) if first.chars().any(|c| c.is_ascii_uppercase()) => (Some(first), ""),
        _ => (None, name),
    }
}

fn check_domain(domain: &str) -> Result<(), ImageError> {
    let (host, port) = match domain.rsplit_once(':') {
        Some((host, port)) if !host.ends_with(']') || domain.starts_with('[') => (host, Some(port)),
        _ => (domain, None),
    };
    if let Some(port) = port
        && (port.is_empty() || port.len() > 5 || !port.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(err(format!("registry port {port:?} is not a number")));
    }
    if host.starts_with('[') && host.ends_with(']') {
        let inner = &host[1..host.len() - 1];
        if inner.is_empty() || !inner.bytes().all(|b| b.is_ascii_hexdigit() || b == b':') {
            return Err(err(format!(
                "registry {host:?} is not a valid IPv6 address"
            )));
        }
        return Ok(());
    }
    for component in host.split('.') {
        let ok = !component.is_empty()
            && component
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !component.starts_with('-')
            && !component.ends_with('-');
        if !ok {
            return Err(err(format!(
                "registry host {host:?} is not a valid host name"
            )));
        }
    }
    Ok(())
}

fn check_path(path: &str) -> Result<(), ImageError> {
    if path.is_empty() {
        return Err(err("image has no repository path"));
    }
    for component in path.split('/') {
        if !path_component_ok(component) {
            return Err(err(format!(
                "repository path component {component:?} must be lowercase letters and digits, separated by '.', '_', '__' or '-'"
            )));
        }
    }
    Ok(())
}

fn path_component_ok(c: &str) -> bool {
    let bytes = c.as_bytes();
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    if bytes.is_empty() || !alnum(bytes[0]) || !alnum(bytes[bytes.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < bytes.len() {
        if alnum(bytes[i]) {
            i += 1;
            continue;
        }
        // A separator run: '.', '_', '__' or any number of '-'.
        let start = i;
        while i < bytes.len() && !alnum(bytes[i]) {
            i += 1;
        }
        let sep = &c[start..i];
        let valid = sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|b| b == b'-');
        if !valid {
            return false;
        }
    }
    true
}

fn check_tag(tag: &str) -> Result<(), ImageError> {
    let bytes = tag.as_bytes();
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let ok = !bytes.is_empty()
        && bytes.len() <= MAX_TAG_LEN
        && word(bytes[0])
        && bytes.iter().all(|&b| word(b) || b == b'.' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(err(format!(
            "tag {tag:?} must be 1 to {MAX_TAG_LEN} letters, digits, '_', '.' or '-', not starting with '.' or '-'"
        )))
    }
}

fn check_digest(digest: &str) -> Result<(), ImageError> {
    let Some((algorithm, hex)) = digest.split_once(':') else {
        return Err(err(format!("digest {digest:?} must be algorithm:hex")));
    };
    let alg_ok = algorithm.split(['+', '.', '_', '-']).all(|part| {
        part.bytes().next().is_some_and(|b| b.is_ascii_alphabetic())
            && part.bytes().all(|b| b.is_ascii_alphanumeric())
    });
    if !alg_ok {
        return Err(err(format!("digest algorithm {algorithm:?} is not valid")));
    }
    let hex_ok = |len_ok: bool| len_ok && hex.bytes().all(|b| b.is_ascii_hexdigit());
    let valid = match algorithm {
        "sha256" => hex_ok(hex.len() == 64) && !hex.bytes().any(|b| b.is_ascii_uppercase()),
        "sha512" => hex_ok(hex.len() == 128) && !hex.bytes().any(|b| b.is_ascii_uppercase()),
        _ => hex_ok(hex.len() >= 32),
    };
    if valid {
        Ok(())
    } else {
        Err(err(format!(
            "digest {digest:?} has the wrong length or non-hex characters for {algorithm}"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHA: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn accepts_common_references() {
        for r in [
            "nginx",
            "nginx:1.27",
            "library/nginx:latest",
            "ghcr.io/acme/todo-api:2.1.0",
            "registry.example.com:5000/team/api:1.4.2",
            "localhost:5000/api",
            "localhost/api",
            "my-registry.local/a__b/c.d/e-f:v1_2-3",
            "[::1]:5000/app:1",
        ] {
            assert!(parse(r).is_ok(), "{r} should be valid: {:?}", parse(r));
        }
    }

    #[test]
    fn registry_port_is_not_a_tag() {
        let r = parse("registry.example.com:5000/team/api").expect("valid");
        assert_eq!(r.domain, Some("registry.example.com:5000"));
        assert_eq!(r.path, "team/api");
        assert_eq!(r.tag, None);
    }

    #[test]
    fn digests_with_and_without_tags() {
        let with_tag = format!("ghcr.io/acme/api:1.0@{SHA}");
        let r = parse(&with_tag).expect("valid");
        assert_eq!(r.tag, Some("1.0"));
        assert_eq!(r.digest, Some(SHA));
        let only_digest = format!("registry.example.com:5000/api@{SHA}");
        let r = parse(&only_digest).expect("valid");
        assert_eq!(r.domain, Some("registry.example.com:5000"));
        assert_eq!(r.tag, None);
    }

    #[test]
    fn rejects_bad_references() {
        for r in [
            "",
            "Nginx:1",
            "acme/API",
            "nginx:",
            "nginx:-1",
            "nginx:.x",
            "nginx::1",
            "ghcr.io/",
            "a//b",
            "a--b_-c",
            "-nginx",
            "nginx@sha256:abc",
            "nginx@sha256:0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef",
            "nginx@md5",
            "registry.example.com:port/api",
            "bad_host.example.com/api",
            "http://registry/api",
        ] {
            assert!(parse(r).is_err(), "{r:?} should be rejected");
        }
    }

    #[test]
    fn tag_length_limit() {
        let ok = format!("api:{}", "a".repeat(128));
        let too_long = format!("api:{}", "a".repeat(129));
        assert!(parse(&ok).is_ok());
        assert!(parse(&too_long).is_err());
    }

    #[test]
    fn name_length_limit() {
        let long = format!("registry.example.com/{}", "a".repeat(250));
        assert!(parse(&long).is_err());
    }
}
