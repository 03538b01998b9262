//! The response body the proxy streams back: an endpoint's body, watched for
//! its end (to count the response, read gRPC's status from the trailers and
//! return the connection to its pool), or a small body the proxy made.

use super::{
    conns::{EndpointConns, PoolConfig},
    RequestBody,
};
use crate::{
    balance::{EndpointState, InFlight},
    metrics::classify,
};
use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use hyper::{body::Incoming, client::conn::http1};
use std::{
    pin::Pin,
    sync::Arc,
    task::{ready, Context, Poll},
};

/// gRPC's status in headers or trailers.
pub fn grpc_status(headers: &HeaderMap) -> Option<u32> {
    const GRPC_STATUS: http::HeaderName = http::HeaderName::from_static("grpc-status");
    headers
        .get(GRPC_STATUS)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
}

/// What is settled when an endpoint's response ends.
#[derive(Debug)]
pub struct Done {
    endpoint: Arc<EndpointState<EndpointConns>>,
    status: u16,
    grpc_status: Option<u32>,
    h1: Option<(http1::SendRequest<RequestBody>, Arc<PoolConfig>)>,
    _in_flight: InFlight<EndpointConns>,
}

impl Done {
    pub fn new(
        endpoint: Arc<EndpointState<EndpointConns>>,
        status: u16,
        grpc_status: Option<u32>,
        h1: Option<(http1::SendRequest<RequestBody>, Arc<PoolConfig>)>,
        in_flight: InFlight<EndpointConns>,
    ) -> Self {
        Self {
            endpoint,
            status,
            grpc_status,
            h1,
            _in_flight: in_flight,
        }
    }

    /// Settles the response; `accrue`: whether it says something of the
    /// endpoint for failure accrual (not when the client left first).
    fn finish(mut self, complete: bool, accrue: bool) {
        let classification = if complete {
            classify(self.status, self.grpc_status)
        } else {
            "failure"
        };
        self.endpoint.conns.metrics(&self.endpoint.labels).response(
            self.status,
            self.grpc_status,
            classification,
        );
        if accrue {
            self.endpoint.response_ended(classification == "success");
        }
        if complete {
            if let Some((sender, pool)) = self.h1.take() {
                self.endpoint.conns.put_h1(sender, &pool);
            }
        }
    }
}

#[derive(Debug)]
enum Kind {
    Upstream {
        inner: Incoming,
        done: Option<Done>,
    },
    Full(Option<Bytes>),
    /// An endpoint's body that never sends (the limits' tests).
    #[cfg(test)]
    Stalled,
}

/// Told how a response body ended: whether it ended cleanly, and gRPC's
/// status when its trailers (or headers) carried one.
pub type EndHook = Box<dyn FnOnce(BodyEnd) + Send + Sync>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BodyEnd {
    pub complete: bool,
    pub grpc_status: Option<u32>,
    /// The body was cut by its deadline or idle limit.
    pub timed_out: Option<BodyTimeout>,
}

/// Why the proxy cut a response body short.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BodyTimeout {
    /// A route's request timeout passed while the body streamed.
    #[error("request timeout")]
    Request,
    /// No frame came within a route's idle timeout.
    #[error("idle timeout")]
    Idle,
}

/// A response body's failure: the endpoint's, or a route's limit.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error(transparent)]
    Upstream(#[from] hyper::Error),
    #[error("response body cut: {0}")]
    Timeout(BodyTimeout),
}

/// Limits a route puts on a response body's streaming.
struct Limits {
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    idle: Option<(std::time::Duration, Pin<Box<tokio::time::Sleep>>)>,
}

impl Limits {
    /// A limit that passed, if one did (registering for the next wake-up
    /// otherwise).
    fn passed(&mut self, cx: &mut Context<'_>) -> Option<BodyTimeout> {
        if let Some(d) = self.deadline.as_mut() {
            if std::future::Future::poll(d.as_mut(), cx).is_ready() {
                return Some(BodyTimeout::Request);
            }
        }
        if let Some((_, sleep)) = self.idle.as_mut() {
            if std::future::Future::poll(sleep.as_mut(), cx).is_ready() {
                return Some(BodyTimeout::Idle);
            }
        }
        None
    }

    /// A frame came: the idle limit starts again.
    fn frame(&mut self) {
        if let Some((idle, sleep)) = self.idle.as_mut() {
            let next = tokio::time::Instant::now() + *idle;
            sleep.as_mut().reset(next);
        }
    }
}

pub struct ResponseBody {
    kind: Kind,
    /// A route's metrics, told when the body ends (or is dropped).
    on_end: Option<(EndHook, Option<u32>)>,
    limits: Option<Box<Limits>>,
    /// A tapped response's events: told each frame, dropped at the end.
    tap: Option<Box<crate::tap::ResponseTap>>,
}

impl std::fmt::Debug for ResponseBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseBody")
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

impl ResponseBody {
    pub fn full(bytes: Bytes) -> Self {
        Self {
            kind: Kind::Full(Some(bytes)),
            on_end: None,
            limits: None,
            tap: None,
        }
    }

    pub fn upstream(inner: Incoming, done: Done) -> Self {
        Self {
            kind: Kind::Upstream {
                inner,
                done: Some(done),
            },
            on_end: None,
            limits: None,
            tap: None,
        }
    }

    /// Calls `hook` when the body ends; `grpc_status` is the status the
    /// response headers carried, if any (a trailers' status replaces it).
    pub fn on_end(&mut self, hook: EndHook, grpc_status: Option<u32>) {
        self.on_end = Some((hook, grpc_status));
    }

    /// Reports the body's frames and end to the taps of its request.
    pub fn tap(&mut self, tap: Box<crate::tap::ResponseTap>) {
        self.tap = Some(tap);
    }

    /// Cuts an endpoint's body at `deadline`, or when no frame comes for
    /// `idle`.
    pub fn limit(
        &mut self,
        deadline: Option<tokio::time::Instant>,
        idle: Option<std::time::Duration>,
    ) {
        // A body the proxy made is whole already.
        if (deadline.is_none() && idle.is_none()) || matches!(self.kind, Kind::Full(_)) {
            return;
        }
        self.limits = Some(Box::new(Limits {
            deadline: deadline.map(|d| Box::pin(tokio::time::sleep_until(d))),
            idle: idle.map(|i| (i, Box::pin(tokio::time::sleep(i)))),
        }));
    }

    fn end(&mut self, complete: bool) {
        self.end_as(complete, None);
    }

    fn end_as(&mut self, complete: bool, timed_out: Option<BodyTimeout>) {
        // Its end event.
        drop(self.tap.take());
        if let Some((hook, grpc_status)) = self.on_end.take() {
            hook(BodyEnd {
                complete,
                grpc_status,
                timed_out,
            });
        }
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        // Checked before the body too: one that never waits still ends at
        // its deadline.
        if let Some(timeout) = this.limits.as_mut().and_then(|l| l.passed(cx)) {
            this.cut(timeout);
            return Poll::Ready(Some(Err(BodyError::Timeout(timeout))));
        }
        let Poll::Ready(frame) = this.poll_inner(cx) else {
            return Poll::Pending;
        };
        if let Some(l) = this.limits.as_mut() {
            l.frame();
        }
        Poll::Ready(frame.map(|f| f.map_err(BodyError::from)))
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Full(b) => b.is_none(),
            Kind::Upstream { inner, .. } => inner.is_end_stream(),
            #[cfg(test)]
            Kind::Stalled => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            Kind::Full(None) => SizeHint::with_exact(0),
            Kind::Upstream { inner, .. } => inner.size_hint(),
            #[cfg(test)]
            Kind::Stalled => SizeHint::default(),
        }
    }
}

impl ResponseBody {
    /// Ends the body early: the endpoint's response is abandoned (its
    /// connection is not pooled) and counted as a failure.
    fn cut(&mut self, timeout: BodyTimeout) {
        self.limits = None;
        if let Kind::Upstream { done, .. } = &mut self.kind {
            if let Some(d) = done.take() {
                // Cut by the route's timeout: the endpoint was too slow.
                d.finish(false, true);
            }
        }
        self.kind = Kind::Full(None);
        self.end_as(false, Some(timeout));
    }

    fn poll_inner(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self;
        let (frame, ended) = match &mut this.kind {
            Kind::Full(bytes) => {
                let frame = bytes.take().map(|b| Ok(Frame::data(b)));
                let ended = frame.is_none().then_some(true);
                (frame, ended)
            }
            Kind::Upstream { inner, done } => {
                let frame = ready!(Pin::new(inner).poll_frame(cx));
                let mut ended = None;
                match &frame {
                    Some(Ok(f)) => {
                        if let Some(s) = f.trailers_ref().and_then(grpc_status) {
                            if let Some(d) = done.as_mut() {
                                d.grpc_status = Some(s);
                            }
                            if let Some((_, status)) = this.on_end.as_mut() {
                                *status = Some(s);
                            }
                        }
                    }
                    Some(Err(_)) => {
                        if let Some(d) = done.take() {
                            d.finish(false, true);
                        }
                        ended = Some(false);
                    }
                    None => {
                        if let Some(d) = done.take() {
                            d.finish(true, true);
                        }
                        ended = Some(true);
                    }
                }
                (frame, ended)
            }
            #[cfg(test)]
            Kind::Stalled => return Poll::Pending,
        };
        if let Some(t) = this.tap.as_mut() {
            t.frame(&frame);
        }
        if let Some(complete) = ended {
            this.end(complete);
        }
        Poll::Ready(frame)
    }
}

impl Drop for ResponseBody {
    fn drop(&mut self) {
        let complete = match &mut self.kind {
            Kind::Upstream { inner, done } => {
                // A body known to be empty may never be polled.
                let complete = inner.is_end_stream();
                if let Some(d) = done.take() {
                    // Dropped before its end: the client left, which says
                    // nothing of the endpoint.
                    d.finish(complete, complete);
                }
                complete
            }
            Kind::Full(b) => b.is_none(),
            #[cfg(test)]
            Kind::Stalled => false,
        };
        self.end(complete);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use std::{sync::Mutex, time::Duration};
    use tokio::time::Instant;

    fn stalled() -> (ResponseBody, Arc<Mutex<Option<BodyEnd>>>) {
        let ended = Arc::new(Mutex::new(None));
        let mut body = ResponseBody {
            kind: Kind::Stalled,
            on_end: None,
            limits: None,
            tap: None,
        };
        let seen = ended.clone();
        body.on_end(
            Box::new(move |end| *seen.lock().expect("lock") = Some(end)),
            None,
        );
        (body, ended)
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_is_cut_at_its_deadline_or_after_its_idle_limit() {
        let started = Instant::now();
        let (mut body, ended) = stalled();
        body.limit(Some(started + Duration::from_millis(700)), None);
        let frame = body.frame().await.expect("an end");
        assert!(matches!(
            frame,
            Err(BodyError::Timeout(BodyTimeout::Request))
        ));
        assert_eq!(started.elapsed(), Duration::from_millis(700));
        let end = ended.lock().expect("lock").expect("told");
        assert_eq!(end.timed_out, Some(BodyTimeout::Request));
        assert!(!end.complete);
        assert!(body.frame().await.is_none(), "nothing after the cut");

        let started = Instant::now();
        let (mut body, ended) = stalled();
        body.limit(
            Some(started + Duration::from_secs(60)),
            Some(Duration::from_millis(300)),
        );
        let frame = body.frame().await.expect("an end");
        assert!(matches!(frame, Err(BodyError::Timeout(BodyTimeout::Idle))));
        assert_eq!(started.elapsed(), Duration::from_millis(300));
        assert_eq!(
            ended.lock().expect("lock").and_then(|e| e.timed_out),
            Some(BodyTimeout::Idle)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_the_proxy_made_is_never_cut() {
        let mut body = ResponseBody::full(Bytes::from_static(b"done"));
        body.limit(Some(Instant::now()), Some(Duration::ZERO));
        tokio::time::advance(Duration::from_secs(1)).await;
        let all = body.collect().await.expect("whole").to_bytes();
        assert_eq!(&all[..], b"done");
    }
}
