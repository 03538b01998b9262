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

/// While the controller cannot be reached, one WARN at most this often
/// (with how many failures it stands for): the cause is said without a
/// log line per attempt or per target.
const UNREACHABLE_WARN_INTERVAL: Duration = Duration::from_secs(30);

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
    warnings: Mutex<WarnLimit>,
}

/// At most one warning per interval; the failures in between are counted
/// and reported with the next one.
#[derive(Debug)]
struct WarnLimit {
    interval: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

impl WarnLimit {
    fn new(interval: Duration) -> Self {
        Self {
            interval,
            last: None,
            suppressed: 0,
        }
    }

    /// `Some(failures suppressed since the last warning)` when one is due now.
    fn due(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(last) if now.duration_since(last) < self.interval => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }
}

/// What a failed connect most likely means, and the flag that changes it.
fn unreachable_hint(error: &std::io::Error, tls: Option<&crate::config::ControlTls>) -> String {
    let text = error.to_string();
    match tls {
        Some(tls) if text.contains("InvalidContentType") || text.contains("corrupt message") => {
            format!(
            "the controller answered in plaintext while this proxy dials it in TLS verifying {}: \
             the controller serves no TLS (give it --identity-trust-anchors), or set \
             --destination-server-name=\"\" to dial it in plaintext",
            tls.server_name
        )
        }
        Some(tls) if text.contains("certificate") || text.contains("NotValidForName") => format!(
            "the controller's certificate does not verify as {} (--destination-server-name; \
             its --service-account, --namespace and --controller-namespace make its name)",
            tls.server_name
        ),
        _ => "check --destination-addr and that the controller runs".to_string(),
    }
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
        self.metrics.discovery.control_connect_attempts_total.inc();
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
        .inspect_err(|e| self.warn_unreachable(e))
    }

    /// A connect failed: said at WARN, at most once per interval, with the
    /// cause and the flag that changes it (the first failure is said at once).
    fn warn_unreachable(&self, error: &std::io::Error) {
        let due = self
            .warnings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .due(Instant::now());
        if let Some(suppressed) = due {
            let cause: String = error.to_string().chars().take(200).collect();
            tracing::warn!(
                addr = %self.addr,
                %cause,
                failures_since_last_warning = suppressed,
                hint = %unreachable_hint(error, self.tls.as_ref()),
                "cannot reach the destination controller; retrying with backoff"
            );
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
    /// The snapshot's book (`--snapshot-path`): what watches record and
    /// start from.
    pub(crate) book: Option<Arc<super::snapshot::Book>>,
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
            warnings: Mutex::new(WarnLimit::new(UNREACHABLE_WARN_INTERVAL)),
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
            book: None,
        })
    }

    /// Watches record what the controller says in `book`, and start from it
    /// when the controller is silent.
    pub fn with_book(mut self, book: Arc<super::snapshot::Book>) -> Self {
        self.book = Some(book);
        self
    }

    /// The book's message for a watch of `kind` on `key`, with the book.
    pub(crate) fn restored(
        &self,
        kind: super::snapshot::Kind,
        key: &str,
    ) -> Option<(Arc<super::snapshot::Book>, super::snapshot::Restored)> {
        let book = self.book.as_ref()?;
        Some((book.clone(), book.restored(kind, key)?))
    }

    pub(crate) fn channel(&self) -> Channel {
        self.channel.clone()
    }

    /// A message arrived: the controller is there; restart the schedule.
    /// Whether the last stream to the controller delivered and none failed
    /// since.
    pub fn is_connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }

    pub(crate) fn healthy(&self) {
        if !self.connected.swap(true, Ordering::Relaxed) {
            self.metrics.discovery.control_connected.set(1);
            tracing::info!(addr = %self.config.addr, "receiving from the destination controller");
            self.gate.healthy();
        }
    }

    /// A stream failed: the controller may be gone.
    pub(crate) fn unhealthy(&self, reason: &str) {
        if self.connected.swap(false, Ordering::Relaxed) {
            self.metrics.discovery.control_connected.set(0);
            let reason: String = reason.chars().take(128).collect();
            tracing::warn!(
                addr = %self.config.addr,
                %reason,
                "lost the destination controller; routing on the last known endpoints while reconnecting"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn unreachable_warnings_are_one_per_interval_counting_the_rest() {
        let mut limit = WarnLimit::new(Duration::from_secs(30));
        // The first failure is said at once.
        assert_eq!(limit.due(Instant::now()), Some(0));
        for _ in 0..5 {
            tokio::time::advance(Duration::from_secs(5)).await;
            assert_eq!(limit.due(Instant::now()), None);
        }
        tokio::time::advance(Duration::from_secs(5)).await;
        // 30 s after the first: the next says the five in between.
        assert_eq!(limit.due(Instant::now()), Some(5));
        tokio::time::advance(Duration::from_secs(29)).await;
        assert_eq!(limit.due(Instant::now()), None);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(limit.due(Instant::now()), Some(1));
    }

    #[test]
    fn a_plaintext_controller_dialled_in_tls_is_named_with_the_flags() {
        let roots = rustls::RootCertStore::empty();
        let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .with_root_certificates(roots)
        .with_no_client_auth();
        let tls = crate::config::ControlTls {
            config: Arc::new(config),
            server_name: ballast_meshtls::IdentityName::parse(
                "ballast-destination.ballast.serviceaccount.identity.ballast.cluster.local",
            )
            .expect("a name"),
        };
        let plaintext = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "received corrupt message of type InvalidContentType",
        );
        let hint = unreachable_hint(&plaintext, Some(&tls));
        assert!(hint.contains("plaintext"), "{hint}");
        assert!(hint.contains("--identity-trust-anchors"), "{hint}");
        assert!(hint.contains("ballast-destination.ballast"), "{hint}");
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(unreachable_hint(&refused, None).contains("--destination-addr"));
    }
}
