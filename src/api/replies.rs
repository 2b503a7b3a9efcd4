//! What List replies may hold at once, encoded, until they are sent. tonic
//! encodes a unary reply whole after the handler returns, and the bytes
//! wait in the HTTP/2 send buffer until the client's window takes them, so
//! a page's budget (`request::take_page`) bounds one call, not how many
//! calls hold a page at once. A List call reserves its page's budget here
//! before it builds the page, from the replica's room and from its
//! connection's share of it, and gives back what the built page's buffer
//! does not hold (`Reserved::fit`); the reservation rides in the reply's
//! extensions, `hold` moves it into the reply's bytes, and it is given back
//! when the last of them is written or dropped, not when the handler
//! returns.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::ApiError;
use super::errors::Reason;

/// How long a List call waits for room before it is refused.
pub const WAIT: Duration = Duration::from_secs(5);

/// Reservations are counted in KiB, so that gigabytes fit a semaphore.
const UNIT: usize = 1024;

#[derive(Clone)]
pub struct ReplyBudget {
    room: Arc<Semaphore>,
    units: usize,
    /// What one connection's replies may hold of the room, so that one
    /// client that leaves its replies unread does not hold every List.
    share: usize,
    /// Each connection's share, while any of it is held.
    shares: Arc<Mutex<HashMap<SocketAddr, Weak<Semaphore>>>>,
}

/// A reservation, put into the reply's extensions for `hold` to move into
/// the reply's bytes (extensions must be `Clone`, a permit is not).
#[derive(Clone)]
pub struct Reserved(Arc<Mutex<Option<Permits>>>);

/// Units of the room, and as many of the connection's share.
struct Permits {
    room: OwnedSemaphorePermit,
    share: Option<OwnedSemaphorePermit>,
}

fn units_of(bytes: usize) -> usize {
    // At most u32::MAX units (4 TiB): a reservation is a u32 of them.
    bytes.div_ceil(UNIT).clamp(1, u32::MAX as usize)
}

impl ReplyBudget {
    /// Room for `bytes` of replies at once, of which one connection's may
    /// hold `per_connection` (each at least one unit).
    pub fn new(bytes: usize, per_connection: usize) -> Self {
        let units = units_of(bytes);
        ReplyBudget {
            room: Arc::new(Semaphore::new(units)),
            units,
            share: units_of(per_connection).min(units),
            shares: Default::default(),
        }
    }

    /// Reserves room for a reply of at most `bytes` to connection `peer`
    /// (or all of its share, if that is less), waiting up to `WAIT` for the
    /// share and the room together.
    pub async fn reserve(
        &self,
        bytes: usize,
        peer: Option<SocketAddr>,
    ) -> Result<Reserved, ApiError> {
        let want = units_of(bytes).min(self.share) as u32;
        let deadline = tokio::time::Instant::now() + WAIT;
        let share = match peer {
            None => None,
            Some(peer) => {
                let acquire = self.share_of(peer).acquire_many_owned(want);
                Some(Self::within(deadline, acquire).await.map_err(|e| {
                    e.unwrap_or_else(|| ApiError::refused(Reason::ConnectionRoomFull, format!(
                        "this connection's List replies not yet read hold its share of this replica's room ({} KiB) for {WAIT:?}; read them, or retry",
                        self.share
                    )))
                })?)
            }
        };
        let room = self.room.clone().acquire_many_owned(want);
        let room = Self::within(deadline, room).await.map_err(|e| {
            e.unwrap_or_else(|| ApiError::refused(Reason::ListRoomFull, format!(
                "List replies not yet read by their clients hold this replica's room ({} KiB) for {WAIT:?}; retry",
                self.units
            )))
        })?;
        Ok(Reserved(Arc::new(Mutex::new(Some(Permits {
            room,
            share,
        })))))
    }

    /// A permit by `deadline`: Err(None) when it passed.
    async fn within(
        deadline: tokio::time::Instant,
        acquire: impl Future<Output = Result<OwnedSemaphorePermit, tokio::sync::AcquireError>>,
    ) -> Result<OwnedSemaphorePermit, Option<ApiError>> {
        match tokio::time::timeout_at(deadline, acquire).await {
            Ok(Ok(permit)) => Ok(permit),
            Ok(Err(_closed)) => Err(Some(ApiError::refused(
                Reason::ShuttingDown,
                "the server is stopping",
            ))),
            Err(_) => Err(None),
        }
    }

    /// `peer`'s share: the one its held replies use, or a fresh one. Shares
    /// nobody holds are dropped here, so the map keeps one entry per
    /// connection with a reply unsent.
    fn share_of(&self, peer: SocketAddr) -> Arc<Semaphore> {
        let mut shares = self.shares.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(held) = shares.get(&peer).and_then(Weak::upgrade) {
            return held;
        }
        shares.retain(|_, s| s.strong_count() > 0);
        let fresh = Arc::new(Semaphore::new(self.share));
        shares.insert(peer, Arc::downgrade(&fresh));
        fresh
    }

    /// Room free now, in bytes (for tests).
    pub fn free_bytes(&self) -> usize {
        self.room.available_permits() * UNIT
    }
}

impl Reserved {
    fn take(&self) -> Option<Permits> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// The reply, carrying this reservation cut to what its bytes hold
    /// (`held`), for `hold` to move into them.
    pub fn ride<M: prost::Message>(self, mut reply: tonic::Response<M>) -> tonic::Response<M> {
        self.fit(held(reply.get_ref()));
        reply.extensions_mut().insert(self);
        reply
    }

    /// Keeps only what a reply holding `bytes` needs (`held`): a page is
    /// reserved at its budget before it is built, and most pages (BASIC
    /// ones, the last of a list) are far smaller.
    fn fit(&self, bytes: usize) {
        let keep = units_of(bytes);
        if let Some(p) = self.0.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            for permit in std::iter::once(&mut p.room).chain(p.share.as_mut()) {
                let spare = permit.num_permits().saturating_sub(keep);
                drop(permit.split(spare));
            }
        }
    }
}

/// What a gRPC reply's bytes hold until sent: tonic encodes a reply (the
/// message and its 5-byte frame header) into a buffer of 8 KiB that
/// doubles as it fills, and the bytes it sends keep that whole buffer.
pub fn held<M: prost::Message>(reply: &M) -> usize {
    (reply.encoded_len() + 5).next_power_of_two().max(8 * 1024)
}

/// Moves a reply's reservation from its extensions into its body's bytes.
pub fn hold(mut res: http::Response<tonic::body::Body>) -> http::Response<tonic::body::Body> {
    match res
        .extensions_mut()
        .remove::<Reserved>()
        .and_then(|r| r.take())
    {
        None => res,
        Some(permits) => res.map(|inner| {
            tonic::body::Body::new(Holding {
                inner,
                permits: Arc::new(permits),
            })
        }),
    }
}

/// A body whose data carries its reservation. hyper drops a body once it
/// has handed over its last frame, while the data still waits in the
/// HTTP/2 send buffer for the client's window; so the reservation rides
/// in the data's bytes, and is given back when the last of them is
/// written or dropped.
struct Holding {
    inner: tonic::body::Body,
    permits: Arc<Permits>,
}

/// Bytes that hold a reservation while any view of them lives.
struct Reserving {
    data: Bytes,
    _permits: Arc<Permits>,
}

impl AsRef<[u8]> for Reserving {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

impl Body for Holding {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        let me = self.get_mut();
        let frame = std::task::ready!(Pin::new(&mut me.inner).poll_frame(cx));
        let permits = &me.permits;
        Poll::Ready(frame.map(|f| {
            f.map(|f| {
                f.map_data(|data| {
                    Bytes::from_owner(Reserving {
                        data,
                        _permits: permits.clone(),
                    })
                })
            })
        }))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn a_reservation_is_given_back_when_the_replys_bytes_are_gone_not_before() {
        let budget = ReplyBudget::new(8 * UNIT, 8 * UNIT);
        let reserved = budget.reserve(5 * UNIT, None).await.expect("room");
        assert_eq!(budget.free_bytes(), 3 * UNIT);
        let mut res = http::Response::new(tonic::body::Body::new(http_body_util::Full::new(
            Bytes::from_static(b"reply"),
        )));
        res.extensions_mut().insert(reserved);
        let res = hold(res);
        // The handler's reply is gone; its body still holds the room.
        assert_eq!(budget.free_bytes(), 3 * UNIT);
        let body = res.into_body().collect().await.expect("body").to_bytes();
        assert_eq!(&body[..], b"reply");
        // The body is gone; its bytes, still to be sent, hold the room.
        assert_eq!(budget.free_bytes(), 3 * UNIT);
        drop(body);
        assert_eq!(budget.free_bytes(), 8 * UNIT);
    }

    #[tokio::test(start_paused = true)]
    async fn no_room_within_the_wait_is_resource_exhausted_and_a_large_ask_takes_all_the_room() {
        let budget = ReplyBudget::new(4 * UNIT, 4 * UNIT);
        // More than the whole room asks for the whole room, not forever.
        let all = budget
            .reserve(100 * UNIT, None)
            .await
            .expect("the whole room");
        assert_eq!(budget.free_bytes(), 0);
        let refused = budget.reserve(1, None).await.err().expect("no room");
        assert_eq!(refused.category(), "LIST_ROOM_FULL");
        drop(all);
        assert!(budget.reserve(1, None).await.is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn one_connection_holds_at_most_its_share_and_the_others_still_get_room() {
        let budget = ReplyBudget::new(8 * UNIT, 4 * UNIT);
        let (a, b, c) = (
            Some("127.0.0.1:1001".parse().unwrap()),
            Some("127.0.0.1:1002".parse().unwrap()),
            Some("127.0.0.1:1003".parse().unwrap()),
        );
        let a1 = budget.reserve(3 * UNIT, a).await.expect("a's first");
        let a2 = budget.reserve(UNIT, a).await.expect("a's share is 4 units");
        let refused = budget.reserve(1, a).await.err().expect("a's share is held");
        assert_eq!(refused.category(), "CONNECTION_ROOM_FULL");
        assert!(
            refused.to_string().contains("this connection's"),
            "{refused}"
        );
        // The room has 4 units left, which a cannot take and b can.
        assert_eq!(budget.free_bytes(), 4 * UNIT);
        let b1 = budget
            .reserve(100 * UNIT, b)
            .await
            .expect("b's whole share");
        let full = budget.reserve(1, c).await.err().expect("the room is full");
        assert!(
            full.to_string().contains("hold this replica's room"),
            "{full}"
        );
        drop((a1, b1));
        budget
            .reserve(UNIT, c)
            .await
            .expect("c, once a's and b's are sent");
        budget
            .reserve(3 * UNIT, a)
            .await
            .expect("a, once its first is sent");
        drop(a2);
        // Shares nobody holds are forgotten as new connections come.
        budget
            .reserve(1, Some("127.0.0.1:1004".parse().unwrap()))
            .await
            .expect("d");
        let remembered = budget.shares.lock().unwrap().len();
        assert!(remembered <= 2, "{remembered} shares kept");
    }

    #[test]
    fn a_reply_holds_tonics_whole_buffer_at_least_8_kib() {
        use crate::api::pb;
        let reply = |n: usize| pb::ListMicroservicesResponse {
            next_page_token: "x".repeat(n),
            ..Default::default()
        };
        assert_eq!(held(&reply(10)), 8 * 1024);
        // 9,000 bytes and their headers outgrow 8 KiB: the buffer doubled.
        assert_eq!(held(&reply(9000)), 16 * 1024);
        assert_eq!(held(&reply(200_000)), 256 * 1024);
    }

    #[tokio::test]
    async fn a_built_page_keeps_only_the_room_its_bytes_need() {
        let budget = ReplyBudget::new(16 * UNIT, 8 * UNIT);
        let peer = Some("127.0.0.1:1001".parse().unwrap());
        let reserved = budget.reserve(8 * UNIT, peer).await.expect("room");
        assert_eq!(budget.free_bytes(), 8 * UNIT);
        reserved.fit(UNIT + 1);
        assert_eq!(budget.free_bytes(), 14 * UNIT);
        // The connection's share got the same back: 6 more units fit.
        let more = budget
            .reserve(6 * UNIT, peer)
            .await
            .expect("the share's rest");
        assert_eq!(budget.free_bytes(), 8 * UNIT);
        // A reply larger than its reservation keeps it whole.
        more.fit(100 * UNIT);
        assert_eq!(budget.free_bytes(), 8 * UNIT);
    }
}
