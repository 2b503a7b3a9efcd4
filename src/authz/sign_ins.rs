//! Refused sign-ins per peer address: the dashboard's sign-in and the
//! token reviews both throttle a peer that keeps failing.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// Failed sign-ins per peer address in a window.
#[derive(Debug)]
pub struct SignIns {
    max_failures: u32,
    window: Duration,
    /// Bounded: a full table forgets windows that have passed, then all.
    capacity: usize,
    failures: HashMap<IpAddr, (u32, Instant)>,
}

impl SignIns {
    pub fn new(max_failures: u32, window: Duration, capacity: usize) -> Self {
        SignIns {
            max_failures,
            window,
            capacity,
            failures: HashMap::new(),
        }
    }

    /// How long `peer` must wait before trying again, if at all.
    pub fn wait(&self, peer: IpAddr, now: Instant) -> Option<Duration> {
        let (n, since) = self.failures.get(&peer)?;
        let ends = *since + self.window;
        (*n >= self.max_failures && ends > now).then(|| ends - now)
    }

    pub fn failed(&mut self, peer: IpAddr, now: Instant) {
        if self.failures.len() >= self.capacity && !self.failures.contains_key(&peer) {
            let window = self.window;
            self.failures.retain(|_, (_, since)| *since + window > now);
            if self.failures.len() >= self.capacity {
                self.failures.clear();
            }
        }
        let e = self.failures.entry(peer).or_insert((0, now));
        if e.1 + self.window <= now {
            *e = (0, now);
        }
        e.0 += 1;
    }

    pub fn succeeded(&mut self, peer: IpAddr) {
        self.failures.remove(&peer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_failures_make_a_peer_wait_and_the_table_stays_bounded() {
        let t0 = Instant::now();
        let mut s = SignIns::new(3, Duration::from_secs(60), 4);
        let peer: IpAddr = "127.0.0.9".parse().unwrap();
        for _ in 0..2 {
            s.failed(peer, t0);
        }
        assert_eq!(s.wait(peer, t0), None);
        s.failed(peer, t0);
        assert_eq!(
            s.wait(peer, t0 + Duration::from_secs(10)),
            Some(Duration::from_secs(50))
        );
        assert_eq!(s.wait(peer, t0 + Duration::from_secs(60)), None);
        // Another peer is not affected; success clears.
        assert_eq!(s.wait("127.0.0.8".parse().unwrap(), t0), None);
        s.succeeded(peer);
        assert_eq!(s.wait(peer, t0), None);
        for i in 0..100u8 {
            s.failed(IpAddr::from([10, 0, 0, i]), t0);
        }
        assert!(s.failures.len() <= 4);
    }
}
