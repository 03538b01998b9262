//! The proxy's identity: a key made in memory at start, a certificate from
//! the identity service (renewed at 70% of its life, the current one kept in
//! service while renewals fail), and the TLS configurations every mesh
//! connection uses.

use ballast_certify as certify;
use ballast_meshtls::{
    tls::{self, CertStore, TRANSPORT_HEADER_ALPN},
    IdentityName,
};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use rustls::{ClientConfig, ServerConfig};
use std::{sync::Arc, time::Duration};
use tokio::sync::Semaphore;

/// Linkerd's defaults.
pub const DEFAULT_TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
pub const DEFAULT_MAX_TLS_HANDSHAKES: usize = 1_024;

#[derive(Clone, Debug)]
pub struct IdentityConfig {
    /// This proxy's identity (its service account's name).
    pub local_name: IdentityName,
    /// Where the certificate comes from; its trust anchors are the mesh's.
    pub renewal: certify::Renewal,
    pub handshake_timeout: Duration,
    pub max_handshakes: usize,
}

/// What every mesh connection of this proxy uses.
#[derive(Debug)]
pub struct MeshTls {
    pub name: IdentityName,
    pub store: Arc<CertStore>,
    /// To meshed endpoints (no ALPN), and with Linkerd's opaque transport.
    pub client: Arc<ClientConfig>,
    pub client_opaque: Arc<ClientConfig>,
    /// Inbound termination; offers the opaque transport ALPN.
    pub server: Arc<ServerConfig>,
    pub handshake_timeout: Duration,
    /// Inbound handshakes in progress, bounded.
    pub handshakes: Arc<Semaphore>,
    pub metrics: IdentityMetrics,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TlsErrorLabels {
    pub direction: crate::metrics::Direction,
    /// `handshake`, `timeout`, `shed`, `identity`, `header`.
    pub error: &'static str,
}

#[derive(Clone, Debug, Default)]
pub struct IdentityMetrics {
    /// The certificate's renewals and expiry.
    pub certify: certify::CertifyMetrics,
    pub tls_errors: Family<TlsErrorLabels, Counter>,
    pub handshakes_in_flight: Gauge<i64, std::sync::atomic::AtomicI64>,
}

impl IdentityMetrics {
    pub fn register(&self, r: &mut Registry) {
        self.certify.register(r);
        r.register(
            "tls_errors",
            "Mesh TLS connections that failed: handshake errors and timeouts, handshakes shed at --max-tls-handshakes, peers with the wrong identity, bad transport headers",
            self.tls_errors.clone(),
        );
        r.register(
            "tls_handshakes_in_flight",
            "Inbound TLS handshakes in progress (bounded by --max-tls-handshakes)",
            self.handshakes_in_flight.clone(),
        );
    }

    pub fn error(&self, direction: crate::metrics::Direction, error: &'static str) {
        self.tls_errors
            .get_or_create(&TlsErrorLabels { direction, error })
            .inc();
    }
}

/// Builds the TLS configurations and starts renewing the certificate.
pub fn start(config: IdentityConfig, metrics: IdentityMetrics) -> Result<Arc<MeshTls>, String> {
    let roots = config.renewal.certify.roots.clone();
    let store = certify::spawn(
        config.local_name.clone(),
        config.renewal,
        metrics.certify.clone(),
    )?;
    let client =
        tls::client_config(roots.clone(), Some(store.clone()), &[]).map_err(|e| e.to_string())?;
    let client_opaque =
        tls::client_config(roots.clone(), Some(store.clone()), &[TRANSPORT_HEADER_ALPN])
            .map_err(|e| e.to_string())?;
    let server = tls::server_config(roots, store.clone(), &[TRANSPORT_HEADER_ALPN])
        .map_err(|e| e.to_string())?;
    Ok(Arc::new(MeshTls {
        name: config.local_name,
        store,
        client,
        client_opaque,
        server,
        handshake_timeout: config.handshake_timeout,
        handshakes: Arc::new(Semaphore::new(config.max_handshakes.max(1))),
        metrics,
    }))
}
