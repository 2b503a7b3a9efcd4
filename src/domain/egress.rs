//! Where Flotilla may call on a spec's behalf (#59): analysis webhooks and
//! Prometheus, and later notifications. The platform names the allowed
//! destinations (`--egress-allow`, repeatable); a spec that names any
//! other is refused before anything is called. Pure.
//!
//! A rule is a host (any port), `host:port`, or a URL prefix
//! (`https://host[:port]/path`: that scheme, host and port, and a path
//! under that one, whole segments). Without rules nothing is allowed.

use http::Uri;

/// The allowed destinations.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Egress {
    rules: Vec<Rule>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Rule {
    Host(String),
    HostPort(String, u16),
    Prefix {
        scheme: String,
        host: String,
        port: u16,
        path: String,
    },
}

/// A destination, as a rule sees it.
struct Target {
    scheme: String,
    host: String,
    port: u16,
    path: String,
}

fn default_port(scheme: &str) -> u16 {
    if scheme == "https" { 443 } else { 80 }
}

fn target(uri: &Uri) -> Option<Target> {
    let scheme = uri.scheme_str()?.to_ascii_lowercase();
    let authority = uri.authority()?;
    if authority.as_str().contains('@') {
        return None;
    }
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase();
    Some(Target {
        port: authority
            .port_u16()
            .unwrap_or_else(|| default_port(&scheme)),
        scheme,
        host,
        path: uri.path().to_string(),
    })
}

impl Rule {
    fn parse(raw: &str) -> Result<Rule, String> {
        let raw = raw.trim();
        let bad = |why: &str| format!("--egress-allow {raw:?}: {why}");
        if raw.is_empty() {
            return Err(bad("empty"));
        }
        if raw.contains("://") {
            let uri: Uri = raw.parse().map_err(|_| bad("not a URL"))?;
            let t = target(&uri).ok_or_else(|| bad("a URL prefix names a scheme and a host"))?;
            if !matches!(t.scheme.as_str(), "http" | "https") || uri.query().is_some() {
                return Err(bad("a URL prefix is http:// or https://, without a query"));
            }
            return Ok(Rule::Prefix {
                path: t.path.trim_end_matches('/').to_string(),
                scheme: t.scheme,
                host: t.host,
                port: t.port,
            });
        }
        // host, [v6], host:port or [v6]:port: a path needs a scheme.
        if raw.contains(['/', '?', '#', '@']) {
            return Err(bad("a path needs a scheme: https://host/path"));
        }
        let uri: Uri = format!("http://{raw}/")
            .parse()
            .map_err(|_| bad("not a host, host:port or URL prefix"))?;
        let t = target(&uri).ok_or_else(|| bad("not a host"))?;
        if t.host.is_empty() {
            return Err(bad("not a host"));
        }
        Ok(match uri.authority().and_then(|a| a.port_u16()) {
            Some(port) => Rule::HostPort(t.host, port),
            None => Rule::Host(t.host),
        })
    }

    fn allows(&self, t: &Target) -> bool {
        match self {
            Rule::Host(h) => *h == t.host,
            Rule::HostPort(h, p) => *h == t.host && *p == t.port,
            Rule::Prefix {
                scheme,
                host,
                port,
                path,
            } => {
                *scheme == t.scheme
                    && *host == t.host
                    && *port == t.port
                    && (t.path == *path
                        || t.path
                            .strip_prefix(path.as_str())
                            .is_some_and(|rest| rest.starts_with('/')))
            }
        }
    }
}

impl Egress {
    /// The rules of `--egress-allow`; a malformed one is an error.
    pub fn parse(values: &[String]) -> Result<Egress, String> {
        let rules = values
            .iter()
            .flat_map(|v| v.split(','))
            .filter(|v| !v.trim().is_empty())
            .map(Rule::parse)
            .collect::<Result<_, _>>()?;
        Ok(Egress { rules })
    }

    /// Whether `url` (an http:// or https:// URL) may be called; `Err`
    /// says why not.
    pub fn check(&self, url: &str) -> Result<(), String> {
        let uri: Uri = url.parse().map_err(|_| format!("{url:?} is not a URL"))?;
        let t = target(&uri).ok_or_else(|| format!("{url:?} names no host, or a user"))?;
        // What some servers rewrite (dot segments, escapes, `;` parameters,
        // backslashes) could walk out of a prefix: refused everywhere.
        let rewritten = t.path.split('/').any(|s| s == ".." || s == ".")
            || t.path.contains(['%', ';', '\\'])
            || !t.path.is_ascii();
        if rewritten {
            return Err(format!(
                "{url:?}: a path with dot segments, escapes, `;` or backslashes"
            ));
        }
        match self.rules.iter().any(|r| r.allows(&t)) {
            true => Ok(()),
            false if self.rules.is_empty() => Err(format!(
                "{url:?} is not an allowed destination: this Flotilla allows none (--egress-allow)"
            )),
            false => Err(format!(
                "{url:?} is not an allowed destination (--egress-allow)"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn egress(rules: &[&str]) -> Egress {
        Egress::parse(&rules.iter().map(|r| r.to_string()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn a_host_a_host_and_port_or_a_url_prefix_allows_only_itself() {
        let e = egress(&[
            "hooks.example.com",
            "127.0.0.1:9090",
            "https://gate.example.com/v1/checks",
            "[::1]",
        ]);
        for ok in [
            "http://hooks.example.com/x",
            "https://HOOKS.example.com:8443/y",
            "http://127.0.0.1:9090/api/v1/query",
            "https://gate.example.com/v1/checks",
            "https://gate.example.com:443/v1/checks/errors",
            "http://[::1]:8080/",
        ] {
            assert_eq!(e.check(ok), Ok(()), "{ok}");
        }
        for refused in [
            "http://hooks.example.com.evil/x",
            "http://127.0.0.1:9091/",
            "http://127.0.0.2:9090/",
            "http://gate.example.com/v1/checks",
            "https://gate.example.com/v1/checksum",
            "https://gate.example.com/v2",
            "https://gate.example.com:8443/v1/checks",
            "https://gate.example.com/v1/checks/../../admin",
            "https://gate.example.com/v1/checks/%2e%2e/admin",
            "https://gate.example.com/v1/checks/..;/admin",
            "http://user@hooks.example.com/",
            "http://169.254.169.254/latest",
        ] {
            assert!(e.check(refused).is_err(), "{refused}");
        }
    }

    #[test]
    fn without_rules_nothing_is_allowed_and_a_bad_rule_is_an_error() {
        let none = Egress::default();
        let e = none.check("http://127.0.0.1/").unwrap_err();
        assert!(e.contains("allows none"), "{e}");
        for bad in [
            "ftp://x/",
            "http://",
            "https://x/?a=b",
            "a b",
            "gate.example.com/v1",
        ] {
            assert!(Egress::parse(&[bad.to_string()]).is_err(), "{bad:?}");
        }
        assert_eq!(egress(&["a.example,b.example"]).rules.len(), 2);
    }
}
