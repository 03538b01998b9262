//! The proxy's identity: a key made in memory at start, a certificate from
//! the identity service (renewed at 70% of its life, the current one kept in
//! service while renewals fail), and the TLS configurations every mesh
//! connection uses.

use ballast_backoff::BackoffConfig;
use ballast_meshtls::{
    certify::{self, CertifyConfig, CertifyError, LocalKey},
    tls::{self, CertStore, TRANSPORT_HEADER_ALPN},
    IdentityName,
};
use linkerd2_proxy_api::identity::identity_client::IdentityClient;
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use rustls::{pki_types::CertificateDer, ClientConfig, RootCertStore, ServerConfig};
use std::{path::PathBuf, sync::Arc, time::Duration};
use tokio::sync::Semaphore;

/// Linkerd's defaults.
pub const DEFAULT_TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
pub const DEFAULT_MAX_TLS_HANDSHAKES: usize = 1_024;

#[derive(Clone, Debug)]
pub struct IdentityConfig {
    /// This proxy's identity (its service account's name).
    pub local_name: IdentityName,
    pub trust_anchors: Vec<CertificateDer<'static>>,
    pub token_file: PathBuf,
    /// The identity service, HOST:PORT.
    pub addr: String,
    /// The identity service's own TLS identity, and whether to dial it in
    /// TLS (Linkerd dials a loopback address in plaintext).
    pub server_name: IdentityName,
    pub tls_to_identity: bool,
    pub min_refresh: Duration,
    pub max_refresh: Duration,
    pub backoff: BackoffConfig,
    pub connect_timeout: Duration,
    pub request_timeout: Duration,
    pub handshake_timeout: Duration,
    pub max_handshakes: usize,
}

/// What every mesh connection of this proxy uses.
#[derive(Debug)]
pub struct MeshTls {
    pub name: IdentityName,
    pub store: Arc<CertStore>,
    pub roots: Arc<RootCertStore>,
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
pub struct ResultLabels {
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TlsErrorLabels {
    pub direction: crate::metrics::Direction,
    /// `handshake`, `timeout`, `shed`, `identity`, `header`.
    pub error: &'static str,
}

#[derive(Clone, Debug, Default)]
pub struct IdentityMetrics {
    pub expiration: Gauge<i64, std::sync::atomic::AtomicI64>,
    pub refresh: Family<ResultLabels, Counter>,
    pub tls_errors: Family<TlsErrorLabels, Counter>,
    pub handshakes_in_flight: Gauge<i64, std::sync::atomic::AtomicI64>,
}

impl IdentityMetrics {
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "identity_cert_expiration_timestamp_seconds",
            "When this proxy's certificate expires (Unix seconds); 0 before the first",
            self.expiration.clone(),
        );
        r.register(
            "identity_cert_refresh",
            "Certify calls by result (ok, or why it failed)",
            self.refresh.clone(),
        );
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
    let roots = tls::root_store(&config.trust_anchors).map_err(|e| e.to_string())?;
    let store = CertStore::new();
    let client =
        tls::client_config(roots.clone(), Some(store.clone()), &[]).map_err(|e| e.to_string())?;
    let client_opaque =
        tls::client_config(roots.clone(), Some(store.clone()), &[TRANSPORT_HEADER_ALPN])
            .map_err(|e| e.to_string())?;
    let server = tls::server_config(roots.clone(), store.clone(), &[TRANSPORT_HEADER_ALPN])
        .map_err(|e| e.to_string())?;
    let key = LocalKey::generate(config.local_name.clone()).map_err(|e| e.to_string())?;

    // The identity service: TLS for its identity unless it is on loopback
    // (and no name was asked for). No client certificate: we have none yet.
    let name = config.tls_to_identity.then(|| config.server_name.clone());
    let channel = certify::channel(&config.addr, name, roots.clone(), config.connect_timeout)?;
    let identity_client =
        IdentityClient::new(channel).max_decoding_message_size(certify::MAX_RESPONSE_BYTES);

    let mesh = Arc::new(MeshTls {
        name: config.local_name.clone(),
        store: store.clone(),
        roots: roots.clone(),
        client,
        client_opaque,
        server,
        handshake_timeout: config.handshake_timeout,
        handshakes: Arc::new(Semaphore::new(config.max_handshakes.max(1))),
        metrics: metrics.clone(),
    });
    let certify_config = CertifyConfig {
        token_file: config.token_file,
        roots,
        min_refresh: config.min_refresh,
        max_refresh: config.max_refresh,
        backoff: config.backoff,
        request_timeout: config.request_timeout,
    };
    tracing::info!(identity = %config.local_name, service = %config.addr, "requesting a certificate");
    tokio::spawn(certify::run(
        identity_client,
        key,
        certify_config,
        store,
        move |outcome| match outcome {
            Ok(not_after) => {
                metrics
                    .refresh
                    .get_or_create(&ResultLabels { result: "ok" })
                    .inc();
                let secs = not_after
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs() as i64)
                    .unwrap_or(0);
                metrics.expiration.set(secs);
            }
            Err(e) => {
                metrics
                    .refresh
                    .get_or_create(&ResultLabels {
                        result: CertifyError::reason(e),
                    })
                    .inc();
            }
        },
    ));
    Ok(mesh)
}
