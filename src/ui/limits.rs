//! Shares of the dashboard per client: open event streams per session (or
//! token, or peer address on an open page), and failed sign-ins per peer
//! address, so one client can neither take every stream slot nor guess
//! tokens at network speed.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Open streams per client key.
#[derive(Debug)]
pub struct ClientStreams {
    per_client: usize,
    open: Mutex<HashMap<String, usize>>,
}

/// One stream's place in its client's share; freed on drop.
#[derive(Debug)]
pub struct ClientSlot {
    owner: Arc<ClientStreams>,
    key: String,
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut open = self.owner.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.key);
            }
        }
    }
}

impl ClientStreams {
    pub fn new(per_client: usize) -> Arc<Self> {
        Arc::new(ClientStreams {
            per_client,
            open: Mutex::new(HashMap::new()),
        })
    }

    /// A slot for `key`, or none when that client holds its share.
    pub fn open(self: &Arc<Self>, key: &str) -> Option<ClientSlot> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let n = open.entry(key.to_string()).or_insert(0);
        if *n >= self.per_client {
            return None;
        }
        *n += 1;
        Some(ClientSlot {
            owner: self.clone(),
            key: key.to_string(),
        })
    }

    /// Clients holding a stream now (their entries go with their last slot).
    pub fn clients(&self) -> usize {
        self.open.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

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
    fn a_client_holds_at_most_its_share_and_a_closed_stream_frees_it() {
        let s = ClientStreams::new(2);
        let a = s.open("session-a").unwrap();
        let _b = s.open("session-a").unwrap();
        assert!(s.open("session-a").is_none(), "a third for one client");
        let _c = s.open("session-b").expect("another client is not affected");
        drop(a);
        assert!(s.open("session-a").is_some());
        assert_eq!(s.clients(), 2);
    }

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
