//! A loopback TCP proxy in front of a member's apiserver that can become a
//! black hole: while holed it accepts connections and moves no byte either
//! way, as a partitioned network does. Open again, it cuts every connection
//! the hole held, and what they held is lost: as after a partition long
//! enough that both ends gave up. Delivering it instead would hand the
//! apiserver writes its leader sent inside its term, late (seen in CI), and
//! no fence at the client can stop the network from doing that.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct Proxy {
    pub port: u16,
    holed: watch::Sender<bool>,
    /// How many holes there have been: a connection older than one is cut.
    holes: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub async fn start(upstream: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let (holed, rx) = watch::channel(false);
        let holes = Arc::new(AtomicU64::new(0));
        let upstream = Arc::new(upstream);
        let counted = holes.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (rx, upstream, holes) = (rx.clone(), upstream.clone(), counted.clone());
                // One accepted inside a hole is held by it like the others.
                let born = if *rx.borrow() {
                    u64::MAX
                } else {
                    holes.load(Ordering::SeqCst)
                };
                tokio::spawn(async move {
                    open(rx.clone()).await;
                    if holes.load(Ordering::SeqCst) != born {
                        return;
                    }
                    let Ok(server) = TcpStream::connect(upstream.as_str()).await else {
                        return;
                    };
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    let link = Link { rx, holes, born };
                    tokio::spawn(pump(cr, sw, link.clone()));
                    tokio::spawn(pump(sr, cw, link));
                });
            }
        });
        Proxy {
            port,
            holed,
            holes,
            task,
        }
    }

    pub fn hole(&self, on: bool) {
        if on && !*self.holed.borrow() {
            self.holes.fetch_add(1, Ordering::SeqCst);
        }
        self.holed.send_replace(on);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn open(mut rx: watch::Receiver<bool>) {
    // The sender lives as long as the proxy; once it is gone, nothing waits.
    let _ = rx.wait_for(|holed| !holed).await;
}

/// One connection's view of the proxy: the hole, and how many holes there
/// had been when it was made.
#[derive(Clone)]
struct Link {
    rx: watch::Receiver<bool>,
    holes: Arc<AtomicU64>,
    born: u64,
}

impl Link {
    /// Waits for the hole to close; false once a hole has come since the
    /// connection was made (it is then cut).
    async fn alive(&self) -> bool {
        open(self.rx.clone()).await;
        self.holes.load(Ordering::SeqCst) == self.born
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    link: Link,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if !link.alive().await {
            break;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        // Bytes read just before the hole opened are lost with it.
        if !link.alive().await || to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

/// What a hole held is lost when it heals, and the connection with it; a
/// connection made after works.
#[tokio::test]
async fn a_healed_hole_cuts_what_it_held() {
    use std::time::Duration;
    let upstream = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = upstream.local_addr().expect("addr").to_string();
    let proxy = Proxy::start(addr).await;
    let (got_tx, mut got) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = upstream.accept().await {
            let got_tx = got_tx.clone();
            tokio::spawn(async move {
                let mut all = Vec::new();
                let _ = s.read_to_end(&mut all).await;
                let _ = got_tx.send(all);
            });
        }
    });
    let limit = Duration::from_secs(5);
    let mut old = TcpStream::connect(("127.0.0.1", proxy.port))
        .await
        .expect("connect");
    old.write_all(b"before ").await.expect("write");
    tokio::time::sleep(Duration::from_millis(200)).await;
    proxy.hole(true);
    old.write_all(b"held").await.expect("write");
    tokio::time::sleep(Duration::from_millis(200)).await;
    proxy.hole(false);
    let first = tokio::time::timeout(limit, got.recv())
        .await
        .expect("cut")
        .expect("bytes");
    assert_eq!(first, b"before ", "what the hole held never arrives");
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(limit, old.read_to_end(&mut rest)).await;
    assert!(closed.is_ok(), "the held connection is closed");
    let mut new = TcpStream::connect(("127.0.0.1", proxy.port))
        .await
        .expect("connect");
    new.write_all(b"after").await.expect("write");
    new.shutdown().await.expect("shutdown");
    let after = tokio::time::timeout(limit, got.recv())
        .await
        .expect("open")
        .expect("bytes");
    assert_eq!(after, b"after");
}
