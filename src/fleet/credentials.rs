//! Member credentials as data, not as code. kube-rs acts on everything a
//! kubeconfig says: it runs `exec` and `auth-provider` commands, reads any
//! file path, dials a proxy and can skip TLS verification. A kubeconfig that
//! anyone with Secret-create rights in the home namespace can supply may
//! therefore carry inline data only. Files in `--kubeconfig-dir` are the
//! administrator's own; commands in them still need an explicit opt-in.

use std::net::IpAddr;
use std::sync::OnceLock;

use kube::config::Kubeconfig;

/// Who wrote the kubeconfig, and so what it may ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trust {
    /// A labelled Secret: inline certificates, keys and tokens only.
    Secret,
    /// A file in the kubeconfig directory; `exec` and `auth-provider` only
    /// with `--allow-exec-kubeconfigs`.
    File { allow_exec: bool },
}

/// A kubeconfig field this source may not use. The message names the field
/// and where it is, never its value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} is not allowed in {place} ({why})")]
pub struct Refused {
    pub field: &'static str,
    pub place: String,
    pub why: &'static str,
}

const DATA_ONLY: &str = "kubeconfigs from Secrets may carry inline data only";
const NO_EXEC: &str = "commands run only with --allow-exec-kubeconfigs";
const TLS_ONLY: &str = "kubeconfigs from Secrets must use https";
const NOT_ALLOWED: &str = "its host is outside --member-server-allow";

/// Where member apiservers may be (`--member-server-allow`): networks
/// (CIDRs) and DNS suffixes. Empty: anywhere.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerAllow {
    nets: Vec<(IpAddr, u8)>,
    suffixes: Vec<String>,
}

impl ServerAllow {
    /// Each item a CIDR (`10.0.0.0/8`, `fd00::/8`), an address, or a DNS
    /// name that admits itself and every name below it.
    pub fn parse(items: &[String]) -> Result<Self, String> {
        let mut out = ServerAllow::default();
        for item in items.iter().map(|i| i.trim()).filter(|i| !i.is_empty()) {
            let (addr, bits) = match item.split_once('/') {
                Some((a, b)) => (a, Some(b)),
                None => (item, None),
            };
            if let Ok(ip) = addr.parse::<IpAddr>() {
                let max = if ip.is_ipv4() { 32 } else { 128 };
                let bits = match bits {
                    None => max,
                    Some(b) => b
                        .parse::<u8>()
                        .ok()
                        .filter(|b| *b <= max)
                        .ok_or_else(|| format!("--member-server-allow {item:?}: not a CIDR"))?,
                };
                out.nets.push((ip, bits));
            } else if bits.is_none()
                && item.trim_start_matches('.').split('.').all(|l| {
                    !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                })
            {
                out.suffixes
                    .push(item.trim_start_matches('.').to_ascii_lowercase());
            } else {
                return Err(format!(
                    "--member-server-allow {item:?}: neither a CIDR nor a DNS name"
                ));
            }
        }
        Ok(out)
    }

    pub fn is_empty(&self) -> bool {
        self.nets.is_empty() && self.suffixes.is_empty()
    }

    /// Whether `host` (an address or a name, as a URL has it) is admitted.
    pub fn admits(&self, host: &str) -> bool {
        if self.is_empty() {
            return true;
        }
        let host = host.trim_start_matches('[').trim_end_matches(']');
        match host.parse::<IpAddr>() {
            Ok(ip) => self
                .nets
                .iter()
                .any(|(net, bits)| contains(*net, *bits, ip)),
            Err(_) => {
                let host = host.trim_end_matches('.').to_ascii_lowercase();
                self.suffixes
                    .iter()
                    .any(|s| host == *s || host.ends_with(&format!(".{s}")))
            }
        }
    }
}

fn contains(net: IpAddr, bits: u8, ip: IpAddr) -> bool {
    let (n, i, width) = match (net, ip) {
        (IpAddr::V4(n), IpAddr::V4(i)) => (u32::from(n) as u128, u32::from(i) as u128, 32),
        (IpAddr::V6(n), IpAddr::V6(i)) => (u128::from(n), u128::from(i), 128),
        _ => return false,
    };
    if bits == 0 {
        return true;
    }
    let shift = width - u32::from(bits);
    (n >> shift) == (i >> shift)
}

static SERVER_ALLOW: OnceLock<ServerAllow> = OnceLock::new();

/// Sets the process's allow-list once, at start-up, before any member
/// client exists; every client is checked against it (`check`).
pub fn set_server_allow(allow: ServerAllow) -> Result<(), String> {
    SERVER_ALLOW
        .set(allow)
        .map_err(|_| "the member server allow-list is already set".to_string())
}

/// The scheme and host of a kubeconfig's `server`.
fn scheme_and_host(server: &str) -> Option<(String, String)> {
    let uri: http::Uri = server.parse().ok()?;
    Some((
        uri.scheme_str()?.to_ascii_lowercase(),
        uri.host()?.to_string(),
    ))
}

/// `check_with` the allow-list this process was started with.
pub fn check(kc: &Kubeconfig, trust: Trust) -> Result<(), Refused> {
    static ANYWHERE: ServerAllow = ServerAllow {
        nets: Vec::new(),
        suffixes: Vec::new(),
    };
    check_with(kc, trust, SERVER_ALLOW.get().unwrap_or(&ANYWHERE))
}

/// Checks every cluster and user entry, not only the current context's, so
/// that no later switch of context can reach a refused one.
pub fn check_with(kc: &Kubeconfig, trust: Trust, allow: &ServerAllow) -> Result<(), Refused> {
    let secret = trust == Trust::Secret;
    let allow_exec = matches!(trust, Trust::File { allow_exec: true });
    let refuse = |field, place: &str, why| {
        Err(Refused {
            field,
            place: place.to_string(),
            why,
        })
    };
    for named in &kc.clusters {
        let Some(c) = &named.cluster else { continue };
        let place = format!("cluster {:?}", named.name);
        if secret {
            if c.certificate_authority.is_some() {
                return refuse("certificate-authority (a file path)", &place, DATA_ONLY);
            }
            if c.proxy_url.is_some() {
                return refuse("proxy-url", &place, DATA_ONLY);
            }
            if c.insecure_skip_tls_verify == Some(true) {
                return refuse("insecure-skip-tls-verify", &place, DATA_ONLY);
            }
        }
    }
    for named in &kc.auth_infos {
        let Some(u) = &named.auth_info else { continue };
        let place = format!("user {:?}", named.name);
        if u.exec.is_some() && !allow_exec {
            return refuse("exec", &place, if secret { DATA_ONLY } else { NO_EXEC });
        }
        if u.auth_provider.is_some() && !allow_exec {
            return refuse(
                "auth-provider",
                &place,
                if secret { DATA_ONLY } else { NO_EXEC },
            );
        }
        if secret {
            if u.token_file.is_some() {
                return refuse("tokenFile (a file path)", &place, DATA_ONLY);
            }
            if u.client_certificate.is_some() {
                return refuse("client-certificate (a file path)", &place, DATA_ONLY);
            }
            if u.client_key.is_some() {
                return refuse("client-key (a file path)", &place, DATA_ONLY);
            }
        }
    }
    // The server last, so a kubeconfig refused for a field says so.
    for named in &kc.clusters {
        let Some(c) = &named.cluster else { continue };
        let place = format!("cluster {:?}", named.name);
        let Some((scheme, host)) = c.server.as_deref().and_then(scheme_and_host) else {
            return refuse("server (not a URL)", &place, DATA_ONLY);
        };
        if secret && scheme != "https" {
            return refuse("server (plaintext http)", &place, TLS_ONLY);
        }
        if !allow.admits(&host) {
            return refuse("server", &place, NOT_ALLOWED);
        }
    }
    Ok(())
}

/// The first clause of an error about a kubeconfig ("failed to load client
/// key"), without the detail after it, which may quote paths or data.
pub fn describe(error: &impl std::fmt::Display) -> String {
    let text = error.to_string();
    let head = text.split(": ").next().unwrap_or_default();
    head.chars().filter(|c| !c.is_control()).take(120).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kubeconfig(cluster: &str, user: &str) -> Kubeconfig {
        let yaml = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\n{cluster}users:\n- name: u\n  user:\n{user}contexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n"
        );
        Kubeconfig::from_yaml(&yaml).expect("test kubeconfig parses")
    }

    const INLINE_USER: &str = "    token: s3cr3t\n";

    #[test]
    fn inline_data_is_accepted_from_every_source() {
        let kc = kubeconfig(
            "    certificate-authority-data: Zm9v\n",
            "    client-certificate-data: Zm9v\n    client-key-data: YmFy\n",
        );
        check(&kc, Trust::Secret).unwrap();
        check(&kc, Trust::File { allow_exec: false }).unwrap();
        check(&kubeconfig("", INLINE_USER), Trust::Secret).unwrap();
    }

    #[test]
    fn every_field_that_runs_code_reads_files_or_redirects_is_refused_from_a_secret() {
        let cases = [
            (
                "",
                "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: /bin/touch\n      args: [/tmp/s3cr3t-marker]\n",
                "exec",
            ),
            (
                "",
                "    auth-provider:\n      name: gcp\n      config: {cmd-path: /bin/touch}\n",
                "auth-provider",
            ),
            ("", "    tokenFile: /var/run/secrets/s3cr3t\n", "tokenFile"),
            (
                "",
                "    client-certificate: /etc/s3cr3t.crt\n    client-key-data: YmFy\n",
                "client-certificate",
            ),
            (
                "",
                "    client-certificate-data: Zm9v\n    client-key: /etc/s3cr3t.key\n",
                "client-key",
            ),
            (
                "    certificate-authority: /etc/s3cr3t-ca.crt\n",
                INLINE_USER,
                "certificate-authority",
            ),
            (
                "    proxy-url: http://127.0.0.1:9/s3cr3t\n",
                INLINE_USER,
                "proxy-url",
            ),
            (
                "    insecure-skip-tls-verify: true\n",
                INLINE_USER,
                "insecure-skip-tls-verify",
            ),
        ];
        for (cluster, user, field) in cases {
            let err = check(&kubeconfig(cluster, user), Trust::Secret).unwrap_err();
            let text = err.to_string();
            assert!(text.starts_with(field), "{field}: {text}");
            assert!(!text.contains("s3cr3t"), "the value leaked: {text}");
        }
    }

    #[test]
    fn files_are_trusted_but_commands_need_the_opt_in() {
        let exec = kubeconfig(
            "",
            "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: kubelogin\n",
        );
        let err = check(&exec, Trust::File { allow_exec: false }).unwrap_err();
        assert!(
            err.to_string().contains("--allow-exec-kubeconfigs"),
            "{err}"
        );
        check(&exec, Trust::File { allow_exec: true }).unwrap();
        let paths = kubeconfig(
            "    certificate-authority: /etc/ca.crt\n",
            "    tokenFile: /var/run/token\n",
        );
        check(&paths, Trust::File { allow_exec: false }).unwrap();
    }

    #[test]
    fn errors_are_described_by_their_first_clause_only() {
        assert_eq!(
            describe(&"failed to load client key: failed to read file '/etc/s3cr3t'"),
            "failed to load client key"
        );
    }

    fn with_server(server: &str) -> Kubeconfig {
        let yaml = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\nusers:\n- name: u\n  user:\n{INLINE_USER}contexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n"
        );
        Kubeconfig::from_yaml(&yaml).expect("test kubeconfig parses")
    }

    #[test]
    fn a_secret_must_use_https_and_every_server_must_be_allowed() {
        let anywhere = ServerAllow::default();
        let plain = with_server("http://127.0.0.1:1");
        let err = check_with(&plain, Trust::Secret, &anywhere).unwrap_err();
        assert_eq!(err.field, "server (plaintext http)");
        // The administrator's own files may (a local test apiserver).
        check_with(&plain, Trust::File { allow_exec: false }, &anywhere).unwrap();

        let allow = ServerAllow::parse(&[
            "10.0.0.0/8".into(),
            "clusters.corp.example".into(),
            "fd00::/8".into(),
        ])
        .unwrap();
        for ok in [
            "https://10.1.2.3:6443",
            "https://api.eu.clusters.corp.example",
            "https://[fd00::1]:6443",
        ] {
            check_with(&with_server(ok), Trust::Secret, &allow)
                .unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for bad in [
            "https://169.254.169.254",
            "https://[::1]:6443",
            "https://127.0.0.1:8080",
            "https://evilclusters.corp.example",
            "https://clusters.corp.example.evil.example",
            "https://kubernetes.default.svc",
        ] {
            let err = check_with(&with_server(bad), Trust::Secret, &allow).unwrap_err();
            assert_eq!(err.field, "server", "{bad}");
            assert!(
                !err.to_string().contains("169.254"),
                "the value is never quoted: {err}"
            );
        }
        // Files are held to the list too: it is the process's policy.
        let err = check_with(
            &with_server("https://127.0.0.1:1"),
            Trust::File { allow_exec: false },
            &allow,
        )
        .unwrap_err();
        assert_eq!(err.field, "server");
    }

    #[test]
    fn the_allow_list_parses_cidrs_addresses_and_names_and_refuses_the_rest() {
        let a = ServerAllow::parse(&["127.0.0.0/8".into(), "::1".into(), ".example.org".into()])
            .unwrap();
        assert!(
            a.admits("127.9.9.9")
                && a.admits("[::1]")
                && a.admits("api.example.org")
                && a.admits("example.org")
        );
        assert!(!a.admits("128.0.0.1") && !a.admits("[::2]") && !a.admits("example.org.evil"));
        assert!(ServerAllow::parse(&[]).unwrap().admits("anything"));
        for bad in ["10.0.0.0/33", "10.0.0.0/x", "bad name", "host/8"] {
            assert!(ServerAllow::parse(&[bad.into()]).is_err(), "{bad}");
        }
    }
}
