//! Cluster labels, from the registration: a Secret's own labels, or for a
//! kubeconfig file `NAME.yaml` the side file `NAME.labels` (a YAML map of
//! strings). Every cluster also carries its own name, so that a selector
//! can name clusters without any setup. Pure but for reading the file.

use std::collections::BTreeMap;
use std::path::Path;

use crate::domain::names::CLUSTER_NAME_LABEL;

pub type Labels = BTreeMap<String, String>;

/// The side file's extension; `scan` never takes these for kubeconfigs.
pub const SIDE_FILE_EXTENSION: &str = "labels";

/// The labels of the cluster registered by `kubeconfig` (a file path):
/// none when there is no side file, an error naming the file when it
/// cannot be used.
pub fn from_side_file(kubeconfig: &Path, cluster: &str) -> Result<Labels, String> {
    let path = kubeconfig.with_extension(SIDE_FILE_EXTENSION);
    let file = path
        .file_name()
        .and_then(|f| f.to_str())
        .unwrap_or_default()
        .to_string();
    match std::fs::read(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(with_name(Labels::new(), cluster)),
        Err(e) => Err(format!("labels file {file}: unreadable ({})", e.kind())),
        Ok(bytes) => parse(&bytes)
            .map(|l| with_name(l, cluster))
            .map_err(|e| format!("labels file {file}: {e}")),
    }
}

/// A YAML map of label keys to values; empty text means no labels.
pub fn parse(bytes: &[u8]) -> Result<Labels, String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "not UTF-8 text".to_string())?;
    if text.trim().is_empty() {
        return Ok(Labels::new());
    }
    let map: Labels = serde_yaml::from_str(text)
        .map_err(|_| "not a YAML map of strings to strings".to_string())?;
    check(&map)?;
    Ok(map)
}

/// Kubernetes' rules for label keys and values.
pub fn check(labels: &Labels) -> Result<(), String> {
    for (k, v) in labels {
        let (prefix, name) = match k.split_once('/') {
            Some((p, n)) => (Some(p), n),
            None => (None, k.as_str()),
        };
        let prefix_ok = prefix.is_none_or(|p| {
            !p.is_empty()
                && p.len() <= 253
                && p.split('.').all(|part| {
                    !part.is_empty()
                        && part
                            .bytes()
                            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                })
        });
        if !prefix_ok || !is_label_name(name, false) {
            return Err(format!("{k:?} is not a valid label key"));
        }
        if !is_label_name(v, true) {
            return Err(format!("the value of {k:?} is not a valid label value"));
        }
    }
    Ok(())
}

fn is_label_name(s: &str, may_be_empty: bool) -> bool {
    if s.is_empty() {
        return may_be_empty;
    }
    let b = s.as_bytes();
    b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// The registration's labels plus the cluster's own name, which wins.
pub fn with_name(mut labels: Labels, cluster: &str) -> Labels {
    labels.insert(CLUSTER_NAME_LABEL.to_string(), cluster.to_string());
    labels
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_side_file_gives_labels_and_the_name_is_always_there() {
        let dir = std::env::temp_dir().join(format!("flotilla-labels-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let kc = dir.join("member-1.yaml");
        assert_eq!(
            from_side_file(&kc, "member-1").unwrap(),
            with_name(Labels::new(), "member-1")
        );
        std::fs::write(
            dir.join("member-1.labels"),
            "ring: canary\nregion: eu-west\n",
        )
        .unwrap();
        let l = from_side_file(&kc, "member-1").unwrap();
        assert_eq!(l["ring"], "canary");
        assert_eq!(l[CLUSTER_NAME_LABEL], "member-1");
        std::fs::write(dir.join("member-1.labels"), "ring: [not, a, string]\n").unwrap();
        let e = from_side_file(&kc, "member-1").unwrap_err();
        assert!(e.contains("member-1.labels"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn keys_and_values_follow_kubernetes_rules() {
        let ok = |k: &str, v: &str| check(&Labels::from([(k.to_string(), v.to_string())])).is_ok();
        assert!(ok("ring", "canary"));
        assert!(ok("example.com/tier", "1"));
        assert!(ok("empty", ""));
        assert!(!ok("bad key", "x"));
        assert!(!ok("/x", "x"));
        assert!(!ok("Ex.com/x", "x"));
        assert!(!ok("x", "-dash"));
        assert!(!ok("x", &"v".repeat(64)));
    }
}
