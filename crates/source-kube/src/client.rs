//! The tower layer on the kube client: counts requests and responses,
//! honours `429 Retry-After`, keeps a watch that ends at once from being
//! reopened in a tight loop, and notes when watch streams deliver data.
//!
//! It sits outermost on kube's stack. kube's own retry layer (which retries
//! 429/503/504 from 5 ms up to 15 times, bypassing the source's backoff) is
//! turned off by [`super::client_from_config`]: every retry the source makes
//! goes through its own schedule and is counted here.

use crate::metrics::{KubeFreshness, KubeMetrics, KubeRequestLabel, KubeResponseLabel};
use ballast_backoff::{Backoff, BackoffConfig};
use ballast_store::metrics::Metrics;
use bytes::Bytes;
use http::{header::RETRY_AFTER, HeaderMap, Method, Request, Response, StatusCode, Uri};
use http_body::{Body, Frame, SizeHint};
use std::{
    collections::HashMap,
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::Duration,
};
use tokio::time::Instant;
use tower::{BoxError, Layer, Service};

/// The wait used for a `Retry-After` that is not a number of seconds (the
/// API server always sends seconds; an HTTP date is not parsed).
const UNPARSED_RETRY_AFTER: Duration = Duration::from_secs(1);
/// Longest `kind` label taken from a URL; longer or odd names count as `other`.
const MAX_KIND_LABEL: usize = 63;

/// What a request does, from its method, path and query.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Verb {
    List,
    Watch,
    Get,
    Other,
}

impl Verb {
    fn as_str(self) -> &'static str {
        match self {
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Get => "get",
            Verb::Other => "other",
        }
    }
}

/// The verb and resource (URL plural) of an API request.
pub(crate) fn classify(method: &Method, uri: &Uri) -> (Verb, String) {
    let mut segs: Vec<&str> = uri.path().split('/').filter(|s| !s.is_empty()).collect();
    let rest = match segs.first().copied() {
        Some("api") if segs.len() >= 2 => segs.split_off(2),
        Some("apis") if segs.len() >= 3 => segs.split_off(3),
        _ => return (Verb::Other, "other".to_string()),
    };
    let mut rest: &[&str] = &rest;
    // The deprecated `/watch/` path prefix.
    let watch_path = rest.first() == Some(&"watch");
    if watch_path {
        rest = &rest[1..];
    }
    if rest.first() == Some(&"namespaces") && rest.len() >= 3 {
        rest = &rest[2..];
    }
    let Some(kind) = rest.first() else {
        return (Verb::Other, "other".to_string());
    };
    let kind = if kind.len() <= MAX_KIND_LABEL
        && kind
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-')
    {
        kind.to_string()
    } else {
        "other".to_string()
    };
    let watch_query = uri.query().is_some_and(|q| {
        q.split('&')
            .any(|kv| matches!(kv, "watch=true" | "watch=1" | "watch=True"))
    });
    let verb = if *method != Method::GET {
        Verb::Other
    } else if watch_path || watch_query {
        Verb::Watch
    } else if rest.len() >= 2 {
        Verb::Get
    } else {
        Verb::List
    };
    (verb, kind)
}

/// The wait a 429 asks for, capped.
pub(crate) fn retry_after(headers: &HeaderMap, max: Duration) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?;
    let wait = value
        .to_str()
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(UNPARSED_RETRY_AFTER);
    Some(wait.min(max))
}

/// Per resource: when its last WATCH started, and the schedule that spaces
/// WATCHes reopened right after one that ended at once.
#[derive(Debug)]
struct WatchPace {
    last_start: Instant,
    backoff: Backoff,
}

struct Shared {
    metrics: KubeMetrics,
    max_retry_after: Duration,
    request_timeout: Duration,
    backoff: BackoffConfig,
    /// A WATCH reopened sooner than this after the previous one started is
    /// delayed by the backoff schedule: the shortest first retry delay, so a
    /// watch reopened after an error backoff is never delayed twice.
    quick_watch: Duration,
    watches: Mutex<HashMap<String, WatchPace>>,
}

impl Shared {
    /// Counts a WATCH and returns how long it must wait before it is sent.
    fn pace_watch(&self, kind: &str) -> Option<Duration> {
        let now = Instant::now();
        let mut watches = self.watches.lock().unwrap_or_else(|e| e.into_inner());
        match watches.get_mut(kind) {
            None => {
                watches.insert(
                    kind.to_string(),
                    WatchPace {
                        last_start: now,
                        backoff: Backoff::new(&self.backoff),
                    },
                );
                None
            }
            Some(pace) => {
                self.metrics
                    .kube_watch_restarts_total
                    .get_or_create(&Metrics::kind(kind))
                    .inc();
                let delay = if now.saturating_duration_since(pace.last_start) < self.quick_watch {
                    Some(pace.backoff.next_delay())
                } else {
                    pace.backoff.reset();
                    None
                };
                pace.last_start = now + delay.unwrap_or_default();
                delay
            }
        }
    }
}

/// The layer; see the module documentation.
#[derive(Clone)]
pub(crate) struct ApiLayer {
    shared: Arc<Shared>,
}

impl ApiLayer {
    pub fn new(
        metrics: KubeMetrics,
        backoff: &BackoffConfig,
        max_retry_after: Duration,
        request_timeout: Duration,
    ) -> Self {
        let backoff = backoff.sanitized();
        Self {
            shared: Arc::new(Shared {
                metrics,
                max_retry_after,
                request_timeout,
                quick_watch: backoff.bounds(0).0,
                backoff,
                watches: Mutex::new(HashMap::new()),
            }),
        }
    }
}

impl<S> Layer<S> for ApiLayer {
    type Service = ApiService<S>;

    fn layer(&self, inner: S) -> ApiService<S> {
        ApiService {
            inner,
            shared: self.shared.clone(),
        }
    }
}

pub(crate) struct ApiService<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for ApiService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    ResBody: Body<Data = Bytes> + Unpin + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<ObservedBody<ResBody>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let shared = self.shared.clone();
        let (verb, kind) = classify(req.method(), req.uri());
        shared
            .metrics
            .kube_requests_total
            .get_or_create(&KubeRequestLabel {
                verb: verb.as_str().to_string(),
                kind: kind.clone(),
            })
            .inc();
        let pace = if verb == Verb::Watch {
            shared.pace_watch(&kind)
        } else {
            None
        };
        // kube's stack does no IO until its future is polled, so a paced
        // WATCH is sent only after the wait.
        let response = self.inner.call(req);
        let deadline = (verb != Verb::Watch).then(|| Instant::now() + shared.request_timeout);
        Box::pin(async move {
            if let Some(wait) = pace {
                tracing::debug!(
                    kind = %kind,
                    wait_ms = wait.as_millis() as u64,
                    "Previous watch ended at once; waiting before watching again"
                );
                tokio::time::sleep(wait).await;
            }
            let response = match deadline {
                Some(at) => match tokio::time::timeout_at(at, response).await {
                    Ok(r) => r.map_err(Into::into),
                    Err(_) => Err(BoxError::from(RequestTimedOut)),
                },
                None => response.await.map_err(Into::into),
            };
            let response = match response {
                Ok(r) => r,
                Err(e) => {
                    shared
                        .metrics
                        .kube_responses_total
                        .get_or_create(&KubeResponseLabel {
                            kind,
                            code: "error".to_string(),
                        })
                        .inc();
                    return Err(e);
                }
            };
            let status = response.status();
            shared
                .metrics
                .kube_responses_total
                .get_or_create(&KubeResponseLabel {
                    kind: kind.clone(),
                    code: status.as_u16().to_string(),
                })
                .inc();
            if status == StatusCode::TOO_MANY_REQUESTS {
                if let Some(wait) = retry_after(response.headers(), shared.max_retry_after) {
                    tracing::debug!(
                        kind = %kind,
                        wait_ms = wait.as_millis() as u64,
                        "API server asked to retry later (429); waiting"
                    );
                    tokio::time::sleep(wait).await;
                }
            }
            let watch = (verb == Verb::Watch && status.is_success())
                .then(|| (shared.metrics.kube_last_event.clone(), kind));
            let deadline = deadline.map(|at| Box::pin(tokio::time::sleep_until(at)));
            Ok(response.map(|inner| ObservedBody {
                inner,
                watch,
                deadline,
            }))
        })
    }
}

/// A request other than WATCH that did not complete within
/// [`super::KubeConfig::request_timeout`].
#[derive(Debug, thiserror::Error)]
#[error("the API server did not answer within the request timeout")]
pub(crate) struct RequestTimedOut;

/// A response body; for a watch stream, every data frame marks the resource
/// as heard from (events and bookmarks alike); for other requests, the body
/// must end by the request's deadline.
pub(crate) struct ObservedBody<B> {
    inner: B,
    watch: Option<(KubeFreshness, String)>,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<B> Body for ObservedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some(deadline) = this.deadline.as_mut() {
            if deadline.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Some(Err(RequestTimedOut.into())));
            }
        }
        let polled = Pin::new(&mut this.inner).poll_frame(cx).map_err(Into::into);
        if let (Poll::Ready(Some(Ok(frame))), Some((freshness, kind))) = (&polled, &this.watch) {
            if frame.data_ref().is_some_and(|d| !d.is_empty()) {
                freshness.touch(kind);
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn c(method: Method, uri: &str) -> (Verb, String) {
        let (v, k) = classify(&method, &uri.parse().unwrap());
        (v, k)
    }

    #[test]
    fn requests_are_classified_by_verb_and_resource() {
        let cases = [
            ("/api/v1/pods?limit=500", Verb::List, "pods"),
            ("/api/v1/pods?limit=500&continue=abc", Verb::List, "pods"),
            (
                "/api/v1/pods?&watch=true&timeoutSeconds=290&allowWatchBookmarks=true&resourceVersion=7",
                Verb::Watch,
                "pods",
            ),
            ("/api/v1/namespaces/ns/services", Verb::List, "services"),
            ("/api/v1/namespaces/ns/services/web", Verb::Get, "services"),
            ("/api/v1/namespaces/ns/pods/web-0/status", Verb::Get, "pods"),
            ("/api/v1/namespaces", Verb::List, "namespaces"),
            ("/api/v1/namespaces/ns", Verb::Get, "namespaces"),
            (
                "/apis/discovery.k8s.io/v1/endpointslices?watch=1",
                Verb::Watch,
                "endpointslices",
            ),
            ("/api/v1/watch/namespaces/ns/pods", Verb::Watch, "pods"),
            ("/version", Verb::Other, "other"),
            ("/api/v1/PODS%20x", Verb::List, "other"),
        ];
        for (uri, verb, kind) in cases {
            assert_eq!(c(Method::GET, uri), (verb, kind.to_string()), "{uri}");
        }
        assert_eq!(
            c(Method::POST, "/api/v1/namespaces/ns/pods"),
            (Verb::Other, "pods".to_string())
        );
    }

    #[test]
    fn retry_after_is_capped_and_tolerant() {
        let max = Duration::from_secs(60);
        let mut h = HeaderMap::new();
        assert_eq!(retry_after(&h, max), None);
        h.insert(RETRY_AFTER, HeaderValue::from_static("3"));
        assert_eq!(retry_after(&h, max), Some(Duration::from_secs(3)));
        h.insert(RETRY_AFTER, HeaderValue::from_static("86400"));
        assert_eq!(retry_after(&h, max), Some(max));
        h.insert(
            RETRY_AFTER,
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(retry_after(&h, max), Some(UNPARSED_RETRY_AFTER));
    }

    #[tokio::test(start_paused = true)]
    async fn watches_reopened_at_once_are_paced() {
        let metrics = KubeMetrics::default();
        let layer = ApiLayer::new(
            metrics.clone(),
            &BackoffConfig::default(),
            Duration::ZERO,
            Duration::from_secs(60),
        );
        let s = &layer.shared;
        assert_eq!(s.pace_watch("pods"), None);
        // Reopened at once: the first step of the schedule, then the second.
        let d1 = s.pace_watch("pods").expect("paced");
        assert!(d1 >= Duration::from_millis(400) && d1 <= Duration::from_millis(800));
        tokio::time::advance(d1).await;
        let d2 = s.pace_watch("pods").expect("paced");
        assert!(d2 >= Duration::from_millis(800) && d2 <= Duration::from_millis(1600));
        // Another resource is independent.
        assert_eq!(s.pace_watch("services"), None);
        // A watch that lasted: no wait, and the schedule starts over.
        tokio::time::advance(d2 + Duration::from_secs(5)).await;
        assert_eq!(s.pace_watch("pods"), None);
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(s.pace_watch("pods"), None);
        assert_eq!(
            metrics
                .kube_watch_restarts_total
                .get_or_create(&Metrics::kind("pods"))
                .get(),
            4
        );
    }

    /// A stand-in for kube's stack: answers every request with `status`.
    struct Answer(StatusCode, Option<&'static str>);

    impl Service<Request<()>> for Answer {
        type Response = Response<http_body_util::Empty<Bytes>>;
        type Error = BoxError;
        type Future = std::future::Ready<Result<Self::Response, BoxError>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: Request<()>) -> Self::Future {
            let mut r = Response::new(http_body_util::Empty::new());
            *r.status_mut() = self.0;
            if let Some(v) = self.1 {
                r.headers_mut()
                    .insert(RETRY_AFTER, HeaderValue::from_static(v));
            }
            std::future::ready(Ok(r))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn too_many_requests_waits_retry_after_up_to_the_cap() {
        let metrics = KubeMetrics::default();
        let layer = ApiLayer::new(
            metrics.clone(),
            &BackoffConfig::default(),
            Duration::from_secs(5),
            Duration::from_secs(60),
        );
        let request = || Request::get("/api/v1/pods?limit=500").body(()).unwrap();
        for (retry_after, waited) in [(Some("2"), 2), (Some("600"), 5), (None, 0)] {
            let mut svc = layer.layer(Answer(StatusCode::TOO_MANY_REQUESTS, retry_after));
            let start = Instant::now();
            let r = svc.call(request()).await.unwrap();
            assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
            assert_eq!(
                start.elapsed(),
                Duration::from_secs(waited),
                "{retry_after:?}"
            );
        }
        let mut svc = layer.layer(Answer(StatusCode::OK, Some("9")));
        let start = Instant::now();
        svc.call(request()).await.unwrap();
        assert_eq!(start.elapsed(), Duration::ZERO);
        let count = |code: &str| {
            metrics
                .kube_responses_total
                .get_or_create(&KubeResponseLabel {
                    kind: "pods".into(),
                    code: code.into(),
                })
                .get()
        };
        assert_eq!((count("429"), count("200")), (3, 1));
    }
}
