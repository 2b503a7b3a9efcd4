//! A loopback TCP proxy that can hold requests: while held, bytes from
//! the client wait in the proxy (nothing fails, nothing is answered) and
//! go on, in order, once released. Silenced, it holds the server's bytes
//! too, so a watch open before delivers nothing: a member gone silent.
#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub struct Gate {
    pub port: u16,
    held: Arc<AtomicBool>,
    /// The server's bytes wait too.
    silent: Arc<AtomicBool>,
    /// Bytes that arrived from a client while held.
    waiting: Arc<AtomicUsize>,
    /// Hold as soon as an etcd write (a Txn with compares) passes.
    armed: Arc<AtomicBool>,
}

impl Gate {
    pub async fn start(upstream: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let held = Arc::new(AtomicBool::new(false));
        let silent = Arc::new(AtomicBool::new(false));
        let waiting = Arc::new(AtomicUsize::new(0));
        let armed = Arc::new(AtomicBool::new(false));
        let (h, s, w, a) = (held.clone(), silent.clone(), waiting.clone(), armed.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                let gate = Held {
                    held: h.clone(),
                    waiting: w.clone(),
                    armed: a.clone(),
                    frames: Some(Frames::default()),
                };
                let back = Held {
                    held: s.clone(),
                    waiting: Arc::new(AtomicUsize::new(0)),
                    armed: Arc::new(AtomicBool::new(false)),
                    frames: None,
                };
                tokio::spawn(pump(cr, sw, Some(gate)));
                tokio::spawn(pump(sr, cw, Some(back)));
            }
        });
        Gate {
            port,
            held,
            silent,
            waiting,
            armed,
        }
    }

    /// Holds the next etcd write, and everything after it, until `release`.
    pub fn hold_next_write(&self) {
        self.waiting.store(0, Ordering::SeqCst);
        self.armed.store(true, Ordering::SeqCst);
    }

    pub fn holding(&self) -> bool {
        self.held.load(Ordering::SeqCst)
    }

    pub fn hold(&self) {
        self.waiting.store(0, Ordering::SeqCst);
        self.held.store(true, Ordering::SeqCst);
    }

    /// Holds both ways: nothing reaches the server, and nothing it sends,
    /// a watch event included, reaches the client.
    pub fn silence(&self) {
        self.silent.store(true, Ordering::SeqCst);
        self.hold();
    }

    pub fn release(&self) {
        self.armed.store(false, Ordering::SeqCst);
        self.held.store(false, Ordering::SeqCst);
        self.silent.store(false, Ordering::SeqCst);
    }

    /// Bytes a client sent since `hold`.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }
}

struct Held {
    held: Arc<AtomicBool>,
    waiting: Arc<AtomicUsize>,
    armed: Arc<AtomicBool>,
    /// Read for etcd writes on the client's side only.
    frames: Option<Frames>,
}

/// Reads HTTP/2 frames off a client's bytes, enough to see gRPC requests.
#[derive(Default)]
struct Frames {
    preface_done: bool,
    buf: Vec<u8>,
}

impl Frames {
    /// Whether these bytes complete a DATA frame carrying an etcd
    /// TxnRequest with compares: a conditional write. Its first field is
    /// `compare` (tag 0x0a), whose message starts with `result` (0x08) or,
    /// for EQUAL, `target` (0x10); the reads are Txns without compares,
    /// and a Range starts with its key.
    fn write_in(&mut self, chunk: &[u8]) -> bool {
        const PREFACE: usize = 24;
        self.buf.extend_from_slice(chunk);
        if !self.preface_done {
            if self.buf.len() < PREFACE {
                return false;
            }
            self.buf.drain(..PREFACE);
            self.preface_done = true;
        }
        let mut found = false;
        while self.buf.len() >= 9 {
            let len = u32::from_be_bytes([0, self.buf[0], self.buf[1], self.buf[2]]) as usize;
            if self.buf.len() < 9 + len {
                break;
            }
            let (kind, flags) = (self.buf[3], self.buf[4]);
            let mut payload = &self.buf[9..9 + len];
            if flags & 0x8 != 0 && !payload.is_empty() {
                payload = &payload[1..];
            }
            // DATA: 5 bytes of gRPC framing, then the message.
            if kind == 0 && payload.len() > 8 && payload[5] == 0x0a {
                let mut i = 6;
                while i < payload.len() && payload[i] & 0x80 != 0 {
                    i += 1;
                }
                found |= matches!(payload.get(i + 1), Some(0x08 | 0x10));
            }
            self.buf.drain(..9 + len);
        }
        found
    }
}

/// Copies `from` to `to`; with a gate, a chunk read while held waits.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut gate: Option<Held>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if let Some(g) = &mut gate {
            if g.frames.as_mut().is_some_and(|f| f.write_in(&buf[..n]))
                && g.armed.swap(false, Ordering::SeqCst)
            {
                g.held.store(true, Ordering::SeqCst);
            }
            if g.held.load(Ordering::SeqCst) {
                g.waiting.fetch_add(n, Ordering::SeqCst);
                while g.held.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
