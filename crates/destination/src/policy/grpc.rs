//! The policy services' gRPC routes, written out as the Destination
//! service's are (`server/grpc.rs`): a Watch stream's response body hands
//! out its subscription's answers as shared, already-encoded frames, so a
//! stream holds no encoder and no buffer of its own.

use super::server::{Answers, PolicyService};
use crate::server::{decode, grpc_response, ResponseBody};
use bytes::Bytes;
use futures_util::Stream;
use http::HeaderMap;
use http_body::Frame;
use linkerd2_proxy_api::{inbound::PortSpec, outbound::TrafficSpec};
use std::{
    convert::Infallible,
    future::Future,
    marker::PhantomData,
    pin::Pin,
    task::{Context, Poll},
};
use tonic::{server::NamedService, Status};

type BoxFuture<T> = Pin<Box<dyn Future<Output = Result<T, Infallible>> + Send>>;

/// One of the two policy APIs: its name, its two methods' paths, its
/// request, and how the service answers each method.
pub trait PolicyApi: Send + Sync + 'static {
    const NAME: &'static str;
    const GET: &'static str;
    const WATCH: &'static str;
    type Request: prost::Message + Default + Send + 'static;
    fn get(service: &PolicyService, req: Self::Request) -> Result<Bytes, Status>;
    fn watch(service: &PolicyService, req: Self::Request) -> Result<Answers, Status>;
}

/// `OutboundPolicies` (`Get`, `Watch`).
pub enum Outbound {}

/// `InboundServerPolicies` (`GetPort`, `WatchPort`).
pub enum Inbound {}

impl PolicyApi for Outbound {
    const NAME: &'static str = "io.linkerd.proxy.outbound.OutboundPolicies";
    const GET: &'static str = "/io.linkerd.proxy.outbound.OutboundPolicies/Get";
    const WATCH: &'static str = "/io.linkerd.proxy.outbound.OutboundPolicies/Watch";
    type Request = TrafficSpec;
    fn get(service: &PolicyService, req: TrafficSpec) -> Result<Bytes, Status> {
        service.get(req)
    }
    fn watch(service: &PolicyService, req: TrafficSpec) -> Result<Answers, Status> {
        service.watch(req)
    }
}

impl PolicyApi for Inbound {
    const NAME: &'static str = "io.linkerd.proxy.inbound.InboundServerPolicies";
    const GET: &'static str = "/io.linkerd.proxy.inbound.InboundServerPolicies/GetPort";
    const WATCH: &'static str = "/io.linkerd.proxy.inbound.InboundServerPolicies/WatchPort";
    type Request = PortSpec;
    fn get(service: &PolicyService, req: PortSpec) -> Result<Bytes, Status> {
        service.get_port(&req)
    }
    fn watch(service: &PolicyService, req: PortSpec) -> Result<Answers, Status> {
        service.watch_port(&req)
    }
}

/// One policy API as a tower service for tonic's router.
pub struct PolicyGrpc<A> {
    service: PolicyService,
    api: PhantomData<fn() -> A>,
}

/// Linkerd's `OutboundPolicies` for tonic's router.
pub type OutboundGrpc = PolicyGrpc<Outbound>;
/// Linkerd's `InboundServerPolicies` for tonic's router.
pub type InboundGrpc = PolicyGrpc<Inbound>;

impl<A> PolicyGrpc<A> {
    pub fn new(service: PolicyService) -> Self {
        Self {
            service,
            api: PhantomData,
        }
    }
}

impl<A> Clone for PolicyGrpc<A> {
    fn clone(&self) -> Self {
        Self::new(self.service.clone())
    }
}

impl<A: PolicyApi> NamedService for PolicyGrpc<A> {
    const NAME: &'static str = A::NAME;
}

impl<A: PolicyApi> tower::Service<http::Request<tonic::body::Body>> for PolicyGrpc<A> {
    type Response = http::Response<ResponseBody>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let path = req.uri().path();
        let watch = if path == A::WATCH {
            true
        } else if path == A::GET {
            false
        } else {
            return Box::pin(async { Ok(Status::unimplemented("no such method").into_http()) });
        };
        let service = self.service.clone();
        Box::pin(async move {
            let spec: A::Request = match decode(req, service.max_request_bytes()).await {
                Ok(spec) => spec,
                Err(status) => return Ok(status.into_http()),
            };
            Ok(if watch {
                answer_stream(A::watch(&service, spec))
            } else {
                answer_once(A::get(&service, spec))
            })
        })
    }
}

fn answer_once(answer: Result<Bytes, Status>) -> http::Response<ResponseBody> {
    match answer {
        Ok(frame) => grpc_response(ResponseBody::Boxed(tonic::body::Body::new(FrameBody {
            stream: futures_util::stream::iter(Some(Ok(frame))),
            ended: false,
        }))),
        Err(status) => status.into_http(),
    }
}

fn answer_stream(stream: Result<Answers, Status>) -> http::Response<ResponseBody> {
    match stream {
        Ok(stream) => grpc_response(ResponseBody::Policy(FrameBody {
            stream,
            ended: false,
        })),
        Err(status) => status.into_http(),
    }
}

/// A response body of shared frames, then the status as trailers: the
/// stream's error if it ended with one, else OK.
pub struct FrameBody<S = Answers> {
    stream: S,
    ended: bool,
}

impl<S> http_body::Body for FrameBody<S>
where
    S: Stream<Item = Result<Bytes, Status>> + Unpin,
{
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.ended {
            return Poll::Ready(None);
        }
        let status = match Pin::new(&mut self.stream).poll_next(cx) {
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
