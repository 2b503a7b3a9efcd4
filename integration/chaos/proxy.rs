//! A loopback TCP proxy in front of a member's apiserver that can become a
//! black hole: while holed it accepts connections and moves no byte either
//! way, as a partitioned network does; open again, held bytes go on.

use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct Proxy {
    pub port: u16,
    holed: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub async fn start(upstream: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let (holed, rx) = watch::channel(false);
        let upstream = Arc::new(upstream);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (rx, upstream) = (rx.clone(), upstream.clone());
                tokio::spawn(async move {
                    // A new connection waits for the hole to close first.
                    open(rx.clone()).await;
                    let Ok(server) = TcpStream::connect(upstream.as_str()).await else {
                        return;
                    };
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    tokio::spawn(pump(cr, sw, rx.clone()));
                    tokio::spawn(pump(sr, cw, rx));
                });
            }
        });
        Proxy { port, holed, task }
    }

    pub fn hole(&self, on: bool) {
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

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    rx: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        open(rx.clone()).await;
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        // Bytes read just before the hole opened wait inside it.
        open(rx.clone()).await;
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}
