//! The policy services' gRPC routes, written out as the Destination
//! service's are (`server/grpc.rs`): a Watch stream's response body hands
//! out its subscription's answers as shared, already-encoded frames, so a
//! stream holds no encoder and no buffer of its own.

use super::server::{FrameStream, PolicyService};
use crate::server::{decode, grpc_response};
use bytes::Bytes;
use http::HeaderMap;
use http_body::Frame;
use linkerd2_proxy_api::{inbound::PortSpec, outbound::TrafficSpec};
use std::{
    convert::Infallible,
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};
use tonic::{server::NamedService, Status};

const OUTBOUND_GET: &str = "/io.linkerd.proxy.outbound.OutboundPolicies/Get";
const OUTBOUND_WATCH: &str = "/io.linkerd.proxy.outbound.OutboundPolicies/Watch";
const INBOUND_GET: &str = "/io.linkerd.proxy.inbound.InboundServerPolicies/GetPort";
const INBOUND_WATCH: &str = "/io.linkerd.proxy.inbound.InboundServerPolicies/WatchPort";

type BoxFuture<T> = Pin<Box<dyn Future<Output = Result<T, Infallible>> + Send>>;

/// Linkerd's `OutboundPolicies` (`Get`, `Watch`) for tonic's router.
#[derive(Clone)]
pub struct OutboundGrpc {
    service: PolicyService,
}

/// Linkerd's `InboundServerPolicies` (`GetPort`, `WatchPort`) for tonic's
/// router.
#[derive(Clone)]
pub struct InboundGrpc {
    service: PolicyService,
}

impl OutboundGrpc {
    pub fn new(service: PolicyService) -> Self {
        Self { service }
    }
}

impl InboundGrpc {
    pub fn new(service: PolicyService) -> Self {
        Self { service }
    }
}

impl NamedService for OutboundGrpc {
    const NAME: &'static str = "io.linkerd.proxy.outbound.OutboundPolicies";
}

impl NamedService for InboundGrpc {
    const NAME: &'static str = "io.linkerd.proxy.inbound.InboundServerPolicies";
}

impl tower::Service<http::Request<tonic::body::Body>> for OutboundGrpc {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let watch = match req.uri().path() {
            OUTBOUND_GET => false,
            OUTBOUND_WATCH => true,
            _ => return unimplemented(),
        };
        let service = self.service.clone();
        Box::pin(async move {
            let spec: TrafficSpec = match decode(req, service.max_request_bytes()).await {
                Ok(spec) => spec,
                Err(status) => return Ok(status.into_http()),
            };
            Ok(if watch {
                answer_stream(service.watch(spec))
            } else {
                answer_once(service.get(spec))
            })
        })
    }
}

impl tower::Service<http::Request<tonic::body::Body>> for InboundGrpc {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let watch = match req.uri().path() {
            INBOUND_GET => false,
            INBOUND_WATCH => true,
            _ => return unimplemented(),
        };
        let service = self.service.clone();
        Box::pin(async move {
            let spec: PortSpec = match decode(req, service.max_request_bytes()).await {
                Ok(spec) => spec,
                Err(status) => return Ok(status.into_http()),
            };
            Ok(if watch {
                answer_stream(service.watch_port(&spec))
            } else {
                answer_once(service.get_port(&spec))
            })
        })
    }
}

fn unimplemented() -> BoxFuture<http::Response<tonic::body::Body>> {
    Box::pin(async { Ok(Status::unimplemented("no such method").into_http()) })
}

fn answer_once(answer: Result<Bytes, Status>) -> http::Response<tonic::body::Body> {
    match answer {
        Ok(frame) => answer_stream(Ok(Box::pin(futures_util::stream::once(async move {
            Ok(frame)
        })))),
        Err(status) => status.into_http(),
    }
}

fn answer_stream(stream: Result<FrameStream, Status>) -> http::Response<tonic::body::Body> {
    match stream {
        Ok(stream) => grpc_response(tonic::body::Body::new(FrameBody {
            stream,
            ended: false,
        })),
        Err(status) => status.into_http(),
    }
}

/// A response body of shared frames, then the status as trailers: the
/// stream's error if it ended with one, else OK.
struct FrameBody {
    stream: FrameStream,
    ended: bool,
}

impl http_body::Body for FrameBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.ended {
            return Poll::Ready(None);
        }
        let status = match self.stream.as_mut().poll_next(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Some(Ok(frame))) => return Poll::Ready(Some(Ok(Frame::data(frame)))),
            Poll::Ready(Some(Err(status))) => status,
            Poll::Ready(None) => Status::ok(""),
        };
        self.ended = true;
        let mut trailers = HeaderMap::new();
        if status.add_header(&mut trailers).is_err() {
            trailers.insert(Status::GRPC_STATUS, (status.code() as i32).into());
        }
        Poll::Ready(Some(Ok(Frame::trailers(trailers))))
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }
}
