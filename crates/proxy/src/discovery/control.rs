//! The one connection to the destination controller, shared by every
//! resolution. Its TCP connects pass a gate that follows a capped, jittered
//! exponential schedule, whatever the number of targets being resolved: while
//! the controller is away, the proxy knocks at its port at the schedule's
//! pace, not once per target (seed 002). The schedule restarts when a message
//! arrives, not when a TCP connect succeeds: a port that accepts and hangs up
//! is no controller.

use crate::{config::ControlConfig, metrics::Metrics};
use ballast_backoff::Backoff;
use hyper_util::rt::TokioIo;
use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};
use tokio::{net::TcpStream, time::Instant};
use tonic::transport::{Channel, Endpoint};

/// Keepalive pings find a controller that vanished without closing.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug)]
struct Gate {
    addr: String,
    connect_timeout: Duration,
    tls: Option<crate::config::ControlTls>,
    schedule: Mutex<GateState>,
    metrics: Arc<Metrics>,
}

#[derive(Debug)]
struct GateState {
    backoff: Backoff,
    next_attempt: Option<Instant>,
}

impl Gate {
    async fn connect(&self) -> std::io::Result<ballast_meshtls::io::ClientIo> {
        // Take a turn: each attempt books the next one a backoff step later.
        let turn = {
            let mut s = self.schedule.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            let turn = s.next_attempt.map_or(now, |t| t.max(now));
            let delay = s.backoff.next_delay();
            s.next_attempt = Some(turn + delay);
            turn
        };
        tokio::time::sleep_until(turn).await;
        self.metrics.control_connect_attempts_total.inc();
        tracing::debug!(addr = %self.addr, "connecting to the destination controller");
        let connect = async {
            let mut last = None;
            for addr in tokio::net::lookup_host(&self.addr).await? {
                match TcpStream::connect(addr).await {
                    Ok(s) => {
                        let _ = s.set_nodelay(true);
                        let tls = self.tls.as_ref().map(|t| (&t.config, &t.server_name));
                        return ballast_meshtls::io::connect(s, tls).await;
                    }
                    Err(e) => last = Some(e),
                }
            }
            Err(last.unwrap_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "no address for the controller",
                )
            }))
        };
        match tokio::time::timeout(self.connect_timeout, connect).await {
            Ok(r) => r,
            Err(_) => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "connect to the destination controller timed out",
            )),
        }
    }

    fn healthy(&self) {
        let mut s = self.schedule.lock().unwrap_or_else(|e| e.into_inner());
        s.backoff.reset();
        s.next_attempt = None;
    }
}

/// A handle on the controller connection; cheap to clone.
#[derive(Clone, Debug)]
pub struct ControlPlane {
    channel: Channel,
    gate: Arc<Gate>,
    connected: Arc<AtomicBool>,
    pub(crate) config: Arc<ControlConfig>,
    pub(crate) metrics: Arc<Metrics>,
}

impl ControlPlane {
    /// A lazily connected channel: nothing happens until the first request.
    pub fn new(config: ControlConfig, metrics: Arc<Metrics>) -> Result<Self, String> {
        let gate = Arc::new(Gate {
            addr: config.addr.clone(),
            connect_timeout: config.connect_timeout,
            tls: config.tls.clone(),
            schedule: Mutex::new(GateState {
                backoff: Backoff::new(&config.backoff),
                next_attempt: None,
            }),
            metrics: metrics.clone(),
        });
        let endpoint = Endpoint::from_shared(format!("http://{}", config.addr))
            .map_err(|e| {
                format!(
                    "invalid destination controller address {:?}: {e}",
                    config.addr
                )
            })?
            .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
            .keep_alive_while_idle(true);
        let connector_gate = gate.clone();
        let connector = tower::service_fn(move |_: http::Uri| {
            let gate = connector_gate.clone();
            async move { gate.connect().await.map(TokioIo::new) }
        });
        let channel = endpoint.connect_with_connector_lazy(connector);
        Ok(Self {
            channel,
            gate,
            connected: Arc::new(AtomicBool::new(false)),
            config: Arc::new(config),
            metrics,
        })
    }

    pub(crate) fn channel(&self) -> Channel {
        self.channel.clone()
    }

    /// A message arrived: the controller is there; restart the schedule.
    /// Whether the last stream to the controller delivered and none failed
    /// since.
    pub(crate) fn is_connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }

    pub(crate) fn healthy(&self) {
        if !self.connected.swap(true, Ordering::Relaxed) {
            self.metrics.control_connected.set(1);
            tracing::info!(addr = %self.config.addr, "receiving from the destination controller");
            self.gate.healthy();
        }
    }

    /// A stream failed: the controller may be gone.
    pub(crate) fn unhealthy(&self, reason: &str) {
        if self.connected.swap(false, Ordering::Relaxed) {
            self.metrics.control_connected.set(0);
            let reason: String = reason.chars().take(128).collect();
            tracing::warn!(
                addr = %self.config.addr,
                %reason,
                "lost the destination controller; routing on the last known endpoints while reconnecting"
            );
        }
    }
}
