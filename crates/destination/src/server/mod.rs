//! Linkerd's Destination gRPC API over the store.
//!
//! Each stream is a small task: it waits for its shared subscription to
//! change, takes the messages that bring its client up to date (encoded
//! once per change for every stream, see [`crate::feed`]), and puts them on
//! a bounded queue that is the response body. A client that does not read
//! fills its queue; the stream is then closed with `RESOURCE_EXHAUSTED` and
//! its subscription released. Nothing else waits on it.

mod grpc;
mod queue;
mod service_profile;
#[cfg(test)]
mod tests;
mod translate;
mod updates;

pub use grpc::DestinationGrpc;
pub use translate::{weighted_addr, MeshConfig, DEFAULT_PROXY_INBOUND_PORT, DEFAULT_WEIGHT};
pub use updates::{EndpointsEncoder, ProfileEncoder, MAX_ADDRS_PER_UPDATE};

use crate::{
    authority,
    feed::Encode,
    index::{EndpointSet, ProfileView, Target},
    metrics::Metrics,
    resource::ServiceType,
    store::{Store, Subscription},
};
use linkerd2_proxy_api::destination::GetDestination;
use prometheus_client::metrics::gauge::Gauge;
use queue::{QueueBody, Sent};
use std::{future::Future, sync::Arc, time::Duration};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tonic::Status;

/// Bounds and behaviour of the gRPC server.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub mesh: MeshConfig,
    /// Messages queued per stream before a client that does not read is cut.
    pub stream_queue: usize,
    /// How long a stream waits for room in a full queue before it is cut.
    pub stream_send_wait: Duration,
    /// Concurrent streams (Get and GetProfile together) before new ones are
    /// refused with `RESOURCE_EXHAUSTED`.
    pub max_streams: usize,
    /// Open client connections when serving TLS (the TLS acceptor's bound;
    /// beyond it new ones wait in the listen backlog).
    pub max_connections: usize,
    /// Largest request message accepted.
    pub max_request_bytes: usize,
    /// HTTP/2 keepalive pings, so that vanished clients are noticed.
    pub keepalive: Duration,
    /// HTTP/2 streams one connection may have open at once (advertised in
    /// SETTINGS; more are refused).
    pub http2_max_concurrent_streams: u32,
    /// Streams one connection may make the server reset before GOAWAY.
    pub http2_max_local_error_resets: usize,
    /// Client-reset streams waiting to be accepted before GOAWAY.
    pub http2_max_pending_accept_resets: usize,
    /// Largest decoded HTTP/2 header list.
    pub http2_max_header_list_bytes: u32,
}

/// Default per-stream queue, in messages.
pub const DEFAULT_STREAM_QUEUE: u32 = 64;
/// Default wait for room in a full stream queue.
pub const DEFAULT_STREAM_SEND_WAIT: Duration = Duration::from_secs(1);
/// Default limit of concurrent streams.
pub const DEFAULT_MAX_STREAMS: u32 = 20_000;
/// HTTP/2 streams one connection may have open at once. A proxy holds one
/// `Get` and one `GetProfile` per target it uses, on one connection; 1,000
/// leaves room for 500 live targets per proxy while one connection can take
/// no more than a twentieth of `DEFAULT_MAX_STREAMS`. A client past it waits
/// for a stream to close (h2 clients queue), it is not failed.
pub const DEFAULT_HTTP2_MAX_CONCURRENT_STREAMS: u32 = 1_000;
/// Streams one connection may make the server reset (stream protocol
/// errors, refused streams) before GOAWAY `ENHANCE_YOUR_CALM` closes it.
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
    endpoints: Arc<dyn Encode<EndpointSet>>,
    streams: Arc<Semaphore>,
    shutdown: watch::Receiver<bool>,
}

impl DestinationService {
    /// `shutdown` turning true ends every stream cleanly (status OK).
    pub fn new(store: Arc<Store>, config: ServerConfig, shutdown: watch::Receiver<bool>) -> Self {
        Self {
            store,
            streams: Arc::new(Semaphore::new(config.max_streams)),
            endpoints: Arc::new(EndpointsEncoder {
                mesh: config.mesh.clone(),
            }),
            config: Arc::new(config),
            shutdown,
        }
    }

    fn admit(&self, method: &str) -> Result<OwnedSemaphorePermit, Status> {
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

    /// Runs one stream: sends what brings its client up to date after each
    /// change until the client leaves, the queue overflows, or the server
    /// shuts down.
    fn spawn_stream<V>(
        &self,
        method: &'static str,
        mut sub: Subscription<V>,
        permit: OwnedSemaphorePermit,
    ) -> QueueBody
    where
        V: PartialEq + Send + Sync + 'static,
    {
        let (tx, body) = queue::queue(self.config.stream_queue);
        let metrics = self.store.metrics();
        let label = Metrics::method(method);
        let open = StreamGauge::open(metrics.streams.get_or_create(&label).clone());
        metrics.streams_total.get_or_create(&label).inc();
        let sent = metrics.updates_sent_total.get_or_create(&label).clone();
        let overflows = metrics.stream_overflows_total.get_or_create(&label).clone();
        let resyncs = metrics.stream_resyncs_total.get_or_create(&label).clone();
        let mut shutdown = self.shutdown.clone();
        let queue = self.config.stream_queue;
        let send_wait = self.config.stream_send_wait;
        tokio::spawn(async move {
            let _permit = permit;
            let _open = open;
            loop {
                let catch_up = sub.catch_up();
                if catch_up.is_reset() {
                    resyncs.inc();
                }
                for frame in catch_up.messages() {
                    // Wait briefly for room (a large answer is many messages
                    // and the client reads them as they go); a client that
                    // makes no room in that time is not reading.
                    match tx.send(frame.clone(), send_wait).await {
                        Sent::Queued => sent.inc(),
                        Sent::Gone => return,
                        Sent::Full => {
                            overflows.inc();
                            tx.finish(Status::resource_exhausted(format!(
                                "client did not read {queue} queued updates; stream closed, reconnect"
                            )));
                            return;
                        }
                    };
                }
                drop(catch_up);
                tokio::select! {
                    alive = sub.changed() => if !alive { return },
                    _ = tx.closed() => return,
                    _ = shutdown.wait_for(|stop| *stop) => return,
                }
            }
        });
        body
    }

    /// Opens a `Get` stream: its response body.
    pub fn get(&self, req: &GetDestination) -> Result<QueueBody, Status> {
        let target = self.target(req)?;
        let permit = self.admit("Get")?;
        let sub = self.store.subscribe_endpoints(target, &self.endpoints);
        Ok(self.spawn_stream("Get", sub, permit))
    }

    /// Opens a `GetProfile` stream: its response body.
    pub fn get_profile(&self, req: &GetDestination) -> Result<QueueBody, Status> {
        let target = self.target(req)?;
        let permit = self.admit("GetProfile")?;
        let encoder: Arc<dyn Encode<ProfileView>> = Arc::new(ProfileEncoder {
            mesh: self.config.mesh.clone(),
            target: target.clone(),
        });
        let sub = self.store.subscribe_profile(target, &encoder);
        Ok(self.spawn_stream("GetProfile", sub, permit))
    }
}

/// Counts a stream as open for as long as its task lives.
struct StreamGauge(Gauge);

impl StreamGauge {
    fn open(g: Gauge) -> Self {
        g.inc();
        Self(g)
    }
}

impl Drop for StreamGauge {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Serves the Destination API and gRPC health on `listener` until `shutdown`
/// resolves, then waits for open connections to close. With `tls`, clients
/// that start a TLS handshake get the controller's own certificate; others
/// are served plaintext.
pub async fn serve(
    listener: tokio::net::TcpListener,
    tls: Option<(
        std::sync::Arc<rustls::ServerConfig>,
        std::sync::Arc<ballast_meshtls::server::ServeStats>,
    )>,
    service: DestinationService,
    policy: Option<crate::policy::PolicyService>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let config = service.config.clone();
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<DestinationGrpc>().await;
    let destination = DestinationGrpc::new(service);
    let router = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(config.keepalive))
        .http2_keepalive_timeout(Some(config.keepalive * 2))
        .max_concurrent_streams(config.http2_max_concurrent_streams)
        .http2_max_local_error_reset_streams(Some(config.http2_max_local_error_resets))
        .http2_max_pending_accept_reset_streams(Some(config.http2_max_pending_accept_resets))
        .http2_max_header_list_size(config.http2_max_header_list_bytes)
        .add_service(health_service)
        .add_service(destination)
        .add_optional_service(policy.as_ref().map(|p| p.outbound_server()))
        .add_optional_service(policy.as_ref().map(|p| p.inbound_server()));
    // Updates are small and latency-bound: no Nagle delay. TCP keepalive
    // finds peers that vanished without a FIN.
    match tls {
        None => {
            let incoming = tonic::transport::server::TcpIncoming::from(listener)
                .with_nodelay(Some(true))
                .with_keepalive(Some(config.keepalive));
            router
                .serve_with_incoming_shutdown(incoming, shutdown)
                .await
        }
        Some((tls, stats)) => {
            let incoming = ballast_meshtls::server::incoming(
                listener,
                Some(tls),
                ballast_meshtls::server::ServeLimits {
                    max_connections: config.max_connections,
                    keepalive: Some(config.keepalive),
                    ..Default::default()
                },
                stats,
            );
            router
                .serve_with_incoming_shutdown(incoming, shutdown)
                .await
        }
    }
}
