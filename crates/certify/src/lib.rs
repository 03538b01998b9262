//! The Certify client: a P-256 key made in memory at start, a CSR naming the
//! local identity, and a loop that asks the identity service for a
//! certificate, renews at 70% of its remaining life (Linkerd's rule, clamped
//! to [min, max] refresh), retries with backoff on failure (at most a
//! quarter of the current certificate's time left apart), and keeps the
//! current certificate in service meanwhile.
//!
//! Shared by the proxy and the controllers (each asks for its own
//! certificate); the identity service reads its refresh rule.

#![forbid(unsafe_code)]

use ballast_backoff::{Backoff, BackoffConfig};
use ballast_meshtls::{io, tls, tls::CertStore, Credentials, IdentityName, NameError};
use linkerd2_proxy_api::identity::{identity_client::IdentityClient, CertifyRequest};
use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use rustls::{
    pki_types::{CertificateDer, PrivatePkcs8KeyDer},
    RootCertStore,
};
use std::{
    path::PathBuf,
    sync::{
        atomic::{AtomicI64, AtomicU64},
        Arc,
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

/// Linkerd's bounds on the wait before a renewal.
pub const DEFAULT_MIN_REFRESH: Duration = Duration::from_secs(10);
pub const DEFAULT_MAX_REFRESH: Duration = Duration::from_secs(24 * 60 * 60);
/// A service-account token is a few KB; anything much larger is not one.
pub const MAX_TOKEN_BYTES: u64 = 64 * 1024;
/// Leaf plus intermediates; a real chain is two or three certificates.
pub const MAX_CHAIN_CERTS: usize = 8;
/// The largest CertifyResponse read.
pub const MAX_RESPONSE_BYTES: usize = 64 * 1024;

/// The local key and the CSR that asks for `name`.
pub struct LocalKey {
    pub name: IdentityName,
    pkcs8: PrivatePkcs8KeyDer<'static>,
    spki: Vec<u8>,
    csr: Vec<u8>,
}

impl LocalKey {
    pub fn generate(name: IdentityName) -> Result<Self, CertifyError> {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
            .map_err(|e| CertifyError::Local(format!("key generation: {e}")))?;
        let mut params = rcgen::CertificateParams::new(vec![name.to_string()])
            .map_err(|e| CertifyError::Local(format!("CSR: {e}")))?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name.as_str());
        let csr = params
            .serialize_request(&key)
            .map_err(|e| CertifyError::Local(format!("CSR: {e}")))?;
        Ok(Self {
            spki: rcgen::PublicKeyData::subject_public_key_info(&key),
            pkcs8: PrivatePkcs8KeyDer::from(key.serialize_der()),
            csr: csr.der().to_vec(),
            name,
        })
    }

    pub fn csr_der(&self) -> &[u8] {
        &self.csr
    }

    /// Checks an issued chain (it carries our name and key, chains to the
    /// anchors, is valid now) and makes it the credentials to serve with.
    pub fn accept(
        &self,
        roots: Arc<RootCertStore>,
        chain: Vec<CertificateDer<'static>>,
    ) -> Result<Credentials, CertifyError> {
        if chain.is_empty() || chain.len() > MAX_CHAIN_CERTS {
            return Err(CertifyError::Response(format!(
                "{} certificates in the chain (1 to {MAX_CHAIN_CERTS} expected)",
                chain.len()
            )));
        }
        if tls::public_key_der(&chain[0]).as_deref() != Some(&self.spki[..]) {
            return Err(CertifyError::Response(
                "the certificate is not for our key".into(),
            ));
        }
        tls::verify_server_chain(roots, &chain, &self.name, SystemTime::now())
            .map_err(|e| CertifyError::Response(format!("the certificate does not verify: {e}")))?;
        let not_after = tls::not_after(&chain[0])
            .ok_or_else(|| CertifyError::Response("the certificate has no expiry".into()))?;
        Credentials::new(self.name.clone(), chain, self.pkcs8.clone_key(), not_after)
            .map_err(|e| CertifyError::Local(e.to_string()))
    }
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum CertifyError {
    #[error("cannot read the token file {path}: {reason}")]
    Token { path: String, reason: String },
    #[error("the identity service refused: {0}")]
    Refused(String),
    /// Refused for load, with the service's retry hint (at least this long).
    #[error("the identity service is busy: {0}")]
    Busy(String, Duration),
    #[error("the identity service is unreachable: {0}")]
    Unreachable(String),
    #[error("bad certificate from the identity service: {0}")]
    Response(String),
    #[error("{0}")]
    Local(String),
}

impl CertifyError {
    /// A short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Token { .. } => "token",
            Self::Refused(_) => "refused",
            Self::Busy(..) => "busy",
            Self::Unreachable(_) => "unreachable",
            Self::Response(_) => "bad_response",
            Self::Local(_) => "local",
        }
    }
}

#[derive(Debug, Clone)]
pub struct CertifyConfig {
    pub token_file: PathBuf,
    pub roots: Arc<RootCertStore>,
    pub min_refresh: Duration,
    pub max_refresh: Duration,
    pub backoff: BackoffConfig,
    /// The deadline of one Certify call.
    pub request_timeout: Duration,
}

/// Linkerd's refresh rule: 70% of the time left, within [min, max].
pub fn refresh_in(
    now: SystemTime,
    not_after: SystemTime,
    min: Duration,
    max: Duration,
) -> Duration {
    let left = not_after.duration_since(now).unwrap_or_default();
    (left * 7 / 10).clamp(min, max.max(min))
}

/// The shortest wait between renewal attempts near or past expiry.
pub const MIN_RETRY: Duration = Duration::from_secs(1);

/// The wait after a failed renewal: the back-off's `delay`, but at most a
/// quarter of the time the current certificate (expiring at `not_after`)
/// has left, and never under [`MIN_RETRY`] for that reason. A back-off grown
/// to its maximum while the identity service was away would otherwise let a
/// certificate with a short life expire between two attempts; this keeps
/// retrying often enough as expiry nears (each attempt is one small call).
pub fn retry_in(delay: Duration, now: SystemTime, not_after: Option<SystemTime>) -> Duration {
    match not_after {
        Some(at) => {
            let left = at.duration_since(now).unwrap_or_default();
            delay.min((left / 4).max(MIN_RETRY))
        }
        None => delay,
    }
}

async fn read_token(path: &PathBuf) -> Result<Vec<u8>, CertifyError> {
    let err = |reason: String| CertifyError::Token {
        path: path.display().to_string(),
        reason,
    };
    let meta = tokio::fs::metadata(path)
        .await
        .map_err(|e| err(e.to_string()))?;
    if meta.len() > MAX_TOKEN_BYTES {
        return Err(err(format!("over {MAX_TOKEN_BYTES} bytes")));
    }
    let token = tokio::fs::read(path)
        .await
        .map_err(|e| err(e.to_string()))?;
    let trimmed = token.trim_ascii();
    if trimmed.is_empty() {
        return Err(err("empty".into()));
    }
    Ok(trimmed.to_vec())
}

/// One Certify call: the token is read afresh (kubelet rotates it).
pub async fn certify_once(
    client: &mut IdentityClient<tonic::transport::Channel>,
    key: &LocalKey,
    config: &CertifyConfig,
) -> Result<Credentials, CertifyError> {
    let token = read_token(&config.token_file).await?;
    let mut req = tonic::Request::new(CertifyRequest {
        identity: key.name.to_string(),
        token,
        certificate_signing_request: key.csr.clone(),
    });
    req.set_timeout(config.request_timeout);
    let rsp = tokio::time::timeout(config.request_timeout, client.certify(req))
        .await
        .map_err(|_| CertifyError::Unreachable("no answer within the request timeout".into()))?
        .map_err(|s| status_error(&s))?
        .into_inner();
    if rsp.valid_until.is_none() {
        return Err(CertifyError::Response("no valid_until".into()));
    }
    let mut chain = Vec::with_capacity(1 + rsp.intermediate_certificates.len());
    chain.push(CertificateDer::from(rsp.leaf_certificate));
    chain.extend(
        rsp.intermediate_certificates
            .into_iter()
            .map(CertificateDer::from),
    );
    key.accept(config.roots.clone(), chain)
}

/// What a failed Certify call's status means for the next attempt.
fn status_error(s: &tonic::Status) -> CertifyError {
    let msg: String = s.message().chars().take(256).collect();
    let hint = s
        .metadata()
        .get(ballast_backoff::RETRY_PUSHBACK_KEY)
        .and_then(|v| v.to_str().ok());
    match s.code() {
        // No answer from the service (or it cannot answer yet).
        tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Unknown => {
            CertifyError::Unreachable(format!("{:?}: {msg}", s.code()))
        }
        tonic::Code::ResourceExhausted if hint.is_some() => CertifyError::Busy(
            format!("{:?}: {msg}", s.code()),
            ballast_backoff::with_pushback(Duration::ZERO, hint),
        ),
        code => CertifyError::Refused(format!("{code:?}: {msg}")),
    }
}

/// The wait after a failed attempt: the schedule's `step`, at least the
/// service's hint when it gave one, but never so long that the current
/// certificate could expire before the next attempt ([`retry_in`]).
pub fn failure_wait(
    step: Duration,
    error: &CertifyError,
    now: SystemTime,
    not_after: Option<SystemTime>,
) -> Duration {
    let step = match error {
        CertifyError::Busy(_, hint) => step.max(*hint),
        _ => step,
    };
    retry_in(step, now, not_after)
}

/// A lazily connected channel to a control-plane service at `addr`
/// (HOST:PORT): TLS verifying it as `server_name` when one is given (no
/// client certificate: the caller may have none yet), plaintext otherwise.
pub fn channel(
    addr: &str,
    server_name: Option<IdentityName>,
    roots: Arc<RootCertStore>,
    connect_timeout: Duration,
) -> Result<tonic::transport::Channel, String> {
    let config = tls::client_config(roots, None, &[]).map_err(|e| e.to_string())?;
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| format!("invalid address {addr:?}: {e}"))?;
    Ok(io::lazy_channel(
        endpoint,
        addr.to_owned(),
        server_name.map(|name| (config, name)),
        connect_timeout,
    ))
}

/// The name to verify a control-plane service at `addr` as: `given` when
/// set (empty: none, the service is dialled in plaintext), none at a
/// loopback address (Linkerd dials those in plaintext), else `default`.
pub fn service_name(
    given: Option<&str>,
    addr: &str,
    default: impl FnOnce() -> Result<IdentityName, NameError>,
) -> Result<Option<IdentityName>, NameError> {
    match given {
        Some("") => Ok(None),
        Some(name) => IdentityName::parse(name).map(Some),
        None if io::is_loopback(addr) => Ok(None),
        None => default().map(Some),
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct ResultLabels {
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}

/// What renewing a certificate exports, under Linkerd's proxy's names (so
/// that alerts written for them apply), in every process that renews one:
/// the proxy and each controller with an identity of its own.
#[derive(Clone, Debug, Default)]
pub struct CertifyMetrics {
    pub expiration: Gauge<i64, AtomicI64>,
    /// When the last certificate was received (Unix seconds, fractional).
    pub refreshed_at: Gauge<f64, AtomicU64>,
    /// Certify calls by `result` (`ok`, `error`), as Linkerd's proxy counts them.
    pub refresh: Family<ResultLabels, Counter>,
    /// Failed Certify calls by why.
    pub refresh_failures: Family<ReasonLabels, Counter>,
}

impl CertifyMetrics {
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "control_identity_cert_expiration_timestamp_seconds",
            "When this process's certificate expires (Unix seconds); 0 before the first",
            self.expiration.clone(),
        );
        r.register(
            "control_identity_cert_refresh_timestamp_seconds",
            "When this process last received a certificate (Unix seconds); 0 before the first",
            self.refreshed_at.clone(),
        );
        r.register(
            "control_identity_cert_refreshes",
            "Certify calls by result (ok, error)",
            self.refresh.clone(),
        );
        r.register(
            "identity_cert_refresh_failures",
            "Failed Certify calls by reason",
            self.refresh_failures.clone(),
        );
    }

    /// Counts a Certify outcome; a new certificate's expiry is exported.
    pub fn observe(&self, outcome: &Result<SystemTime, CertifyError>) {
        let result = match outcome {
            Ok(not_after) => {
                let secs = not_after
                    .duration_since(UNIX_EPOCH)
                    .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
                    .unwrap_or(0);
                self.expiration.set(secs);
                let now = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map(|d| d.as_secs_f64())
                    .unwrap_or(0.0);
                self.refreshed_at.set(now);
                "ok"
            }
            Err(e) => {
                self.refresh_failures
                    .get_or_create(&ReasonLabels { reason: e.reason() })
                    .inc();
                "error"
            }
        };
        self.refresh.get_or_create(&ResultLabels { result }).inc();
    }
}

/// Where and how a certificate is had and renewed.
#[derive(Debug, Clone)]
pub struct Renewal {
    /// The identity service, HOST:PORT, and the name to verify it as
    /// (`None`: plaintext).
    pub addr: String,
    pub server_name: Option<IdentityName>,
    pub connect_timeout: Duration,
    pub certify: CertifyConfig,
}

/// Makes a key for `name` in memory and renews its certificate from the
/// identity service, forever, into the returned store; `metrics` counts
/// every renewal.
pub fn spawn(
    name: IdentityName,
    renewal: Renewal,
    metrics: CertifyMetrics,
) -> Result<Arc<CertStore>, String> {
    let key = LocalKey::generate(name.clone()).map_err(|e| e.to_string())?;
    let channel = channel(
        &renewal.addr,
        renewal.server_name,
        renewal.certify.roots.clone(),
        renewal.connect_timeout,
    )?;
    let client = IdentityClient::new(channel).max_decoding_message_size(MAX_RESPONSE_BYTES);
    let store = CertStore::new();
    tracing::info!(identity = %name, service = %renewal.addr, "requesting a certificate");
    tokio::spawn(run(client, key, renewal.certify, store.clone(), metrics));
    Ok(store)
}

/// Renews forever into `store`, counting every outcome in `metrics`.
pub async fn run(
    mut client: IdentityClient<tonic::transport::Channel>,
    key: LocalKey,
    config: CertifyConfig,
    store: Arc<CertStore>,
    metrics: CertifyMetrics,
) {
    let mut backoff = Backoff::new(&config.backoff);
    loop {
        let outcome = certify_once(&mut client, &key, &config).await;
        let wait = match &outcome {
            Ok(creds) => {
                let not_after = creds.not_after;
                store.set(creds.clone());
                backoff.reset();
                let wait = refresh_in(
                    SystemTime::now(),
                    not_after,
                    config.min_refresh,
                    config.max_refresh,
                );
                tracing::info!(
                    identity = %key.name,
                    renew_in_seconds = wait.as_secs(),
                    "certified"
                );
                wait
            }
            Err(e) => {
                let current = store.get();
                let wait = failure_wait(
                    backoff.next_delay(),
                    e,
                    SystemTime::now(),
                    current.as_ref().map(|c| c.not_after),
                );
                if current.is_some() {
                    tracing::warn!(error = %e, retry_in = ?wait, "renewal failed; serving on the current certificate");
                } else {
                    tracing::warn!(error = %e, retry_in = ?wait, "cannot get a certificate yet");
                }
                wait
            }
        };
        metrics.observe(&outcome.map(|c| c.not_after));
        tokio::time::sleep(wait).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refreshes_at_seventy_percent_within_bounds() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let min = DEFAULT_MIN_REFRESH;
        let max = DEFAULT_MAX_REFRESH;
        let day = Duration::from_secs(86_400);
        assert_eq!(refresh_in(now, now + day, min, max), day * 7 / 10);
        assert_eq!(refresh_in(now, now + Duration::from_secs(5), min, max), min);
        assert_eq!(refresh_in(now, now - day, min, max), min);
        assert_eq!(refresh_in(now, now + day * 100, min, max), max);
    }

    #[test]
    fn retries_come_often_enough_to_renew_before_expiry() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let backoff = Duration::from_secs(30);
        // No certificate yet, or hours left: the back-off decides.
        assert_eq!(retry_in(backoff, now, None), backoff);
        let hours = Some(now + Duration::from_secs(7 * 3600));
        assert_eq!(retry_in(backoff, now, hours), backoff);
        // 60 s left: at most 15 s between attempts.
        let soon = Some(now + Duration::from_secs(60));
        assert_eq!(retry_in(backoff, now, soon), Duration::from_secs(15));
        assert_eq!(
            retry_in(Duration::from_secs(2), now, soon),
            Duration::from_secs(2)
        );
        // Nearly or already expired: every second, not faster.
        let nearly = Some(now + Duration::from_secs(2));
        assert_eq!(retry_in(backoff, now, nearly), MIN_RETRY);
        let past = Some(now - Duration::from_secs(10));
        assert_eq!(retry_in(backoff, now, past), MIN_RETRY);
        assert_eq!(
            retry_in(Duration::from_millis(200), now, past),
            Duration::from_millis(200)
        );
    }

    #[test]
    fn a_busy_service_is_left_alone_as_long_as_it_asks_unless_the_certificate_expires_first() {
        let busy = {
            let mut s = tonic::Status::resource_exhausted("memory");
            s.metadata_mut()
                .insert(ballast_backoff::RETRY_PUSHBACK_KEY, "5000".parse().unwrap());
            s
        };
        let error = status_error(&busy);
        assert_eq!(error.reason(), "busy");
        let step = Duration::from_millis(200);
        let now = SystemTime::now();
        assert_eq!(
            failure_wait(step, &error, now, None),
            Duration::from_secs(5)
        );
        let hours = Some(now + Duration::from_secs(7200));
        assert_eq!(
            failure_wait(step, &error, now, hours),
            Duration::from_secs(5)
        );
        // Eight seconds left: a quarter of it, whatever the hint.
        let soon = Some(now + Duration::from_secs(8));
        assert_eq!(
            failure_wait(step, &error, now, soon),
            Duration::from_secs(2)
        );
        // Without a hint, the schedule alone.
        let plain = status_error(&tonic::Status::resource_exhausted("rate"));
        assert_eq!(plain.reason(), "refused");
        assert_eq!(failure_wait(step, &plain, now, None), step);
        let away = status_error(&tonic::Status::unavailable("down"));
        assert_eq!(away.reason(), "unreachable");
    }

    #[test]
    fn control_plane_names_follow_linkerds_rule() {
        let default = || {
            IdentityName::parse(
                "linkerd-identity.linkerd.serviceaccount.identity.linkerd.cluster.local",
            )
        };
        let named = |n: Option<IdentityName>| n.map(|n| n.to_string());
        // A remote service: its default name; a given one wins.
        assert_eq!(
            named(service_name(None, "identity.linkerd.svc:8080", default).unwrap()).as_deref(),
            Some("linkerd-identity.linkerd.serviceaccount.identity.linkerd.cluster.local")
        );
        assert_eq!(
            named(service_name(Some("x.y"), "127.0.0.1:8080", default).unwrap()).as_deref(),
            Some("x.y")
        );
        // Loopback without a name, or an empty name: plaintext.
        assert_eq!(service_name(None, "127.0.0.1:8080", default).unwrap(), None);
        assert_eq!(
            service_name(Some(""), "10.0.0.1:8080", default).unwrap(),
            None
        );
        assert!(service_name(Some("not a name"), "10.0.0.1:8080", default).is_err());
    }

    #[test]
    fn the_csr_names_the_identity() {
        let name =
            IdentityName::parse("web.shop.serviceaccount.identity.linkerd.cluster.local").unwrap();
        let key = LocalKey::generate(name).unwrap();
        use x509_parser::prelude::FromDer;
        let (_, csr) =
            x509_parser::certification_request::X509CertificationRequest::from_der(key.csr_der())
                .unwrap();
        csr.verify_signature().unwrap();
        let dns: Vec<String> = csr
            .requested_extensions()
            .into_iter()
            .flatten()
            .filter_map(|e| match e {
                x509_parser::extensions::ParsedExtension::SubjectAlternativeName(s) => Some(s),
                _ => None,
            })
            .flat_map(|s| s.general_names.iter())
            .filter_map(|n| match n {
                x509_parser::extensions::GeneralName::DNSName(d) => Some(d.to_string()),
                _ => None,
            })
            .collect();
        assert_eq!(
            dns,
            vec!["web.shop.serviceaccount.identity.linkerd.cluster.local"]
        );
    }
}
