//! Linkerd's Destination gRPC API over the store.
//!
//! A stream is its response body and nothing else: when its connection polls
//! it, it takes the messages that bring its client up to date from its shared
//! subscription (encoded once per change for every stream, see
//! [`crate::feed`]); when there is nothing new, the next change wakes it. A
//! client that does not read is cut by its subscription at a later change
//! (`stream_send_wait`): closed with `RESOURCE_EXHAUSTED`, its subscription
//! released. No task runs per stream.

mod body;
mod grpc;
mod service_profile;
#[cfg(test)]
mod tests;
mod translate;
mod updates;

pub use grpc::DestinationGrpc;
pub use grpc::ResponseBody;
pub(crate) use grpc::{decode, grpc_response};
pub use translate::{
    default_retry_budget, weighted_addr, MeshConfig, DEFAULT_PROXY_INBOUND_PORT, DEFAULT_WEIGHT,
};
pub use updates::{frame, EndpointsEncoder, ProfileEncoder, MAX_ADDRS_PER_UPDATE};

use crate::{
    authority,
    feed::{Encode, FeedLimits},
    index::{EndpointSet, ProfileView, Target},
    metrics::Metrics,
    resource::ServiceType,
    store::{Store, Subscription},
};
use ballast_admin::MemoryBudget;
pub use body::StreamBody;
use body::StreamMetrics;
use linkerd2_proxy_api::destination::GetDestination;
use std::{future::Future, sync::Arc, time::Duration};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tonic::Status;

/// Bounds and behaviour of the gRPC server.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub mesh: MeshConfig,
    /// Changes each subscription keeps for its streams that fall behind
    /// (also bounded by `feed::MAX_HISTORY_BYTES`); a stream further behind
    /// gets a reset and the whole answer instead. Streams have no queue of
    /// their own.
    pub stream_queue: usize,
    /// A stream that has not taken a change this long after its publication
    /// is not reading: the next change to its subscription closes it with
    /// `RESOURCE_EXHAUSTED` and releases its subscription.
    pub stream_send_wait: Duration,
    /// Concurrent streams (Get and GetProfile together) before new ones are
    /// refused with `RESOURCE_EXHAUSTED`.
    pub max_streams: usize,
    /// Open client connections, TLS or plaintext (the accept loop's bound;
    /// beyond it new ones wait in the listen backlog; counted in
    /// `grpc_server_connections_open`).
    pub max_connections: usize,
    /// Largest request message accepted.
    pub max_request_bytes: usize,
    /// The controller's memory budget: near its limit new streams are
    /// refused with `RESOURCE_EXHAUSTED` and a retry hint.
    pub memory: MemoryBudget,
    /// HTTP/2 keepalive pings, so that vanished clients are noticed.
    pub keepalive: Duration,
    /// HTTP/2 streams one connection may have open at once (advertised in
    /// SETTINGS; more are refused).
    pub http2_max_concurrent_streams: u32,
    /// Streams one connection may make the server reset for protocol
    /// errors before GOAWAY, beyond one window of refused streams (see
    /// `ballast_meshtls::server::h2_local_reset_budget`).
    pub http2_max_local_error_resets: usize,
    /// Client-reset streams waiting to be accepted before GOAWAY.
    pub http2_max_pending_accept_resets: usize,
    /// Largest decoded HTTP/2 header list.
    pub http2_max_header_list_bytes: u32,
}

/// Default changes kept per subscription for streams that fall behind.
pub const DEFAULT_STREAM_QUEUE: u32 = 64;
/// Default time a stream has to take a change before it is cut.
pub const DEFAULT_STREAM_SEND_WAIT: Duration = Duration::from_secs(1);
/// Default limit of concurrent streams.
pub const DEFAULT_MAX_STREAMS: u32 = 20_000;
/// HTTP/2 streams one connection may have open at once. A proxy holds one
/// `Get` and one `GetProfile` per target it uses, on one connection; 1,000
/// leaves room for 500 live targets per proxy while one connection can take
/// no more than a twentieth of `DEFAULT_MAX_STREAMS`. A client past it waits
/// for a stream to close (h2 clients queue), it is not failed.
pub const DEFAULT_HTTP2_MAX_CONCURRENT_STREAMS: u32 = 1_000;
/// Streams one connection may make the server reset for stream protocol
/// errors before GOAWAY `ENHANCE_YOUR_CALM` closes it; refusals of one whole
/// window of streams past the limit come on top (h2 counts both in one
/// budget: `ballast_meshtls::server::h2_local_reset_budget`).
/// tonic's builder turns hyper's limit off, so MadeYouReset (CVE-2025-8671)
/// could reset streams without end on one connection, each leaving state
/// behind. A well-behaved client causes none; 100 forgives a buggy one.
pub const DEFAULT_HTTP2_MAX_LOCAL_ERROR_RESETS: usize = 100;
/// Streams a client opened and reset itself that may wait, at once, to be
/// accepted before GOAWAY `ENHANCE_YOUR_CALM` (Rapid Reset, CVE-2023-44487;
/// h2's default).
pub const DEFAULT_HTTP2_MAX_PENDING_ACCEPT_RESETS: usize = 20;
/// Largest decoded HTTP/2 header list: the API's requests carry a handful
/// of short headers, and hyper's default (16 MiB) would let one request hold
/// that much.
pub const DEFAULT_HTTP2_MAX_HEADER_LIST_BYTES: u32 = 16 * 1024;

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            mesh: MeshConfig::default(),
            stream_queue: DEFAULT_STREAM_QUEUE as usize,
            stream_send_wait: DEFAULT_STREAM_SEND_WAIT,
            max_streams: DEFAULT_MAX_STREAMS as usize,
            max_connections: ballast_meshtls::server::DEFAULT_MAX_CONNECTIONS,
            max_request_bytes: 16 * 1024,
            memory: MemoryBudget::unstarted(None),
            keepalive: Duration::from_secs(10),
            http2_max_concurrent_streams: DEFAULT_HTTP2_MAX_CONCURRENT_STREAMS,
            http2_max_local_error_resets: DEFAULT_HTTP2_MAX_LOCAL_ERROR_RESETS,
            http2_max_pending_accept_resets: DEFAULT_HTTP2_MAX_PENDING_ACCEPT_RESETS,
            http2_max_header_list_bytes: DEFAULT_HTTP2_MAX_HEADER_LIST_BYTES,
        }
    }
}

#[derive(Clone)]
pub struct DestinationService {
    store: Arc<Store>,
    config: Arc<ServerConfig>,
    limits: FeedLimits,
    endpoints: Arc<dyn Encode<EndpointSet>>,
    streams: Arc<Semaphore>,
    shutdown: watch::Receiver<bool>,
    get_metrics: Arc<StreamMetrics>,
    profile_metrics: Arc<StreamMetrics>,
}

impl DestinationService {
    /// `shutdown` turning true ends every stream cleanly (status OK). Call
    /// within a tokio runtime: one task wakes every stream at shutdown.
    pub fn new(store: Arc<Store>, config: ServerConfig, shutdown: watch::Receiver<bool>) -> Self {
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let (store, mut shutdown) = (store.clone(), shutdown.clone());
            rt.spawn(async move {
                // A dropped sender counts as a shutdown (bodies see it so).
                let _ = shutdown.wait_for(|stop| *stop).await;
                store.wake_readers();
            });
        }
        Self {
            get_metrics: stream_metrics(store.metrics(), "Get"),
            profile_metrics: stream_metrics(store.metrics(), "GetProfile"),
            limits: FeedLimits {
                history: config.stream_queue,
                send_wait: config.stream_send_wait,
            },
            store,
            streams: Arc::new(Semaphore::new(config.max_streams)),
            endpoints: Arc::new(EndpointsEncoder {
                mesh: config.mesh.clone(),
            }),
            config: Arc::new(config),
            shutdown,
        }
    }

    fn admit(&self, method: &'static str) -> Result<OwnedSemaphorePermit, Status> {
        if self.config.memory.refuse(method) {
            return Err(memory_refusal());
        }
        self.streams.clone().try_acquire_owned().map_err(|_| {
            self.store
                .metrics()
                .streams_refused_total
                .get_or_create(&Metrics::method(method))
                .inc();
            Status::resource_exhausted(format!(
                "stream limit reached ({} concurrent streams); retry with backoff",
                self.config.max_streams
            ))
        })
    }

    fn target(&self, req: &GetDestination) -> Result<Target, Status> {
        let target = authority::parse(&req.path, &self.config.mesh.cluster_domain)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        if let Target::Service { service, .. } = &target {
            let external = self.store.with_index(|i| {
                i.service(service)
                    .is_some_and(|s| s.type_ == ServiceType::ExternalName)
            });
            if external {
                return Err(Status::invalid_argument(format!(
                    "service {service} is ExternalName; it has no endpoints to discover"
                )));
            }
        }
        Ok(target)
    }

    /// A stream's body: it reads its subscription's feed when polled.
    fn open_stream<V>(
        &self,
        metrics: &Arc<StreamMetrics>,
        method: &'static str,
        sub: Subscription<V>,
        permit: OwnedSemaphorePermit,
    ) -> StreamBody<V> {
        self.store
            .metrics()
            .streams_opened_total
            .get_or_create(&Metrics::method(method))
            .inc();
        StreamBody::new(sub, self.shutdown.clone(), metrics.clone(), permit)
    }

    /// Opens a `Get` stream: its response body.
    pub fn get(&self, req: &GetDestination) -> Result<StreamBody<EndpointSet>, Status> {
        let target = self.target(req)?;
        let permit = self.admit("Get")?;
        let sub = self
            .store
            .subscribe_endpoints(target, &self.endpoints, self.limits);
        Ok(self.open_stream(&self.get_metrics, "Get", sub, permit))
    }

    /// Opens a `GetProfile` stream: its response body.
    pub fn get_profile(&self, req: &GetDestination) -> Result<StreamBody<ProfileView>, Status> {
        let target = self.target(req)?;
        let permit = self.admit("GetProfile")?;
        let encoder: Arc<dyn Encode<ProfileView>> = Arc::new(ProfileEncoder {
            mesh: self.config.mesh.clone(),
            target: target.clone(),
        });
        let sub = self.store.subscribe_profile(target, &encoder, self.limits);
        Ok(self.open_stream(&self.profile_metrics, "GetProfile", sub, permit))
    }
}

fn stream_metrics(metrics: &Metrics, method: &str) -> Arc<StreamMetrics> {
    let label = Metrics::method(method);
    Arc::new(StreamMetrics {
        open: metrics.streams.get_or_create(&label).clone(),
        sent: metrics.updates_sent_total.get_or_create(&label).clone(),
        resyncs: metrics.stream_resyncs_total.get_or_create(&label).clone(),
    })
}

/// Serves the Destination API, the policy APIs (with `policy`) and gRPC
/// health on `listener` until `shutdown` resolves, then waits for open
/// connections to close. With `tls`, clients that start a TLS handshake get
/// the controller's own certificate; others are served plaintext.
/// Connections are bounded (`max_connections`) and counted in `stats`
/// either way. Each connection runs with its streams in one task
/// (`crate::h2`): a change that reaches several streams of one
/// connection leaves in one write.
pub async fn serve(
    listener: tokio::net::TcpListener,
    tls: Option<std::sync::Arc<rustls::ServerConfig>>,
    stats: std::sync::Arc<ballast_meshtls::server::ServeStats>,
    service: DestinationService,
    policy: Option<crate::policy::PolicyService>,
    shutdown: impl Future<Output = ()> + Send,
) {
    let config = service.config.clone();
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<DestinationGrpc>().await;
    let routes = grpc::Routes {
        health: health_service,
        destination: DestinationGrpc::new(service),
        outbound: policy.as_ref().map(|p| p.outbound_server()),
        inbound: policy.as_ref().map(|p| p.inbound_server()),
    };
    let limits = crate::h2::H2Limits {
        keepalive: Some(config.keepalive),
        max_concurrent_streams: config.http2_max_concurrent_streams,
        max_local_error_resets: ballast_meshtls::server::h2_local_reset_budget(
            config.http2_max_local_error_resets,
            config.http2_max_concurrent_streams,
        ),
        max_pending_accept_resets: config.http2_max_pending_accept_resets,
        max_header_list_bytes: config.http2_max_header_list_bytes,
    };
    // Updates are small and latency-bound: no Nagle delay. TCP keepalive
    // finds peers that vanished without a FIN.
    let incoming = ballast_meshtls::server::incoming(
        listener,
        tls,
        ballast_meshtls::server::ServeLimits {
            max_connections: config.max_connections,
            keepalive: Some(config.keepalive),
            ..Default::default()
        },
        stats,
    );
    crate::h2::serve(incoming, limits, routes, shutdown).await
}

pub use ballast_admin::budget::RETRY_PUSHBACK_KEY;

/// A stream refused because the controller's memory is near its limit:
/// `RESOURCE_EXHAUSTED`, with a retry hint in `grpc-retry-pushback-ms`.
pub fn memory_refusal() -> Status {
    with_retry_hint("the controller's memory is near its limit")
}

/// An open stream closed because the controller's memory is at its limit,
/// as [`memory_refusal`].
pub fn memory_closed() -> Status {
    with_retry_hint("stream closed: the controller's memory is at its limit")
}

fn with_retry_hint(why: &str) -> Status {
    let after = ballast_admin::budget::RETRY_AFTER;
    let mut status = Status::resource_exhausted(format!("{why}; retry in {}s", after.as_secs()));
    if let Ok(v) = after.as_millis().to_string().parse() {
        status.metadata_mut().insert(RETRY_PUSHBACK_KEY, v);
    }
    status
}
