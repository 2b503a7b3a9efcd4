//! A loopback TCP proxy in front of a member's apiserver that can become a
//! black hole: while holed it accepts connections and moves no byte either
//! way, as a partitioned network does. Open again, it cuts every connection
//! the hole held, and what they held is lost: as after a partition long
//! enough that both ends gave up.
//!
//! A partition can also end the other way (`late`): the hole takes what
//! the operator sends, and when it heals delivers it, each byte as long
//! after it left as the first held one, in order, then closes the
//! connection. A write then lands after its writer's term may have ended,
//! and maybe after the writer gave up on it: no fence at a client can stop
//! the network from doing that. Every connection reaches the apiserver
//! from an address of its own in 127.1.0.0/16, which the audit log records
//! as the source, so `Delivery` says exactly which writes came late, and by
//! how much.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;

/// A connection's held bytes, delivered late: every request the apiserver
/// received from `source` since `healed` left its writer `lag` earlier.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub source: String,
    pub healed: Timestamp,
    pub lag: Duration,
}

pub struct Proxy {
    pub port: u16,
    holed: watch::Sender<bool>,
    late: watch::Sender<bool>,
    /// How many holes there have been: a connection older than one is cut.
    holes: Arc<AtomicU64>,
    deliveries: Arc<Mutex<Vec<Delivery>>>,
    task: tokio::task::JoinHandle<()>,
}

/// How long a late connection stays open after its replay, so the
/// apiserver finishes what it was handed before the connection goes.
const AFTER_REPLAY: Duration = Duration::from_secs(3);

/// Each upstream connection's own source address.
fn next_source() -> std::net::SocketAddr {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let [_, a, b, c] = n.to_be_bytes();
    ([127, 1u8.wrapping_add(a), b, c], 0).into()
}

async fn connect(upstream: &str) -> Option<(TcpStream, String)> {
    let to: std::net::SocketAddr = upstream.parse().ok()?;
    let socket = TcpSocket::new_v4().ok()?;
    let from = next_source();
    socket.bind(from).ok()?;
    let stream = socket.connect(to).await.ok()?;
    Some((stream, from.ip().to_string()))
}

impl Proxy {
    pub async fn start(upstream: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let (holed, rx) = watch::channel(false);
        let (late, late_rx) = watch::channel(false);
        let holes = Arc::new(AtomicU64::new(0));
        let deliveries: Arc<Mutex<Vec<Delivery>>> = Default::default();
        let upstream = Arc::new(upstream);
        let (counted, log) = (holes.clone(), deliveries.clone());
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (rx, upstream, holes) = (rx.clone(), upstream.clone(), counted.clone());
                let (late, log) = (late_rx.clone(), log.clone());
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
                    let Some((server, source)) = connect(upstream.as_str()).await else {
                        return;
                    };
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    let link = Link { rx, holes, born };
                    let up = Up {
                        late: late.clone(),
                        source,
                        log,
                    };
                    tokio::spawn(pump_up(cr, sw, link.clone(), up));
                    tokio::spawn(pump(sr, cw, link, late));
                });
            }
        });
        Proxy {
            port,
            holed,
            late,
            holes,
            deliveries,
            task,
        }
    }

    pub fn hole(&self, on: bool) {
        if on && !*self.holed.borrow() {
            self.holes.fetch_add(1, Ordering::SeqCst);
        }
        self.holed.send_replace(on);
    }

    /// Holds every byte from now on (`true`), to be delivered late when
    /// this is called with `false`.
    pub fn late(&self, on: bool) {
        self.late.send_replace(on);
    }

    /// Every late delivery so far.
    pub fn deliveries(&self) -> Vec<Delivery> {
        self.deliveries.lock().unwrap().clone()
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

/// The operator's side of a connection: what late delivery needs.
struct Up {
    late: watch::Receiver<bool>,
    source: String,
    log: Arc<Mutex<Vec<Delivery>>>,
}

/// The apiserver's answers: held while late (a partition moves nothing).
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    link: Link,
    late: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let _ = late.clone().wait_for(|l| !l).await;
        if !link.alive().await {
            break;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        // Bytes read just before the hole opened are lost with it.
        let _ = late.clone().wait_for(|l| !l).await;
        if !link.alive().await || to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

/// The operator's bytes: on time, lost to a hole, or held while late and
/// then replayed late, after which the connection closes.
async fn pump_up(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, link: Link, mut up: Up) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if *up.late.borrow() {
            hold_then_replay(Vec::new(), &mut from, &mut to, &mut up).await;
            break;
        }
        if !link.alive().await {
            break;
        }
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            },
            _ = up.late.wait_for(|l| *l) => continue,
        };
        if *up.late.borrow() {
            // Read as the fault began: it is held with the rest.
            let first = (Instant::now(), buf[..n].to_vec());
            hold_then_replay(vec![first], &mut from, &mut to, &mut up).await;
            break;
        }
        // Bytes read just before the hole opened are lost with it.
        if !link.alive().await || to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

/// Holds what the operator sends (after `held`, already taken) until the
/// fault ends, then replays it.
async fn hold_then_replay(
    mut held: Vec<(Instant, Vec<u8>)>,
    from: &mut OwnedReadHalf,
    to: &mut OwnedWriteHalf,
    up: &mut Up,
) {
    hold(from, up, &mut held).await;
    replay(held, to, up).await;
}

/// Takes what the operator sends, with when, until the fault ends (also
/// after the operator closed: what it sent is still on its way).
async fn hold(from: &mut OwnedReadHalf, up: &mut Up, held: &mut Vec<(Instant, Vec<u8>)>) {
    let mut buf = vec![0u8; 16 * 1024];
    let mut closed = false;
    loop {
        tokio::select! {
            read = from.read(&mut buf), if !closed => match read {
                Ok(0) | Err(_) => closed = true,
                Ok(n) => held.push((Instant::now(), buf[..n].to_vec())),
            },
            _ = up.late.wait_for(|l| !l) => return,
        }
    }
}

/// Delivers what was held, each chunk as long after it left as the first
/// one, records that, and closes a moment later.
async fn replay(held: Vec<(Instant, Vec<u8>)>, to: &mut OwnedWriteHalf, up: &Up) {
    if let Some((first, _)) = held.first() {
        let lag = first.elapsed();
        up.log.lock().unwrap().push(Delivery {
            source: up.source.clone(),
            healed: Timestamp::now(),
            lag,
        });
        for (at, bytes) in held {
            tokio::time::sleep_until(at + lag).await;
            if to.write_all(&bytes).await.is_err() {
                return;
            }
        }
    }
    tokio::time::sleep(AFTER_REPLAY).await;
}

/// When a write from `source` received at `received` left its writer:
/// earlier by its lag if a late delivery brought it.
pub fn sent_at(deliveries: &[Delivery], source: &str, received: Timestamp) -> Timestamp {
    deliveries
        .iter()
        .filter(|d| d.source == source && d.healed <= received)
        .max_by_key(|d| d.healed)
        .and_then(|d| {
            let lag = jiff::SignedDuration::try_from(d.lag).ok()?;
            received.checked_sub(lag).ok()
        })
        .unwrap_or(received)
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

/// Bytes sent while late are held, then delivered as long after they left
/// as the first held one, in order, from the connection's own address,
/// which `deliveries` names; the connection then closes, and a new one is
/// on time.
#[tokio::test]
async fn late_writes_arrive_late_from_their_own_address() {
    let upstream = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = upstream.local_addr().expect("addr").to_string();
    let proxy = Proxy::start(addr).await;
    let (got_tx, mut got) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut s, from)) = upstream.accept().await {
            let got_tx = got_tx.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 64];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    let at = std::time::Instant::now();
                    let _ = got_tx.send((from.ip().to_string(), buf[..n].to_vec(), at));
                }
            });
        }
    });
    let limit = Duration::from_secs(5);
    let mut c = TcpStream::connect(("127.0.0.1", proxy.port))
        .await
        .expect("connect");
    c.write_all(b"before").await.expect("write");
    let (source, bytes, _) = tokio::time::timeout(limit, got.recv())
        .await
        .expect("on time")
        .expect("bytes");
    assert_eq!(bytes, b"before");
    assert_ne!(source, "127.0.0.1", "each connection has its own address");
    proxy.late(true);
    let sent = std::time::Instant::now();
    c.write_all(b"one").await.expect("write");
    tokio::time::sleep(Duration::from_millis(300)).await;
    c.write_all(b"two").await.expect("write");
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(got.try_recv().is_err(), "nothing moves while late");
    proxy.late(false);
    let (_, one, at_one) = tokio::time::timeout(limit, got.recv())
        .await
        .expect("delivered")
        .expect("bytes");
    let (_, two, at_two) = tokio::time::timeout(limit, got.recv())
        .await
        .expect("delivered")
        .expect("bytes");
    assert_eq!(
        (one.as_slice(), two.as_slice()),
        (b"one".as_slice(), b"two".as_slice())
    );
    assert!(at_one.duration_since(sent) >= Duration::from_millis(700));
    assert!(
        at_two.duration_since(at_one) >= Duration::from_millis(250),
        "spacing kept: {:?}",
        at_two.duration_since(at_one)
    );
    let d = proxy.deliveries();
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(d[0].source, source);
    assert!(d[0].lag >= Duration::from_millis(700), "{d:?}");
    let later = d[0].healed + jiff::SignedDuration::from_millis(50);
    let lag = jiff::SignedDuration::try_from(d[0].lag).unwrap();
    assert_eq!(sent_at(&d, &source, later), later - lag);
    assert_eq!(
        sent_at(&d, "127.0.0.9", later),
        later,
        "another connection was on time"
    );
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(limit, c.read_to_end(&mut rest)).await;
    assert!(
        closed.is_ok(),
        "the late connection closes after its replay"
    );
    let mut d2 = TcpStream::connect(("127.0.0.1", proxy.port))
        .await
        .expect("connect");
    d2.write_all(b"after").await.expect("write");
    let (_, bytes, _) = tokio::time::timeout(limit, got.recv())
        .await
        .expect("on time")
        .expect("bytes");
    assert_eq!(bytes, b"after");
}
