//! The Destination service's gRPC routes, written out so that a stream's
//! response body hands out shared, already-encoded frames (tonic's
//! generated server would encode every message again for every stream, in a
//! buffer of its own per stream).

use super::{DestinationService, StreamBody};
use http::{header::CONTENT_TYPE, HeaderValue};
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
    type Response = http::Response<tonic::body::Body>;
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
                service.get_profile(&request).map(response)
            } else {
                service.get(&request).map(response)
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

fn response<V: PartialEq + Send + Sync + 'static>(
    body: StreamBody<V>,
) -> http::Response<tonic::body::Body> {
    grpc_response(tonic::body::Body::new(body))
}

/// A gRPC response around `body` (its messages and trailers).
pub(crate) fn grpc_response(body: tonic::body::Body) -> http::Response<tonic::body::Body> {
    let mut res = http::Response::new(body);
    res.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    res
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
type Response = http::Response<tonic::body::Body>;

impl<H> hyper::service::Service<http::Request<crate::h2::RequestBody>> for Routes<H>
where
    H: tower::Service<Request, Response = Response, Error = Infallible>
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
            return Box::pin(self.health.clone().oneshot(req));
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
