//! What the CRD schema cannot fully express, checked before any write.

use super::DomainError;
use super::image;
use crate::crd::MicroserviceSpec;

pub const MAX_REPLICAS: i32 = 1000;

/// Checks a spec (and the name, which names the Service) for what would make
/// invalid children. The schema catches most of this on admission; this is
/// the last word, and it holds even against an older CRD.
pub fn validate(name: &str, spec: &MicroserviceSpec) -> Result<(), DomainError> {
    if !is_dns1035_label(name) {
        return Err(DomainError::InvalidSpec(format!(
            "name {name:?} must be a DNS-1035 label (at most 63 lowercase letters, digits or '-', starting with a letter), because it names the Service"
        )));
    }
    image::parse(&spec.image)
        .map_err(|e| DomainError::InvalidSpec(format!("image {:?}: {e}", spec.image)))?;
    if !(1..=65535).contains(&spec.port) {
        return Err(DomainError::InvalidSpec(format!(
            "port {} is outside 1-65535",
            spec.port
        )));
    }
    if !(0..=MAX_REPLICAS).contains(&spec.replicas) {
        return Err(DomainError::InvalidSpec(format!(
            "replicas {} is outside 0-{MAX_REPLICAS}",
            spec.replicas
        )));
    }
    let mut seen = std::collections::BTreeSet::new();
    for e in &spec.env {
        if PLATFORM_ENV.contains(&e.name.as_str()) {
            return Err(DomainError::InvalidSpec(format!(
                "env {:?} is set by the platform and cannot be overridden",
                e.name
            )));
        }
        if !seen.insert(e.name.as_str()) {
            return Err(DomainError::InvalidSpec(format!(
                "env {:?} is listed twice",
                e.name
            )));
        }
    }
    Ok(())
}

/// The variables the platform sets on every container.
pub const PLATFORM_ENV: [&str; 4] = [
    "ASPNETCORE_URLS",
    "OTEL_SERVICE_NAME",
    "OTEL_SERVICE_VERSION",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];

fn is_dns1035_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_lowercase()
        && b.iter()
            .all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        && b[b.len() - 1] != b'-'
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(image: &str, port: i32, replicas: i32) -> MicroserviceSpec {
        MicroserviceSpec {
            image: image.into(),
            port,
            replicas,
            env: Vec::new(),
        }
    }

    fn with_env(names: &[&str]) -> MicroserviceSpec {
        MicroserviceSpec {
            env: names
                .iter()
                .map(|n| crate::crd::EnvEntry {
                    name: n.to_string(),
                    value: "v".into(),
                })
                .collect(),
            ..spec("app:1", 80, 1)
        }
    }

    #[test]
    fn env_may_not_override_the_platform_or_repeat() {
        assert!(validate("a", &with_env(&["LOG_LEVEL", "REGION"])).is_ok());
        let e = validate("a", &with_env(&["OTEL_SERVICE_NAME"])).unwrap_err();
        assert!(e.to_string().contains("set by the platform"), "{e}");
        let e = validate("a", &with_env(&["A", "A"])).unwrap_err();
        assert!(e.to_string().contains("twice"), "{e}");
    }

    #[test]
    fn port_edges() {
        assert!(validate("a", &spec("app:1", 1, 2)).is_ok());
        assert!(validate("a", &spec("app:1", 65535, 2)).is_ok());
        assert!(validate("a", &spec("app:1", 0, 2)).is_err());
        assert!(validate("a", &spec("app:1", 65536, 2)).is_err());
        assert!(validate("a", &spec("app:1", -1, 2)).is_err());
    }

    #[test]
    fn replica_edges() {
        assert!(validate("a", &spec("app:1", 80, 0)).is_ok());
        assert!(validate("a", &spec("app:1", 80, 1000)).is_ok());
        assert!(validate("a", &spec("app:1", 80, 1001)).is_err());
        assert!(validate("a", &spec("app:1", 80, -1)).is_err());
    }

    #[test]
    fn names_that_cannot_name_a_service() {
        for bad in ["", "1api", "api-", "my.api", "Api", &"a".repeat(64)] {
            assert!(validate(bad, &spec("app:1", 80, 1)).is_err(), "{bad:?}");
        }
        assert!(validate(&"a".repeat(63), &spec("app:1", 80, 1)).is_ok());
    }

    #[test]
    fn image_errors_name_the_image() {
        let e = validate("a", &spec("App:1", 80, 1)).unwrap_err();
        assert!(e.to_string().contains("\"App:1\""), "{e}");
    }
}
