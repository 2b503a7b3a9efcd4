//! What List replies may hold at once, encoded, until they are sent. tonic
//! encodes a unary reply whole after the handler returns, and the bytes
//! wait in the HTTP/2 send buffer until the client's window takes them, so
//! a page's budget (`request::take_page`) bounds one call, not how many
//! calls hold a page at once. A List call reserves its page's budget here
//! before it builds the page; the reservation rides in the reply's
//! extensions, `hold` moves it into the reply's bytes, and it is given back
//! when the last of them is written or dropped, not when the handler
//! returns.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::ApiError;

/// How long a List call waits for room before it is refused.
pub const WAIT: Duration = Duration::from_secs(5);

/// Reservations are counted in KiB, so that gigabytes fit a semaphore.
const UNIT: usize = 1024;

#[derive(Clone)]
pub struct ReplyBudget {
    room: Arc<Semaphore>,
    units: usize,
}

/// A reservation, put into the reply's extensions for `hold` to move into
/// the reply's bytes (extensions must be `Clone`, a permit is not).
#[derive(Clone)]
pub struct Reserved(Arc<Mutex<Option<OwnedSemaphorePermit>>>);

impl ReplyBudget {
    /// Room for `bytes` of replies at once (at least one unit).
    pub fn new(bytes: usize) -> Self {
        // At most u32::MAX units (4 TiB): a reservation is a u32 of them.
        let units = bytes.div_ceil(UNIT).clamp(1, u32::MAX as usize);
        ReplyBudget {
            room: Arc::new(Semaphore::new(units)),
            units,
        }
    }

    /// Reserves room for a reply of at most `bytes` (or all the room, if
    /// that is less), waiting up to `WAIT`.
    pub async fn reserve(&self, bytes: usize) -> Result<Reserved, ApiError> {
        let want = bytes.div_ceil(UNIT).clamp(1, self.units);
        let acquire = self.room.clone().acquire_many_owned(want as u32);
        match tokio::time::timeout(WAIT, acquire).await {
            Ok(Ok(permit)) => Ok(Reserved(Arc::new(Mutex::new(Some(permit))))),
            Ok(Err(_closed)) => Err(ApiError::Unavailable("the server is stopping".into())),
            Err(_) => Err(ApiError::ResourceExhausted(format!(
                "List replies not yet read by their clients hold this replica's room ({} KiB) for {WAIT:?}; retry",
                self.units
            ))),
        }
    }

    /// Room free now, in bytes (for tests).
    pub fn free_bytes(&self) -> usize {
        self.room.available_permits() * UNIT
    }
}

impl Reserved {
    fn take(&self) -> Option<OwnedSemaphorePermit> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// Moves a reply's reservation from its extensions into its body's bytes.
pub fn hold(mut res: http::Response<tonic::body::Body>) -> http::Response<tonic::body::Body> {
    match res
        .extensions_mut()
        .remove::<Reserved>()
        .and_then(|r| r.take())
    {
        None => res,
        Some(permit) => res.map(|inner| {
            tonic::body::Body::new(Holding {
                inner,
                permit: Arc::new(permit),
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
    permit: Arc<OwnedSemaphorePermit>,
}

/// Bytes that hold a reservation while any view of them lives.
struct Reserving {
    data: Bytes,
    _permit: Arc<OwnedSemaphorePermit>,
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
        let permit = &me.permit;
        Poll::Ready(frame.map(|f| {
            f.map(|f| {
                f.map_data(|data| {
                    Bytes::from_owner(Reserving {
                        data,
                        _permit: permit.clone(),
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
        let budget = ReplyBudget::new(8 * UNIT);
        let reserved = budget.reserve(5 * UNIT).await.expect("room");
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
        let budget = ReplyBudget::new(4 * UNIT);
        // More than the whole room asks for the whole room, not forever.
        let all = budget.reserve(100 * UNIT).await.expect("the whole room");
        assert_eq!(budget.free_bytes(), 0);
        let refused = budget.reserve(1).await.err().expect("no room");
        assert_eq!(refused.category(), "ResourceExhausted");
        drop(all);
        assert!(budget.reserve(1).await.is_ok());
    }
}
