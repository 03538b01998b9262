//! One request under an outbound policy: its route and rule, the rule's
//! filters, a backend per try, timeouts, retries, and the route metrics.
//!
//! - No route matches: `404` with `l5d-proxy-error: no route` (Linkerd's).
//! - The rule's request timeout bounds the whole request, every try and
//!   backoff included; the response timeout (or the retry's own timeout)
//!   bounds each try until its response headers. Either gives `504` with
//!   `l5d-proxy-error` naming the timeout. A response body still streaming
//!   at the request timeout, or silent for the idle timeout, is cut (the
//!   client sees the stream fail).
//! - A retryable answer (a status in the retry's ranges, a gRPC code among
//!   its conditions, or a try that timed out) is tried again, at most
//!   `max_retries` times, after the retry's backoff, with a new backend
//!   choice; only while the request's body was read whole and kept within
//!   `max_request_bytes` ([`crate::http::ReplayBody`]).

use super::{
    backend,
    bound::BoundBackend,
    filters::{self, InvalidRedirect},
    overrides,
    policy::{
        BackendTarget, ClientPolicy, Filter, HttpRoutes, RetryBackoff, RetryPolicy, RouteBackend,
        RulePolicy,
    },
    Outbound, Target, DIRECTION,
};
use crate::{
    balance::FailureAccrual,
    http::{
        error_response, grpc_status, BodyEnd, BodyTimeout, Naming, ReplayBody, RequestBody,
        ResponseBody, PROXY_ERROR_HEADER,
    },
    metrics::route::{
        grpc_status_name, BackendHandles, OutboundPolicyMetrics, Outcome, RetryCounters,
        RouteBackendLabels, RouteError, RouteFamilies, RouteHandles,
    },
    route,
};
use ballast_backoff::{Backoff, BackoffConfig};
use bytes::Bytes;
use http::{header, request::Parts, HeaderValue, Request, Response, StatusCode};
use hyper::body::Incoming;
use std::{sync::Arc, time::Duration};
use tokio::time::Instant;

/// What the rule matched, for the rest of the request.
struct Matched<'p> {
    /// The route's series (the policy's parent, the route, the hostname).
    handles: Arc<RouteHandles>,
    rule: &'p RulePolicy,
    prefix_len: Option<usize>,
    grpc: bool,
}

/// Serves `req` under `policy`.
pub(super) async fn serve(
    outbound: &Outbound,
    policy: Arc<ClientPolicy>,
    mut req: Request<Incoming>,
) -> Response<ResponseBody> {
    let started = Instant::now();
    let grpc_request = is_grpc(req.headers());
    let Some(matched) = find(&outbound.metrics.outbound_policy, &policy, &req) else {
        outbound.metrics.error(DIRECTION, "no_route");
        return answer_error(grpc_request, StatusCode::NOT_FOUND, "no route");
    };
    let families = matched.families(&outbound.metrics.outbound_policy);
    let rule = matched.rule;
    let mut response_filters = Vec::new();
    for filter in &rule.filters {
        match filter {
            Filter::RequestHeaders(m) => filters::modify_headers(m, req.headers_mut()),
            Filter::ResponseHeaders(m) => response_filters.push(m),
            Filter::Redirect(r) => {
                let rsp = redirect(outbound, r, &req, matched.prefix_len);
                return finish(families, &matched, started, rsp, None);
            }
            Filter::HttpFailure {
                status,
                message,
                ratio,
            } => {
                if filters::sample(*ratio, &mut rand::rng()) {
                    outbound.metrics.error(DIRECTION, "injected_failure");
                    let rsp = proxy_error(*status, message);
                    return finish(families, &matched, started, rsp, None);
                }
            }
            Filter::GrpcFailure {
                code,
                message,
                ratio,
            } => {
                if filters::sample(*ratio, &mut rand::rng()) {
                    outbound.metrics.error(DIRECTION, "injected_failure");
                    let rsp = grpc_failure(*code, message);
                    return finish(families, &matched, started, rsp, None);
                }
            }
        }
    }
    let (retry, timeouts) = overrides::apply(
        rule.allow_l5d_request_headers,
        rule.retry.as_ref(),
        rule.timeouts,
        req.headers_mut(),
    );
    let tries = Tries {
        outbound,
        families,
        matched: &matched,
        grpc_request,
        try_timeout: retry.as_ref().and_then(|r| r.timeout).or(timeouts.response),
        accrual: policy.failure_accrual.as_ref(),
    };
    let mut rsp = within(timeouts.request, tries.run(req, retry.as_ref()), |limit| {
        outbound.metrics.error(DIRECTION, "request_timeout");
        answer_error(
            grpc_request,
            StatusCode::GATEWAY_TIMEOUT,
            &format!("request timeout: {limit:?}"),
        )
    })
    .await;
    for m in response_filters {
        filters::modify_headers(m, rsp.headers_mut());
    }
    // The request timeout bounds the response's body too; the idle
    // timeout, each wait for its next frame.
    rsp.body_mut()
        .limit(timeouts.request.map(|d| started + d), timeouts.idle);
    let error = error_of(&rsp);
    finish(families, &matched, started, rsp, error)
}

impl Matched<'_> {
    fn families<'m>(&self, metrics: &'m OutboundPolicyMetrics) -> &'m RouteFamilies {
        if self.grpc {
            &metrics.grpc
        } else {
            &metrics.http
        }
    }
}

fn find<'p, B>(
    metrics: &OutboundPolicyMetrics,
    policy: &'p ClientPolicy,
    req: &Request<B>,
) -> Option<Matched<'p>> {
    let host = route::request_host(req);
    let (meta, slot, rule, prefix_len, grpc) = match policy.routes(req.version()) {
        HttpRoutes::Http(routes) => {
            let (i, rank, rule) = route::find(&routes.routes, req, host)?;
            let (meta, slot) = (routes.metas.get(i)?, routes.slots.get(i)?);
            (meta, slot, rule, rank.prefix_len(), false)
        }
        HttpRoutes::Grpc(routes) => {
            let (i, _, rule) = route::find(&routes.routes, req, host)?;
            (routes.metas.get(i)?, routes.slots.get(i)?, rule, None, true)
        }
    };
    let families = if grpc { &metrics.grpc } else { &metrics.http };
    Some(Matched {
        handles: slot.handles(families, &policy.parent, meta, host),
        rule,
        prefix_len,
        grpc,
    })
}

/// A response the proxy made, naming why (`l5d-proxy-error`).
fn proxy_error(status: StatusCode, reason: &str) -> Response<ResponseBody> {
    let reason: String = reason.chars().take(256).collect();
    error_response(status, &reason)
}

fn is_grpc(headers: &http::HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// A proxy-made answer: to a gRPC client, as a gRPC status (Linkerd's
/// mapping: not found, deadline exceeded, unavailable, internal); to
/// others, as the HTTP status. Either names the reason in
/// `l5d-proxy-error`.
fn answer_error(grpc: bool, status: StatusCode, reason: &str) -> Response<ResponseBody> {
    if !grpc {
        return proxy_error(status, reason);
    }
    let code = match status {
        StatusCode::NOT_FOUND => 5,
        StatusCode::GATEWAY_TIMEOUT => 4,
        StatusCode::SERVICE_UNAVAILABLE => 14,
        StatusCode::INTERNAL_SERVER_ERROR => 13,
        _ => 2,
    };
    let reason: String = reason.chars().take(256).collect();
    grpc_failure(code, &reason)
}

fn grpc_failure(code: u32, message: &str) -> Response<ResponseBody> {
    let mut rsp = Response::new(ResponseBody::full(Bytes::new()));
    let headers = rsp.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    headers.insert("grpc-status", HeaderValue::from(code));
    if let Ok(v) = HeaderValue::from_str(message) {
        headers.insert("grpc-message", v.clone());
        headers.insert(PROXY_ERROR_HEADER, v);
    }
    rsp
}

fn redirect(
    outbound: &Outbound,
    r: &super::policy::Redirect,
    req: &Request<Incoming>,
    prefix_len: Option<usize>,
) -> Response<ResponseBody> {
    // The request's URI as the client meant it: with the authority of
    // `Host` when it was sent in origin form.
    let mut uri = req.uri().clone();
    if uri.authority().is_none() {
        if let Some(host) = req
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
        {
            let pq = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
            if let Ok(u) = format!("http://{host}{pq}").parse() {
                uri = u;
            }
        }
    }
    match filters::redirect(r, &uri, prefix_len) {
        Ok(Some((status, location))) => {
            let mut rsp = Response::new(ResponseBody::full(Bytes::new()));
            *rsp.status_mut() = status;
            if let Ok(v) = HeaderValue::from_str(&location.to_string()) {
                rsp.headers_mut().insert(header::LOCATION, v);
            }
            rsp.headers_mut()
                .insert(PROXY_ERROR_HEADER, HeaderValue::from_static("redirected"));
            rsp
        }
        Ok(None) | Err(InvalidRedirect::NoAuthority | InvalidRedirect::Location) => {
            outbound.metrics.error(DIRECTION, "invalid_redirect");
            proxy_error(StatusCode::INTERNAL_SERVER_ERROR, "invalid redirect")
        }
        Err(InvalidRedirect::NotAPrefixMatch) => {
            outbound.metrics.error(DIRECTION, "invalid_redirect");
            proxy_error(StatusCode::INTERNAL_SERVER_ERROR, "invalid redirect")
        }
    }
}

/// The `error` label of a response the proxy made in place of an
/// endpoint's.
fn error_of(rsp: &Response<ResponseBody>) -> Option<RouteError> {
    let reason = rsp.headers().get(PROXY_ERROR_HEADER)?.as_bytes();
    Some(match reason {
        b"failfast" => RouteError::FailFast,
        b"queue_full" | b"memory_limit" => RouteError::LoadShed,
        r if r.starts_with(b"response timeout") => RouteError::ResponseHeadersTimeout,
        r if r.starts_with(b"request timeout") => RouteError::RequestTimeout,
        _ => return None,
    })
}

/// Records the request's duration and status when its response body ends.
fn finish(
    families: &RouteFamilies,
    matched: &Matched<'_>,
    started: Instant,
    mut rsp: Response<ResponseBody>,
    error: Option<RouteError>,
) -> Response<ResponseBody> {
    let handles = matched.handles.clone();
    let status = rsp.status().as_u16();
    let grpc = matched.grpc;
    let statuses = families.request_statuses.clone();
    // Only a gRPC outcome reads it.
    let header_status = if grpc {
        grpc_status(rsp.headers())
    } else {
        None
    };
    rsp.body_mut().on_end(
        Box::new(move |end: BodyEnd| {
            handles
                .request_duration
                .observe(started.elapsed().as_secs_f64());
            let error = match end.timed_out {
                Some(BodyTimeout::Request) => Some(RouteError::RequestTimeout),
                Some(BodyTimeout::Idle) => Some(RouteError::IdleTimeout),
                None => error,
            };
            let outcome = if grpc {
                let name = if end.complete || end.grpc_status.is_some() {
                    grpc_status_name(end.grpc_status)
                } else {
                    "UNKNOWN"
                };
                Outcome::Grpc(name, error)
            } else {
                Outcome::Http(error.is_none().then_some(status), error)
            };
            handles.statuses.inc(&statuses, outcome);
        }),
        header_status,
    );
    rsp
}

/// The tries of one request.
struct Tries<'a> {
    outbound: &'a Outbound,
    families: &'a RouteFamilies,
    matched: &'a Matched<'a>,
    /// The client speaks gRPC: the proxy's own answers are gRPC statuses.
    grpc_request: bool,
    try_timeout: Option<Duration>,
    /// The parent's failure accrual, for its backends' balancers.
    accrual: Option<&'a Arc<FailureAccrual>>,
}

impl Tries<'_> {
    async fn run(
        &self,
        req: Request<Incoming>,
        retry: Option<&RetryPolicy>,
    ) -> Response<ResponseBody> {
        let Some(retry) = retry.filter(|r| r.max_retries > 0) else {
            return self.once(req.map(RequestBody::from)).await;
        };
        let (parts, body) = req.into_parts();
        let held = self
            .outbound
            .metrics
            .outbound_policy
            .retry_body_bytes
            .clone();
        let (first, replay) = match ReplayBody::new(body, retry.max_request_bytes, held) {
            Ok(b) => b,
            // Announced larger than the retry buffer: sent once.
            Err(body) => {
                return self
                    .once(Request::from_parts(parts, RequestBody::from(body)))
                    .await
            }
        };
        retry_loop(
            retry,
            RequestBody::Replay(first),
            || replay.body().map(RequestBody::Replay),
            |body| self.once(copy_of(&parts, body)),
            self.matched.handles.retries(self.families),
        )
        .await
    }

    /// One try: a backend chosen, the request sent within the try timeout.
    async fn once(&self, mut req: Request<RequestBody>) -> Response<ResponseBody> {
        let outbound = self.outbound;
        let Some(chosen) = backend::choose(&self.matched.rule.backends, &mut rand::rng()) else {
            outbound.metrics.error(DIRECTION, "no_backend");
            return proxy_error(StatusCode::INTERNAL_SERVER_ERROR, "no backend");
        };
        let mut response_filters = Vec::new();
        for f in &chosen.filters {
            match f {
                Filter::RequestHeaders(m) => filters::modify_headers(m, req.headers_mut()),
                Filter::ResponseHeaders(m) => response_filters.push(m),
                // Redirects and failures belong to rules.
                _ => {}
            }
        }
        let bound = chosen.bound.get_or_init(|| {
            let labels = self.matched.handles.labels();
            BoundBackend {
                metrics: BackendHandles::new(
                    self.families,
                    RouteBackendLabels {
                        parent: labels.parent.clone(),
                        route: labels.route.clone(),
                        backend: chosen.backend.meta.clone(),
                    },
                ),
                balancer: outbound
                    .http_balancer(&target_of(chosen))
                    .map(|b| Arc::downgrade(&b))
                    .unwrap_or_default(),
            }
        });
        bound.metrics.requests.inc();
        // The bound balancer, unless the cache let it go (or had no room
        // when it was bound): then the cache's, as without binding.
        let balancer = match bound.balancer.upgrade() {
            Some(b) => b,
            None => match outbound.http_balancer(&target_of(chosen)) {
                Ok(b) => b,
                Err(e) => {
                    outbound.too_many_targets(&e);
                    return proxy_error(StatusCode::SERVICE_UNAVAILABLE, "too_many_targets");
                }
            },
        };
        if matches!(chosen.backend.target, BackendTarget::Balancer(_)) {
            balancer.set_failure_accrual(self.accrual);
        }
        let started = Instant::now();
        let send = outbound
            .forwarder
            .forward_body(&balancer, req, Naming::Exact);
        let mut rsp = within(self.try_timeout, send, |limit| {
            outbound.metrics.error(DIRECTION, "response_timeout");
            answer_error(
                self.grpc_request,
                StatusCode::GATEWAY_TIMEOUT,
                &format!("response timeout: {limit:?}"),
            )
        })
        .await;
        for m in response_filters {
            filters::modify_headers(m, rsp.headers_mut());
        }
        bound
            .metrics
            .response_duration
            .observe(started.elapsed().as_secs_f64());
        let error = error_of(&rsp);
        let outcome = if self.matched.grpc {
            Outcome::Grpc(grpc_status_name(grpc_status(rsp.headers())), error)
        } else {
            Outcome::Http(error.is_none().then_some(rsp.status().as_u16()), error)
        };
        bound
            .metrics
            .statuses
            .inc(&self.families.backend_response_statuses, outcome);
        rsp
    }
}

/// Where a backend's requests go.
fn target_of(b: &RouteBackend) -> Target {
    match &b.backend.target {
        BackendTarget::Balancer(path) => Target::Logical(path.clone()),
        BackendTarget::Forward(endpoint) => Target::Endpoint(endpoint.clone()),
    }
}

/// A try of a retryable request: its head again, with `body`.
fn copy_of(parts: &Parts, body: RequestBody) -> Request<RequestBody> {
    let mut req = Request::new(body);
    *req.method_mut() = parts.method.clone();
    *req.uri_mut() = parts.uri.clone();
    *req.version_mut() = parts.version;
    *req.headers_mut() = parts.headers.clone();
    // Each try is tapped (as Linkerd taps each endpoint request).
    if let Some(t) = parts.extensions.get::<crate::tap::Tapping>() {
        req.extensions_mut().insert(t.clone());
    }
    req
}

/// The answer of `work`, or of `timed_out` once `limit` (if any) passed.
///
/// Not an `async fn`: one would keep `work` both as its argument and inside
/// the timeout, doubling the request's future (it nests three deep), and a
/// future is moved whole, so its size is paid per request in copies.
fn within<W>(
    limit: Option<Duration>,
    work: W,
    timed_out: impl FnOnce(Duration) -> Response<ResponseBody>,
) -> impl std::future::Future<Output = Response<ResponseBody>>
where
    W: std::future::Future<Output = Response<ResponseBody>>,
{
    use futures_util::{future::Either, FutureExt};
    match limit {
        None => Either::Left(work),
        Some(limit) => Either::Right(
            tokio::time::timeout(limit, work).map(move |r| r.unwrap_or_else(|_| timed_out(limit))),
        ),
    }
}

/// Sends `first`, and again (a body from `again` each time) while the
/// answer is retryable, retries remain, and a body can be had; sleeps the
/// retry's backoff between tries.
async fn retry_loop<B, SendTry, Sent>(
    retry: &RetryPolicy,
    first: B,
    again: impl Fn() -> Option<B>,
    mut send: SendTry,
    counters: &RetryCounters,
) -> Response<ResponseBody>
where
    SendTry: FnMut(B) -> Sent,
    Sent: std::future::Future<Output = Response<ResponseBody>>,
{
    let mut backoff = retry.backoff.map(|b| Backoff::new(&backoff_config(b)));
    let mut body = first;
    let mut retries = 0;
    loop {
        let rsp = send(body).await;
        if !retryable(retry, &rsp) {
            if retries > 0 && !rsp.status().is_server_error() {
                counters.successes.inc();
            }
            return rsp;
        }
        if retries >= retry.max_retries {
            counters.limit_exceeded.inc();
            return rsp;
        }
        // Only a body read whole and kept can be sent again.
        let Some(next) = again() else {
            return rsp;
        };
        drop(rsp);
        retries += 1;
        counters.requests.inc();
        if let Some(b) = backoff.as_mut() {
            tokio::time::sleep(b.next_delay()).await;
        }
        body = next;
    }
}

/// Whether a try's answer is one the retry policy tries again.
fn retryable(retry: &RetryPolicy, rsp: &Response<ResponseBody>) -> bool {
    if matches!(
        error_of(rsp),
        Some(RouteError::ResponseHeadersTimeout | RouteError::FailFast)
    ) {
        return true;
    }
    let status = rsp.status().as_u16();
    if retry
        .statuses
        .iter()
        .any(|(lo, hi)| (*lo..=*hi).contains(&status))
    {
        return true;
    }
    !retry.grpc_codes.is_empty()
        && grpc_status(rsp.headers()).is_some_and(|c| retry.grpc_codes.contains(&c))
}

fn backoff_config(b: RetryBackoff) -> BackoffConfig {
    BackoffConfig {
        initial: b.min,
        max: b.max,
        factor: 2.0,
        jitter: b.jitter,
        reset_after: Duration::from_secs(3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn status(code: u16) -> Response<ResponseBody> {
        let mut rsp = Response::new(ResponseBody::full(Bytes::new()));
        *rsp.status_mut() = StatusCode::from_u16(code).expect("status");
        rsp
    }

    fn policy(max_retries: u32, backoff: Option<RetryBackoff>) -> RetryPolicy {
        RetryPolicy {
            max_retries,
            max_request_bytes: 1024,
            statuses: vec![(502, 503)],
            grpc_codes: vec![14],
            timeout: None,
            backoff,
        }
    }

    fn counters() -> RetryCounters {
        RetryCounters::default()
    }

    const BACKOFF: RetryBackoff = RetryBackoff {
        min: Duration::from_millis(100),
        max: Duration::from_millis(400),
        jitter: 0.0,
    };

    #[tokio::test(start_paused = true)]
    async fn retries_stop_at_max_retries_with_backoff_between_tries() {
        let tries = AtomicU32::new(0);
        let at = std::sync::Mutex::new(Vec::new());
        let started = Instant::now();
        let c = counters();
        let rsp = retry_loop(
            &policy(3, Some(BACKOFF)),
            (),
            || Some(()),
            |()| {
                tries.fetch_add(1, Ordering::Relaxed);
                at.lock().expect("lock").push(started.elapsed());
                async { status(503) }
            },
            &c,
        )
        .await;
        assert_eq!(rsp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            tries.load(Ordering::Relaxed),
            4,
            "one try and three retries"
        );
        // Exponential: 100, 200, 400 ms between tries.
        let ms: Vec<u128> = at
            .lock()
            .expect("lock")
            .iter()
            .map(|d| d.as_millis())
            .collect();
        assert_eq!(ms, [0, 100, 300, 700]);
        assert_eq!(
            (c.requests.get(), c.limit_exceeded.get(), c.successes.get()),
            (3, 1, 0)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_success_ends_the_tries_and_other_statuses_are_not_retried() {
        let tries = AtomicU32::new(0);
        let c = counters();
        let rsp = retry_loop(
            &policy(5, None),
            (),
            || Some(()),
            |()| {
                let n = tries.fetch_add(1, Ordering::Relaxed);
                async move { status(if n < 2 { 502 } else { 200 }) }
            },
            &c,
        )
        .await;
        assert_eq!(rsp.status(), StatusCode::OK);
        assert_eq!(tries.load(Ordering::Relaxed), 3);
        assert_eq!(
            (c.requests.get(), c.successes.get(), c.limit_exceeded.get()),
            (2, 1, 0)
        );

        let tries = AtomicU32::new(0);
        let rsp = retry_loop(
            &policy(5, None),
            (),
            || Some(()),
            |()| {
                tries.fetch_add(1, Ordering::Relaxed);
                async { status(500) }
            },
            &counters(),
        )
        .await;
        assert_eq!(rsp.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(tries.load(Ordering::Relaxed), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_cannot_be_had_again_is_sent_once() {
        let tries = AtomicU32::new(0);
        let c = counters();
        let rsp = retry_loop(
            &policy(3, None),
            (),
            || None,
            |()| {
                tries.fetch_add(1, Ordering::Relaxed);
                async { status(503) }
            },
            &c,
        )
        .await;
        assert_eq!(rsp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(tries.load(Ordering::Relaxed), 1);
        assert_eq!(c.requests.get(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_try_past_its_timeout_is_a_504_and_is_retried() {
        let tries = AtomicU32::new(0);
        let started = Instant::now();
        let limit = Some(Duration::from_millis(300));
        let rsp = retry_loop(
            &policy(2, None),
            (),
            || Some(()),
            |()| {
                let n = tries.fetch_add(1, Ordering::Relaxed);
                // The first two tries hang; the third answers in 50 ms.
                let work = async move {
                    let wait = if n < 2 {
                        Duration::from_secs(3600)
                    } else {
                        Duration::from_millis(50)
                    };
                    tokio::time::sleep(wait).await;
                    status(200)
                };
                within(limit, work, |d| {
                    proxy_error(
                        StatusCode::GATEWAY_TIMEOUT,
                        &format!("response timeout: {d:?}"),
                    )
                })
            },
            &counters(),
        )
        .await;
        assert_eq!(rsp.status(), StatusCode::OK);
        assert_eq!(started.elapsed(), Duration::from_millis(650));

        // A request timeout bounds every try together.
        let started = Instant::now();
        let (many, c) = (policy(10, Some(BACKOFF)), counters());
        let all = retry_loop(
            &many,
            (),
            || Some(()),
            |()| {
                within(limit, std::future::pending(), |_| {
                    proxy_error(StatusCode::GATEWAY_TIMEOUT, "response timeout: 300ms")
                })
            },
            &c,
        );
        let rsp = within(Some(Duration::from_secs(1)), all, |d| {
            proxy_error(
                StatusCode::GATEWAY_TIMEOUT,
                &format!("request timeout: {d:?}"),
            )
        })
        .await;
        assert_eq!(rsp.status(), StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(
            rsp.headers()
                .get(PROXY_ERROR_HEADER)
                .and_then(|v| v.to_str().ok()),
            Some("request timeout: 1s")
        );
        assert_eq!(started.elapsed(), Duration::from_secs(1));
    }

    #[test]
    fn grpc_clients_get_the_proxys_answers_as_grpc_statuses() {
        let rsp = answer_error(true, StatusCode::GATEWAY_TIMEOUT, "request timeout: 1s");
        assert_eq!(rsp.status(), StatusCode::OK);
        assert_eq!(grpc_status(rsp.headers()), Some(4));
        assert_eq!(error_of(&rsp), Some(RouteError::RequestTimeout));
        let rsp = answer_error(false, StatusCode::NOT_FOUND, "no route");
        assert_eq!(rsp.status(), StatusCode::NOT_FOUND);
        let mut h = http::HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc+proto"),
        );
        assert!(is_grpc(&h));
    }

    #[test]
    fn proxy_made_answers_are_labelled_as_linkerd_does() {
        let timeout = proxy_error(StatusCode::GATEWAY_TIMEOUT, "response timeout: 1s");
        assert_eq!(error_of(&timeout), Some(RouteError::ResponseHeadersTimeout));
        assert_eq!(
            error_of(&error_response(StatusCode::SERVICE_UNAVAILABLE, "failfast")),
            Some(RouteError::FailFast)
        );
        assert_eq!(error_of(&status(503)), None);
        let r = policy(1, None);
        assert!(retryable(&r, &timeout), "a try that timed out is retried");
        let mut grpc = status(200);
        grpc.headers_mut()
            .insert("grpc-status", HeaderValue::from_static("14"));
        assert!(retryable(&r, &grpc));
        grpc.headers_mut()
            .insert("grpc-status", HeaderValue::from_static("2"));
        assert!(!retryable(&r, &grpc));
    }
}
