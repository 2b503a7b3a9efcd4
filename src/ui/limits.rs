//! Shares of the dashboard per client: open event streams per session (or
//! token, or peer address on an open page), so one client cannot take
//! every stream slot. Failed sign-ins are `authz::sign_ins`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

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
}
