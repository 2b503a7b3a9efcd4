//! The kubeconfig directory: one file per member cluster, named after the
//! file stem, picked up, changed and removed while the operator runs.

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::api::core::v1::Secret;

use super::credentials::{self, Trust};
use super::labels::{self, Labels};

/// One file's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// Parsed; `fingerprint` changes whenever the file's bytes do.
    Valid { fingerprint: u64 },
    /// The reason names the file, never its contents.
    Invalid { reason: String },
}

fn fingerprint(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// A cluster name must work as a label value and a file stem.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// One file of the directory.
#[derive(Debug, Clone)]
pub struct Found {
    /// Where it came from, for logs and the status API: `file NAME` or `secret NS/NAME`.
    pub source: String,
    pub entry: Entry,
    /// Present exactly when the entry is valid.
    pub kubeconfig: Option<kube::config::Kubeconfig>,
    /// What the kubeconfig may ask for, by where it came from.
    pub trust: Trust,
    /// The cluster's labels (its name included), or why they cannot be read.
    pub labels: Result<Labels, String>,
}

fn found(
    path: &Path,
    entry: Entry,
    kubeconfig: Option<kube::config::Kubeconfig>,
    trust: Trust,
) -> Found {
    let file = path
        .file_name()
        .and_then(|f| f.to_str())
        .unwrap_or_default();
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or_default();
    Found {
        source: format!("file {file}"),
        entry,
        kubeconfig,
        trust,
        labels: labels::from_side_file(path, stem),
    }
}

/// Reads the directory: cluster name -> what its file holds. Hidden files
/// and editor leftovers are skipped. `allow_exec` lets these files run
/// credential plugins.
pub fn scan(dir: &Path, allow_exec: bool) -> std::io::Result<BTreeMap<String, Found>> {
    let trust = Trust::File { allow_exec };
    let mut out = BTreeMap::new();
    for item in std::fs::read_dir(dir)? {
        let path = item?.path();
        let Some(file) = path.file_name().and_then(|f| f.to_str()) else {
            continue;
        };
        let side_file = path
            .extension()
            .is_some_and(|e| e == labels::SIDE_FILE_EXTENSION);
        if file.starts_with('.') || file.ends_with('~') || side_file || !path.is_file() {
            continue;
        }
        let stem = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default()
            .to_string();
        if !valid_name(&stem) {
            let reason = format!(
                "file {file}: {stem:?} is not a valid cluster name (lowercase letters, digits and '-')"
            );
            out.insert(
                stem.clone(),
                found(&path, Entry::Invalid { reason }, None, trust),
            );
            continue;
        }
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) => {
                let reason = format!("file {file}: unreadable ({})", e.kind());
                out.insert(stem, found(&path, Entry::Invalid { reason }, None, trust));
                continue;
            }
        };
        let entry = match parse(&bytes, trust) {
            Ok(kc) => found(
                &path,
                Entry::Valid {
                    fingerprint: fingerprint(&bytes),
                },
                Some(kc),
                trust,
            ),
            Err(why) => found(
                &path,
                Entry::Invalid {
                    reason: format!("file {file}: {why}"),
                },
                None,
                trust,
            ),
        };
        out.insert(stem, entry);
    }
    Ok(out)
}

/// The label that makes a Secret in the operator's home namespace a member cluster.
pub const SECRET_LABEL: &str = "platform.example.io/member-cluster";
/// The data key holding the kubeconfig.
pub const SECRET_KEY: &str = "kubeconfig";

/// Member clusters from labelled Secrets, each named after its Secret.
pub fn from_secrets(secrets: &[Secret]) -> BTreeMap<String, Found> {
    let mut out = BTreeMap::new();
    for secret in secrets {
        let Some(name) = secret.metadata.name.clone() else {
            continue;
        };
        let ns = secret.metadata.namespace.clone().unwrap_or_default();
        let source = format!("secret {ns}/{name}");
        // The Secret's labels are the cluster's, less the one that registers it.
        let mut own = secret.metadata.labels.clone().unwrap_or_default();
        own.remove(SECRET_LABEL);
        let cluster_labels = labels::check(&own)
            .map(|_| labels::with_name(own, &name))
            .map_err(|e| format!("{source}: {e}"));
        let invalid = |reason: String| Found {
            source: source.clone(),
            entry: Entry::Invalid { reason },
            kubeconfig: None,
            trust: Trust::Secret,
            labels: cluster_labels.clone(),
        };
        let entry = if !valid_name(&name) {
            invalid(format!("{source}: not a valid cluster name"))
        } else {
            match secret.data.as_ref().and_then(|d| d.get(SECRET_KEY)) {
                None => invalid(format!("{source}: no data key {SECRET_KEY:?}")),
                Some(bytes) => match parse(&bytes.0, Trust::Secret) {
                    Ok(kc) => Found {
                        source: source.clone(),
                        entry: Entry::Valid {
                            fingerprint: fingerprint(&bytes.0),
                        },
                        kubeconfig: Some(kc),
                        trust: Trust::Secret,
                        labels: cluster_labels.clone(),
                    },
                    Err(why) => invalid(format!("{source}: {why}")),
                },
            }
        };
        out.insert(name, entry);
    }
    out
}

/// Both sources together. A name defined by both is refused: which one is
/// meant cannot be guessed.
pub fn merge(
    files: BTreeMap<String, Found>,
    secrets: BTreeMap<String, Found>,
) -> BTreeMap<String, Found> {
    let mut out = files;
    for (name, from_secret) in secrets {
        match out.remove(&name) {
            None => {
                out.insert(name, from_secret);
            }
            Some(from_file) => {
                let reason = format!(
                    "cluster {name} is defined twice ({} and {}); remove one",
                    from_file.source, from_secret.source
                );
                out.insert(
                    name,
                    Found {
                        source: from_file.source,
                        entry: Entry::Invalid { reason },
                        kubeconfig: None,
                        trust: from_file.trust,
                        labels: from_file.labels,
                    },
                );
            }
        }
    }
    out
}

/// Parses a kubeconfig without echoing any of it: errors say what is wrong,
/// not what the file holds. Fields its source may not use make it invalid.
pub fn parse(bytes: &[u8], trust: Trust) -> Result<kube::config::Kubeconfig, String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "not UTF-8 text".to_string())?;
    let kc = kube::config::Kubeconfig::from_yaml(text)
        .map_err(|_| "not a valid kubeconfig (YAML did not parse as one)".to_string())?;
    if kc.clusters.is_empty() {
        return Err("kubeconfig names no cluster".into());
    }
    if kc.current_context.is_none() && kc.contexts.len() != 1 {
        return Err("kubeconfig has no current-context".into());
    }
    credentials::check(&kc, trust).map_err(|e| e.to_string())?;
    Ok(kc)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://127.0.0.1:1'}\nusers:\n- name: u\n  user: {token: s3cr3t-token}\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n";

    #[test]
    fn files_become_clusters_named_after_their_stem() {
        let dir = std::env::temp_dir().join(format!("flotilla-registry-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("member-1.yaml"), GOOD).unwrap();
        std::fs::write(dir.join("broken.yaml"), "clusters: [ {{{ s3cr3t-token").unwrap();
        std::fs::write(dir.join(".hidden.yaml"), GOOD).unwrap();
        std::fs::write(dir.join("Bad_Name.yaml"), GOOD).unwrap();
        let found = scan(&dir, false).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(matches!(found["member-1"].entry, Entry::Valid { .. }));
        for name in ["broken", "Bad_Name"] {
            match &found[name].entry {
                Entry::Invalid { reason } => {
                    assert!(!reason.contains("s3cr3t"), "secret leaked: {reason}")
                }
                other => panic!("{name}: {other:?}"),
            }
        }
        assert!(!found.contains_key(".hidden"));
    }

    #[test]
    fn a_changed_file_changes_its_fingerprint() {
        assert_ne!(
            fingerprint(GOOD.as_bytes()),
            fingerprint(GOOD.replace("x", "y").as_bytes())
        );
    }

    fn secret(name: &str, data: Option<&str>) -> Secret {
        let mut s = Secret::default();
        s.metadata.name = Some(name.into());
        s.metadata.namespace = Some("flotilla-system".into());
        s.data = data.map(|d| {
            [(
                SECRET_KEY.to_string(),
                k8s_openapi::ByteString(d.as_bytes().to_vec()),
            )]
            .into()
        });
        s
    }

    #[test]
    fn secrets_become_clusters_and_bad_ones_are_invalid_without_leaking() {
        let found = from_secrets(&[
            secret("member-4", Some(GOOD)),
            secret("member-5", Some("garbage s3cr3t-token {{")),
            secret("member-6", None),
        ]);
        assert!(matches!(found["member-4"].entry, Entry::Valid { .. }));
        assert_eq!(found["member-4"].source, "secret flotilla-system/member-4");
        for name in ["member-5", "member-6"] {
            match &found[name].entry {
                Entry::Invalid { reason } => assert!(!reason.contains("s3cr3t"), "{reason}"),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn a_secret_that_would_run_a_command_is_invalid_and_names_the_field() {
        let exec = GOOD.replace(
            "user: {token: s3cr3t-token}",
            "user: {exec: {apiVersion: client.authentication.k8s.io/v1, command: /bin/touch, args: [/tmp/s3cr3t]}}",
        );
        let found = from_secrets(&[secret("member-7", Some(&exec))]);
        match &found["member-7"].entry {
            Entry::Invalid { reason } => {
                assert!(reason.contains("exec is not allowed"), "{reason}");
                assert!(!reason.contains("s3cr3t"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_name_from_both_sources_is_refused() {
        let files = from_secrets(&[secret("member-1", Some(GOOD))]);
        let secrets = from_secrets(&[
            secret("member-1", Some(GOOD)),
            secret("member-2", Some(GOOD)),
        ]);
        let merged = merge(files, secrets);
        assert!(matches!(merged["member-1"].entry, Entry::Invalid { .. }));
        assert!(matches!(merged["member-2"].entry, Entry::Valid { .. }));
    }

    #[test]
    fn kubeconfig_without_clusters_is_refused() {
        assert!(parse(b"apiVersion: v1\nkind: Config\n", Trust::Secret).is_err());
    }
}
