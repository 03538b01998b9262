//! The Destination service's gRPC routes, written out so that a stream's
//! response body hands out shared, already-encoded frames (tonic's
//! generated server would encode every message again for every stream, in a
//! buffer of its own per stream).

use super::{DestinationService, StreamBody};
use crate::index::{EndpointSet, ProfileView};
use bytes::Bytes;
use http::{header::CONTENT_TYPE, HeaderValue};
use http_body::{Body, Frame, SizeHint};
use linkerd2_proxy_api::destination::GetDestination;
use std::{
    convert::Infallible,
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};
use tonic::{codec::Streaming, server::NamedService, Status};

const GET: &str = "/io.linkerd.proxy.destination.Destination/Get";
const GET_PROFILE: &str = "/io.linkerd.proxy.destination.Destination/GetProfile";
/// Room to decode a request; a `GetDestination` is a path and a token, a
/// policy request a target and a workload.
const REQUEST_BUFFER_BYTES: usize = 1024;

/// Linkerd's Destination API (`Get`, `GetProfile`) as a tower service for
/// tonic's router.
#[derive(Clone)]
pub struct DestinationGrpc {
    service: DestinationService,
}

impl DestinationGrpc {
    pub fn new(service: DestinationService) -> Self {
        Self { service }
    }
}

impl NamedService for DestinationGrpc {
    const NAME: &'static str = "io.linkerd.proxy.destination.Destination";
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = Result<T, Infallible>> + Send>>;

impl tower::Service<http::Request<tonic::body::Body>> for DestinationGrpc {
    type Response = http::Response<ResponseBody>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let profile = match req.uri().path() {
            GET => false,
            GET_PROFILE => true,
            _ => {
                return Box::pin(async { Ok(Status::unimplemented("no such method").into_http()) })
            }
        };
        let service = self.service.clone();
        Box::pin(async move {
            let max = service.config.max_request_bytes;
            let request: GetDestination = match decode(req, max).await {
                Ok(r) => r,
                Err(status) => return Ok(status.into_http()),
            };
            let opened = if profile {
                service
                    .get_profile(&request)
                    .map(|body| grpc_response(ResponseBody::Profile(body)))
            } else {
                service
                    .get(&request)
                    .map(|body| grpc_response(ResponseBody::Endpoints(body)))
            };
            Ok(opened.unwrap_or_else(|status| status.into_http()))
        })
    }
}

/// The one request message of a call (unary or server-streaming).
pub(crate) async fn decode<M: prost::Message + Default + Send + 'static>(
    req: http::Request<tonic::body::Body>,
    max_request_bytes: usize,
) -> Result<M, Status> {
    let decoder = tonic_prost::ProstDecoder::<M>::new(tonic::codec::BufferSettings::new(
        REQUEST_BUFFER_BYTES,
        REQUEST_BUFFER_BYTES,
    ));
    // No compression is offered: a compressed request is refused by the
    // decoder, by name.
    let mut stream =
        Streaming::new_request(decoder, req.into_body(), None, Some(max_request_bytes));
    stream
        .message()
        .await?
        .ok_or_else(|| Status::invalid_argument("missing request message"))
}

/// A gRPC response around `body` (its messages and trailers).
pub(crate) fn grpc_response(body: ResponseBody) -> http::Response<ResponseBody> {
    let mut res = http::Response::new(body);
    res.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    res
}

/// A response body of the controller's routes. The bodies of the streams
/// a change reaches are held inline (in the connection's set of streams,
/// `crate::h2`): a fan-out polls each of them once, and tonic's body
/// would add a box, a call through a vtable and an error mapping to every
/// poll. Anything else (errors, unary answers, health) is tonic's.
pub enum ResponseBody {
    Endpoints(StreamBody<EndpointSet>),
    Profile(StreamBody<ProfileView>),
    Policy(crate::policy::grpc::FrameBody),
    Boxed(tonic::body::Body),
}

impl Default for ResponseBody {
    /// An empty body: a response that is its headers (a gRPC error).
    fn default() -> Self {
        ResponseBody::Boxed(tonic::body::Body::default())
    }
}

/// A frame of a body whose errors cannot happen, as `ResponseBody`'s.
fn infallible(
    frame: Poll<Option<Result<Frame<Bytes>, Infallible>>>,
) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
    frame.map(|f| f.map(|f| f.map_err(|never| match never {})))
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        // Every variant is `Unpin`.
        match self.get_mut() {
            ResponseBody::Endpoints(b) => infallible(Pin::new(b).poll_frame(cx)),
            ResponseBody::Profile(b) => infallible(Pin::new(b).poll_frame(cx)),
            ResponseBody::Policy(b) => infallible(Pin::new(b).poll_frame(cx)),
            ResponseBody::Boxed(b) => Pin::new(b).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ResponseBody::Endpoints(b) => b.is_end_stream(),
            ResponseBody::Profile(b) => b.is_end_stream(),
            ResponseBody::Policy(b) => b.is_end_stream(),
            ResponseBody::Boxed(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ResponseBody::Boxed(b) => b.size_hint(),
            _ => SizeHint::default(),
        }
    }
}

/// The controller's gRPC services on one connection, chosen by the
/// request path's service name as tonic's router does; any other path is
/// `UNIMPLEMENTED`.
#[derive(Clone)]
pub(crate) struct Routes<H> {
    pub health: H,
    pub destination: DestinationGrpc,
    pub outbound: Option<crate::policy::grpc::OutboundGrpc>,
    pub inbound: Option<crate::policy::grpc::InboundGrpc>,
}

type Request = http::Request<tonic::body::Body>;
type Response = http::Response<ResponseBody>;
/// tonic's health service answers with tonic's body.
type HealthResponse = http::Response<tonic::body::Body>;

impl<H> hyper::service::Service<http::Request<crate::h2::RequestBody>> for Routes<H>
where
    H: tower::Service<Request, Response = HealthResponse, Error = Infallible>
        + NamedService
        + Clone
        + Send
        + 'static,
    H::Future: Send + 'static,
{
    type Response = Response;
    type Error = Infallible;
    type Future = BoxFuture<Response>;

    fn call(&self, req: http::Request<crate::h2::RequestBody>) -> Self::Future {
        use tower::ServiceExt;
        let req = req.map(tonic::body::Body::new);
        let name = req
            .uri()
            .path()
            .strip_prefix('/')
            .and_then(|p| p.split_once('/'))
            .map(|(service, _)| service);
        use crate::policy::grpc::{InboundGrpc, OutboundGrpc};
        if name == Some(DestinationGrpc::NAME) {
            return Box::pin(self.destination.clone().oneshot(req));
        }
        if name == Some(H::NAME) {
            let answer = self.health.clone().oneshot(req);
            return Box::pin(async move { Ok(answer.await?.map(ResponseBody::Boxed)) });
        }
        if let Some(s) = (self.outbound.as_ref()).filter(|_| name == Some(OutboundGrpc::NAME)) {
            return Box::pin(s.clone().oneshot(req));
        }
        if let Some(s) = (self.inbound.as_ref()).filter(|_| name == Some(InboundGrpc::NAME)) {
            return Box::pin(s.clone().oneshot(req));
        }
        Box::pin(async { Ok(Status::unimplemented("").into_http()) })
    }
}
