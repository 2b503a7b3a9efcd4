//! Stable digests: the same bytes give the same number on every build and
//! platform, so a digest written by one replica is read by another; and
//! SHA-256, which tokens are kept and compared as.

use crate::crd::MicroserviceSpec;

/// A stable digest of a spec, to tell whether a member object still holds
/// exactly what was written (FNV-1a over its JSON; field order is fixed).
pub fn digest(spec: &MicroserviceSpec) -> u64 {
    digest_bytes(&serde_json::to_vec(spec).unwrap_or_default())
}

/// FNV-1a: stable across builds and platforms, unlike `DefaultHasher`.
pub fn digest_bytes(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// SHA-256 of a token. Comparing digests of equal length in constant time
/// reveals neither a prefix nor the token's length.
pub type Digest = [u8; 32];

pub fn sha256(bytes: &[u8]) -> Digest {
    let d = ring::digest::digest(&ring::digest::SHA256, bytes);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}
