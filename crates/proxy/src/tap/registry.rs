//! The open taps as the request path sees them, and the events of tapped
//! requests.
//!
//! - Per connection ([`Taps::connection`]): the client's address and TLS,
//!   read once when the proxy has a tap listener.
//! - Per request, in the pipeline ([`ConnTap::tapping`]): one atomic load of
//!   the open-tap count; only while taps are open does the request carry a
//!   [`Tapping`] extension (the taps open at its start and its client).
//! - When the request is sent to an endpoint ([`request`]): each tap's match
//!   is evaluated once, with the endpoint's address and labels; a matching
//!   request takes its three events' tokens from the tap's bucket, a slot of
//!   its `limit`, and queues `RequestInit`. Its [`RequestTap`] then emits
//!   `ResponseInit` ([`RequestTap::response`]) and, through the response
//!   body, `ResponseEnd` ([`ResponseTap`]).
//!
//! Events go to each tap's bounded queue with `try_send`: a full queue drops
//! the event (counted), so a client that does not read never slows the data
//! path or grows memory.

use super::{
    bucket::TokenBucket,
    event::{self, EventLimits},
    matcher::{Inspect, Match},
};
use crate::{
    config::TapConfig,
    discovery::Endpoint,
    http::grpc_status,
    metrics::{Direction, DstLabels, TlsLabels},
};
use arc_swap::ArcSwapOption;
use bytes::Bytes;
use http::{HeaderMap, Request};
use http_body::Frame;
use linkerd2_proxy_api::{
    net::TcpAddress,
    tap::{
        eos,
        tap_event::{self, http as ev, ProxyDirection},
        Eos, TapEvent,
    },
};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry as Prometheus,
};
use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};
use tokio::{
    sync::mpsc::{self, error::TrySendError},
    time::Instant,
};

/// The events of one tapped request: request init, response init, response
/// end. Its tokens are taken together, so a client sees whole requests.
pub const EVENTS_PER_REQUEST: u32 = 3;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}

/// The Tap API's metrics (Linkerd-like names).
#[derive(Clone, Debug, Default)]
pub struct TapMetrics {
    pub open: Gauge,
    pub events: Counter,
    /// `rate` (over `--tap-max-events-per-second`) or `queue` (the client's
    /// queue was full).
    pub dropped: Family<ReasonLabels, Counter>,
    /// `limit` (`--tap-max-taps` open), `unauthorized`, `invalid`.
    pub refused: Family<ReasonLabels, Counter>,
}

impl TapMetrics {
    pub fn register(&self, r: &mut Prometheus) {
        r.register(
            "tap_observations_open",
            "Taps open (bounded by --tap-max-taps)",
            self.open.clone(),
        );
        r.register(
            "tap_events",
            "Tap events queued for tap clients",
            self.events.clone(),
        );
        r.register(
            "tap_events_dropped",
            "Tap events dropped: over --tap-max-events-per-second (rate), or the client's queue of --tap-queue-capacity was full (queue)",
            self.dropped.clone(),
        );
        r.register(
            "tap_observations_refused",
            "Taps refused: --tap-max-taps open (limit), a client that is not --tap-client-identity (unauthorized), a bad request (invalid)",
            self.refused.clone(),
        );
    }

    fn dropped(&self, reason: &'static str, n: u64) {
        self.dropped
            .get_or_create(&ReasonLabels { reason })
            .inc_by(n);
    }

    pub fn refused(&self, reason: &'static str) {
        self.refused.get_or_create(&ReasonLabels { reason }).inc();
    }
}

/// The taps of one proxy; disabled (and free) without a tap listener.
#[derive(Clone, Debug, Default)]
pub struct Taps(Option<Arc<Registry>>);

/// Why a tap was not opened.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Refused {
    #[error("{0} taps are open, the most this proxy allows (--tap-max-taps)")]
    TooMany(usize),
}

impl Taps {
    pub fn disabled() -> Self {
        Self(None)
    }

    pub fn new(config: &TapConfig, metrics: TapMetrics) -> Self {
        let seed: u32 = rand::random();
        Self(Some(Arc::new(Registry {
            open: AtomicUsize::new(0),
            snapshot: ArcSwapOption::empty(),
            taps: Mutex::new(Vec::new()),
            max_taps: config.max_taps.max(1),
            max_requests_per_tap: config.max_requests_per_tap.max(1),
            rate: config.max_events_per_second.max(1),
            queue_capacity: config.queue_capacity.max(1),
            limits: EventLimits::new(config.max_event_bytes),
            metrics: Arc::new(metrics),
            next_base: AtomicU32::new(seed),
        })))
    }

    pub fn enabled(&self) -> bool {
        self.0.is_some()
    }

    pub(super) fn registry(&self) -> Option<&Arc<Registry>> {
        self.0.as_ref()
    }

    /// What a connection's requests carry to taps: its client's address and
    /// TLS. `None` without a tap listener.
    pub fn connection(
        &self,
        peer: Option<SocketAddr>,
        direction: Direction,
        tls: TlsLabels,
    ) -> Option<ConnTap> {
        let registry = self.0.clone()?;
        Some(ConnTap {
            registry,
            source: Arc::new(Source {
                addr: peer.map(|a| SocketAddr::new(a.ip().to_canonical(), a.port())),
                direction,
                tls,
            }),
        })
    }
}

/// A request's client.
#[derive(Debug)]
struct Source {
    addr: Option<SocketAddr>,
    direction: Direction,
    tls: TlsLabels,
}

/// A connection's side of tapping.
#[derive(Clone, Debug)]
pub struct ConnTap {
    registry: Arc<Registry>,
    source: Arc<Source>,
}

impl ConnTap {
    /// The taps open now, for a new request: one atomic load when none is.
    #[inline]
    pub fn tapping(&self) -> Option<Tapping> {
        if self.registry.open.load(Ordering::Relaxed) == 0 {
            return None;
        }
        self.tapping_slow()
    }

    #[cold]
    fn tapping_slow(&self) -> Option<Tapping> {
        let taps = self.registry.snapshot.load_full()?;
        Some(Tapping(Arc::new(TappingInner {
            taps,
            source: self.source.clone(),
            limits: self.registry.limits,
        })))
    }
}

/// A request extension: the taps open when the request started, and its
/// client.
#[derive(Clone, Debug)]
pub struct Tapping(Arc<TappingInner>);

#[derive(Debug)]
struct TappingInner {
    taps: Arc<Vec<Arc<Tap>>>,
    source: Arc<Source>,
    limits: EventLimits,
}

/// The request being sent to `endpoint` (of a target labelled `labels`),
/// tapped if it carries [`Tapping`] and a tap matches it. Without taps this
/// is one look into the request's (empty) extensions.
#[inline]
pub fn request<B>(
    req: &Request<B>,
    endpoint: &Endpoint,
    labels: &DstLabels,
    meshed: bool,
) -> Option<Box<RequestTap>> {
    let t = req.extensions().get::<Tapping>()?;
    t.0.start(req, endpoint, labels, meshed)
}

/// The destination's TLS as the dialer decides it (see `connect::Dialer`).
fn dst_tls(direction: Direction, meshed: bool, endpoint: &Endpoint) -> TlsLabels {
    match (meshed, &endpoint.identity) {
        (true, Some(id)) => TlsLabels::ServerId(Arc::from(id.as_str())),
        (true, None) => TlsLabels::NoIdentity("not_provided_by_service_discovery"),
        (false, _) => match direction {
            Direction::inbound => TlsLabels::NoIdentity("loopback"),
            Direction::outbound => TlsLabels::Disabled,
        },
    }
}

fn authority_of<B>(req: &Request<B>) -> Option<&str> {
    req.uri().authority().map(|a| a.as_str()).or_else(|| {
        req.headers()
            .get(http::header::HOST)
            .and_then(|h| h.to_str().ok())
    })
}

impl TappingInner {
    #[cold]
    fn start<B>(
        &self,
        req: &Request<B>,
        endpoint: &Endpoint,
        labels: &DstLabels,
        meshed: bool,
    ) -> Option<Box<RequestTap>> {
        let now = Instant::now();
        let direction = self.source.direction;
        // Inbound, the endpoint is the workload on loopback; the request
        // was addressed to this pod (the original destination).
        let dst = match direction {
            Direction::inbound => labels.authority.parse().unwrap_or(endpoint.addr),
            Direction::outbound => endpoint.addr,
        };
        let dst_labels = event::dst_labels(labels);
        let authority = authority_of(req);
        let inspect = Inspect {
            src: self.source.addr,
            dst: Some(dst),
            dst_labels: &dst_labels,
            method: req.method(),
            scheme: req.uri().scheme_str(),
            authority,
            path: req.uri().path(),
        };
        let mut base: Option<TapEvent> = None;
        let mut init: Option<ev::RequestInit> = None;
        let mut headers: Option<linkerd2_proxy_api::http_types::Headers> = None;
        let mut taps = Vec::new();
        for tap in self.taps.iter() {
            if !tap.matcher.matches(&inspect) {
                continue;
            }
            let Some(id) = tap.admit(now) else {
                continue;
            };
            let base = base.get_or_insert_with(|| TapEvent {
                source: self.source.addr.map(TcpAddress::from),
                source_meta: Some(event::meta(&[], &self.source.tls)),
                route_meta: None,
                destination: Some(TcpAddress::from(dst)),
                destination_meta: Some(event::meta(
                    &dst_labels,
                    &dst_tls(direction, meshed, endpoint),
                )),
                proxy_direction: match direction {
                    Direction::inbound => ProxyDirection::Inbound,
                    Direction::outbound => ProxyDirection::Outbound,
                } as i32,
                event: None,
            });
            let mut init = init
                .get_or_insert_with(|| ev::RequestInit {
                    id: None,
                    method: Some(event::method(req.method(), &self.limits)),
                    scheme: req.uri().scheme().map(event::scheme),
                    authority: event::cut(authority.unwrap_or(""), self.limits.authority),
                    path: event::cut(req.uri().path(), self.limits.path),
                    headers: None,
                })
                .clone();
            init.id = Some(id);
            if tap.headers {
                init.headers = Some(
                    headers
                        .get_or_insert_with(|| request_headers(req, authority, &self.limits))
                        .clone(),
                );
            }
            let sink = Sink {
                id,
                tx: tap.tx.clone(),
                metrics: tap.metrics.clone(),
                headers: tap.headers,
            };
            if sink.send(base, ev::Event::RequestInit(init)) {
                taps.push(sink);
            } else {
                // Its other events would be orphans: not sent, counted.
                tap.metrics
                    .dropped("queue", u64::from(EVENTS_PER_REQUEST - 1));
            }
        }
        if taps.is_empty() {
            return None;
        }
        Some(Box::new(RequestTap {
            started: now,
            base: base.unwrap_or_default(),
            taps,
            limits: self.limits,
        }))
    }
}

/// A request's headers, HTTP/2's pseudo-headers first (as Linkerd's tap).
fn request_headers<B>(
    req: &Request<B>,
    authority: Option<&str>,
    limits: &EventLimits,
) -> linkerd2_proxy_api::http_types::Headers {
    if req.version() == http::Version::HTTP_2 {
        let pq = req.uri().path_and_query().map_or("", |p| p.as_str());
        let pseudos = [
            (":method", req.method().as_str().as_bytes()),
            (":scheme", req.uri().scheme_str().unwrap_or("").as_bytes()),
            (":authority", authority.unwrap_or("").as_bytes()),
            (":path", pq.as_bytes()),
        ];
        event::headers(pseudos, req.headers(), limits)
    } else {
        event::headers([], req.headers(), limits)
    }
}

/// One tap's stream of events for one request.
#[derive(Debug)]
struct Sink {
    id: ev::StreamId,
    tx: mpsc::Sender<TapEvent>,
    metrics: Arc<TapMetrics>,
    headers: bool,
}

impl Sink {
    /// Queues one event; whether it was queued.
    fn send(&self, base: &TapEvent, event: ev::Event) -> bool {
        let e = TapEvent {
            event: Some(tap_event::Event::Http(tap_event::Http {
                event: Some(event),
            })),
            ..base.clone()
        };
        match self.tx.try_send(e) {
            Ok(()) => {
                self.metrics.events.inc();
                true
            }
            Err(TrySendError::Full(_)) => {
                self.metrics.dropped("queue", 1);
                false
            }
            // The client is gone; its tap is being removed.
            Err(TrySendError::Closed(_)) => false,
        }
    }
}

fn duration(d: Duration) -> Option<prost_types::Duration> {
    prost_types::Duration::try_from(d).ok()
}

/// A tapped request until its response headers: dropped without them
/// (the endpoint failed), it ends the request's events.
#[derive(Debug)]
pub struct RequestTap {
    started: Instant,
    base: TapEvent,
    taps: Vec<Sink>,
    limits: EventLimits,
}

impl RequestTap {
    /// The response headers arrived: `ResponseInit`, and what follows the
    /// body to its end.
    pub fn response(mut self: Box<Self>, parts: &http::response::Parts) -> Box<ResponseTap> {
        let now = Instant::now();
        let since = duration(now.saturating_duration_since(self.started));
        let taps = std::mem::take(&mut self.taps);
        let mut headers = None;
        for t in &taps {
            let hs = if t.headers {
                Some(
                    headers
                        .get_or_insert_with(|| response_headers(parts, &self.limits))
                        .clone(),
                )
            } else {
                None
            };
            let init = ev::ResponseInit {
                id: Some(t.id),
                since_request_init: since,
                http_status: u32::from(parts.status.as_u16()),
                headers: hs,
            };
            t.send(&self.base, ev::Event::ResponseInit(init));
        }
        Box::new(ResponseTap {
            started: self.started,
            responded: Some(now),
            base: std::mem::take(&mut self.base),
            taps,
            limits: self.limits,
            bytes: 0,
            grpc_status: grpc_status(&parts.headers),
            reset: None,
            trailers: None,
        })
    }
}

impl Drop for RequestTap {
    fn drop(&mut self) {
        if self.taps.is_empty() {
            return;
        }
        let end = ResponseTap {
            started: self.started,
            responded: None,
            base: std::mem::take(&mut self.base),
            taps: std::mem::take(&mut self.taps),
            limits: self.limits,
            bytes: 0,
            grpc_status: None,
            reset: None,
            trailers: None,
        };
        drop(end);
    }
}

fn response_headers(
    parts: &http::response::Parts,
    limits: &EventLimits,
) -> linkerd2_proxy_api::http_types::Headers {
    if parts.version == http::Version::HTTP_2 {
        let status = parts.status.as_str().as_bytes();
        event::headers([(":status", status)], &parts.headers, limits)
    } else {
        event::headers([], &parts.headers, limits)
    }
}

/// A tapped response's body: bytes counted, gRPC status and reset read;
/// `ResponseEnd` when it is dropped (the body ended, failed, or was
/// abandoned).
#[derive(Debug)]
pub struct ResponseTap {
    started: Instant,
    responded: Option<Instant>,
    base: TapEvent,
    taps: Vec<Sink>,
    limits: EventLimits,
    bytes: u64,
    grpc_status: Option<u32>,
    /// The HTTP/2 reset code that ended the body, if one did.
    reset: Option<u32>,
    trailers: Option<HeaderMap>,
}

impl ResponseTap {
    /// One frame of the body (or its end, or its failure).
    pub fn frame(&mut self, frame: &Option<Result<Frame<Bytes>, hyper::Error>>) {
        match frame {
            Some(Ok(f)) => {
                if let Some(d) = f.data_ref() {
                    self.bytes += d.len() as u64;
                } else if let Some(t) = f.trailers_ref() {
                    if let Some(s) = grpc_status(t) {
                        self.grpc_status = Some(s);
                    }
                    if self.taps.iter().any(|t| t.headers) {
                        self.trailers = Some(t.clone());
                    }
                }
            }
            Some(Err(e)) => self.reset = reset_code(e),
            None => {}
        }
    }
}

/// The HTTP/2 reason a hyper error carries, if any.
fn reset_code(e: &hyper::Error) -> Option<u32> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(h2) = s.downcast_ref::<h2::Error>() {
            return h2.reason().map(u32::from);
        }
        source = s.source();
    }
    None
}

impl Drop for ResponseTap {
    fn drop(&mut self) {
        if self.taps.is_empty() {
            return;
        }
        let now = Instant::now();
        let end = match (self.grpc_status, self.reset) {
            (Some(code), _) => Some(eos::End::GrpcStatusCode(code)),
            (None, Some(reason)) => Some(eos::End::ResetErrorCode(reason)),
            (None, None) => None,
        };
        let trailers = self
            .trailers
            .take()
            .map(|t| event::headers([], &t, &self.limits));
        for t in &self.taps {
            let end = ev::ResponseEnd {
                id: Some(t.id),
                since_request_init: duration(now.saturating_duration_since(self.started)),
                since_response_init: self
                    .responded
                    .and_then(|r| duration(now.saturating_duration_since(r))),
                response_bytes: self.bytes,
                eos: Some(Eos { end }),
                trailers: if t.headers { trailers.clone() } else { None },
            };
            t.send(&self.base, ev::Event::ResponseEnd(end));
        }
    }
}

/// One open tap.
#[derive(Debug)]
pub(super) struct Tap {
    base: u32,
    matcher: Match,
    limit: u64,
    count: AtomicU64,
    headers: bool,
    bucket: Mutex<TokenBucket>,
    /// The tap's own sender; dropped with the tap (at its limit, or when
    /// its client goes), after which the stream ends once the requests in
    /// flight have sent their last events.
    tx: mpsc::Sender<TapEvent>,
    metrics: Arc<TapMetrics>,
    registry: std::sync::Weak<Registry>,
}

impl Tap {
    /// Whether a matching request is tapped: its three events' tokens, and
    /// a slot of the limit; the last slot removes the tap.
    fn admit(&self, now: Instant) -> Option<ev::StreamId> {
        if self.count.load(Ordering::Relaxed) >= self.limit {
            return None;
        }
        let tokens = self
            .bucket
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .try_take(EVENTS_PER_REQUEST, now);
        if !tokens {
            self.metrics.dropped("rate", u64::from(EVENTS_PER_REQUEST));
            return None;
        }
        let n = self.count.fetch_add(1, Ordering::Relaxed);
        if n >= self.limit {
            return None;
        }
        if n + 1 == self.limit {
            if let Some(r) = self.registry.upgrade() {
                r.remove(self.base);
            }
        }
        Some(ev::StreamId {
            base: self.base,
            stream: n,
        })
    }
}

/// Every open tap.
#[derive(Debug)]
pub(super) struct Registry {
    /// How many taps are open: the request path's one load.
    open: AtomicUsize,
    snapshot: ArcSwapOption<Vec<Arc<Tap>>>,
    taps: Mutex<Vec<Arc<Tap>>>,
    max_taps: usize,
    max_requests_per_tap: u32,
    rate: u32,
    queue_capacity: usize,
    limits: EventLimits,
    pub(super) metrics: Arc<TapMetrics>,
    next_base: AtomicU32,
}

/// An open tap, removed when dropped (its client went away).
#[derive(Debug)]
pub(super) struct Registration {
    registry: Arc<Registry>,
    base: u32,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.registry.remove(self.base);
    }
}

impl Registry {
    /// Opens a tap of at most `limit` requests (lowered to
    /// `--tap-max-requests-per-tap`).
    pub(super) fn open(
        self: &Arc<Self>,
        matcher: Match,
        limit: u32,
        headers: bool,
    ) -> Result<(Registration, mpsc::Receiver<TapEvent>), Refused> {
        let mut taps = self.taps.lock().unwrap_or_else(|e| e.into_inner());
        if taps.len() >= self.max_taps {
            return Err(Refused::TooMany(taps.len()));
        }
        let (tx, rx) = mpsc::channel(self.queue_capacity);
        let base = self.next_base.fetch_add(1, Ordering::Relaxed);
        let burst = self.rate.max(EVENTS_PER_REQUEST);
        taps.push(Arc::new(Tap {
            base,
            matcher,
            limit: u64::from(limit.clamp(1, self.max_requests_per_tap)),
            count: AtomicU64::new(0),
            headers,
            bucket: Mutex::new(TokenBucket::new(self.rate, burst, Instant::now())),
            tx,
            metrics: self.metrics.clone(),
            registry: Arc::downgrade(self),
        }));
        self.metrics.open.inc();
        self.publish(&taps);
        Ok((
            Registration {
                registry: self.clone(),
                base,
            },
            rx,
        ))
    }

    fn remove(&self, base: u32) {
        let mut taps = self.taps.lock().unwrap_or_else(|e| e.into_inner());
        let before = taps.len();
        taps.retain(|t| t.base != base);
        if taps.len() < before {
            self.metrics.open.dec();
            self.publish(&taps);
        }
    }

    fn publish(&self, taps: &[Arc<Tap>]) {
        if taps.is_empty() {
            self.snapshot.store(None);
        } else {
            self.snapshot.store(Some(Arc::new(taps.to_vec())));
        }
        self.open.store(taps.len(), Ordering::Relaxed);
    }

    #[cfg(test)]
    pub(super) fn open_count(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::DstWorkload;

    fn taps(rate: u32, queue: usize) -> (Taps, Arc<Registry>) {
        let config = TapConfig {
            max_taps: 2,
            max_events_per_second: rate,
            queue_capacity: queue,
            max_requests_per_tap: 100,
            ..TapConfig::default()
        };
        let t = Taps::new(&config, TapMetrics::default());
        let r = t.registry().unwrap().clone();
        (t, r)
    }

    fn conn(t: &Taps) -> ConnTap {
        t.connection(
            Some("[::ffff:10.0.0.9]:5000".parse().unwrap()),
            Direction::outbound,
            TlsLabels::NoIdentity("loopback"),
        )
        .unwrap()
    }

    fn endpoint() -> (Endpoint, DstLabels) {
        let mut e = Endpoint::bare("10.1.0.5:8080".parse().unwrap());
        e.namespace = Arc::from("shop");
        e.service = Arc::from("web");
        let labels = DstLabels {
            dst_namespace: Arc::from("shop"),
            dst_service: Arc::from("web"),
            workload: DstWorkload::none(),
            ..DstLabels::unknown(Direction::outbound)
        };
        (e, labels)
    }

    fn get(c: &ConnTap, path: &str) -> Request<()> {
        let mut req = Request::get(path)
            .header("host", "web.shop.svc.cluster.local")
            .body(())
            .unwrap();
        if let Some(t) = c.tapping() {
            req.extensions_mut().insert(t);
        }
        req
    }

    fn path_prefix(p: &str) -> Match {
        Match::Http(super::super::matcher::HttpMatch::Path(
            super::super::matcher::StringMatch::Prefix(p.into()),
        ))
    }

    fn events(rx: &mut mpsc::Receiver<TapEvent>) -> Vec<ev::Event> {
        let mut out = Vec::new();
        while let Ok(e) = rx.try_recv() {
            match e.event {
                Some(tap_event::Event::Http(h)) => out.extend(h.event),
                None => {}
            }
        }
        out
    }

    #[tokio::test(start_paused = true)]
    async fn no_open_tap_means_no_extension_and_no_tap() {
        let (t, _) = taps(1000, 16);
        let c = conn(&t);
        let req = get(&c, "/");
        assert!(req.extensions().get::<Tapping>().is_none());
        let (e, l) = endpoint();
        assert!(request(&req, &e, &l, false).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_matching_request_emits_its_three_events_and_others_none() {
        let (t, r) = taps(1000, 16);
        let (reg, mut rx) = r.open(path_prefix("/api"), 10, false).unwrap();
        let c = conn(&t);
        let (e, l) = endpoint();
        assert!(request(&get(&c, "/health"), &e, &l, false).is_none());
        let tapped = request(&get(&c, "/api/cart"), &e, &l, false).expect("tapped");
        tokio::time::advance(Duration::from_millis(30)).await;
        let rsp = http::Response::builder().status(201).body(()).unwrap();
        let (parts, ()) = rsp.into_parts();
        let mut body = tapped.response(&parts);
        tokio::time::advance(Duration::from_millis(20)).await;
        body.frame(&Some(Ok(Frame::data(Bytes::from_static(b"hello")))));
        body.frame(&None);
        drop(body);
        let got = events(&mut rx);
        assert_eq!(got.len(), 3, "{got:?}");
        match &got[0] {
            ev::Event::RequestInit(i) => {
                assert_eq!(i.path, "/api/cart");
                assert_eq!(i.authority, "web.shop.svc.cluster.local");
                assert_eq!(i.method, Some(http::Method::GET.into()));
            }
            other => panic!("{other:?}"),
        }
        match &got[1] {
            ev::Event::ResponseInit(i) => {
                assert_eq!(i.http_status, 201);
                assert_eq!(i.since_request_init, duration(Duration::from_millis(30)));
            }
            other => panic!("{other:?}"),
        }
        match &got[2] {
            ev::Event::ResponseEnd(end) => {
                assert_eq!(end.response_bytes, 5);
                assert_eq!(end.since_request_init, duration(Duration::from_millis(50)));
                assert_eq!(end.since_response_init, duration(Duration::from_millis(20)));
                assert_eq!(end.eos, Some(Eos { end: None }));
            }
            other => panic!("{other:?}"),
        }
        drop(reg);
        assert_eq!(r.open_count(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_limit_removes_the_tap_and_ends_its_stream() {
        let (t, r) = taps(1000, 64);
        let (_reg, mut rx) = r.open(Match::All(vec![]), 2, false).unwrap();
        let c = conn(&t);
        let (e, l) = endpoint();
        for _ in 0..2 {
            drop(request(&get(&c, "/"), &e, &l, false).expect("tapped"));
        }
        assert_eq!(r.open_count(), 0, "the second request was the last");
        assert!(get(&c, "/").extensions().get::<Tapping>().is_none());
        // Every sender is gone: the stream ends after its four events.
        let mut n = 0;
        while rx.recv().await.is_some() {
            n += 1;
        }
        assert_eq!(n, 4, "request init and response end, twice");
    }

    #[tokio::test(start_paused = true)]
    async fn over_the_rate_whole_requests_are_dropped_and_counted() {
        let (t, r) = taps(30, 1024);
        let (_reg, mut rx) = r.open(Match::All(vec![]), 100, false).unwrap();
        let c = conn(&t);
        let (e, l) = endpoint();
        let tapped = (0..50)
            .filter_map(|_| request(&get(&c, "/"), &e, &l, false))
            .count();
        assert_eq!(tapped, 10, "30 tokens: ten requests of three events");
        let rate = r
            .metrics
            .dropped
            .get_or_create(&ReasonLabels { reason: "rate" })
            .get();
        assert_eq!(rate, 120);
        tokio::time::advance(Duration::from_millis(100)).await;
        assert!(request(&get(&c, "/"), &e, &l, false).is_some(), "refilled");
        assert_eq!(events(&mut rx).len(), 22);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_queue_drops_events_and_never_waits() {
        let (t, r) = taps(100_000, 4);
        let (_reg, mut rx) = r.open(Match::All(vec![]), 100, false).unwrap();
        let c = conn(&t);
        let (e, l) = endpoint();
        let mut tapped = 0;
        for _ in 0..10 {
            if request(&get(&c, "/"), &e, &l, false).is_some() {
                tapped += 1;
            }
        }
        // Each request queued its init and, dropped unanswered, its end:
        // two of them fill the queue of four.
        assert_eq!(tapped, 2);
        let queue = r
            .metrics
            .dropped
            .get_or_create(&ReasonLabels { reason: "queue" })
            .get();
        assert_eq!(queue, 8 * 3, "eight requests' events");
        assert_eq!(events(&mut rx).len(), 4);
        assert_eq!(r.metrics.events.get(), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn taps_past_the_bound_are_refused_and_a_closed_one_frees_its_place() {
        let (_t, r) = taps(10, 4);
        let a = r.open(Match::All(vec![]), 1, false).unwrap();
        let _b = r.open(Match::All(vec![]), 1, false).unwrap();
        assert_eq!(
            r.open(Match::All(vec![]), 1, false).unwrap_err(),
            Refused::TooMany(2)
        );
        assert_eq!(r.metrics.open.get(), 2);
        drop(a);
        assert!(r.open(Match::All(vec![]), 1, false).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn events_name_both_ends_and_carry_headers_only_when_asked() {
        let (t, r) = taps(1000, 16);
        let (_plain, mut plain) = r.open(Match::All(vec![]), 10, false).unwrap();
        let (_h, mut with) = r.open(Match::All(vec![]), 10, true).unwrap();
        let c = conn(&t);
        let (mut e, l) = endpoint();
        e.identity = Some(
            ballast_meshtls::IdentityName::parse(
                "web.shop.serviceaccount.identity.linkerd.cluster.local",
            )
            .unwrap(),
        );
        let mut req = get(&c, "/x");
        req.headers_mut()
            .insert("x-user", http::HeaderValue::from_static("ann"));
        let tapped = request(&req, &e, &l, true).unwrap();
        drop(tapped);
        let first = |rx: &mut mpsc::Receiver<TapEvent>| rx.try_recv().unwrap();
        let p = first(&mut plain);
        assert_eq!(
            p.source,
            Some(TcpAddress::from(
                "10.0.0.9:5000".parse::<SocketAddr>().unwrap()
            )),
            "IPv4-mapped clients are shown as IPv4"
        );
        assert_eq!(
            p.destination,
            Some(TcpAddress::from(
                "10.1.0.5:8080".parse::<SocketAddr>().unwrap()
            ))
        );
        let dst = p.destination_meta.clone().unwrap().labels;
        assert_eq!(dst["tls"], "true");
        assert_eq!(
            dst["server_id"],
            "web.shop.serviceaccount.identity.linkerd.cluster.local"
        );
        assert_eq!(dst["service"], "web");
        assert_eq!(p.source_meta.as_ref().unwrap().labels["tls"], "loopback");
        assert_eq!(p.proxy_direction, ProxyDirection::Outbound as i32);
        let init = |e: TapEvent| match e.event {
            Some(tap_event::Event::Http(tap_event::Http {
                event: Some(ev::Event::RequestInit(i)),
            })) => i,
            other => panic!("{other:?}"),
        };
        assert!(init(p).headers.is_none());
        let h = init(first(&mut with)).headers.expect("headers asked for");
        assert!(h
            .headers
            .iter()
            .any(|x| x.name == "x-user" && x.value == b"ann"));
    }
}
