//! Member credentials as data, not as code. kube-rs acts on everything a
//! kubeconfig says: it runs `exec` and `auth-provider` commands, reads any
//! file path, dials a proxy and can skip TLS verification. A kubeconfig that
//! anyone with Secret-create rights in the home namespace can supply may
//! therefore carry inline data only. Files in `--kubeconfig-dir` are the
//! administrator's own; commands in them still need an explicit opt-in.

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

/// Checks every cluster and user entry, not only the current context's, so
/// that no later switch of context can reach a refused one.
pub fn check(kc: &Kubeconfig, trust: Trust) -> Result<(), Refused> {
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
}
