//! Tap fan-out: an `/api/tap` query becomes one `Tap/Observe` stream per
//! tapped proxy (at most [`MAX_PODS_PER_TAP`]), their events combined per
//! request and written as NDJSON lines, one [`TapEvent`] (or [`TapNotice`])
//! each.
//!
//! Bounds, per tap: the client's line queue ([`CLIENT_QUEUE_LINES`]; a
//! client that reads slower than events come loses events, counted in a
//! notice), the requests waiting for their response
//! ([`combine::DEFAULT_MAX_IN_FLIGHT`]), the proxies' events waiting for the
//! combiner ([`POD_QUEUE_EVENTS`]; proxies wait, they do not buffer here),
//! `max_rps` (each proxy's share per window is the `limit` of its stream,
//! and the combined events are capped again); across taps, `max_taps`.
//!
//! A tap follows its target: every `follow_interval` the pods it selects
//! are read again from the index; new ones are tapped (within
//! [`MAX_PODS_PER_TAP`] at once and [`MAX_PODS_EVER_PER_TAP`] in all),
//! those gone are let go. The tap ends when no pod is left to tap.

mod combine;
mod pod;
mod query;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use ballast_meshtls::IdentityName;
use ballast_serve::GaugeGuard;
use ballast_vizcore::api::{ResourceRef, TapEvent, TapNotice};
use ballast_vizcore::targets::PodTarget;
use bytes::Bytes;
use linkerd2_proxy_api::tap::ObserveRequest;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::mpsc;
use tokio::task::AbortHandle;
use tokio::time::Instant;

pub use combine::DEFAULT_MAX_IN_FLIGHT;
pub use query::{parse as parse_query, TapKind, TapQuery};

/// Proxies tapped by one tap at most; the rest are named in a notice.
pub const MAX_PODS_PER_TAP: usize = 100;
/// Proxies one tap may tap over its life (each keeps a few hundred bytes
/// until the tap ends), however often its target's pods are replaced.
pub const MAX_PODS_EVER_PER_TAP: usize = 10 * MAX_PODS_PER_TAP;
/// How often a tap looks for new and gone pods of its target.
pub const DEFAULT_FOLLOW_INTERVAL: Duration = Duration::from_secs(5);
/// Lines waiting for the HTTP client per tap.
pub const CLIENT_QUEUE_LINES: usize = 256;
/// Proxy events waiting for the combiner per tap.
pub const POD_QUEUE_EVENTS: usize = 1024;
/// `to` pods matched by address as well as by labels, at most.
const MAX_TO_ADDRESSES: usize = 100;

/// How taps are opened.
#[derive(Clone, Debug)]
pub struct TapConfig {
    /// Concurrent `/api/tap` streams at most (`ballast viz --max-taps`,
    /// default 16); more get [`TapError::TooManyTaps`].
    pub max_taps: usize,
    /// Requests per second a tap shows when the query names no `max_rps`,
    /// and the most it may ask (Linkerd's default is 100).
    pub default_max_rps: u32,
    /// Dialling a proxy's tap port, TLS handshake included.
    pub connect_timeout: Duration,
    /// Mutual TLS to the proxies' tap ports (identity on); `None`: plaintext.
    pub tls: Option<TapTls>,
    /// How often an open tap reads its target's pods again
    /// ([`DEFAULT_FOLLOW_INTERVAL`]).
    pub follow_interval: Duration,
}

/// Viz's client side of the proxies' mutual-TLS tap listeners.
#[derive(Clone, Debug)]
pub struct TapTls {
    /// Verifies proxies against the trust anchors and sends viz's
    /// certificate: `ballast_meshtls::tls::client_config(roots,
    /// Some(viz_cert_store), &[])`.
    pub client: Arc<rustls::ClientConfig>,
    /// A proxy must prove `<sa>.<ns>.serviceaccount.identity.<control_namespace>.<trust_domain>`.
    pub control_namespace: String,
    pub trust_domain: String,
}

#[derive(Debug, thiserror::Error)]
pub enum TapError {
    /// 400.
    #[error("{0}")]
    BadQuery(String),
    /// 404.
    #[error("{0}")]
    NotFound(String),
    /// 503.
    #[error("too many taps open (at most {0}); try again later")]
    TooManyTaps(usize),
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DropLabels {
    /// `slow_client` (the client's queue was full), `max_rps` (over the
    /// tap's rate), `incomplete` (emitted without its response).
    reason: &'static str,
}

/// What taps did, registered by [`Tapper::register`].
#[derive(Clone, Debug, Default)]
struct TapMetrics {
    open: Gauge,
    refused: Counter,
    pod_streams: Gauge,
    pod_errors: Counter,
    events: Counter,
    dropped: Family<DropLabels, Counter>,
    in_flight: Gauge,
}

impl TapMetrics {
    fn dropped(&self, reason: &'static str, n: u64) {
        if n > 0 {
            self.dropped.get_or_create(&DropLabels { reason }).inc_by(n);
        }
    }
}

/// Opens taps against the meshed pods `targets` names.
pub struct Tapper {
    config: TapConfig,
    targets: crate::Targets,
    open: Arc<AtomicUsize>,
    metrics: TapMetrics,
}

impl Tapper {
    pub fn new(config: TapConfig, targets: crate::Targets) -> Self {
        Self {
            config,
            targets,
            open: Arc::default(),
            metrics: TapMetrics::default(),
        }
    }

    /// The tap metrics (`viz_tap_*`).
    pub fn register(&self, r: &mut Registry) {
        let m = &self.metrics;
        r.register(
            "viz_taps_open",
            "Open /api/tap streams (at most --max-taps, 16 by default)",
            m.open.clone(),
        );
        r.register(
            "viz_taps_refused",
            "/api/tap requests refused because --max-taps streams were open",
            m.refused.clone(),
        );
        r.register(
            "viz_tap_proxy_streams_open",
            "Proxies being tapped (at most 100 per tap)",
            m.pod_streams.clone(),
        );
        r.register(
            "viz_tap_proxy_errors",
            "Tap streams to proxies that could not be opened or broke",
            m.pod_errors.clone(),
        );
        r.register(
            "viz_tap_events",
            "Requests sent to tap clients",
            m.events.clone(),
        );
        r.register(
            "viz_tap_events_dropped",
            "Requests not sent to tap clients, by reason (slow_client: its queue of 256 lines was full; max_rps; incomplete: emitted without a response)",
            m.dropped.clone(),
        );
        r.register(
            "viz_tap_requests_in_flight",
            "Tapped requests waiting for their response (at most 1,024 per tap)",
            m.in_flight.clone(),
        );
    }

    /// Parses the /api/tap query string and starts the taps. Must be
    /// called on a Tokio runtime (the taps run as tasks).
    pub fn open(&self, query: &str) -> Result<TapStream, TapError> {
        let query = query::parse(query)?;
        let slot = self.reserve()?;
        let snapshot = (self.targets)();
        let mut selected: Vec<&PodTarget> = snapshot
            .meshed
            .iter()
            .filter(|p| query.target.selects(p))
            .collect();
        if selected.is_empty() {
            let known: u32 = snapshot
                .pods_per_workload
                .iter()
                .filter(|(w, _)| {
                    w.namespace == query.target.namespace
                        && (query.target.kind == TapKind::Namespace
                            || (w.kind == query.target.kind.api_name()
                                && query.target.name.as_ref().is_none_or(|n| *n == w.name)))
                })
                .map(|(_, n)| *n)
                .sum();
            let why = if known > 0 {
                format!("{known} pods, none meshed and running (no linkerd-proxy container)")
            } else {
                "no running meshed pods".to_string()
            };
            return Err(TapError::NotFound(format!(
                "cannot tap {}: {why}",
                query.target.describe()
            )));
        }
        let mut notices = Vec::new();
        if selected.len() > MAX_PODS_PER_TAP {
            notices.push(format!(
                "tapping {MAX_PODS_PER_TAP} of the {} pods of {} (at most {MAX_PODS_PER_TAP} per tap)",
                selected.len(),
                query.target.describe()
            ));
            selected.truncate(MAX_PODS_PER_TAP);
        }
        let cap = self.config.default_max_rps.max(1);
        let max_rps = match query.max_rps {
            Some(asked) if asked > cap => {
                notices.push(format!(
                    "max_rps {asked} lowered to {cap}, this server's most"
                ));
                cap
            }
            Some(asked) => asked,
            None => cap,
        };
        let to_ips: Vec<std::net::IpAddr> = match &query.to {
            Some(to) if !matches!(to.kind, TapKind::Namespace | TapKind::Service) => snapshot
                .meshed
                .iter()
                .filter(|p| to.selects(p))
                .map(|p| p.ip)
                .take(MAX_TO_ADDRESSES)
                .collect(),
            _ => Vec::new(),
        };
        let per_pod = max_rps
            .div_ceil(u32::try_from(selected.len()).unwrap_or(u32::MAX))
            .max(1);
        let request = ObserveRequest {
            limit: per_pod,
            r#match: Some(query::observe_match(&query, &to_ips)),
            extract: None,
        };
        let peers = peers_of(&snapshot.meshed);

        let (out_tx, out_rx) = mpsc::channel(CLIENT_QUEUE_LINES);
        let (pod_tx, pod_rx) = mpsc::channel(POD_QUEUE_EVENTS);
        for n in notices {
            let _ = out_tx.try_send(notice_line(&n));
        }
        let mut fleet = Fleet {
            dialer: Dialer {
                connect_timeout: self.config.connect_timeout,
                tls: self.config.tls.clone(),
            },
            targets: self.targets.clone(),
            target: query.target.clone(),
            request,
            tx: pod_tx.downgrade(),
            tapped: HashMap::new(),
            pods: Vec::new(),
            tasks: AbortOnDrop(Vec::new()),
            said_full: false,
            metrics: self.metrics.clone(),
        };
        for target in &selected {
            if let Some(n) = fleet.tap(target, &pod_tx) {
                let _ = out_tx.try_send(notice_line(&n));
            }
        }
        // The pods' tasks hold the only senders: when every one has ended
        // (and none is left to follow), the driver ends.
        drop(pod_tx);
        let driver = Driver {
            fleet,
            combiner: combine::Combiner::new(DEFAULT_MAX_IN_FLIGHT, peers),
            out: out_tx,
            limit: query.limit,
            max_rps,
            follow_interval: self.config.follow_interval,
            metrics: self.metrics.clone(),
        };
        let task = tokio::spawn(driver.run(pod_rx)).abort_handle();
        Ok(TapStream {
            rx: out_rx,
            _tasks: AbortOnDrop(vec![task]),
            _slot: slot,
        })
    }

    fn reserve(&self) -> Result<Slot, TapError> {
        let max = self.config.max_taps;
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .map_err(|_| {
                self.metrics.refused.inc();
                TapError::TooManyTaps(max)
            })?;
        self.metrics.open.inc();
        Ok(Slot {
            open: self.open.clone(),
            gauge: self.metrics.open.clone(),
        })
    }
}

/// Dials proxies' tap ports.
struct Dialer {
    connect_timeout: Duration,
    tls: Option<TapTls>,
}

impl Dialer {
    fn dial(&self, target: &PodTarget) -> Result<pod::GrpcObserver, String> {
        let tls = match &self.tls {
            None => None,
            Some(t) => Some((
                t.client.clone(),
                pod_identity(target, t).map_err(|e| format!("no identity name: {e}"))?,
            )),
        };
        pod::GrpcObserver::new(pod::Dial {
            addr: SocketAddr::new(target.ip, target.tap_port),
            connect_timeout: self.connect_timeout,
            tls,
        })
    }
}

/// Workload names by pod IP, to name a tapped request's peers.
fn peers_of(meshed: &[PodTarget]) -> combine::Peers {
    Arc::new(
        meshed
            .iter()
            .map(|p| {
                (
                    p.ip,
                    combine::workload_name(p.workload.as_ref().unwrap_or(&p.pod)),
                )
            })
            .collect::<HashMap<_, _>>(),
    )
}

/// The pods one tap taps: a task per pod, started as pods of the target
/// appear and aborted as they go.
struct Fleet {
    dialer: Dialer,
    targets: crate::Targets,
    target: query::Selector,
    request: ObserveRequest,
    /// Weak: the tap ends when no pod task holds a sender.
    tx: mpsc::WeakSender<pod::PodMsg>,
    /// Pods tapped now (by name and address: a pod back with another
    /// address is another proxy), with their index in `pods` and task.
    tapped: HashMap<(ResourceRef, IpAddr), (usize, Option<AbortHandle>)>,
    /// Every pod this tap has tapped, by index (events name their pod so).
    pods: Vec<combine::PodInfo>,
    tasks: AbortOnDrop,
    /// Whether the client was told that pods were left out.
    said_full: bool,
    metrics: TapMetrics,
}

impl Fleet {
    /// Starts tapping `target`; a notice when it cannot be.
    fn tap(&mut self, target: &PodTarget, tx: &mpsc::Sender<pod::PodMsg>) -> Option<String> {
        let index = self.pods.len();
        let info = combine::PodInfo {
            pod: target.pod.clone(),
            workload: target.workload.clone(),
            identity: self
                .dialer
                .tls
                .as_ref()
                .and_then(|t| pod_identity(target, t).ok().map(|n| n.as_str().to_string())),
        };
        let label = format!(
            "{} ({})",
            info.label(),
            SocketAddr::new(target.ip, target.tap_port)
        );
        self.pods.push(info);
        let key = (target.pod.clone(), target.ip);
        let observer = match self.dialer.dial(target) {
            Ok(o) => o,
            Err(why) => {
                // Not retried: what is missing (a name) will not come.
                self.tapped.insert(key, (index, None));
                return Some(format!("pod {label}: cannot tap: {why}"));
            }
        };
        let tx = tx.clone();
        let request = self.request.clone();
        let metrics = self.metrics.clone();
        let task = tokio::spawn(async move {
            let _open = GaugeGuard::new(&metrics.pod_streams);
            pod::run(index, label, observer, request, tx).await;
        })
        .abort_handle();
        self.tasks.0.retain(|t| !t.is_finished());
        self.tasks.0.push(task.clone());
        self.tapped.insert(key, (index, Some(task)));
        None
    }

    /// Reads the target's pods again: taps the new ones, lets go of those
    /// gone (what they had in flight goes to `done`, incomplete). Returns
    /// notices for the client, and how many requests were cut short.
    fn follow(
        &mut self,
        combiner: &mut combine::Combiner,
        done: &mut Vec<TapEvent>,
    ) -> (Vec<String>, usize) {
        let mut notices = Vec::new();
        let mut cut = 0;
        // No sender left: every pod task ended; the driver is ending.
        let Some(tx) = self.tx.upgrade() else {
            return (notices, cut);
        };
        let snapshot = (self.targets)();
        let selected: Vec<&PodTarget> = snapshot
            .meshed
            .iter()
            .filter(|p| self.target.selects(p))
            .collect();
        let live: std::collections::HashSet<(&ResourceRef, IpAddr)> =
            selected.iter().map(|p| (&p.pod, p.ip)).collect();
        let gone: Vec<(ResourceRef, IpAddr)> = self
            .tapped
            .keys()
            .filter(|(pod, ip)| !live.contains(&(pod, *ip)))
            .cloned()
            .collect();
        for key in gone {
            if let Some((index, task)) = self.tapped.remove(&key) {
                if let Some(task) = task {
                    task.abort();
                }
                cut += combiner.end_pod(index, "incomplete: the pod is gone", done);
                notices.push(format!(
                    "pod {}/{}: gone; no longer tapped",
                    key.0.namespace, key.0.name
                ));
            }
        }
        let mut left_out = 0;
        for target in selected {
            if self.tapped.contains_key(&(target.pod.clone(), target.ip)) {
                continue;
            }
            if self.tapped.len() >= MAX_PODS_PER_TAP || self.pods.len() >= MAX_PODS_EVER_PER_TAP {
                left_out += 1;
                continue;
            }
            notices.push(format!(
                "pod {}/{}: new; tapping it",
                target.pod.namespace, target.pod.name
            ));
            notices.extend(self.tap(target, &tx));
        }
        if left_out > 0 && !self.said_full {
            self.said_full = true;
            notices.push(format!(
                "{left_out} new pods not tapped: at most {MAX_PODS_PER_TAP} at once and \
                 {MAX_PODS_EVER_PER_TAP} in all per tap"
            ));
        }
        combiner.set_peers(peers_of(&snapshot.meshed));
        (notices, cut)
    }
}

/// The identity a pod's proxy proves: its service account's.
fn pod_identity(
    target: &PodTarget,
    tls: &TapTls,
) -> Result<IdentityName, ballast_meshtls::NameError> {
    let sa = if target.service_account.is_empty() {
        "default"
    } else {
        &target.service_account
    };
    IdentityName::for_service_account(
        sa,
        &target.pod.namespace,
        &tls.control_namespace,
        &tls.trust_domain,
    )
}

fn notice_line(text: &str) -> Bytes {
    json_line(&TapNotice {
        notice: text.to_string(),
    })
}

fn json_line<T: serde::Serialize>(value: &T) -> Bytes {
    let mut line = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
    line.push(b'\n');
    Bytes::from(line)
}

/// Combines the pods' events and writes the client's lines.
struct Driver {
    fleet: Fleet,
    combiner: combine::Combiner,
    out: mpsc::Sender<Bytes>,
    limit: Option<u64>,
    max_rps: u32,
    follow_interval: Duration,
    metrics: TapMetrics,
}

/// Why the driver stopped.
enum Stop {
    ClientGone,
    LimitReached,
}

impl Driver {
    async fn run(mut self, mut rx: mpsc::Receiver<pod::PodMsg>) {
        let mut state = Emit {
            sent: 0,
            dropped_slow: 0,
            window_start: Instant::now(),
            window_sent: 0,
        };
        let mut done = Vec::new();
        // Says what a slow client lost even when no more events come.
        let mut flush = tokio::time::interval(pod::RATE_WINDOW);
        flush.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let every = self.follow_interval.max(Duration::from_millis(10));
        let mut follow = tokio::time::interval_at(Instant::now() + every, every);
        follow.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let msg = tokio::select! {
                msg = rx.recv() => match msg {
                    Some(msg) => msg,
                    None => break,
                },
                _ = flush.tick() => {
                    if self.flush_dropped(&mut state).is_err() {
                        break;
                    }
                    continue;
                }
                _ = follow.tick() => {
                    let before = self.combiner.in_flight();
                    let (notices, cut) = self.fleet.follow(&mut self.combiner, &mut done);
                    self.metrics.dropped("incomplete", cut as u64);
                    let mut stop = self.emit(&mut state, &mut done);
                    for n in notices {
                        if stop.is_ok() {
                            stop = self.line(&mut state, notice_line(&n));
                        }
                    }
                    self.track_in_flight(before);
                    if stop.is_err() {
                        break;
                    }
                    continue;
                }
            };
            let before = self.combiner.in_flight();
            let stop = match msg {
                pod::PodMsg::Event(index, event) => {
                    let Some(info) = self.fleet.pods.get(index) else {
                        continue;
                    };
                    let pushed = self.combiner.push(index, info, *event, &mut done);
                    self.metrics.dropped("incomplete", pushed.evicted as u64);
                    self.emit(&mut state, &mut done)
                }
                pod::PodMsg::Ended(index) => {
                    let n = self.combiner.end_pod(
                        index,
                        "incomplete: the proxy's tap stream ended first",
                        &mut done,
                    );
                    self.metrics.dropped("incomplete", n as u64);
                    self.emit(&mut state, &mut done)
                }
                pod::PodMsg::Notice(text) => {
                    if text.contains("cannot tap") {
                        self.metrics.pod_errors.inc();
                    }
                    self.line(&mut state, notice_line(&text))
                }
            };
            self.track_in_flight(before);
            if stop.is_err() {
                break;
            }
        }
        let before = self.combiner.in_flight();
        self.combiner
            .finish("incomplete: the tap ended first", &mut done);
        self.track_in_flight(before);
    }

    fn track_in_flight(&self, before: usize) {
        let after = self.combiner.in_flight();
        if after > before {
            self.metrics.in_flight.inc_by((after - before) as i64);
        } else {
            self.metrics.in_flight.dec_by((before - after) as i64);
        }
    }

    /// Writes the completed events within the rate and the limit.
    fn emit(&mut self, state: &mut Emit, done: &mut Vec<TapEvent>) -> Result<(), Stop> {
        for event in done.drain(..) {
            let now = Instant::now();
            if now.duration_since(state.window_start) >= pod::RATE_WINDOW {
                state.window_start = now;
                state.window_sent = 0;
            }
            if state.window_sent >= u64::from(self.max_rps) {
                self.metrics.dropped("max_rps", 1);
                continue;
            }
            state.window_sent += 1;
            self.line(state, json_line(&event))?;
            self.metrics.events.inc();
            state.sent += 1;
            if self.limit.is_some_and(|l| state.sent >= l) {
                return Err(Stop::LimitReached);
            }
        }
        Ok(())
    }

    /// Queues a line for the client without waiting: a full queue drops it
    /// and the count is said in a notice once there is room.
    fn line(&self, state: &mut Emit, line: Bytes) -> Result<(), Stop> {
        use mpsc::error::TrySendError;
        if !self.flush_dropped(state)? {
            state.dropped_slow += 1;
            self.metrics.dropped("slow_client", 1);
            return Ok(());
        }
        match self.out.try_send(line) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => {
                state.dropped_slow += 1;
                self.metrics.dropped("slow_client", 1);
                Ok(())
            }
            Err(TrySendError::Closed(_)) => Err(Stop::ClientGone),
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        // Aborted with requests waiting: they leave the gauge with it.
        self.metrics
            .in_flight
            .dec_by(self.combiner.in_flight() as i64);
    }
}

impl Driver {
    /// Says how many events a slow client lost, if any and if there is
    /// room; true when nothing is left to say.
    fn flush_dropped(&self, state: &mut Emit) -> Result<bool, Stop> {
        use mpsc::error::TrySendError;
        if state.dropped_slow == 0 {
            return Ok(true);
        }
        let text = format!(
            "{} events dropped: the client read slower than they came",
            state.dropped_slow
        );
        match self.out.try_send(notice_line(&text)) {
            Ok(()) => {
                state.dropped_slow = 0;
                Ok(true)
            }
            Err(TrySendError::Full(_)) => Ok(false),
            Err(TrySendError::Closed(_)) => Err(Stop::ClientGone),
        }
    }
}

struct Emit {
    sent: u64,
    dropped_slow: u64,
    window_start: Instant,
    window_sent: u64,
}

/// NDJSON lines (each ends in '\n'); dropping it ends every proxy stream.
pub struct TapStream {
    rx: mpsc::Receiver<Bytes>,
    _tasks: AbortOnDrop,
    _slot: Slot,
}

impl futures_util::Stream for TapStream {
    type Item = Bytes;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        self.rx.poll_recv(cx)
    }
}

struct AbortOnDrop(Vec<AbortHandle>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

/// One of `max_taps`, given back when the stream is dropped.
struct Slot {
    open: Arc<AtomicUsize>,
    gauge: Gauge,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::AcqRel);
        self.gauge.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ballast_testkit::eventually_sync;
    use ballast_vizcore::api::ResourceRef;
    use ballast_vizcore::targets::Snapshot;
    use futures_util::StreamExt;
    use linkerd2_proxy_api::http_types::HttpMethod;
    use linkerd2_proxy_api::net::TcpAddress;
    use linkerd2_proxy_api::tap::{self as proto, tap_event, tap_server};
    use std::sync::atomic::AtomicU64;
    use std::sync::Mutex;

    const DEADLINE: Duration = Duration::from_secs(20);

    /// A proxy's Tap API that answers every Observe with `requests`
    /// complete requests, then keeps the stream open.
    #[derive(Clone, Default)]
    struct FakeTap {
        requests: u64,
        seen: Arc<Mutex<Vec<ObserveRequest>>>,
        sent: Arc<AtomicU64>,
    }

    type EventStream =
        Pin<Box<dyn futures_util::Stream<Item = Result<proto::TapEvent, tonic::Status>> + Send>>;

    #[tonic::async_trait]
    impl tap_server::Tap for FakeTap {
        type ObserveStream = EventStream;
        async fn observe(
            &self,
            request: tonic::Request<ObserveRequest>,
        ) -> Result<tonic::Response<EventStream>, tonic::Status> {
            self.seen.lock().expect("lock").push(request.into_inner());
            let sent = self.sent.clone();
            let events = futures_util::stream::iter(0..self.requests)
                .flat_map(|i| futures_util::stream::iter(request_parts(i)))
                .inspect(move |_| {
                    sent.fetch_add(1, Ordering::Relaxed);
                })
                .map(Ok)
                .chain(futures_util::stream::pending());
            Ok(tonic::Response::new(Box::pin(events)))
        }
    }

    fn request_parts(i: u64) -> Vec<proto::TapEvent> {
        use tap_event::http::{Event, RequestInit, ResponseEnd, ResponseInit, StreamId};
        let id = Some(StreamId { base: 1, stream: i });
        let parts = [
            Event::RequestInit(RequestInit {
                id,
                method: Some(HttpMethod::from(http::Method::GET)),
                scheme: Some("http".into()),
                authority: "web.demo.svc.cluster.local".into(),
                path: format!("/{i}"),
                headers: None,
            }),
            Event::ResponseInit(ResponseInit {
                id,
                since_request_init: Some(prost_types::Duration {
                    seconds: 0,
                    nanos: 2_000_000,
                }),
                http_status: 200,
                headers: None,
            }),
            Event::ResponseEnd(ResponseEnd {
                id,
                since_request_init: Some(prost_types::Duration {
                    seconds: 0,
                    nanos: 3_000_000,
                }),
                since_response_init: None,
                response_bytes: 10,
                eos: None,
                trailers: None,
            }),
        ];
        parts
            .into_iter()
            .map(|e| proto::TapEvent {
                source: Some(TcpAddress::from(SocketAddr::from(([127, 0, 0, 1], 5555)))),
                destination: Some(TcpAddress::from(SocketAddr::from(([127, 0, 0, 2], 80)))),
                destination_meta: Some(tap_event::EndpointMeta {
                    labels: [("deployment".to_string(), "web".to_string())].into(),
                }),
                proxy_direction: tap_event::ProxyDirection::Outbound as i32,
                event: Some(tap_event::Event::Http(tap_event::Http { event: Some(e) })),
                ..Default::default()
            })
            .collect()
    }

    async fn serve(tap: FakeTap) -> u16 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(tap_server::TapServer::new(tap))
                .serve_with_incoming(incoming),
        );
        port
    }

    /// A port nothing listens on.
    async fn closed_port() -> u16 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        listener.local_addr().expect("addr").port()
    }

    fn load_pod(name: &str, tap_port: u16) -> PodTarget {
        PodTarget {
            pod: ResourceRef {
                kind: "pod".into(),
                namespace: "demo".into(),
                name: name.into(),
            },
            workload: Some(ResourceRef {
                kind: "deployment".into(),
                namespace: "demo".into(),
                name: "load".into(),
            }),
            ip: "127.0.0.1".parse().expect("ip"),
            admin_port: 1,
            tap_port,
            service_account: "load".into(),
        }
    }

    fn tapper(max_taps: usize, max_rps: u32, pods: Vec<PodTarget>) -> Tapper {
        let snapshot = Snapshot {
            meshed: pods,
            pods_per_workload: HashMap::new(),
        };
        Tapper::new(
            TapConfig {
                max_taps,
                default_max_rps: max_rps,
                connect_timeout: Duration::from_secs(2),
                tls: None,
                follow_interval: DEFAULT_FOLLOW_INTERVAL,
            },
            Arc::new(move || snapshot.clone()),
        )
    }

    /// The stream's lines until it ends or `n` lines were read.
    async fn read_lines(stream: &mut TapStream, n: usize) -> Vec<serde_json::Value> {
        let mut lines = Vec::new();
        while lines.len() < n {
            let Some(line) = tokio::time::timeout(DEADLINE, stream.next())
                .await
                .expect("a line in time")
            else {
                break;
            };
            assert_eq!(line.last(), Some(&b'\n'));
            lines.push(serde_json::from_slice(&line).expect("a JSON line"));
        }
        lines
    }

    #[tokio::test]
    async fn taps_a_proxy_and_names_the_one_it_cannot_reach() {
        let tap = FakeTap {
            requests: 3,
            ..FakeTap::default()
        };
        let port = serve(tap.clone()).await;
        let dead = closed_port().await;
        let tapper = tapper(
            4,
            10,
            vec![load_pod("load-1", port), load_pod("load-2", dead)],
        );
        let mut stream = tapper
            .open("target=deploy/load&namespace=demo&method=GET")
            .expect("open");
        // Three events and one notice, in whichever order they came.
        let mut lines = Vec::new();
        while lines
            .iter()
            .filter(|l: &&serde_json::Value| l.get("notice").is_some())
            .count()
            < 1
            || lines.iter().filter(|l| l.get("path").is_some()).count() < 3
        {
            lines.extend(read_lines(&mut stream, 1).await);
        }
        let notices: Vec<&serde_json::Value> =
            lines.iter().filter(|l| l.get("notice").is_some()).collect();
        assert_eq!(notices.len(), 1, "{lines:?}");
        let notice = notices[0]["notice"].as_str().expect("text");
        assert!(
            notice.starts_with(&format!("pod demo/load-2 (127.0.0.1:{dead}): cannot tap:")),
            "{notice}"
        );
        let events: Vec<TapEvent> = lines
            .iter()
            .filter(|l| l.get("notice").is_none())
            .map(|l| serde_json::from_value(l.clone()).expect("a TapEvent"))
            .collect();
        let paths: Vec<&str> = events.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["/0", "/1", "/2"]);
        for e in &events {
            assert_eq!(e.proxy, "demo/load-1");
            assert_eq!(e.method, "GET");
            assert_eq!(e.status, Some(200));
            assert_eq!(e.latency_ms, Some(2.0));
            assert_eq!(e.destination_workload.as_deref(), Some("deployment/web"));
            assert_eq!(e.source_workload.as_deref(), Some("deployment/load"));
        }
        // Each pod's share of max_rps 10, and the method filter, reached the proxy.
        let seen = tap.seen.lock().expect("lock").clone();
        assert_eq!(seen[0].limit, 5);
        let text = format!("{:?}", seen[0].r#match);
        assert!(text.contains("Method"), "{text}");
        assert_eq!(tapper.metrics.pod_errors.get(), 1);
        drop(stream);

        // With a limit the stream ends after that many requests.
        let mut stream = tapper
            .open("target=pod/load-1&namespace=demo&limit=2")
            .expect("open");
        let lines = read_lines(&mut stream, 10).await;
        let paths: Vec<&str> = lines.iter().filter_map(|l| l["path"].as_str()).collect();
        assert_eq!(paths, ["/0", "/1"], "{lines:?}");
    }

    #[tokio::test]
    async fn a_tap_follows_its_targets_pods_as_they_come_and_go() {
        let tap = FakeTap {
            requests: 2,
            ..FakeTap::default()
        };
        let (port_1, port_2) = (serve(tap.clone()).await, serve(tap.clone()).await);
        let pods = Arc::new(Mutex::new(vec![load_pod("load-1", port_1)]));
        let read = pods.clone();
        let tapper = Tapper::new(
            TapConfig {
                max_taps: 1,
                default_max_rps: 100,
                connect_timeout: Duration::from_secs(2),
                tls: None,
                follow_interval: Duration::from_millis(50),
            },
            Arc::new(move || Snapshot {
                meshed: read.lock().expect("lock").clone(),
                pods_per_workload: HashMap::new(),
            }),
        );
        let mut stream = tapper
            .open("target=deploy/load&namespace=demo")
            .expect("open");
        // Reads until a line `want` accepts, keeping what came before.
        async fn until(
            stream: &mut TapStream,
            seen: &mut Vec<serde_json::Value>,
            want: impl Fn(&serde_json::Value) -> bool,
        ) {
            loop {
                let line = read_lines(stream, 1).await;
                assert_eq!(line.len(), 1, "the stream ended; saw {seen:?}");
                seen.extend(line);
                if want(seen.last().expect("a line")) {
                    return;
                }
            }
        }
        let from =
            |pod: &'static str| move |l: &serde_json::Value| l["proxy"].as_str() == Some(pod);
        let said =
            |text: &'static str| move |l: &serde_json::Value| l["notice"].as_str() == Some(text);
        let mut seen = Vec::new();
        until(&mut stream, &mut seen, from("demo/load-1")).await;

        pods.lock().expect("lock").push(load_pod("load-2", port_2));
        until(
            &mut stream,
            &mut seen,
            said("pod demo/load-2: new; tapping it"),
        )
        .await;
        until(&mut stream, &mut seen, from("demo/load-2")).await;

        pods.lock().expect("lock").remove(0);
        until(
            &mut stream,
            &mut seen,
            said("pod demo/load-1: gone; no longer tapped"),
        )
        .await;
        // The aborted task is dropped by the runtime soon after.
        eventually_sync(
            &format!("load-1's stream to end with it; saw {seen:?}"),
            DEADLINE,
            || tapper.metrics.pod_streams.get() == 1,
        )
        .await;

        // With no pod left, the tap ends.
        pods.lock().expect("lock").clear();
        until(
            &mut stream,
            &mut seen,
            said("pod demo/load-2: gone; no longer tapped"),
        )
        .await;
        let rest = read_lines(&mut stream, 100).await;
        assert!(
            rest.iter().all(|l| l.get("notice").is_some()),
            "only notices after the last pod went: {rest:?}"
        );
        drop(stream);
        eventually_sync("the pods' streams to end with the tap", DEADLINE, || {
            tapper.metrics.pod_streams.get() == 0
        })
        .await;
    }

    #[tokio::test]
    async fn taps_are_bounded_and_unknown_targets_are_not_found() {
        let port = serve(FakeTap::default()).await;
        let tapper = tapper(1, 10, vec![load_pod("load-1", port)]);
        let first = tapper
            .open("target=deploy/load&namespace=demo")
            .expect("open");
        assert!(matches!(
            tapper.open("target=deploy/load&namespace=demo"),
            Err(TapError::TooManyTaps(1))
        ));
        drop(first);
        let again = tapper
            .open("target=pod/load-1&namespace=demo")
            .expect("a slot is free again");
        drop(again);
        match tapper.open("target=deploy/web&namespace=demo") {
            Err(TapError::NotFound(msg)) => {
                assert_eq!(
                    msg,
                    "cannot tap deployment demo/web: no running meshed pods"
                )
            }
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("expected NotFound"),
        }
        assert!(matches!(
            tapper.open("target=deploy/load&bogus=1"),
            Err(TapError::BadQuery(_))
        ));
        assert_eq!(tapper.open.load(Ordering::Acquire), 0);
    }

    #[tokio::test]
    async fn a_client_that_does_not_read_loses_events_not_memory() {
        const REQUESTS: u64 = 2_000;
        let tap = FakeTap {
            requests: REQUESTS,
            ..FakeTap::default()
        };
        let port = serve(tap.clone()).await;
        let tapper = tapper(1, 1_000_000, vec![load_pod("load-1", port)]);
        let mut stream = tapper
            .open("target=deploy/load&namespace=demo")
            .expect("open");
        // Nothing is read until every request went past the full queue.
        let dropped = || {
            tapper
                .metrics
                .dropped
                .get_or_create(&DropLabels {
                    reason: "slow_client",
                })
                .get()
        };
        eventually_sync(
            &format!("{REQUESTS} requests past the full queue"),
            DEADLINE,
            || dropped() + CLIENT_QUEUE_LINES as u64 == REQUESTS,
        )
        .await;
        assert_eq!(tap.sent.load(Ordering::Relaxed), REQUESTS * 3);
        let lines = read_lines(&mut stream, CLIENT_QUEUE_LINES + 1).await;
        assert!(lines[..CLIENT_QUEUE_LINES]
            .iter()
            .all(|l| l.get("path").is_some()));
        let lost = REQUESTS - CLIENT_QUEUE_LINES as u64;
        assert_eq!(
            lines[CLIENT_QUEUE_LINES]["notice"].as_str(),
            Some(format!("{lost} events dropped: the client read slower than they came").as_str())
        );
    }

    /// A proxy's tap listener as identity makes it: mutual TLS, a client
    /// certificate required; the client identities that connected are kept.
    mod mtls {
        use super::*;
        use ballast_meshtls::tls;
        use ballast_meshtls::{CertStore, Credentials};
        use rustls::pki_types::{CertificateDer, PrivatePkcs8KeyDer};

        pub struct Pki {
            anchor: CertificateDer<'static>,
            issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
        }

        impl Pki {
            pub fn new() -> Pki {
                let key =
                    rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
                let mut params = rcgen::CertificateParams::default();
                params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
                params.key_usages = vec![
                    rcgen::KeyUsagePurpose::KeyCertSign,
                    rcgen::KeyUsagePurpose::DigitalSignature,
                ];
                let cert = params.self_signed(&key).expect("anchor");
                let issuer = rcgen::Issuer::new(params, key);
                Pki {
                    anchor: cert.der().clone(),
                    issuer,
                }
            }

            pub fn roots(&self) -> Arc<rustls::RootCertStore> {
                tls::root_store(std::slice::from_ref(&self.anchor)).expect("roots")
            }

            /// A certificate store holding `name`'s certificate.
            pub fn store(&self, name: &str) -> Arc<CertStore> {
                let key =
                    rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
                let params = rcgen::CertificateParams::new(vec![name.to_string()]).expect("params");
                let cert = params.signed_by(&key, &self.issuer).expect("leaf");
                let store = CertStore::new();
                store.set(
                    Credentials::new(
                        IdentityName::parse(name).expect("name"),
                        vec![cert.der().clone()],
                        PrivatePkcs8KeyDer::from(key.serialize_der()),
                        std::time::SystemTime::now() + Duration::from_secs(3600),
                    )
                    .expect("credentials"),
                );
                store
            }
        }

        pub struct Conn(tokio_rustls::server::TlsStream<tokio::net::TcpStream>);

        impl tonic::transport::server::Connected for Conn {
            type ConnectInfo = ();
            fn connect_info(&self) {}
        }

        impl tokio::io::AsyncRead for Conn {
            fn poll_read(
                mut self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &mut tokio::io::ReadBuf<'_>,
            ) -> Poll<std::io::Result<()>> {
                Pin::new(&mut self.0).poll_read(cx, buf)
            }
        }

        impl tokio::io::AsyncWrite for Conn {
            fn poll_write(
                mut self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &[u8],
            ) -> Poll<std::io::Result<usize>> {
                Pin::new(&mut self.0).poll_write(cx, buf)
            }
            fn poll_flush(
                mut self: Pin<&mut Self>,
                cx: &mut Context<'_>,
            ) -> Poll<std::io::Result<()>> {
                Pin::new(&mut self.0).poll_flush(cx)
            }
            fn poll_shutdown(
                mut self: Pin<&mut Self>,
                cx: &mut Context<'_>,
            ) -> Poll<std::io::Result<()>> {
                Pin::new(&mut self.0).poll_shutdown(cx)
            }
        }

        /// Serves `tap` over mutual TLS as `name`; returns the port and the
        /// identities of the clients that completed a handshake.
        pub async fn serve(pki: &Pki, name: &str, tap: FakeTap) -> (u16, Arc<Mutex<Vec<String>>>) {
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                pki.roots(),
                tls::provider(),
            )
            .build()
            .expect("verifier");
            let config = rustls::ServerConfig::builder_with_provider(tls::provider())
                .with_protocol_versions(&[&rustls::version::TLS13])
                .expect("tls 1.3")
                .with_client_cert_verifier(verifier)
                .with_cert_resolver(pki.store(name));
            let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let port = listener.local_addr().expect("addr").port();
            let clients = Arc::new(Mutex::new(Vec::new()));
            let (tx, mut rx) = mpsc::channel::<std::io::Result<Conn>>(8);
            let seen = clients.clone();
            tokio::spawn(async move {
                while let Ok((tcp, _)) = listener.accept().await {
                    let (acceptor, tx, seen) = (acceptor.clone(), tx.clone(), seen.clone());
                    tokio::spawn(async move {
                        if let Ok(stream) = acceptor.accept(tcp).await {
                            if let Some(id) =
                                tls::peer_identity(stream.get_ref().1.peer_certificates())
                            {
                                seen.lock().expect("lock").push(id.as_str().to_string());
                            }
                            let _ = tx.send(Ok(Conn(stream))).await;
                        }
                    });
                }
            });
            let incoming = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx));
            tokio::spawn(
                tonic::transport::Server::builder()
                    .add_service(tap_server::TapServer::new(tap))
                    .serve_with_incoming(incoming),
            );
            (port, clients)
        }
    }

    #[tokio::test]
    async fn taps_over_mutual_tls_as_viz_and_checks_each_proxys_name() {
        let pki = mtls::Pki::new();
        let proxy_name = "load.demo.serviceaccount.identity.linkerd.cluster.local";
        let viz_name = "ballast-viz.ballast.serviceaccount.identity.linkerd.cluster.local";
        let tap = FakeTap {
            requests: 2,
            ..FakeTap::default()
        };
        let (port, clients) = mtls::serve(&pki, proxy_name, tap).await;
        let client =
            ballast_meshtls::tls::client_config(pki.roots(), Some(pki.store(viz_name)), &[])
                .expect("client config");
        let mut impostor = load_pod("load-2", port);
        // Its proxy would be `other.demo...`: the certificate above is not it.
        impostor.service_account = "other".into();
        let snapshot = Snapshot {
            meshed: vec![load_pod("load-1", port), impostor],
            pods_per_workload: HashMap::new(),
        };
        let tapper = Tapper::new(
            TapConfig {
                max_taps: 1,
                default_max_rps: 10,
                connect_timeout: Duration::from_secs(5),
                tls: Some(TapTls {
                    client,
                    control_namespace: "linkerd".into(),
                    trust_domain: "cluster.local".into(),
                }),
                follow_interval: DEFAULT_FOLLOW_INTERVAL,
            },
            Arc::new(move || snapshot.clone()),
        );
        let mut stream = tapper
            .open("target=deploy/load&namespace=demo")
            .expect("open");
        let mut lines = Vec::new();
        while lines
            .iter()
            .filter(|l: &&serde_json::Value| l.get("path").is_some())
            .count()
            < 2
            || !lines.iter().any(|l| l.get("notice").is_some())
        {
            lines.extend(read_lines(&mut stream, 1).await);
        }
        let events: Vec<&serde_json::Value> =
            lines.iter().filter(|l| l.get("path").is_some()).collect();
        assert!(
            events.iter().all(|e| e["proxy"] == "demo/load-1"),
            "{lines:?}"
        );
        let notice = lines
            .iter()
            .find_map(|l| l["notice"].as_str())
            .expect("a notice");
        assert!(
            notice.starts_with(&format!("pod demo/load-2 (127.0.0.1:{port}): cannot tap:")),
            "{notice}"
        );
        // Every handshake that completed presented viz's certificate.
        let clients = clients.lock().expect("lock").clone();
        assert!(!clients.is_empty());
        assert!(clients.iter().all(|c| c == viz_name), "{clients:?}");
    }
}
