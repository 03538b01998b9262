//! Connections to one endpoint: a pool of idle HTTP/1 connections (bounded,
//! expiring) and one shared, multiplexed HTTP/2 connection, opened by one
//! connect at a time however many requests want it.

use super::RequestBody;
use crate::{
    config::{HttpLimits, TrafficConfig},
    connect::{ConnectError, Dialer},
    discovery::Endpoint,
    io::Counted,
    metrics::{DstLabels, HttpEndpointMetrics, Metrics, TcpMetrics, TlsLabels},
};
use ballast_meshtls::io::ClientIo;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex, OnceLock,
    },
    time::{Duration, Instant},
};
use tokio::sync::Notify;

/// Pool limits and timeouts.
#[derive(Clone, Copy, Debug)]
pub struct PoolConfig {
    pub connect_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_idle: usize,
    /// Head, frame and window limits, the same towards endpoints as towards
    /// clients; and the HTTP/1 connection count per endpoint.
    pub limits: HttpLimits,
}

impl PoolConfig {
    pub fn new(config: &TrafficConfig, limits: &HttpLimits) -> Self {
        Self {
            connect_timeout: config.connect_timeout,
            idle_timeout: config.http1_pool_idle_timeout,
            max_idle: config.http1_pool_max_idle,
            limits: *limits,
        }
    }
}

#[derive(Debug)]
pub struct EndpointConns {
    h1_idle: Mutex<Vec<(http1::SendRequest<RequestBody>, Instant)>>,
    h2: Mutex<Option<http2::SendRequest<RequestBody>>>,
    /// Held by the one HTTP/2 connect in flight; the requests that wait on
    /// it use its connection (or its failure) instead of connecting too.
    /// Holds whether the last connect failed.
    h2_connecting: tokio::sync::Mutex<bool>,
    metrics: Arc<Metrics>,
    /// Per-request metric handles, made on first use.
    http_metrics: OnceLock<HttpEndpointMetrics>,
    /// HTTP/1 connections open (idle or busy), bounded by
    /// `max_connections_per_endpoint`.
    h1_open: Arc<AtomicUsize>,
    /// Woken when an HTTP/1 connection is returned or closes.
    h1_freed: Arc<Notify>,
}

/// Holds one of an endpoint's HTTP/1 connection slots while the connection
/// lives.
struct Slot {
    open: Arc<AtomicUsize>,
    freed: Arc<Notify>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::AcqRel);
        self.freed.notify_one();
    }
}

/// Connects, then counts the connection and its bytes.
async fn connect_counted(
    dialer: &Dialer,
    ep: &Endpoint,
    tcp: impl FnOnce(TlsLabels) -> TcpMetrics,
) -> Result<(Counted<ClientIo>, TcpMetrics), ConnectError> {
    let (stream, tls) = dialer.dial(ep, false).await?;
    let tcp = tcp(tls);
    let stream = Counted::new(stream, tcp.read.clone(), tcp.write.clone());
    Ok((stream, tcp))
}

impl EndpointConns {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self {
            h1_idle: Mutex::default(),
            h2: Mutex::default(),
            h2_connecting: tokio::sync::Mutex::default(),
            metrics,
            http_metrics: OnceLock::new(),
            h1_open: Arc::default(),
            h1_freed: Arc::default(),
        }
    }

    /// What a balancer of HTTP endpoints makes each endpoint's state with.
    pub fn maker(metrics: &Arc<Metrics>) -> crate::balance::MakeConns<Self> {
        let metrics = metrics.clone();
        Arc::new(move || Self::new(metrics.clone()))
    }

    /// The endpoint's per-request metric handles.
    pub fn metrics(&self, labels: &DstLabels) -> &HttpEndpointMetrics {
        self.http_metrics
            .get_or_init(|| HttpEndpointMetrics::new(self.metrics.clone(), labels.clone()))
    }

    /// An idle HTTP/1 connection that is still open, if any.
    pub fn take_h1(&self, config: &PoolConfig) -> Option<http1::SendRequest<RequestBody>> {
        let mut idle = self.h1_idle.lock().unwrap_or_else(|e| e.into_inner());
        while let Some((sender, since)) = idle.pop() {
            if !sender.is_closed() && since.elapsed() < config.idle_timeout {
                return Some(sender);
            }
        }
        None
    }

    /// Drops idle connections that are closed or past the idle timeout.
    pub fn expire_h1(&self, config: &PoolConfig) {
        let mut idle = self.h1_idle.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        idle.retain(|(s, since)| {
            !s.is_closed() && now.duration_since(*since) < config.idle_timeout
        });
    }

    /// Returns a connection whose exchange finished.
    pub fn put_h1(&self, sender: http1::SendRequest<RequestBody>, config: &PoolConfig) {
        if sender.is_closed() {
            return;
        }
        let mut idle = self.h1_idle.lock().unwrap_or_else(|e| e.into_inner());
        // Stale connections are swept periodically (`expire_h1`); here only
        // when they take the room this one needs.
        if idle.len() >= config.max_idle {
            let now = Instant::now();
            idle.retain(|(s, since)| {
                !s.is_closed() && now.duration_since(*since) < config.idle_timeout
            });
        }
        if idle.len() < config.max_idle {
            idle.push((sender, Instant::now()));
            drop(idle);
            self.h1_freed.notify_one();
        }
    }

    /// A free slot for a new HTTP/1 connection, or, at the bound, the first
    /// pooled connection returned before `deadline`.
    async fn h1_slot(
        &self,
        addr: SocketAddr,
        config: &PoolConfig,
        deadline: tokio::time::Instant,
    ) -> Result<Result<Slot, http1::SendRequest<RequestBody>>, ConnectError> {
        let max = config.limits.max_connections_per_endpoint.max(1);
        loop {
            let freed = self.h1_freed.notified();
            if self.h1_open.fetch_add(1, Ordering::AcqRel) < max {
                return Ok(Ok(Slot {
                    open: self.h1_open.clone(),
                    freed: self.h1_freed.clone(),
                }));
            }
            self.h1_open.fetch_sub(1, Ordering::AcqRel);
            if let Some(sender) = self.take_h1(config) {
                return Ok(Err(sender));
            }
            if tokio::time::timeout_at(deadline, freed).await.is_err() {
                return Err(ConnectError::Exhausted(addr));
            }
        }
    }

    /// Opens a new HTTP/1 connection, or waits until `deadline` for one to
    /// be returned when the endpoint is at its connection bound. The flag
    /// is true for a new connection.
    /// `tcp` opens the new connection's metrics once it is connected.
    pub async fn connect_h1(
        &self,
        (dialer, ep): (&Dialer, &Endpoint),
        config: &PoolConfig,
        deadline: tokio::time::Instant,
        tcp: impl FnOnce(TlsLabels) -> TcpMetrics,
    ) -> Result<(http1::SendRequest<RequestBody>, bool), ConnectError> {
        let addr = ep.addr;
        let slot = match self.h1_slot(addr, config, deadline).await? {
            Ok(slot) => slot,
            Err(pooled) => return Ok((pooled, false)),
        };
        let (stream, tcp) = connect_counted(dialer, ep, tcp).await?;
        let limits = &config.limits;
        let mut builder = http1::Builder::new();
        builder
            .max_header_size(limits.h1_max_header_bytes)
            .max_buf_size(limits.h1_max_header_bytes.max(8 * 1024));
        if limits.h1_max_headers != crate::config::DEFAULT_HTTP1_MAX_HEADERS {
            builder.max_headers(limits.h1_max_headers);
        }
        let (sender, conn) = match builder.handshake(TokioIo::new(stream)).await {
            Ok(handshaken) => handshaken,
            Err(e) => {
                tcp.close(false);
                return Err(ConnectError::Handshake(addr, e));
            }
        };
        tokio::spawn(async move {
            let result = conn.await;
            if let Err(e) = &result {
                tracing::debug!(%addr, error = %e, "endpoint HTTP/1 connection ended");
            }
            tcp.close(result.is_ok());
            drop(slot);
        });
        Ok((sender, true))
    }

    /// The shared HTTP/2 connection, if open.
    pub fn open_h2(&self) -> Option<http2::SendRequest<RequestBody>> {
        self.h2
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .filter(|s| !s.is_closed())
            .cloned()
    }

    /// The shared HTTP/2 connection, opened if there is none. One connect
    /// is in flight per endpoint: the others wait for it until `deadline`
    /// and share its connection, or its failure.
    pub async fn h2(
        &self,
        (dialer, ep): (&Dialer, &Endpoint),
        config: &PoolConfig,
        deadline: tokio::time::Instant,
        tcp: impl FnOnce(TlsLabels) -> TcpMetrics,
    ) -> Result<http2::SendRequest<RequestBody>, ConnectError> {
        let addr = ep.addr;
        if let Some(s) = self.open_h2() {
            return Ok(s);
        }
        // Another request's connect is in flight: this one waits for it.
        let waited = self.h2_connecting.try_lock().is_err();
        let mut last_failed = tokio::time::timeout_at(deadline, self.h2_connecting.lock())
            .await
            .map_err(|_| ConnectError::Deadline(addr))?;
        if let Some(s) = self.open_h2() {
            return Ok(s);
        }
        if waited && *last_failed {
            // The connect this request waited for failed: answer with it
            // rather than queueing another connect behind it.
            return Err(ConnectError::SharedAttemptFailed(addr));
        }
        let connect = Box::pin(self.connect_h2((dialer, ep), config, tcp));
        let result = tokio::time::timeout_at(deadline, connect)
            .await
            .unwrap_or(Err(ConnectError::Deadline(addr)));
        *last_failed = result.is_err();
        result
    }

    async fn connect_h2(
        &self,
        (dialer, ep): (&Dialer, &Endpoint),
        config: &PoolConfig,
        tcp: impl FnOnce(TlsLabels) -> TcpMetrics,
    ) -> Result<http2::SendRequest<RequestBody>, ConnectError> {
        let addr = ep.addr;
        let (stream, tcp) = connect_counted(dialer, ep, tcp).await?;
        let limits = &config.limits;
        let handshake = http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .max_header_list_size(limits.h2_max_header_list_bytes)
            .max_frame_size(limits.h2_max_frame_bytes)
            .initial_stream_window_size(limits.h2_initial_stream_window_bytes)
            .initial_connection_window_size(limits.h2_initial_connection_window_bytes)
            .max_send_buf_size(limits.h2_max_send_buffer_bytes)
            .handshake(TokioIo::new(stream))
            .await;
        let (sender, conn) = match handshake {
            Ok(handshaken) => handshaken,
            Err(e) => {
                tcp.close(false);
                return Err(ConnectError::Handshake(addr, e));
            }
        };
        tokio::spawn(async move {
            let result = conn.await;
            if let Err(e) = &result {
                tracing::debug!(%addr, error = %e, "endpoint HTTP/2 connection ended");
            }
            tcp.close(result.is_ok());
        });
        *self.h2.lock().unwrap_or_else(|e| e.into_inner()) = Some(sender.clone());
        Ok(sender)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{Direction, DstLabels, Peer};
    use prometheus_client::registry::Registry;
    use std::sync::atomic::AtomicU64;
    use tokio::net::TcpListener;

    /// A listener that accepts and holds every connection, counting them.
    async fn holding_listener() -> (SocketAddr, Arc<AtomicU64>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let accepted = Arc::new(AtomicU64::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::Relaxed);
                held.push(s);
            }
        });
        (addr, accepted)
    }

    fn pool(max_connections_per_endpoint: usize) -> PoolConfig {
        PoolConfig {
            connect_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(3),
            max_idle: 8,
            limits: HttpLimits {
                max_connections_per_endpoint,
                ..HttpLimits::default()
            },
        }
    }

    fn metrics() -> Arc<Metrics> {
        Metrics::register(&mut Registry::default())
    }

    fn plain_dialer() -> Dialer {
        Dialer::plain(Duration::from_secs(5), Direction::outbound)
    }

    fn open_dst(metrics: &Arc<Metrics>, tls: TlsLabels) -> TcpMetrics {
        TcpMetrics::open(
            metrics,
            Peer::dst,
            DstLabels::unknown(Direction::outbound),
            tls,
        )
    }

    #[tokio::test]
    async fn concurrent_requests_for_a_cold_endpoint_share_one_http2_connect() {
        let (addr, accepted) = holding_listener().await;
        let metrics = metrics();
        let conns = Arc::new(EndpointConns::new(metrics.clone()));
        let config = Arc::new(pool(10));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let mut tasks = Vec::new();
        for _ in 0..50 {
            let (conns, config, metrics) = (conns.clone(), config.clone(), metrics.clone());
            tasks.push(tokio::spawn(async move {
                let dialer = plain_dialer();
                conns
                    .h2((&dialer, &Endpoint::bare(addr)), &config, deadline, |tls| {
                        open_dst(&metrics, tls)
                    })
                    .await
                    .map(|_| ())
            }));
        }
        for t in tasks {
            t.await.expect("task").expect("a connection");
        }
        assert_eq!(
            accepted.load(Ordering::Relaxed),
            1,
            "one connect for 50 requests"
        );
    }

    #[tokio::test]
    async fn http1_connections_per_endpoint_are_bounded_and_the_next_waits_then_fails() {
        let (addr, accepted) = holding_listener().await;
        let metrics = metrics();
        let conns = EndpointConns::new(metrics.clone());
        let config = pool(2);
        let tcp = |tls| open_dst(&metrics, tls);
        let dialer = plain_dialer();
        let ep = Endpoint::bare(addr);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let mut held = Vec::new();
        for _ in 0..2 {
            let (sender, fresh) = conns
                .connect_h1((&dialer, &ep), &config, deadline, tcp)
                .await
                .expect("under the bound");
            assert!(fresh);
            held.push(sender);
        }
        let soon = tokio::time::Instant::now() + Duration::from_millis(200);
        let third = conns.connect_h1((&dialer, &ep), &config, soon, tcp).await;
        assert!(
            matches!(third, Err(ConnectError::Exhausted(_))),
            "{:?}",
            third.map(|_| ())
        );
        assert!(
            tokio::time::Instant::now() >= soon,
            "it waited for a free slot"
        );
        // A connection returned to the pool is handed to the next request.
        conns.put_h1(held.pop().expect("held"), &config);
        let (_, fresh) = conns
            .connect_h1((&dialer, &ep), &config, deadline, tcp)
            .await
            .expect("the returned connection");
        assert!(!fresh, "the pooled connection, not a new one");
        assert_eq!(accepted.load(Ordering::Relaxed), 2);
    }
}
