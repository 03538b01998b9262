//! Linkerd's outbound route metrics: per route (`outbound_http_route_*`,
//! `outbound_grpc_route_*`), per route backend, and per route's retries,
//! labelled by the policy's parent, route and backend resources
//! (`parent_*`, `route_*`, `backend_*`). Every family is a
//! [`RetainedFamily`], so series are bounded like the other traffic
//! families.

use super::series::{RetainedFamily, SeriesDrops, SeriesLimits};
use prometheus_client::{
    encoding::{EncodeLabelSet, EncodeLabelValue, LabelSetEncoder, LabelValueEncoder},
    metrics::{counter::Counter, gauge::Gauge, histogram::Histogram},
    registry::{Registry, Unit},
};
use std::{
    hash::Hash,
    sync::{Arc, OnceLock},
};

/// Linkerd's buckets of `*_route_request_duration_seconds`.
const REQUEST_BUCKETS: [f64; 4] = [0.05, 0.5, 1.0, 10.0];
/// Linkerd's buckets of `*_route_backend_response_duration_seconds`.
const RESPONSE_BUCKETS: [f64; 7] = [0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 10.0];

/// A policy resource as metrics name it (Linkerd's `Meta`): a Kubernetes
/// resource, or one of the proxy's defaults (`kind="default"`).
///
/// Route label sets are hashed on every request (several families, each
/// holding parent, route and backend): a meta hashes as one `u64` computed
/// from its fields when it is made, not as its five strings (8,400
/// callgrind instructions per request before). Its fields are read, never
/// changed, after it is made (it lives behind an `Arc`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceMeta {
    pub group: Arc<str>,
    pub kind: Arc<str>,
    pub namespace: Arc<str>,
    pub name: Arc<str>,
    pub port: Option<u16>,
    pub section: Arc<str>,
    /// A hash of the fields above: equal metas have equal ids.
    id: u64,
}

impl std::hash::Hash for ResourceMeta {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(self.id);
    }
}

impl ResourceMeta {
    pub fn new(
        group: Arc<str>,
        kind: Arc<str>,
        namespace: Arc<str>,
        name: Arc<str>,
        port: Option<u16>,
        section: Arc<str>,
    ) -> Self {
        use std::hash::{Hash, Hasher};
        // Fixed keys: the same fields give the same id in the process.
        let mut h = std::hash::DefaultHasher::new();
        (&group, &kind, &namespace, &name, port, &section).hash(&mut h);
        Self {
            group,
            kind,
            namespace,
            name,
            port,
            section,
            id: h.finish(),
        }
    }

    /// One of the proxy's own defaults, named `name`.
    pub fn default_named(name: &str) -> Self {
        let empty = super::empty_label();
        Self::new(
            empty.clone(),
            Arc::from("default"),
            empty.clone(),
            Arc::from(name),
            None,
            empty,
        )
    }

    fn encode_meta(&self, scope: &str, enc: &mut LabelSetEncoder) -> std::fmt::Result {
        let key = |k: &str| format!("{scope}_{k}");
        [
            (key("group"), &*self.group),
            (key("kind"), &*self.kind),
            (key("namespace"), &*self.namespace),
            (key("name"), &*self.name),
        ]
        .encode(enc)
    }

    /// A parent or backend: with its port and section.
    fn encode_service(&self, scope: &str, enc: &mut LabelSetEncoder) -> std::fmt::Result {
        self.encode_meta(scope, enc)?;
        let port = self.port.map(|p| p.to_string()).unwrap_or_default();
        [
            (format!("{scope}_port"), port.as_str()),
            (format!("{scope}_section_name"), &*self.section),
        ]
        .encode(enc)
    }
}

/// A route of a parent, and the host the request named.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct RouteLabels {
    pub parent: Arc<ResourceMeta>,
    pub route: Arc<ResourceMeta>,
    pub hostname: Arc<str>,
}

impl EncodeLabelSet for RouteLabels {
    fn encode(&self, enc: &mut LabelSetEncoder) -> std::fmt::Result {
        self.parent.encode_service("parent", enc)?;
        self.route.encode_meta("route", enc)?;
        [("hostname", &*self.hostname)].encode(enc)
    }
}

/// A backend of a route of a parent.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct RouteBackendLabels {
    pub parent: Arc<ResourceMeta>,
    pub route: Arc<ResourceMeta>,
    pub backend: Arc<ResourceMeta>,
}

impl EncodeLabelSet for RouteBackendLabels {
    fn encode(&self, enc: &mut LabelSetEncoder) -> std::fmt::Result {
        self.parent.encode_service("parent", enc)?;
        self.route.encode_meta("route", enc)?;
        self.backend.encode_service("backend", enc)
    }
}

/// Why a request got no response from an endpoint (Linkerd's `error`
/// label values).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum RouteError {
    FailFast,
    LoadShed,
    RequestTimeout,
    ResponseHeadersTimeout,
    IdleTimeout,
    Unknown,
}

impl EncodeLabelValue for RouteError {
    fn encode(&self, enc: &mut LabelValueEncoder) -> std::fmt::Result {
        use std::fmt::Write;
        enc.write_str(match self {
            Self::FailFast => "FAIL_FAST",
            Self::LoadShed => "LOAD_SHED",
            Self::RequestTimeout => "REQUEST_TIMEOUT",
            Self::ResponseHeadersTimeout => "RESPONSE_HEADERS_TIMEOUT",
            Self::IdleTimeout => "IDLE_TIMEOUT",
            Self::Unknown => "UNKNOWN",
        })
    }
}

/// How a request (or a try of it) ended: an HTTP status, a gRPC status,
/// or an error.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct StatusLabels<P> {
    pub of: P,
    pub outcome: Outcome,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub enum Outcome {
    Http(Option<u16>, Option<RouteError>),
    /// gRPC's status name (`OK`, `UNAVAILABLE`, ...).
    Grpc(&'static str, Option<RouteError>),
}

impl<P: EncodeLabelSet> EncodeLabelSet for StatusLabels<P> {
    fn encode(&self, enc: &mut LabelSetEncoder) -> std::fmt::Result {
        self.of.encode(enc)?;
        match &self.outcome {
            Outcome::Http(status, error) => {
                let status = status.map(|s| s.to_string()).unwrap_or_default();
                [("http_status", status.as_str())].encode(enc)?;
                [("error", *error)].encode(enc)
            }
            Outcome::Grpc(status, error) => {
                [("grpc_status", *status)].encode(enc)?;
                [("error", *error)].encode(enc)
            }
        }
    }
}

/// gRPC's status names, as Linkerd labels them.
pub fn grpc_status_name(code: Option<u32>) -> &'static str {
    match code {
        Some(0) => "OK",
        Some(1) => "CANCELLED",
        Some(3) => "INVALID_ARGUMENT",
        Some(4) => "DEADLINE_EXCEEDED",
        Some(5) => "NOT_FOUND",
        Some(6) => "ALREADY_EXISTS",
        Some(7) => "PERMISSION_DENIED",
        Some(8) => "RESOURCE_EXHAUSTED",
        Some(9) => "FAILED_PRECONDITION",
        Some(10) => "ABORTED",
        Some(11) => "OUT_OF_RANGE",
        Some(12) => "UNIMPLEMENTED",
        Some(13) => "INTERNAL",
        Some(14) => "UNAVAILABLE",
        Some(15) => "DATA_LOSS",
        Some(16) => "UNAUTHENTICATED",
        _ => "UNKNOWN",
    }
}

/// The families of one protocol's routes (`http` or `grpc`).
#[derive(Debug)]
pub struct RouteFamilies {
    pub request_duration: RetainedFamily<RouteLabels, Histogram>,
    pub request_statuses: RetainedFamily<StatusLabels<RouteLabels>, Counter>,
    pub backend_requests: RetainedFamily<RouteBackendLabels, Counter>,
    pub backend_response_duration: RetainedFamily<RouteBackendLabels, Histogram>,
    pub backend_response_statuses: RetainedFamily<StatusLabels<RouteBackendLabels>, Counter>,
    pub retry_requests: RetainedFamily<RouteLabels, Counter>,
    pub retry_successes: RetainedFamily<RouteLabels, Counter>,
    pub retry_limit_exceeded: RetainedFamily<RouteLabels, Counter>,
    pub retry_overflow: RetainedFamily<RouteLabels, Counter>,
}

fn request_histogram() -> Histogram {
    Histogram::new(REQUEST_BUCKETS)
}

fn response_histogram() -> Histogram {
    Histogram::new(RESPONSE_BUCKETS)
}

impl RouteFamilies {
    pub(crate) fn new(limits: SeriesLimits, drops: &SeriesDrops) -> Self {
        let (l, d) = (limits, drops);
        Self {
            request_duration: RetainedFamily::new(l, d.clone(), request_histogram),
            request_statuses: RetainedFamily::new(l, d.clone(), Counter::default),
            backend_requests: RetainedFamily::new(l, d.clone(), Counter::default),
            backend_response_duration: RetainedFamily::new(l, d.clone(), response_histogram),
            backend_response_statuses: RetainedFamily::new(l, d.clone(), Counter::default),
            retry_requests: RetainedFamily::new(l, d.clone(), Counter::default),
            retry_successes: RetainedFamily::new(l, d.clone(), Counter::default),
            retry_limit_exceeded: RetainedFamily::new(l, d.clone(), Counter::default),
            retry_overflow: RetainedFamily::new(l, d.clone(), Counter::default),
        }
    }

    /// Registers as Linkerd names them: `outbound_{protocol}_route_*`.
    fn register(&self, registry: &mut Registry, protocol: &str) {
        let r = registry.sub_registry_with_prefix(format!("outbound_{protocol}_route"));
        r.register_with_unit(
            "request_duration",
            "The time between request initialization and response headers",
            Unit::Seconds,
            self.request_duration.clone(),
        );
        r.register(
            "request_statuses",
            "Completed request-response streams",
            self.request_statuses.clone(),
        );
        r.register(
            "backend_requests",
            "The total number of requests dispatched to a route backend",
            self.backend_requests.clone(),
        );
        r.register_with_unit(
            "backend_response_duration",
            "The time between request dispatch and response headers",
            Unit::Seconds,
            self.backend_response_duration.clone(),
        );
        r.register(
            "backend_response_statuses",
            "Completed responses",
            self.backend_response_statuses.clone(),
        );
        r.register(
            "retry_requests",
            "Retry requests emitted",
            self.retry_requests.clone(),
        );
        r.register(
            "retry_successes",
            "Successful responses to retry requests",
            self.retry_successes.clone(),
        );
        r.register(
            "retry_limit_exceeded",
            "Retryable requests not sent due to retry limits",
            self.retry_limit_exceeded.clone(),
        );
        r.register(
            "retry_overflow",
            "Retryable requests not sent due to circuit breakers",
            self.retry_overflow.clone(),
        );
    }

    fn sweep(&self, now: tokio::time::Instant) {
        self.request_duration.sweep(now);
        self.request_statuses.sweep(now);
        self.backend_requests.sweep(now);
        self.backend_response_duration.sweep(now);
        self.backend_response_statuses.sweep(now);
        self.retry_requests.sweep(now);
        self.retry_successes.sweep(now);
        self.retry_limit_exceeded.sweep(now);
        self.retry_overflow.sweep(now);
    }
}

/// Most outcomes of one label set whose status series [`Outcomes`] keeps.
const KEPT_OUTCOMES: usize = 4;

/// The status series of one label set, the first few outcomes' handles
/// kept: a route's requests end in one or a few outcomes (a 200, a few
/// statuses), so counting one of those takes neither a lock nor a hash.
/// Other outcomes are counted through the family, as any series is.
#[derive(Debug)]
pub struct Outcomes<L> {
    of: L,
    kept: [OnceLock<(Outcome, Arc<Counter>)>; KEPT_OUTCOMES],
}

impl<L: Clone + Hash + Eq> Outcomes<L> {
    pub fn new(of: L) -> Self {
        Self {
            of,
            kept: Default::default(),
        }
    }

    pub fn labels(&self) -> &L {
        &self.of
    }

    /// Counts one `outcome` of these labels in `family`.
    pub fn inc(&self, family: &RetainedFamily<StatusLabels<L>, Counter>, outcome: Outcome) {
        for slot in &self.kept {
            match slot.get() {
                Some((kept, counter)) if *kept == outcome => {
                    counter.inc();
                    return;
                }
                Some(_) => continue,
                None => {
                    let counter = family.get(&StatusLabels {
                        of: self.of.clone(),
                        outcome: outcome.clone(),
                    });
                    counter.inc();
                    // Lost to another thread: its outcome is kept instead.
                    let _ = slot.set((outcome, counter));
                    return;
                }
            }
        }
        family
            .get(&StatusLabels {
                of: self.of.clone(),
                outcome,
            })
            .inc();
    }
}

/// A route's retry counters.
#[derive(Debug, Default)]
pub struct RetryCounters {
    pub requests: Arc<Counter>,
    pub successes: Arc<Counter>,
    pub limit_exceeded: Arc<Counter>,
}

/// The series of one route (for one hostname), resolved once and used by
/// every request that takes it: a policy version keeps them while it
/// lives, so they stay exported while the route is in force.
#[derive(Debug)]
pub struct RouteHandles {
    pub request_duration: Arc<Histogram>,
    pub statuses: Outcomes<RouteLabels>,
    /// Made by the first request that may retry: a route without retries
    /// exports no retry series, as before.
    retries: OnceLock<RetryCounters>,
}

impl RouteHandles {
    pub fn new(families: &RouteFamilies, labels: RouteLabels) -> Self {
        Self {
            request_duration: families.request_duration.get(&labels),
            statuses: Outcomes::new(labels),
            retries: OnceLock::new(),
        }
    }

    pub fn labels(&self) -> &RouteLabels {
        self.statuses.labels()
    }

    pub fn retries(&self, families: &RouteFamilies) -> &RetryCounters {
        self.retries.get_or_init(|| {
            let labels = self.labels();
            RetryCounters {
                requests: families.retry_requests.get(labels),
                successes: families.retry_successes.get(labels),
                limit_exceeded: families.retry_limit_exceeded.get(labels),
            }
        })
    }
}

/// The series of one backend of one route, resolved once (see
/// [`RouteHandles`]).
#[derive(Debug)]
pub struct BackendHandles {
    pub requests: Arc<Counter>,
    pub response_duration: Arc<Histogram>,
    pub statuses: Outcomes<RouteBackendLabels>,
}

impl BackendHandles {
    pub fn new(families: &RouteFamilies, labels: RouteBackendLabels) -> Self {
        Self {
            requests: families.backend_requests.get(&labels),
            response_duration: families.backend_response_duration.get(&labels),
            statuses: Outcomes::new(labels),
        }
    }
}

/// The outbound policy metrics: HTTP and gRPC routes, and open watches.
#[derive(Debug)]
pub struct OutboundPolicyMetrics {
    pub http: RouteFamilies,
    pub grpc: RouteFamilies,
    /// Policy watches open (one per target in use or recently used).
    pub watches: Gauge,
    /// Request body bytes kept for retries, all requests together (each
    /// request keeps at most its rule's `max_request_bytes`, at most
    /// `outbound::policy::MAX_RETRY_BODY_BYTES`).
    pub retry_body_bytes: Gauge,
}

impl OutboundPolicyMetrics {
    pub fn new(limits: SeriesLimits, drops: &SeriesDrops) -> Self {
        Self {
            http: RouteFamilies::new(limits, drops),
            grpc: RouteFamilies::new(limits, drops),
            watches: Gauge::default(),
            retry_body_bytes: Gauge::default(),
        }
    }

    pub fn register(&self, registry: &mut Registry) {
        self.http.register(registry, "http");
        self.grpc.register(registry, "grpc");
        registry.register(
            "outbound_policy_watches",
            "Outbound policy watches open (one per target in use or recently used)",
            self.watches.clone(),
        );
        registry.register(
            "outbound_retry_body_bytes",
            "Request body bytes kept in memory for retries (each request at most its route's max_request_bytes, capped at 1 MiB)",
            self.retry_body_bytes.clone(),
        );
    }

    pub fn sweep(&self, now: tokio::time::Instant) {
        self.http.sweep(now);
        self.grpc.sweep(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::series::{SeriesDrops, SeriesLimits};
    use std::hash::{BuildHasher, RandomState};

    fn meta(name: &str, port: Option<u16>) -> ResourceMeta {
        ResourceMeta::new(
            Arc::from("gateway.networking.k8s.io"),
            Arc::from("HTTPRoute"),
            Arc::from("shop"),
            Arc::from(name),
            port,
            Arc::from(""),
        )
    }

    #[test]
    fn outcomes_count_into_the_familys_series_kept_or_not() {
        let limits = SeriesLimits {
            retention: std::time::Duration::from_secs(600),
            max_series: 100,
        };
        let families = RouteFamilies::new(limits, &SeriesDrops::default());
        let labels = RouteBackendLabels {
            parent: Arc::new(meta("parent", Some(80))),
            route: Arc::new(meta("route", None)),
            backend: Arc::new(meta("backend", Some(80))),
        };
        let outcomes = Outcomes::new(labels.clone());
        let family = &families.backend_response_statuses;
        // More outcomes than are kept: every one is counted all the same.
        let statuses: Vec<u16> = (0..KEPT_OUTCOMES as u16 + 3).map(|i| 200 + i).collect();
        for round in 1..=3u64 {
            for s in &statuses {
                outcomes.inc(family, Outcome::Http(Some(*s), None));
            }
            for s in &statuses {
                let series = family.get(&StatusLabels {
                    of: labels.clone(),
                    outcome: Outcome::Http(Some(*s), None),
                });
                assert_eq!(series.get(), round, "status {s}");
            }
        }
        assert_eq!(family.len(), statuses.len());
        outcomes.inc(family, Outcome::Http(None, Some(RouteError::FailFast)));
        assert_eq!(family.len(), statuses.len() + 1);
    }

    #[test]
    fn equal_metas_hash_equal_and_each_field_tells_them_apart() {
        let s = RandomState::new();
        let a = meta("web", Some(80));
        assert_eq!(a, meta("web", Some(80)));
        assert_eq!(s.hash_one(&a), s.hash_one(meta("web", Some(80))));
        for other in [
            meta("api", Some(80)),
            meta("web", Some(81)),
            meta("web", None),
        ] {
            assert_ne!(a, other);
            assert_ne!(s.hash_one(&a), s.hash_one(&other), "{other:?}");
        }
        // The same strings in other fields are another meta.
        let swapped = ResourceMeta::new(
            Arc::from("HTTPRoute"),
            Arc::from("gateway.networking.k8s.io"),
            Arc::from("shop"),
            Arc::from("web"),
            Some(80),
            Arc::from(""),
        );
        assert_ne!(s.hash_one(&a), s.hash_one(&swapped));
        assert_eq!(
            s.hash_one(ResourceMeta::default_named("x")),
            s.hash_one(ResourceMeta::default_named("x"))
        );
    }
}
