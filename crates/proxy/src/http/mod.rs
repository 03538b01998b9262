//! HTTP proxying, per request: choose an endpoint through the target's
//! balancer, send the request on a pooled connection of the same protocol
//! version, stream the response back. Bodies are streamed, never collected;
//! trailers (gRPC's status) pass through.

mod body;
mod conns;
pub mod framing;
pub mod metrics;
pub mod orig_proto;
mod request_body;
pub mod server;

pub use body::{grpc_status, BodyEnd, BodyError, BodyTimeout, EndHook, ResponseBody};
pub use conns::{EndpointConns, PoolConfig};
pub use request_body::{Replay, ReplayBody, RequestBody};

use crate::{
    balance::{BalanceError, Balancer, EndpointState, InFlight, MAX_CONNECT_ATTEMPTS},
    connect::ConnectError,
    metrics::{Direction, Metrics, Peer, TcpMetrics},
};
use body::Done;
use bytes::Bytes;
use http::{
    header, HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode, Uri, Version,
};
use hyper::body::Incoming;
use std::sync::Arc;
use tokio::time::Instant;

/// The header naming why the proxy itself answered (Linkerd's name). A
/// `HeaderName`, not a `&str`: looking a name up by string parses it
/// first, on every response.
pub const PROXY_ERROR_HEADER: HeaderName = HeaderName::from_static("l5d-proxy-error");

/// A response made by the proxy, naming the reason.
pub fn error_response(status: StatusCode, reason: &str) -> Response<ResponseBody> {
    let mut rsp = Response::new(ResponseBody::full(Bytes::from(format!("{reason}\n"))));
    *rsp.status_mut() = status;
    let headers = rsp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(reason) {
        headers.insert(PROXY_ERROR_HEADER, v);
    }
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    rsp
}

/// Why a request's host cannot be trusted, if it cannot: more than one
/// `Host` line (RFC 9112 section 3.2), or a `Host` naming another host or
/// port than the request target's authority (an absolute-form target, or
/// HTTP/2's `:authority`). A hop that read the other value would send the
/// request elsewhere than this proxy routes it, so it is answered 400 where
/// RFC 9112 would let a proxy replace `Host`.
pub fn conflicting_host<B>(req: &Request<B>) -> Option<&'static str> {
    let mut hosts = req.headers().get_all(header::HOST).iter();
    let host = hosts.next()?;
    if hosts.next().is_some() {
        return Some("duplicate_host");
    }
    let authority = req.uri().authority()?;
    let default_port = if req.uri().scheme() == Some(&http::uri::Scheme::HTTPS) {
        443
    } else {
        80
    };
    let same = host
        .to_str()
        .ok()
        .and_then(|h| h.parse::<http::uri::Authority>().ok())
        .is_some_and(|h| {
            h.host().eq_ignore_ascii_case(authority.host())
                && h.port_u16().unwrap_or(default_port)
                    == authority.port_u16().unwrap_or(default_port)
        });
    (!same).then_some("host_mismatch")
}

/// The balancer of an HTTP target.
pub type HttpBalancer = Balancer<EndpointConns>;
type Endpoint = EndpointState<EndpointConns>;

/// How the request named its target, which decides the answer when the
/// controller says there is no such service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Naming {
    /// A full service name, an address, or a route fixed by the connection.
    Exact,
    /// `NAME.NS`: as likely a name outside the mesh (`example.com`) as a
    /// service; if the mesh has no such service, it was not for the mesh.
    Short,
}

fn balance_error_response(
    e: &BalanceError,
    naming: Naming,
    metrics: &Metrics,
    direction: Direction,
) -> Response<ResponseBody> {
    let (status, reason) = match (e, naming) {
        (BalanceError::NotFound, Naming::Short) => {
            (StatusCode::BAD_REQUEST, "not_a_mesh_authority")
        }
        (BalanceError::Failfast | BalanceError::QueueFull | BalanceError::NotFound, _) => {
            (StatusCode::SERVICE_UNAVAILABLE, e.reason())
        }
        (BalanceError::Loop | BalanceError::Invalid(_), _) => (StatusCode::BAD_GATEWAY, e.reason()),
    };
    if *e == BalanceError::NotFound {
        metrics.error(direction, reason);
    }
    error_response(status, reason)
}

/// An HTTP/1 message's head as it goes on to the next hop, in either
/// version: hyper read its body by Transfer-Encoding, which overrides a
/// Content-Length (RFC 9112 section 6.3), so that length is not the body's
/// and is not forwarded with it; and this hop's headers stay here.
pub fn forwarded_h1_head(headers: &mut HeaderMap) {
    if headers.contains_key(header::TRANSFER_ENCODING) {
        headers.remove(header::CONTENT_LENGTH);
    }
    strip_hop_by_hop(headers);
}

/// An HTTP/1 request as it goes on: [`forwarded_h1_head`], and an
/// origin-form target (endpoints get those; the Host header stays).
pub fn forwarded_h1_request<B>(req: &mut Request<B>) {
    forwarded_h1_head(req.headers_mut());
    if req.uri().authority().is_some() {
        if let Some(pq) = req.uri().path_and_query().cloned() {
            if let Ok(uri) = Uri::builder().path_and_query(pq).build() {
                *req.uri_mut() = uri;
            }
        }
    }
}

/// Headers that belong to one HTTP/1 hop and must not be forwarded.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // One pass over the names, comparing enum tags for standard names; no
    // hashing, lookups or removals for a name that is not there.
    let mut present = [false; HOP_BY_HOP.len()];
    for name in headers.keys() {
        if let Some(i) = hop_by_hop_index(name.as_str()) {
            present[i] = true;
        }
    }
    if present[0] {
        if let header::Entry::Occupied(connection) = headers.entry(header::CONNECTION) {
            let (_, mut values) = connection.remove_entry_mult();
            // Usually one value: the rest collect into no allocation.
            let first = values.next();
            let rest: Vec<HeaderValue> = values.collect();
            // Split the raw bytes: one byte that is not visible ASCII must not
            // hide the other names in the value.
            for token in first
                .iter()
                .chain(&rest)
                .flat_map(|v| v.as_bytes().split(|&b| b == b','))
                .map(<[u8]>::trim_ascii)
            {
                // `keep-alive` is on the list below. (`close` is looked up
                // too: a header of that name would be this hop's.)
                if token.is_empty() || token.eq_ignore_ascii_case(b"keep-alive") {
                    continue;
                }
                if let Ok(name) = HeaderName::from_bytes(token) {
                    headers.remove(name);
                }
            }
        }
    }
    for (name, _) in HOP_BY_HOP.iter().zip(present).skip(1).filter(|(_, p)| *p) {
        headers.remove(name);
    }
}

/// Where `name` is in [`HOP_BY_HOP`]: a match on the name's text, which
/// compiles to length and byte comparisons.
fn hop_by_hop_index(name: &str) -> Option<usize> {
    Some(match name {
        "connection" => 0,
        "transfer-encoding" => 1,
        "upgrade" => 2,
        "proxy-authorization" => 3,
        "te" => 4,
        "keep-alive" => 5,
        "proxy-connection" => 6,
        _ => return None,
    })
}

/// Headers that belong to one hop whatever `Connection` says; `Connection`
/// first.
static HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_must_be_single_and_agree_with_the_targets_authority() {
        let req = |uri: &str, hosts: &[&str]| {
            let mut b = Request::get(uri);
            for h in hosts {
                b = b.header(header::HOST, *h);
            }
            b.body(()).unwrap()
        };
        let cases = [
            (req("/", &["web"]), None),
            (req("/", &[]), None),
            (req("http://web/", &[]), None),
            (req("http://web/", &["WEB:80"]), None),
            (req("https://web/", &["web:443"]), None),
            (req("http://web:8080/", &["web:8080"]), None),
            (req("/", &["web", "web"]), Some("duplicate_host")),
            (req("http://web/", &["other"]), Some("host_mismatch")),
            (req("http://web/", &["web:8080"]), Some("host_mismatch")),
            (req("http://web/", &["web/x"]), Some("host_mismatch")),
        ];
        for (r, want) in cases {
            assert_eq!(conflicting_host(&r), want, "{r:?}");
        }
    }

    #[test]
    fn headers_named_by_connection_are_stripped_whatever_else_the_value_holds() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONNECTION,
            HeaderValue::from_bytes(b"keep-\x9f\x97ive, x-trace ,\tx-other").expect("value"),
        );
        headers.insert("x-trace", HeaderValue::from_static("1"));
        headers.insert("x-other", HeaderValue::from_static("2"));
        headers.insert("x-kept", HeaderValue::from_static("3"));
        headers.insert(header::TE, HeaderValue::from_static("trailers"));
        strip_hop_by_hop(&mut headers);
        let left: Vec<&str> = headers.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, ["x-kept"]);
    }

    #[test]
    fn the_index_matches_the_table() {
        for (i, name) in HOP_BY_HOP.iter().enumerate() {
            assert_eq!(hop_by_hop_index(name.as_str()), Some(i));
        }
        assert_eq!(hop_by_hop_index("host"), None);
    }

    #[test]
    fn messages_without_hop_by_hop_headers_are_left_alone_and_others_lose_only_those() {
        let mut plain = HeaderMap::new();
        plain.insert(header::HOST, HeaderValue::from_static("web"));
        plain.insert("x-keep-alive-ish", HeaderValue::from_static("1"));
        let before = plain.clone();
        strip_hop_by_hop(&mut plain);
        assert_eq!(plain, before);

        let mut rsp = HeaderMap::new();
        rsp.insert(header::CONNECTION, HeaderValue::from_static("Keep-Alive"));
        rsp.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        rsp.insert(header::CONTENT_LENGTH, HeaderValue::from_static("1024"));
        rsp.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        strip_hop_by_hop(&mut rsp);
        let left: Vec<&str> = rsp.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, ["content-length"]);
    }

    #[test]
    fn a_header_named_by_a_connection_token_goes_even_when_the_token_is_close() {
        // Found by fuzzing: `close` was skipped as a connection option.
        let mut headers = HeaderMap::new();
        headers.append(header::CONNECTION, HeaderValue::from_static("close"));
        headers.append(header::CONNECTION, HeaderValue::from_static("x-j"));
        headers.insert("close", HeaderValue::from_static("2"));
        headers.insert("x-b", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut headers);
        let left: Vec<&str> = headers.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, ["x-b"]);
    }
}

/// One try on one endpoint.
enum Attempt {
    Sent(Response<ResponseBody>),
    /// Not sent: the request, and the connect error if there was one.
    Unsent(Request<RequestBody>, Option<ConnectError>),
}

/// Shared by every request of every connection on one side of the proxy.
#[derive(Debug)]
pub struct Forwarder {
    pub pool: Arc<PoolConfig>,
    /// How endpoint connections are opened (mutual TLS to meshed ones).
    pub dialer: crate::connect::Dialer,
    pub metrics: Arc<Metrics>,
    pub direction: Direction,
}

impl Forwarder {
    /// Proxies one request to an endpoint of `balancer`. A request is only
    /// ever sent once; a failed connect or a pooled connection found closed
    /// before sending is retried on another choice until the failfast
    /// deadline.
    pub async fn forward(
        &self,
        balancer: &HttpBalancer,
        req: Request<Incoming>,
        naming: Naming,
    ) -> Response<ResponseBody> {
        self.forward_body(balancer, req.map(RequestBody::from), naming)
            .await
    }

    /// [`Forwarder::forward`] for a request whose body may be a replay.
    pub async fn forward_body(
        &self,
        balancer: &HttpBalancer,
        mut req: Request<RequestBody>,
        naming: Naming,
    ) -> Response<ResponseBody> {
        let deadline = Instant::now() + balancer.failfast_timeout();
        let h2 = req.version() == Version::HTTP_2;
        // HTTP/1 to a meshed proxy that takes HTTP/2 travels upgraded
        // (Linkerd's l5d-orig-proto), unless it asks for a protocol upgrade.
        let upgradable = !h2
            && self.dialer.mesh.is_some()
            && req.method() != http::Method::CONNECT
            && !req.headers().contains_key(header::UPGRADE);
        if !h2 {
            forwarded_h1_request(&mut req);
        }
        let mut failed_connects = 0;
        loop {
            let endpoint = match balancer.select(deadline).await {
                Ok(e) => e,
                Err(e) => return balance_error_response(&e, naming, &self.metrics, self.direction),
            };
            let upgrade =
                upgradable && endpoint.endpoint.h2_hint && endpoint.endpoint.identity.is_some();
            let orig = if upgrade {
                orig_proto::upgrade(&mut req)
            } else {
                None
            };
            match self
                .send(&endpoint, req, h2 || orig.is_some(), deadline)
                .await
            {
                Attempt::Sent(mut rsp) => {
                    if let Some(version) = orig {
                        orig_proto::restore(&mut rsp, version);
                    }
                    return rsp;
                }
                Attempt::Unsent(mut returned, connect_error) => {
                    if let Some(version) = orig {
                        orig_proto::undo(&mut returned, version);
                    }
                    if let Some(e) = connect_error {
                        tracing::debug!(error = %e, "endpoint connect failed");
                        endpoint.connect_failed();
                        self.metrics.error(self.direction, "connect");
                        failed_connects += 1;
                    }
                    req = returned;
                    if Instant::now() >= deadline || failed_connects >= MAX_CONNECT_ATTEMPTS {
                        return error_response(StatusCode::BAD_GATEWAY, "connect");
                    }
                }
            }
        }
    }

    /// Sends on one endpoint. Gives the request back when it was not sent.
    async fn send(
        &self,
        endpoint: &Arc<Endpoint>,
        req: Request<RequestBody>,
        h2: bool,
        deadline: Instant,
    ) -> Attempt {
        let addr = endpoint.endpoint.addr;
        let metrics = endpoint.conns.metrics(&endpoint.labels);
        // Endpoint connections count like TCP forwarding's (`peer="dst"`).
        let tcp = |tls| TcpMetrics::open(&self.metrics, Peer::dst, endpoint.labels.clone(), tls);
        let dial = (&self.dialer, &endpoint.endpoint);
        if h2 {
            // The shared connection, when open; connecting (boxed: the rare
            // state of a request's future) otherwise.
            let open = endpoint.conns.open_h2();
            let connected = match open {
                Some(s) => Ok(s),
                None => Box::pin(endpoint.conns.h2(dial, &self.pool, deadline, tcp)).await,
            };
            let mut sender = match connected {
                Ok(s) => s,
                Err(e) => return Attempt::Unsent(req, Some(e)),
            };
            endpoint.connect_succeeded();
            metrics.request();
            let tap = self.tap(&req, endpoint);
            let in_flight = endpoint.start();
            return Attempt::Sent(match sender.try_send_request(req).await {
                Ok(rsp) => self.respond(rsp, endpoint, in_flight, None, true, tap),
                Err(mut e) => match e.take_message() {
                    Some(req) => return Attempt::Unsent(req, None),
                    None => self.upstream_failed(endpoint, e.into_error()),
                },
            });
        }
        let (mut sender, fresh) = match endpoint.conns.take_h1(&self.pool) {
            Some(s) => (s, false),
            // Boxed: a request future is moved whole, and is sized for its
            // largest state; connecting is the rare one.
            None => {
                match Box::pin(endpoint.conns.connect_h1(dial, &self.pool, deadline, tcp)).await {
                    Ok((s, fresh)) => {
                        if fresh {
                            endpoint.connect_succeeded();
                        }
                        (s, fresh)
                    }
                    Err(ConnectError::Exhausted(_)) => {
                        self.metrics
                            .error(self.direction, "max_connections_per_endpoint");
                        return Attempt::Sent(error_response(
                            StatusCode::SERVICE_UNAVAILABLE,
                            "max_connections_per_endpoint",
                        ));
                    }
                    Err(e) => return Attempt::Unsent(req, Some(e)),
                }
            }
        };
        // A pooled connection may have closed while idle; a new one that
        // closes at once counts against the endpoint. Either way nothing
        // was sent, so the request may go elsewhere.
        let unsent = |req| Attempt::Unsent(req, fresh.then_some(ConnectError::Closed(addr)));
        if sender.ready().await.is_err() {
            return unsent(req);
        }
        metrics.request();
        let tap = self.tap(&req, endpoint);
        let in_flight = endpoint.start();
        match sender.try_send_request(req).await {
            Ok(rsp) => {
                Attempt::Sent(self.respond(rsp, endpoint, in_flight, Some(sender), !fresh, tap))
            }
            Err(mut e) => match e.take_message() {
                Some(req) => unsent(req),
                None => Attempt::Sent(self.upstream_failed(endpoint, e.into_error())),
            },
        }
    }

    fn respond(
        &self,
        rsp: Response<Incoming>,
        endpoint: &Arc<Endpoint>,
        in_flight: InFlight<EndpointConns>,
        h1: Option<hyper::client::conn::http1::SendRequest<RequestBody>>,
        // The first exchange on a new connection pays for its setup at the
        // endpoint too; one such sample would mark the endpoint slow for
        // seconds (peak-EWMA), so only settled connections are measured.
        measure: bool,
        tap: Option<Box<crate::tap::RequestTap>>,
    ) -> Response<ResponseBody> {
        let rtt = if measure {
            in_flight.observe()
        } else {
            in_flight.elapsed()
        };
        endpoint.conns.metrics(&endpoint.labels).latency(rtt);
        let (mut parts, incoming) = rsp.into_parts();
        if h1.is_some() {
            forwarded_h1_head(&mut parts.headers);
        }
        // gRPC runs over HTTP/2 only: an HTTP/1 response has no status to read.
        let grpc_status = if h1.is_some() {
            None
        } else {
            body::grpc_status(&parts.headers)
        };
        let done = Done::new(
            endpoint.clone(),
            parts.status.as_u16(),
            grpc_status,
            h1.map(|s| (s, self.pool.clone())),
            in_flight,
        );
        let mut body = ResponseBody::upstream(incoming, done);
        if let Some(tap) = tap {
            body.tap(tap.response(&parts));
        }
        Response::from_parts(parts, body)
    }

    /// The request's taps, if it is tapped (taps are open and one matches
    /// it); dropped without a response, it still ends its events.
    fn tap(
        &self,
        req: &Request<RequestBody>,
        endpoint: &Endpoint,
    ) -> Option<Box<crate::tap::RequestTap>> {
        let meshed = self.dialer.mesh.is_some();
        crate::tap::request(req, &endpoint.endpoint, &endpoint.labels, meshed)
    }

    fn upstream_failed(&self, endpoint: &Arc<Endpoint>, e: hyper::Error) -> Response<ResponseBody> {
        tracing::debug!(addr = %endpoint.endpoint.addr, error = %e, "endpoint request failed");
        if framing::MalformedChunk::caused(&e) {
            // The client's body failed, not the endpoint: no failure
            // accrual. (The HTTP/1 server answers it so on every path.)
            self.metrics.error(self.direction, "malformed_chunk");
            return framing::refused_response();
        }
        endpoint.response_ended(false);
        endpoint
            .conns
            .metrics(&endpoint.labels)
            .response(502, None, "failure");
        self.metrics.error(self.direction, "upstream");
        error_response(StatusCode::BAD_GATEWAY, "upstream")
    }
}
