//! The Kubernetes source: kube-rs watchers on Pods, Services and
//! EndpointSlices (discovery.k8s.io/v1), feeding the same index as the
//! manifests source, gently.
//!
//! What a start costs the API server: per resource kind, one paginated LIST
//! ([`KubeConfig::page_size`] objects a page) and one WATCH with bookmarks.
//! After that:
//!
//! - a watch that ends (timeout, cut connection) is reopened from the last
//!   resourceVersion seen (an event or a bookmark) with no LIST; a WATCH
//!   reopened right after one that ended at once waits on the backoff
//!   schedule, so a server that closes watches at once is not hammered;
//! - only `410 Gone` (an expired resourceVersion or continue token) relists
//!   the kind; the relist replaces the kind's objects in one
//!   [`Op::Reset`]: what is gone is removed, what is unchanged sends nothing;
//! - every failure (connection refused, 5xx, 429, 410) waits one step of
//!   the capped, jittered exponential schedule ([`BackoffConfig`]) before the
//!   next request, and logs one warning naming the kind, what failed and the
//!   wait; a `429` additionally waits its `Retry-After` (capped at
//!   [`KubeConfig::max_retry_after`]) before the failure is reported;
//! - kube's built-in retry layer is off: no request is retried outside the
//!   schedule.
//!
//! While the API server is unreachable the index keeps its last state (the
//! source never resets it on errors), the process stays live, and
//! `destination_kube_last_event_age_seconds{kind}` grows. The store is set
//! ready once every kind has completed its first list.
//!
//! Objects are decoded into slim projections ([`ballast_store::resource`]'s wire
//! types): fields the index does not read are skipped by the decoder and
//! never allocated. A relist holds the new objects next to the index until
//! it completes, so memory peaks near twice the steady state during one.

#![forbid(unsafe_code)]

mod client;
pub mod metrics;
mod resources;
mod settle;

pub use ballast_backoff::{
    BackoffConfig, DEFAULT_FACTOR, DEFAULT_INITIAL, DEFAULT_JITTER, DEFAULT_MAX,
    DEFAULT_RESET_AFTER,
};
pub use resources::WATCHED_RESOURCES;
pub use settle::{DEFAULT_SERVER_SETTLE, MAX_SETTLING};

use ballast_backoff::Backoff;
pub use metrics::KubeMetrics;

use ballast_store::{
    metrics::Metrics,
    resource::{
        truncate, AuthorizationPolicyWire, EndpointSliceWire, GrpcRouteWire, HttpRouteWire,
        LinkerdHttpRouteWire, MeshTlsAuthenticationWire, NamespaceWire, NetworkAuthenticationWire,
        PodWire, ServerWire, ServiceProfileWire, ServiceWire,
    },
    store::Store,
};
use futures_util::StreamExt;
use kube::runtime::watcher;
use resources::{ApiKind, Translator, Watched};
use std::{
    future::Future,
    path::PathBuf,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};
use tokio::time::Instant;

/// Default objects per LIST page (kube's and client-go's default).
pub const DEFAULT_PAGE_SIZE: u32 = 500;
/// Default cap on the wait a `429 Retry-After` asks for.
pub const DEFAULT_MAX_RETRY_AFTER: Duration = Duration::from_secs(60);
/// Default time a LIST or GET has to complete, body included.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Longest error text logged.
const ERROR_TEXT_MAX: usize = 300;

/// How the Kubernetes source reaches and treats the API server.
#[derive(Clone, Debug, PartialEq)]
pub struct KubeConfig {
    /// A kubeconfig file; `None` infers the configuration: `KUBECONFIG` or
    /// `~/.kube/config` if present, else the in-cluster service account.
    pub kubeconfig: Option<PathBuf>,
    /// Objects per LIST page (at least 1). Default [`DEFAULT_PAGE_SIZE`], 500.
    pub page_size: u32,
    /// The retry schedule after failures. Default: 800 ms doubling to 30 s,
    /// half of each delay random ([`BackoffConfig::default`]).
    pub backoff: BackoffConfig,
    /// Longest wait honoured from a `429` response's `Retry-After`. Default
    /// [`DEFAULT_MAX_RETRY_AFTER`], 60 s.
    pub max_retry_after: Duration,
    /// Time a request other than WATCH has to complete, body included (a
    /// stalled LIST fails and is retried on the schedule). Default
    /// [`DEFAULT_REQUEST_TIMEOUT`], 60 s. Watches are bounded by kube's idle
    /// timeout (the watch timeout, 290 s, plus 5 s).
    pub request_timeout: Duration,
    /// How long a Server's add or update is held before it is applied, so
    /// that authorizations created just before it (on other watches) are
    /// applied first. Default [`DEFAULT_SERVER_SETTLE`], 1 s; zero applies
    /// Servers as they arrive.
    pub server_settle: Duration,
}

impl Default for KubeConfig {
    fn default() -> Self {
        Self {
            kubeconfig: None,
            page_size: DEFAULT_PAGE_SIZE,
            backoff: BackoffConfig::default(),
            max_retry_after: DEFAULT_MAX_RETRY_AFTER,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            server_settle: DEFAULT_SERVER_SETTLE,
        }
    }
}

/// Why the Kubernetes source cannot start.
///
/// The causes are kept as one-line text, not as `source()`s: kube's errors
/// already repeat their own sources' text (and the YAML parser's spans
/// several lines), so a chained `{:#}` would print each cause two or three
/// times.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error(
        "cannot use the kubeconfig {path}: {reason}; pass a readable kubeconfig file, or omit it to use KUBECONFIG or the in-cluster service account"
    )]
    Kubeconfig { path: String, reason: String },
    #[error(
        "no Kubernetes configuration found (not in a pod with a service account, and {reason}); run in a pod with a service account, set KUBECONFIG, or pass a kubeconfig file"
    )]
    Infer { reason: String },
    #[error("cannot build the Kubernetes client: {0}")]
    Client(String),
    #[error(
        "the {0} watcher stopped unexpectedly; this is a bug: restart the controller and report it"
    )]
    Stopped(&'static str),
}

/// A kubeconfig error as one line, its cause said once: an unreadable file
/// gives the IO error alone (the caller names the file), other errors their
/// first line (the YAML parser appends a drawing of the bad line).
/// A kube client for the source: the kubeconfig file if one is given, else
/// the inferred configuration (see [`KubeConfig::kubeconfig`]); see
/// [`client_from_config`] for what is added.
pub async fn client(config: &KubeConfig, metrics: &KubeMetrics) -> Result<kube::Client, KubeError> {
    let kube_config = ballast_kubeconfig::load(config.kubeconfig.as_deref())
        .await
        .map_err(|e| match e {
            ballast_kubeconfig::ConfigError::File { path, reason } => {
                KubeError::Kubeconfig { path, reason }
            }
            ballast_kubeconfig::ConfigError::Infer { reason } => KubeError::Infer { reason },
        })?;
    client_from_config(kube_config, config, metrics)
}

/// A kube client from an explicit kube configuration (tests point it at an
/// emulated API server), with the source's layer: requests counted by verb
/// and resource, responses by status code, `429 Retry-After` honoured up to
/// [`KubeConfig::max_retry_after`], WATCHes reopened at once paced, requests
/// other than WATCH bounded by [`KubeConfig::request_timeout`]. kube's own
/// retry layer is turned off.
pub fn client_from_config(
    mut kube_config: kube::Config,
    config: &KubeConfig,
    metrics: &KubeMetrics,
) -> Result<kube::Client, KubeError> {
    kube_config.default_retry = false;
    let layer = client::ApiLayer::new(
        metrics.clone(),
        &config.backoff,
        config.max_retry_after,
        config.request_timeout,
    );
    let builder = kube::client::ClientBuilder::try_from(kube_config)
        .map_err(|e| KubeError::Client(ballast_kubeconfig::first_line(&e.to_string())))?;
    Ok(builder.with_layer(&layer).build())
}

/// Runs the source until `shutdown` resolves: one watcher per kind, each
/// feeding `store` and counting in `metrics`; the store is set ready once
/// every kind is listed.
///
/// Errors from the API server never end it (they are retried on the
/// schedule); it returns `Ok(())` on shutdown.
pub async fn run(
    config: KubeConfig,
    client: kube::Client,
    store: Arc<Store>,
    metrics: KubeMetrics,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), KubeError> {
    let pending = AtomicUsize::new(resources::WATCHED_RESOURCES.len());
    let ctx = Ctx {
        config: &config,
        client: &client,
        store: &store,
        metrics: &metrics,
        pending: &pending,
    };
    let watchers: Vec<WatchLoop<'_>> = vec![
        Box::pin(watch::<PodWire>(ctx)),
        Box::pin(watch::<ServiceWire>(ctx)),
        Box::pin(watch::<EndpointSliceWire>(ctx)),
        Box::pin(watch::<NamespaceWire>(ctx)),
        Box::pin(watch::<HttpRouteWire>(ctx)),
        Box::pin(watch::<GrpcRouteWire>(ctx)),
        Box::pin(watch::<LinkerdHttpRouteWire>(ctx)),
        Box::pin(watch::<ServerWire>(ctx)),
        Box::pin(watch::<AuthorizationPolicyWire>(ctx)),
        Box::pin(watch::<MeshTlsAuthenticationWire>(ctx)),
        Box::pin(watch::<NetworkAuthenticationWire>(ctx)),
        Box::pin(watch::<ServiceProfileWire>(ctx)),
    ];
    debug_assert_eq!(watchers.len(), resources::WATCHED_RESOURCES.len());
    // One task applies every kind's changes; the streams they reach are
    // woken once it has applied all that is ready (two objects changed
    // together reach a stream's connection as one write).
    let watchers = ballast_store::wakes::Coalesce::new(async {
        futures_util::future::try_join_all(watchers)
            .await
            .map(|_| ())
    });
    tokio::select! {
        () = shutdown => Ok(()),
        r = watchers => r,
    }
}

type WatchLoop<'a> = std::pin::Pin<Box<dyn Future<Output = Result<(), KubeError>> + Send + 'a>>;

#[derive(Copy, Clone)]
struct Ctx<'a> {
    config: &'a KubeConfig,
    client: &'a kube::Client,
    store: &'a Arc<Store>,
    metrics: &'a KubeMetrics,
    /// Kinds that have not completed their first list.
    pending: &'a AtomicUsize,
}

impl Ctx<'_> {
    fn watcher<W: ApiKind>(
        &self,
    ) -> impl futures_util::Stream<Item = watcher::Result<watcher::Event<Watched<W>>>> + Send + use<'_, W>
    {
        let api = kube::Api::<Watched<W>>::all(self.client.clone());
        let wc = watcher::Config::default().page_size(self.config.page_size.max(1));
        watcher::watcher(api, wc)
    }
}

/// One kind's watch loop. Returns only if kube's watcher stream ends, which
/// it does not.
async fn watch<W: ApiKind>(ctx: Ctx<'_>) -> Result<(), KubeError> {
    let metrics = ctx.metrics;
    let kind = W::PLURAL;
    metrics.kube_last_event.start(kind);
    let mut stream = ctx.watcher::<W>().boxed();
    let mut translator = Translator::new::<W>();
    let mut backoff = Backoff::new(&ctx.config.backoff);
    let mut last_failure: Option<Instant> = None;
    let mut listed_once = false;
    let hold = if W::KIND == ballast_store::resource::Kind::Server {
        ctx.config.server_settle
    } else {
        Duration::ZERO
    };
    let mut settle = settle::Settle::new(hold, MAX_SETTLING);
    let settling = metrics
        .kube_settling_objects
        .get_or_create(&Metrics::kind(kind))
        .clone();
    loop {
        let due = settle.next_due();
        let item = tokio::select! {
            biased;
            () = async {
                match due {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            } => {
                let ops = settle.take_due(Instant::now());
                settling.set(settle.len() as i64);
                if !ops.is_empty() {
                    ctx.store.update(ops);
                }
                continue;
            }
            item = stream.next() => item,
        };
        let Some(item) = item else {
            return Err(KubeError::Stopped(kind));
        };
        match item {
            Ok(event) => {
                // `Init` comes before each list attempt, answered or not.
                if !matches!(event, watcher::Event::Init) {
                    metrics.kube_last_event.touch(kind);
                }
                let outcome = translator.on_event(event);
                if outcome.relist {
                    metrics
                        .kube_relists_total
                        .get_or_create(&Metrics::kind(kind))
                        .inc();
                    tracing::info!(kind, "Relisting (the watch could not resume)");
                }
                if let Some(op) = outcome.op {
                    let ops = settle.admit(op, Instant::now());
                    settling.set(settle.len() as i64);
                    if !ops.is_empty() {
                        ctx.store.update(ops);
                    }
                }
                metrics
                    .kube_invalid_objects
                    .get_or_create(&Metrics::kind(kind))
                    .set(translator.invalid_count() as i64);
                if outcome.progress {
                    backoff.reset();
                }
                if outcome.listed && !listed_once {
                    listed_once = true;
                    tracing::info!(kind, "Initial list complete");
                    if ctx.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
                        tracing::info!("Every kind listed; the Kubernetes source is ready");
                        ctx.store.set_ready();
                    }
                }
            }
            Err(error) => {
                // Nothing more arrives while the watch is down: held
                // objects would wait for nothing.
                let held = settle.take_all();
                settling.set(0);
                if !held.is_empty() {
                    ctx.store.update(held);
                }
                let now = Instant::now();
                if last_failure.is_some_and(|at| {
                    now.saturating_duration_since(at) > backoff.config().reset_after
                }) {
                    backoff.reset();
                }
                last_failure = Some(now);
                let delay = backoff.next_delay();
                let mut text = error.to_string();
                truncate(&mut text, ERROR_TEXT_MAX);
                tracing::warn!(
                    kind,
                    failed = what_failed(&error),
                    error = %text,
                    retry_in_ms = delay.as_millis() as u64,
                    attempt = backoff.step(),
                    "Kubernetes API request failed; serving the last known state"
                );
                if !listed_once && W::KIND.is_policy() && not_installed(&error) {
                    // A mesh without Gateway API or Linkerd's policy CRDs is
                    // a mesh without those objects: serve it, keep asking.
                    listed_once = true;
                    tracing::info!(
                        kind,
                        group = W::GROUP,
                        "Resource type not installed (404); serving none of it until it appears"
                    );
                    ctx.store
                        .update(vec![ballast_store::store::Op::Reset(W::KIND, Vec::new())]);
                    if ctx.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
                        tracing::info!("Every kind listed; the Kubernetes source is ready");
                        ctx.store.set_ready();
                    }
                }
                if gone_at_watch_start(&error) {
                    // kube's watcher would retry the WATCH from the same
                    // (expired) resourceVersion; a new watcher relists.
                    stream = ctx.watcher::<W>().boxed();
                }
                tokio::time::sleep(delay).await;
            }
        }
    }
}

fn what_failed(error: &watcher::Error) -> &'static str {
    match error {
        watcher::Error::InitialListFailed(_) => "list",
        watcher::Error::WatchStartFailed(_) => "watch start",
        watcher::Error::WatchError(_) => "watch (error event)",
        watcher::Error::WatchFailed(_) => "watch stream",
        watcher::Error::NoResourceVersion => "list (no resourceVersion)",
    }
}

/// A LIST answered `404 Not Found`: the resource type is not served (its
/// CRD is not installed).
fn not_installed(error: &watcher::Error) -> bool {
    matches!(error, watcher::Error::InitialListFailed(kube::Error::Api(s)) if s.code == 404)
}

/// A WATCH refused with `410 Gone` as its HTTP status (a real API server
/// sends the 410 as an event, which kube's watcher answers with a relist).
fn gone_at_watch_start(error: &watcher::Error) -> bool {
    matches!(error, watcher::Error::WatchStartFailed(kube::Error::Api(s)) if s.code == 410)
}

#[cfg(test)]
mod tests;
