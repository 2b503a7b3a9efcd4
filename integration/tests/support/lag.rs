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

/// Refuses requests about `resource` with a 403 while `failing` is set;
/// the rest of the client is untouched.
#[derive(Clone)]
pub struct FailLayer {
    pub resource: &'static str,
    pub failing: std::sync::Arc<std::sync::atomic::AtomicBool>,
    pub refuse: Refuse,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Refuse {
    /// Watches and lists, for as long as `failing` is set: open watches
    /// end, as after an RBAC change that took `watch` away.
    Reads,
    /// The next write to one object, once: a passing API error (`failing`
    /// is cleared by it).
    NextWrite,
}

impl<S> Layer<S> for FailLayer {
    type Service = Failing<S>;
    fn layer(&self, inner: S) -> Failing<S> {
        Failing {
            inner,
            by: self.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Failing<S> {
    inner: S,
    by: FailLayer,
}

fn is_read_of(uri: &Uri, resource: &str) -> bool {
    uri.path().ends_with(&format!("/{resource}"))
}

impl<S> Service<Request<kube::client::Body>> for Failing<S>
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
        use std::sync::atomic::Ordering;
        let (ours, refused) = match self.by.refuse {
            Refuse::Reads => {
                let ours = is_read_of(req.uri(), self.by.resource);
                (ours, ours && self.by.failing.load(Ordering::SeqCst))
            }
            Refuse::NextWrite => {
                let ours = req.method() != http::Method::GET
                    && req
                        .uri()
                        .path()
                        .contains(&format!("/{}/", self.by.resource));
                (ours, ours && self.by.failing.swap(false, Ordering::SeqCst))
            }
        };
        if refused {
            let body = br#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"forbidden by the test","reason":"Forbidden","code":403}"#;
            let response = Response::builder()
                .status(403)
                .header("content-type", "application/json")
                .body(Box::new(Once(Some(Bytes::from_static(body)))) as DynBody)
                .expect("response");
            return Box::pin(async move { Ok(response) });
        }
        let failing = self.by.failing.clone();
        let ends = ours && self.by.refuse == Refuse::Reads;
        let response = self.inner.call(req);
        Box::pin(async move {
            let response = response.await?;
            Ok(match ends {
                true => response.map(|inner| {
                    Box::new(Ending {
                        inner,
                        failing,
                        check: Box::pin(tokio::time::sleep(Duration::from_millis(100))),
                    }) as DynBody
                }),
                false => response,
            })
        })
    }
}

/// One frame, then the end.
struct Once(Option<Bytes>);

impl Body for Once {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Poll::Ready(self.0.take().map(|b| Ok(Frame::data(b))))
    }
}

/// A response body that ends as soon as `failing` is set (checked every
/// 100 ms, so an idle watch ends too).
struct Ending {
    inner: DynBody,
    failing: std::sync::Arc<std::sync::atomic::AtomicBool>,
    check: Pin<Box<tokio::time::Sleep>>,
}

impl Body for Ending {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        loop {
            if this.failing.load(std::sync::atomic::Ordering::SeqCst) {
                return Poll::Ready(None);
            }
            if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
                return Poll::Ready(frame);
            }
            ready!(this.check.as_mut().poll(cx));
            this.check
                .as_mut()
                .reset(tokio::time::Instant::now() + Duration::from_millis(100));
        }
    }
}
