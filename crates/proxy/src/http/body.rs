//! The response body the proxy streams back: an endpoint's body, watched for
//! its end (to count the response, read gRPC's status from the trailers and
//! return the connection to its pool), or a small body the proxy made.

use super::conns::{EndpointConns, PoolConfig};
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

pub fn grpc_status(headers: &HeaderMap) -> Option<u32> {
    headers
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
}

/// What is settled when an endpoint's response ends.
#[derive(Debug)]
pub struct Done {
    endpoint: Arc<EndpointState<EndpointConns>>,
    status: u16,
    grpc_status: Option<u32>,
    h1: Option<(http1::SendRequest<Incoming>, Arc<PoolConfig>)>,
    _in_flight: InFlight<EndpointConns>,
}

impl Done {
    pub fn new(
        endpoint: Arc<EndpointState<EndpointConns>>,
        status: u16,
        grpc_status: Option<u32>,
        h1: Option<(http1::SendRequest<Incoming>, Arc<PoolConfig>)>,
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

    fn finish(mut self, complete: bool) {
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
        if complete {
            if let Some((sender, pool)) = self.h1.take() {
                self.endpoint.conns.put_h1(sender, &pool);
            }
        }
    }
}

#[derive(Debug)]
enum Kind {
    Upstream { inner: Incoming, done: Option<Done> },
    Full(Option<Bytes>),
}

#[derive(Debug)]
pub struct ResponseBody {
    kind: Kind,
}

impl ResponseBody {
    pub fn full(bytes: Bytes) -> Self {
        Self {
            kind: Kind::Full(Some(bytes)),
        }
    }

    pub fn upstream(inner: Incoming, done: Done) -> Self {
        Self {
            kind: Kind::Upstream {
                inner,
                done: Some(done),
            },
        }
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match &mut self.get_mut().kind {
            Kind::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            Kind::Upstream { inner, done } => {
                let frame = ready!(Pin::new(inner).poll_frame(cx));
                match &frame {
                    Some(Ok(f)) => {
                        if let (Some(trailers), Some(d)) = (f.trailers_ref(), done.as_mut()) {
                            if let Some(s) = grpc_status(trailers) {
                                d.grpc_status = Some(s);
                            }
                        }
                    }
                    Some(Err(_)) => {
                        if let Some(d) = done.take() {
                            d.finish(false);
                        }
                    }
                    None => {
                        if let Some(d) = done.take() {
                            d.finish(true);
                        }
                    }
                }
                Poll::Ready(frame)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Full(b) => b.is_none(),
            Kind::Upstream { inner, .. } => inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            Kind::Full(None) => SizeHint::with_exact(0),
            Kind::Upstream { inner, .. } => inner.size_hint(),
        }
    }
}

impl Drop for ResponseBody {
    fn drop(&mut self) {
        if let Kind::Upstream { inner, done } = &mut self.kind {
            if let Some(d) = done.take() {
                // A body known to be empty may never be polled.
                d.finish(inner.is_end_stream());
            }
        }
    }
}
