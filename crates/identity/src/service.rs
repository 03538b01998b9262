//! The Certify service: Linkerd's checks, in Linkerd's order, with its
//! status codes; bounded by request size, concurrent certifications and a
//! per-client rate; the issuer swapped in place when its files change.

use crate::{
    csr,
    issuer::{Issuer, IssuerFiles, Raw, SignConfig},
    metrics::{CertLabels, Metrics, ResultLabels},
    token::{TokenError, TokenValidator},
};
use arc_swap::ArcSwap;
use ballast_admin::MemoryBudget;
use ballast_certify::refresh_in;
use ballast_meshtls::{tls::CertStore, Credentials, IdentityName};
use linkerd2_proxy_api::identity::{
    identity_server::{Identity, IdentityServer},
    CertifyRequest, CertifyResponse,
};
use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};
use tokio::{sync::Semaphore, time::Instant};
use tonic::{Request, Response, Status};

pub const DEFAULT_MAX_CONCURRENT_CERTIFY: usize = 128;
pub const DEFAULT_CLIENT_RATE: f64 = 5.0;
pub const DEFAULT_CLIENT_BURST: u32 = 20;
pub const DEFAULT_MAX_TRACKED_CLIENTS: usize = 65_536;
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 16 * 1024;
pub const DEFAULT_RELOAD_INTERVAL: Duration = Duration::from_secs(2);

#[derive(Debug, Clone)]
pub struct IdentityConfig {
    pub sign: SignConfig,
    pub max_concurrent: usize,
    /// Requests per second each client address may make, and its burst.
    pub client_rate: f64,
    pub client_burst: u32,
    pub max_tracked_clients: usize,
    pub max_request_bytes: usize,
    /// The controller's memory budget: near its limit Certify is refused
    /// with `RESOURCE_EXHAUSTED` and a retry hint.
    pub memory: MemoryBudget,
}

/// What the issuer files last said.
#[derive(Debug, Clone)]
pub struct IssuerStatus {
    /// The issuer to sign with: the last one that loaded.
    pub issuer: Option<Arc<Issuer>>,
    /// Why the current files are refused (or the issuer has expired).
    pub problem: Option<String>,
}

impl IssuerStatus {
    pub fn is_ready(&self) -> bool {
        self.issuer.is_some() && self.problem.is_none()
    }
}

#[derive(Clone)]
pub struct IdentityService {
    inner: Arc<Inner>,
}

struct Inner {
    config: IdentityConfig,
    status: ArcSwap<IssuerStatus>,
    validator: TokenValidator,
    signing: Semaphore,
    clients: Mutex<Clients>,
    metrics: Metrics,
}

/// The token buckets, and when they were last swept for clients owed
/// nothing (a sweep reads every bucket: at most one a second).
#[derive(Debug, Default)]
struct Clients {
    buckets: HashMap<IpAddr, Bucket>,
    swept: Option<Instant>,
}

const SWEEP_EVERY: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl IdentityService {
    pub fn new(config: IdentityConfig, validator: TokenValidator, metrics: Metrics) -> Self {
        Self {
            inner: Arc::new(Inner {
                signing: Semaphore::new(config.max_concurrent.max(1)),
                config,
                status: ArcSwap::from_pointee(IssuerStatus {
                    issuer: None,
                    problem: Some("the issuer has not been read yet".into()),
                }),
                validator,
                clients: Mutex::new(Clients::default()),
                metrics,
            }),
        }
    }

    pub fn server(&self) -> IdentityServer<Self> {
        IdentityServer::new(self.clone())
            .max_decoding_message_size(self.inner.config.max_request_bytes)
    }

    pub fn status(&self) -> Arc<IssuerStatus> {
        self.inner.status.load_full()
    }

    pub fn set_status(&self, status: IssuerStatus) {
        self.inner
            .metrics
            .issuer_loaded
            .set(i64::from(status.is_ready()));
        self.inner.status.store(Arc::new(status));
    }

    fn count(&self, result: &'static str) {
        self.inner
            .metrics
            .certify_total
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// Token bucket per client address; `false` when the client is over its
    /// rate or too many clients are tracked to track another.
    fn admit(&self, ip: Option<IpAddr>) -> bool {
        let Some(ip) = ip else { return true };
        let c = &self.inner.config;
        let now = Instant::now();
        let mut clients = self.inner.clients.lock().unwrap_or_else(|e| e.into_inner());
        let Clients { buckets, swept } = &mut *clients;
        if !buckets.contains_key(&ip) && buckets.len() >= c.max_tracked_clients {
            if swept.is_some_and(|at| now.duration_since(at) < SWEEP_EVERY) {
                return false;
            }
            // Forget clients whose bucket has refilled: they are owed nothing.
            *swept = Some(now);
            let full = f64::from(c.client_burst);
            buckets.retain(|_, b| {
                b.tokens + now.duration_since(b.at).as_secs_f64() * c.client_rate < full
            });
            if buckets.len() >= c.max_tracked_clients {
                return false;
            }
        }
        let b = buckets.entry(ip).or_insert(Bucket {
            tokens: f64::from(c.client_burst),
            at: now,
        });
        b.tokens = (b.tokens + now.duration_since(b.at).as_secs_f64() * c.client_rate)
            .min(f64::from(c.client_burst));
        b.at = now;
        let admitted = b.tokens >= 1.0;
        if admitted {
            b.tokens -= 1.0;
        }
        self.inner.metrics.tracked_clients.set(buckets.len() as u64);
        admitted
    }

    async fn certify_checked(
        &self,
        remote: Option<IpAddr>,
        req: CertifyRequest,
    ) -> Result<CertifyResponse, (&'static str, Status)> {
        if self.inner.config.memory.refuse("Certify") {
            return Err(("memory", memory_refusal()));
        }
        if !self.admit(remote) {
            return Err((
                "rate_limited",
                Status::resource_exhausted("too many certify requests from this client"),
            ));
        }
        let status = self.status();
        let Some(issuer) = status.issuer.clone() else {
            return Err((
                "not_ready",
                Status::unavailable("cert issuer not ready yet"),
            ));
        };
        let invalid = |m: &str| ("invalid_request", Status::invalid_argument(m.to_owned()));
        if req.identity.is_empty() {
            return Err(invalid("missing identity"));
        }
        if req.token.is_empty() {
            return Err(invalid("missing token"));
        }
        if req.certificate_signing_request.is_empty() {
            return Err(invalid("missing certificate signing request"));
        }
        let c = &self.inner.config;
        let name = IdentityName::parse(&req.identity).map_err(|e| {
            (
                "invalid_request",
                Status::invalid_argument(format!("identity: {e}")),
            )
        })?;
        let Some((sa, ns)) = name.service_account(&c.sign.control_ns, &c.sign.trust_domain) else {
            return Err((
                "invalid_request",
                Status::invalid_argument(format!(
                    "identity must be SA.NS.serviceaccount.identity.{}.{}",
                    c.sign.control_ns, c.sign.trust_domain
                )),
            ));
        };
        if let Err(e) = issuer.check_valid(SystemTime::now()) {
            return Err(("issuer_invalid", Status::unavailable(e.to_string())));
        }
        let spki = csr::check(&req.certificate_signing_request, &name).map_err(|e| {
            if e.is_malformed() {
                ("csr_invalid", Status::invalid_argument(e.to_string()))
            } else {
                ("csr_refused", Status::failed_precondition(e.to_string()))
            }
        })?;
        let Ok(_slot) = self.inner.signing.try_acquire() else {
            return Err((
                "busy",
                Status::resource_exhausted("too many certify requests in flight"),
            ));
        };
        let _in_flight = InFlight::new(&self.inner.metrics);
        let proven = self
            .inner
            .validator
            .validate(&req.token)
            .await
            .map_err(|e| match e {
                TokenError::NotAuthenticated => (
                    "unauthenticated",
                    Status::failed_precondition(e.to_string()),
                ),
                TokenError::Invalid(_) => {
                    ("token_invalid", Status::invalid_argument(e.to_string()))
                }
                TokenError::Unavailable(_) => (
                    "token_check_failed",
                    Status::internal(format!("error validating token for {name}: {e}")),
                ),
            })?;
        if proven.namespace != ns || proven.name != sa {
            return Err(("identity_mismatch", Status::failed_precondition(format!(
                "requested identity did not match provided token: requested={name}; found={}.{}.serviceaccount.identity.{}.{}",
                proven.name, proven.namespace, c.sign.control_ns, c.sign.trust_domain
            ))));
        }
        let signed = issuer
            .sign(&spki, &name, &c.sign)
            .map_err(|e| ("sign_failed", Status::internal(e.to_string())))?;
        tracing::debug!(identity = %name, "certified");
        Ok(CertifyResponse {
            leaf_certificate: signed.leaf.to_vec(),
            intermediate_certificates: signed.intermediates.iter().map(|c| c.to_vec()).collect(),
            valid_until: Some(prost_types::Timestamp::from(signed.not_after)),
        })
    }
}

struct InFlight<'a>(&'a Metrics);

impl<'a> InFlight<'a> {
    fn new(m: &'a Metrics) -> Self {
        m.certify_in_flight.inc();
        Self(m)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.certify_in_flight.dec();
    }
}

#[tonic::async_trait]
impl Identity for IdentityService {
    async fn certify(
        &self,
        request: Request<CertifyRequest>,
    ) -> Result<Response<CertifyResponse>, Status> {
        let remote = request.remote_addr().map(|a| a.ip());
        match self.certify_checked(remote, request.into_inner()).await {
            Ok(rsp) => {
                self.count("ok");
                Ok(Response::new(rsp))
            }
            Err((reason, status)) => {
                self.count(reason);
                tracing::debug!(
                    ?remote,
                    reason,
                    message = status.message(),
                    "certify refused"
                );
                Err(status)
            }
        }
    }
}

/// Reads the issuer files now and every `interval`, swapping the issuer in
/// when they change and load, refusing (with a logged reason, /ready
/// failing) when they do not; re-checks validity on every tick so an issuer
/// that expires while running turns the controller unready. After each load
/// the controller's own serving certificate is signed afresh, and again at
/// 70% of its life.
pub async fn watch_issuer(
    service: IdentityService,
    files: IssuerFiles,
    own: Option<(IdentityName, Arc<CertStore>)>,
    interval: Duration,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let mut last: Option<Raw> = None;
    let own_key = match own {
        Some((name, store)) => match rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256) {
            Ok(key) => Some((name, store, key)),
            Err(e) => {
                tracing::error!(error = %e, "cannot make the controller's own key; serving plaintext only");
                None
            }
        },
        None => None,
    };
    let mut own_renew_at: Option<SystemTime> = None;
    loop {
        let now = SystemTime::now();
        let metrics = &service.inner.metrics;
        let reload = |result: &'static str| {
            metrics
                .issuer_reloads
                .get_or_create(&ResultLabels { result })
                .inc()
        };
        let current = service.status();
        match files.read() {
            Err(e) => {
                if current.problem.as_deref() != Some(&e.to_string()) {
                    tracing::error!(error = %e, "cannot read the issuer");
                    reload("unreadable");
                }
                service.set_status(IssuerStatus {
                    issuer: current.issuer.clone(),
                    problem: Some(e.to_string()),
                });
            }
            Ok(raw) if last.as_ref() != Some(&raw) => {
                match Issuer::load(&raw, now) {
                    Ok(issuer) => {
                        tracing::info!(subject = %issuer.info.subject, expires = %crate::issuer::rfc3339(issuer.info.not_after), "issuer loaded");
                        reload("ok");
                        metrics.expiration.clear();
                        let unix = |t: SystemTime| {
                            t.duration_since(SystemTime::UNIX_EPOCH)
                                .map(|d| d.as_secs() as i64)
                                .unwrap_or(0)
                        };
                        metrics
                            .expiration
                            .get_or_create(&CertLabels {
                                cert: "issuer",
                                subject: issuer.info.subject.clone(),
                            })
                            .set(unix(issuer.info.not_after));
                        for a in &issuer.anchors {
                            metrics
                                .expiration
                                .get_or_create(&CertLabels {
                                    cert: "anchor",
                                    subject: a.subject.clone(),
                                })
                                .set(unix(a.not_after));
                        }
                        service.set_status(IssuerStatus {
                            issuer: Some(Arc::new(issuer)),
                            problem: None,
                        });
                        own_renew_at = None;
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "issuer refused; still signing with the last valid issuer, if any, and not ready");
                        reload("refused");
                        service.set_status(IssuerStatus {
                            issuer: current.issuer.clone(),
                            problem: Some(e.to_string()),
                        });
                    }
                }
                last = Some(raw);
            }
            Ok(_) => {
                if let Some(issuer) = &current.issuer {
                    if let Err(e) = issuer.check_valid(now) {
                        if current.problem.is_none() {
                            tracing::error!(error = %e, "the issuer is no longer valid");
                        }
                        service.set_status(IssuerStatus {
                            issuer: current.issuer.clone(),
                            problem: Some(e.to_string()),
                        });
                    }
                }
            }
        }
        if let (Some((name, store, key)), Some(issuer)) =
            (&own_key, service.status().issuer.clone())
        {
            if own_renew_at.is_none_or(|at| now >= at) {
                let spki = rcgen::PublicKeyData::subject_public_key_info(key);
                match issuer.sign(&spki, name, &service.inner.config.sign) {
                    Ok(signed) => {
                        let mut chain = vec![signed.leaf];
                        chain.extend(signed.intermediates);
                        let pkcs8 =
                            rustls::pki_types::PrivatePkcs8KeyDer::from(key.serialize_der());
                        match Credentials::new(name.clone(), chain, pkcs8, signed.not_after) {
                            Ok(c) => {
                                store.set(c);
                                own_renew_at = Some(
                                    now + refresh_in(
                                        now,
                                        signed.not_after,
                                        Duration::from_secs(10),
                                        Duration::from_secs(86_400),
                                    ),
                                );
                            }
                            Err(e) => {
                                tracing::error!(error = %e, "cannot use the controller's own certificate")
                            }
                        }
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "cannot sign the controller's own certificate")
                    }
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = &mut shutdown => return,
        }
    }
}

/// Certify refused because the controller's memory is near its limit:
/// `RESOURCE_EXHAUSTED` with gRPC's retry hint, which Ballast's proxy
/// honours.
fn memory_refusal() -> Status {
    let after = ballast_admin::budget::RETRY_AFTER;
    let mut status = Status::resource_exhausted(format!(
        "the identity controller's memory is near its limit; retry in {}s",
        after.as_secs()
    ));
    if let Ok(v) = after.as_millis().to_string().parse() {
        status
            .metadata_mut()
            .insert(ballast_admin::budget::RETRY_PUSHBACK_KEY, v);
    }
    status
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::token::ManifestTokens;

    fn service(max_tracked_clients: usize) -> IdentityService {
        let config = IdentityConfig {
            sign: SignConfig {
                lifetime: Duration::from_secs(3600),
                clock_skew: Duration::ZERO,
                control_ns: "linkerd".into(),
                trust_domain: "cluster.local".into(),
            },
            max_concurrent: 1,
            client_rate: 1.0,
            client_burst: 1,
            max_tracked_clients,
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
            memory: MemoryBudget::unstarted(Some(64 << 20)),
        };
        let tokens = TokenValidator::Manifests(ManifestTokens::new("/nonexistent".into()));
        IdentityService::new(config, tokens, Metrics::default())
    }

    fn ip(n: u8) -> Option<IpAddr> {
        Some(IpAddr::from([10, 0, 0, n]))
    }

    #[tokio::test(start_paused = true)]
    async fn each_client_has_its_bucket_and_the_map_its_bound() {
        let s = service(2);
        assert!(s.admit(ip(1)));
        assert!(!s.admit(ip(1)), "over its rate");
        assert!(s.admit(ip(2)), "another client has its own bucket");
        // Full, and nobody is owed nothing yet: a new client is refused.
        assert!(!s.admit(ip(3)));
        tokio::time::advance(Duration::from_millis(500)).await;
        // Half refilled: still owed; and the last sweep was under a second ago.
        assert!(!s.admit(ip(3)));
        tokio::time::advance(Duration::from_millis(600)).await;
        // Refilled buckets are forgotten at the next sweep: room again.
        assert!(s.admit(ip(3)));
        assert_eq!(s.inner.metrics.tracked_clients.get(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn near_the_memory_limit_certify_is_refused_with_a_retry_hint() {
        let s = service(2);
        s.inner.config.memory.set(ballast_admin::Pressure::Refusing);
        let Err((result, status)) = s.certify_checked(ip(1), CertifyRequest::default()).await
        else {
            panic!("certified under memory pressure");
        };
        assert_eq!(result, "memory");
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert_eq!(
            status
                .metadata()
                .get(ballast_admin::budget::RETRY_PUSHBACK_KEY)
                .and_then(|v| v.to_str().ok()),
            Some("5000")
        );
        s.inner.config.memory.set(ballast_admin::Pressure::Normal);
        let Err((result, _)) = s.certify_checked(ip(1), CertifyRequest::default()).await else {
            panic!("an empty request certified");
        };
        assert_ne!(result, "memory", "taken again once memory falls");
    }
}
