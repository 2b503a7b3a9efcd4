//! Every listening port (gRPC, dashboard) accepts through here, so nobody
//! holds a replica's memory or a worker thread before authenticating: open
//! connections and TLS handshakes in flight are capped (more wait in the
//! kernel's backlog), a handshake and the first request have deadlines, a
//! connection with no bytes either way for the idle limit is closed, and
//! accept errors back off instead of spinning.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::time::{Instant, Sleep};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use super::tls::Rotating;
use crate::telemetry::metrics::METRICS;

#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    /// Open connections at once; further clients wait in the backlog.
    pub max_connections: usize,
    /// TLS handshakes in flight at once.
    pub max_handshakes: usize,
    pub handshake: Duration,
    /// From accept (or the end of the handshake) to the first byte read.
    pub first_byte: Duration,
    /// No byte read or written for this long closes the connection. Keep
    /// it above every keep-alive the server sends (SSE 15 s, h2 pings 30 s).
    pub idle: Duration,
    /// The kernel's send buffer per connection, when set. Linux grows it to
    /// 4 MiB for a client that does not read, charged to the pod's memory;
    /// the dashboard caps it, so a stalled browser is found stalled (and
    /// cut) after kilobytes, not megabytes.
    pub send_buffer: Option<usize>,
}

impl Default for ConnLimits {
    fn default() -> Self {
        ConnLimits {
            max_connections: 1024,
            max_handshakes: 64,
            handshake: Duration::from_secs(10),
            first_byte: Duration::from_secs(10),
            idle: Duration::from_secs(60),
            send_buffer: None,
        }
    }
}

/// Plain TCP or TLS over it.
pub enum Io {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

/// One accepted connection: its place under the cap, and its deadline.
pub struct Conn {
    io: Io,
    pub peer: SocketAddr,
    local: SocketAddr,
    port: &'static str,
    deadline: Pin<Box<Sleep>>,
    idle: Duration,
    heard: bool,
    /// The last byte either way once heard. The timer is moved only when
    /// it fires, not on every read and write (the gRPC hot path).
    active_at: Instant,
    _permit: OwnedSemaphorePermit,
}

impl Conn {
    fn new(
        io: Io,
        peer: SocketAddr,
        local: SocketAddr,
        permit: OwnedSemaphorePermit,
        port: &'static str,
        limits: &ConnLimits,
    ) -> Self {
        Conn {
            io,
            peer,
            local,
            port,
            deadline: Box::pin(tokio::time::sleep(limits.first_byte)),
            idle: limits.idle,
            heard: false,
            active_at: Instant::now(),
            _permit: permit,
        }
    }

    fn progress(&mut self, read: bool) {
        self.heard |= read;
        // Until the client has said something, writing does not extend it.
        if self.heard {
            self.active_at = Instant::now();
        }
    }

    /// Pending, or an error once the deadline passed.
    fn expired<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        loop {
            if self.deadline.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            // Fired: a connection active since has until its idle limit.
            let until = self.active_at + self.idle;
            if !self.heard || until <= Instant::now() {
                break;
            }
            self.deadline.as_mut().reset(until);
        }
        let reason = if self.heard { "idle" } else { "silent" };
        METRICS.connections_cut_total.inc(&[self.port, reason]);
        Poll::Ready(Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("connection {reason} past its limit"),
        )))
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = match &mut self.io {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        };
        match polled {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    self.progress(true);
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => self.expired(cx),
            other => other,
        }
    }
}

impl Conn {
    /// A write's outcome, counted as progress, or the deadline's.
    fn wrote(
        &mut self,
        polled: Poll<io::Result<usize>>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<usize>> {
        match polled {
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    self.progress(false);
                }
                Poll::Ready(Ok(n))
            }
            Poll::Pending => self.expired(cx),
            other => other,
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = match &mut self.io {
            Io::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        };
        self.wrote(polled, cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = match &mut self.io {
            Io::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        };
        self.wrote(polled, cx)
    }

    fn is_write_vectored(&self) -> bool {
        match &self.io {
            Io::Plain(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = match &mut self.io {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        };
        match polled {
            Poll::Pending => self.expired(cx),
            other => other,
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.io {
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        tonic::transport::server::TcpConnectInfo {
            local_addr: Some(self.local),
            remote_addr: Some(self.peer),
        }
    }
}

/// Where connections come from: a TCP listener, or a test's stand-in.
pub trait Accept: Send + 'static {
    fn accept(&mut self) -> impl Future<Output = io::Result<(TcpStream, SocketAddr)>> + Send;
    fn local(&self) -> SocketAddr;
}

impl Accept for TcpListener {
    async fn accept(&mut self) -> io::Result<(TcpStream, SocketAddr)> {
        TcpListener::accept(self).await
    }

    fn local(&self) -> SocketAddr {
        self.local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 0)))
    }
}

/// Errors that concern one connection only; anything else (out of file
/// descriptors, of memory) would fail again at once.
fn per_connection(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::Interrupted
    )
}

/// The wait after the `n`th accept error in a row: 10 ms doubling to 1 s.
pub fn backoff(n: u32) -> Duration {
    Duration::from_millis(10u64.saturating_mul(1 << n.min(7))).min(Duration::from_secs(1))
}

/// Accepted (and, with `tls`, handshaken) connections, until the receiver
/// is dropped.
pub fn incoming<A: Accept>(
    listener: A,
    tls: Option<Rotating>,
    limits: ConnLimits,
    port: &'static str,
) -> mpsc::Receiver<Conn> {
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(accept_loop(listener, tls, limits, port, tx));
    rx
}

async fn accept_loop<A: Accept>(
    mut listener: A,
    tls: Option<Rotating>,
    limits: ConnLimits,
    port: &'static str,
    tx: mpsc::Sender<Conn>,
) {
    let open = Arc::new(Semaphore::new(limits.max_connections));
    let handshakes = Arc::new(Semaphore::new(limits.max_handshakes));
    let local = listener.local();
    let mut errors = 0u32;
    loop {
        let permit = tokio::select! {
            p = open.clone().acquire_owned() => p.expect("never closed"),
            _ = tx.closed() => return,
        };
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = tx.closed() => return,
        };
        let (tcp, peer) = match accepted {
            Ok(a) => {
                errors = 0;
                a
            }
            Err(e) if per_connection(&e) => continue,
            Err(e) => {
                let wait = backoff(errors);
                errors = errors.saturating_add(1);
                tracing::warn!(error = %e, port, ?wait, "accept failed; backing off");
                tokio::time::sleep(wait).await;
                continue;
            }
        };
        tcp.set_nodelay(true).ok();
        if let Some(bytes) = limits.send_buffer {
            socket2::SockRef::from(&tcp)
                .set_send_buffer_size(bytes)
                .ok();
        }
        // Dead peers are noticed even on connections with nothing to say.
        let keepalive = socket2::TcpKeepalive::new().with_time(Duration::from_secs(60));
        socket2::SockRef::from(&tcp)
            .set_tcp_keepalive(&keepalive)
            .ok();
        let Some(tls) = &tls else {
            if tx
                .send(Conn::new(
                    Io::Plain(tcp),
                    peer,
                    local,
                    permit,
                    port,
                    &limits,
                ))
                .await
                .is_err()
            {
                return;
            }
            continue;
        };
        let handshake = tokio::select! {
            p = handshakes.clone().acquire_owned() => p.expect("never closed"),
            _ = tx.closed() => return,
        };
        let acceptor = TlsAcceptor::from(tls.config());
        let tx = tx.clone();
        tokio::spawn(async move {
            let done = tokio::time::timeout(limits.handshake, acceptor.accept(tcp)).await;
            drop(handshake);
            match done {
                Ok(Ok(s)) => {
                    let conn = Conn::new(Io::Tls(Box::new(s)), peer, local, permit, port, &limits);
                    tx.send(conn).await.ok();
                }
                Ok(Err(e)) => tracing::debug!(error = %e, "TLS handshake failed"),
                Err(_) => {
                    METRICS.connections_cut_total.inc(&[port, "handshake"]);
                    tracing::debug!("TLS handshake timed out");
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    struct Failing(Arc<AtomicUsize>);

    impl Accept for Failing {
        async fn accept(&mut self) -> io::Result<(TcpStream, SocketAddr)> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Err(io::Error::from_raw_os_error(24)) // EMFILE
        }

        fn local(&self) -> SocketAddr {
            SocketAddr::from(([127, 0, 0, 1], 0))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn accept_errors_back_off_instead_of_spinning() {
        let calls = Arc::new(AtomicUsize::new(0));
        let rx = incoming(Failing(calls.clone()), None, ConnLimits::default(), "test");
        tokio::time::sleep(Duration::from_secs(1)).await;
        let n = calls.load(Ordering::SeqCst);
        assert!((2..=20).contains(&n), "{n} accepts in 1 s");
        drop(rx);
    }

    #[test]
    fn backoff_doubles_to_a_second() {
        assert_eq!(backoff(0), Duration::from_millis(10));
        assert_eq!(backoff(3), Duration::from_millis(80));
        assert_eq!(backoff(40), Duration::from_secs(1));
    }

    async fn listener() -> (TcpListener, SocketAddr) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = l.local_addr().unwrap();
        (l, a)
    }

    #[tokio::test]
    async fn a_silent_client_is_cut_and_the_cap_holds_the_next_until_then() {
        let (l, addr) = listener().await;
        let limits = ConnLimits {
            max_connections: 1,
            first_byte: Duration::from_millis(300),
            idle: Duration::from_secs(5),
            ..ConnLimits::default()
        };
        let mut rx = incoming(l, None, limits, "test");
        let mut silent = TcpStream::connect(addr).await.unwrap();
        let mut first = rx.recv().await.unwrap();
        let _second_client = TcpStream::connect(addr).await.unwrap();
        // The cap: the second waits while the first is open.
        assert!(
            tokio::time::timeout(Duration::from_millis(150), rx.recv())
                .await
                .is_err()
        );
        // The first said nothing: its reads fail at the deadline.
        let mut buf = [0u8; 8];
        let err = tokio::time::timeout(Duration::from_secs(3), first.read(&mut buf))
            .await
            .expect("cut within its deadline")
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        drop(first);
        // Its slot is free: the second is accepted.
        tokio::time::timeout(Duration::from_secs(3), rx.recv())
            .await
            .unwrap()
            .unwrap();
        silent.write_all(b"x").await.ok();
    }

    #[tokio::test]
    async fn a_client_that_talks_is_kept_past_the_first_byte_deadline() {
        let (l, addr) = listener().await;
        let limits = ConnLimits {
            first_byte: Duration::from_millis(200),
            idle: Duration::from_secs(5),
            ..ConnLimits::default()
        };
        let mut rx = incoming(l, None, limits, "test");
        let mut client = TcpStream::connect(addr).await.unwrap();
        let mut conn = rx.recv().await.unwrap();
        client.write_all(b"hello").await.unwrap();
        let mut buf = [0u8; 5];
        conn.read_exact(&mut buf).await.unwrap();
        tokio::time::sleep(Duration::from_millis(400)).await;
        client.write_all(b"again").await.unwrap();
        conn.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"again");
    }

    #[tokio::test]
    async fn a_client_that_falls_silent_is_cut_at_its_idle_limit() {
        let (l, addr) = listener().await;
        let limits = ConnLimits {
            first_byte: Duration::from_millis(100),
            idle: Duration::from_millis(400),
            ..ConnLimits::default()
        };
        let mut rx = incoming(l, None, limits, "test");
        let mut client = TcpStream::connect(addr).await.unwrap();
        let mut conn = rx.recv().await.unwrap();
        client.write_all(b"hi").await.unwrap();
        let mut buf = [0u8; 2];
        conn.read_exact(&mut buf).await.unwrap();
        let t0 = std::time::Instant::now();
        let err = tokio::time::timeout(Duration::from_secs(3), conn.read(&mut buf))
            .await
            .expect("cut")
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        // Past the first-byte deadline, at the idle limit after the last byte.
        assert!(
            t0.elapsed() >= Duration::from_millis(300),
            "{:?}",
            t0.elapsed()
        );
    }
}
