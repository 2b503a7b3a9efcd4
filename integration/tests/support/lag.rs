//! A member client whose watches of one resource lag behind the API
//! server: every frame of their response bodies is held back, as on a busy
//! apiserver whose watch caches fall behind. Races between a controller's
//! own writes and its watches can then be staged on purpose.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use http::{Request, Response, Uri};
use http_body::{Body, Frame};
use tower::{BoxError, Layer, Service};

type DynBody = Box<dyn Body<Data = Bytes, Error = BoxError> + Send + Unpin>;

/// Holds back each frame of watches of `resource` (e.g. "services") by `lag`.
#[derive(Clone, Copy)]
pub struct LagLayer {
    pub resource: &'static str,
    pub lag: Duration,
}

impl<S> Layer<S> for LagLayer {
    type Service = Lagged<S>;
    fn layer(&self, inner: S) -> Lagged<S> {
        Lagged { inner, by: *self }
    }
}

#[derive(Clone)]
pub struct Lagged<S> {
    inner: S,
    by: LagLayer,
}

fn is_watch_of(uri: &Uri, resource: &str) -> bool {
    uri.path().ends_with(&format!("/{resource}"))
        && uri
            .query()
            .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"))
}

impl<S> Service<Request<kube::client::Body>> for Lagged<S>
where
    S: Service<Request<kube::client::Body>, Response = Response<DynBody>>,
    S::Future: Send + 'static,
{
    type Response = Response<DynBody>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Response<DynBody>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<kube::client::Body>) -> Self::Future {
        let lag = is_watch_of(req.uri(), self.by.resource).then_some(self.by.lag);
        let response = self.inner.call(req);
        Box::pin(async move {
            let response = response.await?;
            Ok(match lag {
                Some(lag) => response.map(|inner| {
                    Box::new(Lagging {
                        inner,
                        lag,
                        held: None,
                    }) as DynBody
                }),
                None => response,
            })
        })
    }
}

type Held = (Pin<Box<tokio::time::Sleep>>, Result<Frame<Bytes>, BoxError>);

struct Lagging {
    inner: DynBody,
    lag: Duration,
    held: Option<Held>,
}

impl Body for Lagging {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if this.held.is_none() {
            match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(frame) => {
                    this.held = Some((Box::pin(tokio::time::sleep(this.lag)), frame));
                }
                None => return Poll::Ready(None),
            }
        }
        if let Some((sleep, _)) = this.held.as_mut() {
            ready!(sleep.as_mut().poll(cx));
        }
        Poll::Ready(this.held.take().map(|(_, frame)| frame))
    }
}
