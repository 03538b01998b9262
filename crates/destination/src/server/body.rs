//! One stream's response body, reading its subscription's feed directly.
//!
//! There is no task and no queue per stream: when its connection polls the body
//! (as the client's flow control allows), it takes what is new in the feed,
//! shared frames encoded once for every stream, and hands them over one by one;
//! when there is nothing new it leaves its waker in the feed's slot for the
//! next publication. A stream holds its cursor, the frames it is handing over
//! (references), and its admission permit. A client that does not read leaves
//! its body unpolled: the feed cuts it at a later publication
//! (`--stream-send-wait`), its subscription is released then, and the body ends
//! with `RESOURCE_EXHAUSTED` if it is ever polled again.

use crate::{
    feed::{CatchUp, Next},
    store::Subscription,
};
use bytes::Bytes;
use http::HeaderMap;
use http_body::Frame;
use prometheus_client::metrics::{counter::Counter, gauge::Gauge};
use std::{
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};
use tokio::sync::{watch, OwnedSemaphorePermit};
use tonic::Status;

/// The metrics of one method's streams, shared by all of them.
pub struct StreamMetrics {
    pub open: Gauge,
    pub sent: Counter,
    pub resyncs: Counter,
}

/// Why a stream ends (its `Status` is built only then: it is large).
#[derive(Clone, Copy)]
enum End {
    Ok,
    Cut,
    /// Closed to relieve the controller's memory.
    Shed,
}

impl End {
    fn status(self) -> Status {
        match self {
            End::Ok => Status::ok(""),
            End::Cut => Status::resource_exhausted(
                "client did not read its updates in time; stream closed, reconnect",
            ),
            End::Shed => super::memory_closed(),
        }
    }
}

/// The response body of one stream.
pub struct StreamBody<V> {
    /// `None` once the stream has ended (its subscription released).
    sub: Option<Subscription<V>>,
    /// The messages being handed over, and how many were.
    pending: Option<(CatchUp<V>, usize)>,
    /// How the stream ends, once `pending` is sent.
    end: Option<End>,
    /// Trailers were sent: nothing follows.
    ended: bool,
    shutdown: watch::Receiver<bool>,
    metrics: Arc<StreamMetrics>,
    /// Counts against the concurrent stream limit until the stream ends.
    permit: Option<OwnedSemaphorePermit>,
}

impl<V> StreamBody<V> {
    pub fn new(
        sub: Subscription<V>,
        shutdown: watch::Receiver<bool>,
        metrics: Arc<StreamMetrics>,
        permit: OwnedSemaphorePermit,
    ) -> Self {
        metrics.open.inc();
        Self {
            sub: Some(sub),
            pending: None,
            end: None,
            ended: false,
            shutdown,
            metrics,
            permit: Some(permit),
        }
    }

    /// Frees the subscription and the stream's place, once.
    fn release(&mut self) {
        if self.permit.take().is_some() {
            self.metrics.open.dec();
        }
        self.sub = None;
        self.pending = None;
    }

    fn shutting_down(&self) -> bool {
        // A dropped sender is a shutdown too: nothing can announce one now.
        *self.shutdown.borrow() || self.shutdown.has_changed().is_err()
    }
}

impl<V: PartialEq + Send + Sync + 'static> http_body::Body for StreamBody<V> {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        loop {
            if let Some((up, sent)) = &mut this.pending {
                if let Some(m) = up.message(*sent) {
                    *sent += 1;
                    this.metrics.sent.inc();
                    return Poll::Ready(Some(Ok(Frame::data(m.clone()))));
                }
                this.pending = None;
            }
            if this.ended {
                return Poll::Ready(None);
            }
            if let Some(end) = this.end.take() {
                let status = end.status();
                this.ended = true;
                this.release();
                let mut trailers = HeaderMap::new();
                if status.add_header(&mut trailers).is_err() {
                    trailers.insert(Status::GRPC_STATUS, (status.code() as i32).into());
                }
                return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
            }
            let Some(sub) = &mut this.sub else {
                this.end = Some(End::Ok);
                continue;
            };
            match sub.poll_catch_up(cx) {
                Poll::Ready(Next::Up(up)) => {
                    if up.is_reset() {
                        this.metrics.resyncs.inc();
                    }
                    this.pending = Some((up, 0));
                }
                Poll::Ready(Next::Cut) => {
                    // Counted when it was cut (`Store::update`).
                    this.end = Some(End::Cut);
                }
                // Counted by the closing step that shed it.
                Poll::Ready(Next::Shed) => this.end = Some(End::Shed),
                // The waker is registered before the check, so a shutdown
                // announced after it wakes this body (`Store::wake_readers`).
                Poll::Pending if this.shutting_down() => this.end = Some(End::Ok),
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }
}

impl<V> Drop for StreamBody<V> {
    fn drop(&mut self) {
        self.release();
    }
}
