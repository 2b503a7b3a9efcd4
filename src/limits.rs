//! Process limits a fleet replica needs. A replica holds two connections
//! to every member (its Lease client and its member client), so a thousand
//! members need more descriptors than the soft limit of 1024 that many
//! container runtimes still start processes with.

use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};

/// The kernel's default `fs.nr_open`: a soft limit cannot be set above it,
/// so an unlimited hard limit is read as this.
const NR_OPEN_DEFAULT: u64 = 1 << 20;

/// The soft and hard open-files limits, `None` meaning unlimited.
pub fn open_files() -> (Option<u64>, Option<u64>) {
    let l = getrlimit(Resource::Nofile);
    (l.current, l.maximum)
}

/// Raises the soft open-files limit to the hard one, as Go programs do at
/// start-up. Returns the soft limit before and after.
pub fn raise_open_files() -> Result<(Option<u64>, Option<u64>), String> {
    let (soft, hard) = open_files();
    let target = Some(hard.unwrap_or(NR_OPEN_DEFAULT));
    if soft.is_none() || soft >= target {
        return Ok((soft, soft));
    }
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: target,
            maximum: hard,
        },
    )
    .map_err(|e| format!("cannot raise the open-files limit from {soft:?} to {target:?}: {e}"))?;
    Ok((soft, target))
}
