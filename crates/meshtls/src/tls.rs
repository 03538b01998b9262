//! rustls configurations for the mesh: TLS 1.3 only, ring, ECDSA P-256
//! certificates chaining to the trust anchors. The local certificate lives in
//! a [`CertStore`] that renewals swap without touching open connections.

use crate::name::IdentityName;
use arc_swap::ArcSwapOption;
use rustls::{
    client::{danger::ServerCertVerifier, ResolvesClientCert, WebPkiServerVerifier},
    crypto::CryptoProvider,
    pki_types::{CertificateDer, PrivatePkcs8KeyDer, ServerName, UnixTime},
    server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier},
    sign::CertifiedKey,
    ClientConfig, RootCertStore, ServerConfig, SignatureScheme,
};
use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

/// ALPN of Linkerd's opaque transport: the client sends a transport header
/// first, inside TLS.
pub const TRANSPORT_HEADER_ALPN: &[u8] = b"transport.l5d.io/v1";

/// ring, TLS 1.3 suites only.
pub fn provider() -> Arc<CryptoProvider> {
    let mut p = rustls::crypto::ring::default_provider();
    p.cipher_suites
        .retain(|s| s.version() == &rustls::version::TLS13);
    Arc::new(p)
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("trust anchors: {0}")]
    Anchors(String),
    #[error("certificate: {0}")]
    Certificate(String),
    #[error("rustls: {0}")]
    Rustls(#[from] rustls::Error),
}

/// The trust anchors as a root store; every certificate must parse.
pub fn root_store(anchors: &[CertificateDer<'static>]) -> Result<Arc<RootCertStore>, TlsError> {
    let mut roots = RootCertStore::empty();
    for (i, a) in anchors.iter().enumerate() {
        roots
            .add(a.clone())
            .map_err(|e| TlsError::Anchors(format!("anchor {}: {e}", i + 1)))?;
    }
    if roots.is_empty() {
        return Err(TlsError::Anchors("no certificate".into()));
    }
    Ok(Arc::new(roots))
}

/// The trust anchors in the PEM bundle at `path`, as a root store.
pub fn root_store_file(path: &std::path::Path) -> Result<Arc<RootCertStore>, TlsError> {
    let bytes = std::fs::read(path)
        .map_err(|e| TlsError::Anchors(format!("cannot read {}: {e}", path.display())))?;
    let anchors = crate::pem::certificates(&bytes)
        .map_err(|e| TlsError::Anchors(format!("{}: {e}", path.display())))?;
    root_store(&anchors)
}

/// A certificate (leaf first, then intermediates) with its key and identity.
#[derive(Debug, Clone)]
pub struct Credentials {
    pub name: IdentityName,
    pub key: Arc<CertifiedKey>,
    pub not_after: SystemTime,
}

impl Credentials {
    pub fn new(
        name: IdentityName,
        chain: Vec<CertificateDer<'static>>,
        key: PrivatePkcs8KeyDer<'static>,
        not_after: SystemTime,
    ) -> Result<Self, TlsError> {
        let signing = provider()
            .key_provider
            .load_private_key(key.into())
            .map_err(|e| TlsError::Certificate(format!("key: {e}")))?;
        Ok(Self {
            name,
            key: Arc::new(CertifiedKey::new(chain, signing)),
            not_after,
        })
    }
}

/// The local identity's current certificate; empty until the first is had.
/// Both a server and a client resolver: one store serves every connection.
#[derive(Debug, Default)]
pub struct CertStore {
    current: ArcSwapOption<Credentials>,
}

impl CertStore {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    pub fn set(&self, creds: Credentials) {
        self.current.store(Some(Arc::new(creds)));
    }

    pub fn get(&self) -> Option<Arc<Credentials>> {
        self.current.load_full()
    }

    /// Holds a certificate that has not expired.
    pub fn is_ready(&self) -> bool {
        self.current
            .load()
            .as_ref()
            .is_some_and(|c| c.not_after > SystemTime::now())
    }
}

impl ResolvesServerCert for CertStore {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current.load().as_ref().map(|c| c.key.clone())
    }
}

impl ResolvesClientCert for CertStore {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        self.current.load().as_ref().map(|c| c.key.clone())
    }

    fn has_certs(&self) -> bool {
        self.current.load().is_some()
    }
}

/// A mesh server: the store's certificate; a client certificate is verified
/// against the anchors when sent, and may be absent (plaintext-era callers,
/// proxies without an identity yet, as Linkerd allows).
pub fn server_config(
    roots: Arc<RootCertStore>,
    certs: Arc<CertStore>,
    alpn: &[&[u8]],
) -> Result<Arc<ServerConfig>, TlsError> {
    let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider())
        .allow_unauthenticated()
        .build()
        .map_err(|e| TlsError::Anchors(e.to_string()))?;
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(certs);
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    // No session resumption: every connection proves its identity afresh.
    config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    config.send_tls13_tickets = 0;
    Ok(Arc::new(config))
}

/// A mesh client: the server must chain to the anchors and carry the name
/// dialled (SNI); our certificate is sent when we hold one.
pub fn client_config(
    roots: Arc<RootCertStore>,
    certs: Option<Arc<CertStore>>,
    alpn: &[&[u8]],
) -> Result<Arc<ClientConfig>, TlsError> {
    let verifier: Arc<dyn ServerCertVerifier> =
        WebPkiServerVerifier::builder_with_provider(roots, provider())
            .build()
            .map_err(|e| TlsError::Anchors(e.to_string()))?;
    let builder = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let mut config = match certs {
        Some(store) => builder.with_client_cert_resolver(store),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    config.resumption = rustls::client::Resumption::disabled();
    Ok(Arc::new(config))
}

/// The TLS server name for an identity.
pub fn server_name(name: &IdentityName) -> ServerName<'static> {
    // An IdentityName is a valid DNS name by construction.
    ServerName::try_from(name.as_str().to_owned())
        .unwrap_or_else(|_| ServerName::try_from("invalid.identity").expect("static name"))
}

/// The identity a verified peer certificate carries: its first DNS SAN.
pub fn peer_identity(chain: Option<&[CertificateDer<'_>]>) -> Option<IdentityName> {
    let leaf = chain?.first()?;
    dns_names(leaf).into_iter().next()
}

/// The DNS SANs of a certificate that are valid identity names.
pub fn dns_names(cert: &CertificateDer<'_>) -> Vec<IdentityName> {
    use x509_parser::{extensions::GeneralName, prelude::FromDer};
    let Ok((_, cert)) = x509_parser::certificate::X509Certificate::from_der(cert) else {
        return Vec::new();
    };
    let Ok(Some(san)) = cert.subject_alternative_name() else {
        return Vec::new();
    };
    san.value
        .general_names
        .iter()
        .filter_map(|n| match n {
            GeneralName::DNSName(d) => IdentityName::parse(d).ok(),
            _ => None,
        })
        .collect()
}

/// A certificate's subject public key info (DER).
pub fn public_key_der(cert: &CertificateDer<'_>) -> Option<Vec<u8>> {
    use x509_parser::prelude::FromDer;
    let (_, c) = x509_parser::certificate::X509Certificate::from_der(cert).ok()?;
    Some(c.public_key().raw.to_vec())
}

/// When a certificate stops being valid.
pub fn not_after(cert: &CertificateDer<'_>) -> Option<SystemTime> {
    use x509_parser::prelude::FromDer;
    let (_, cert) = x509_parser::certificate::X509Certificate::from_der(cert).ok()?;
    let secs = cert.validity().not_after.timestamp();
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(secs).ok()?))
}

/// Verifies `chain` (leaf first) for `name` against `roots` at `now`, as a
/// client dialling `name` would.
pub fn verify_server_chain(
    roots: Arc<RootCertStore>,
    chain: &[CertificateDer<'static>],
    name: &IdentityName,
    now: SystemTime,
) -> Result<(), TlsError> {
    let (leaf, rest) = chain
        .split_first()
        .ok_or_else(|| TlsError::Certificate("empty chain".into()))?;
    let verifier = WebPkiServerVerifier::builder_with_provider(roots, provider())
        .build()
        .map_err(|e| TlsError::Anchors(e.to_string()))?;
    let now = UnixTime::since_unix_epoch(
        now.duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default(),
    );
    verifier.verify_server_cert(leaf, rest, &server_name(name), &[], now)?;
    Ok(())
}
