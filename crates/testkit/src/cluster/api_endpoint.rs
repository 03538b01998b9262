//! The API server as pods see it: `https://NODE_IP:6443` inside the node's namespace
//! (the `kubernetes` Service's endpoint), TLS with the cluster CA, each connection
//! relayed in plaintext to the in-process [`ApiServer`](crate::ApiServer) on 127.0.0.1.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

/// The port the API server's endpoint listens on in the node namespace.
pub const API_SERVER_PORT: u16 = 6443;
/// The `kubernetes` Service's cluster IP (`KUBERNETES_SERVICE_HOST`).
pub const KUBERNETES_SERVICE_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 1);
/// Connections relayed at once; more wait in the backlog.
const MAX_CONNECTIONS: usize = 256;

/// The cluster's CA (what pods get as `ca.crt`) and the API server's serving
/// certificate, for 10.96.0.1, the node IP and the `kubernetes` Service's names.
pub struct ClusterCa {
    /// PEM of the CA certificate.
    pub ca_pem: String,
    cert_der: rustls::pki_types::CertificateDer<'static>,
    key_der: rustls::pki_types::PrivateKeyDer<'static>,
}

impl ClusterCa {
    pub fn generate(node_ip: Ipv4Addr) -> io::Result<ClusterCa> {
        let fail =
            |what: &'static str| move |e: rcgen::Error| io::Error::other(format!("{what}: {e}"));
        let ca_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
            .map_err(fail("the cluster CA key"))?;
        let mut ca = rcgen::CertificateParams::default();
        ca.distinguished_name = rcgen::DistinguishedName::new();
        ca.distinguished_name
            .push(rcgen::DnType::CommonName, "ballast-testkit cluster CA");
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
        ca.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca.self_signed(&ca_key).map_err(fail("the cluster CA"))?;
        let ca_pem = ca_cert.pem();
        let issuer = rcgen::Issuer::new(ca, ca_key);

        let mut leaf = rcgen::CertificateParams::new(vec![
            "kubernetes".to_string(),
            "kubernetes.default".to_string(),
            "kubernetes.default.svc".to_string(),
            "kubernetes.default.svc.cluster.local".to_string(),
        ])
        .map_err(fail("the API server's names"))?;
        leaf.subject_alt_names
            .push(rcgen::SanType::IpAddress(KUBERNETES_SERVICE_IP.into()));
        leaf.subject_alt_names
            .push(rcgen::SanType::IpAddress(node_ip.into()));
        leaf.distinguished_name = rcgen::DistinguishedName::new();
        leaf.distinguished_name
            .push(rcgen::DnType::CommonName, "kube-apiserver");
        leaf.is_ca = rcgen::IsCa::ExplicitNoCa;
        leaf.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
        leaf.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
            .map_err(fail("the API server key"))?;
        let cert = leaf
            .signed_by(&key, &issuer)
            .map_err(fail("the API server certificate"))?;
        Ok(ClusterCa {
            ca_pem,
            cert_der: cert.der().clone(),
            key_der: rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        })
    }

    fn server_config(&self) -> io::Result<Arc<rustls::ServerConfig>> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(io::Error::other)?
            .with_no_client_auth()
            .with_single_cert(vec![self.cert_der.clone()], self.key_der.clone_key())
            .map_err(io::Error::other)?;
        // The emulation speaks HTTP/1.1 only; offering it keeps ALPN clients honest.
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

/// The relay task; stopped on drop.
pub(crate) struct ApiServerEndpoint {
    task: JoinHandle<()>,
}

impl ApiServerEndpoint {
    /// Serves on `listener` (bound in the node namespace), relaying to `upstream`.
    pub fn start(
        listener: std::net::TcpListener,
        ca: &ClusterCa,
        upstream: SocketAddr,
    ) -> io::Result<ApiServerEndpoint> {
        let listener = TcpListener::from_std(listener)?;
        let acceptor = TlsAcceptor::from(ca.server_config()?);
        let task = tokio::spawn(relay_loop(listener, acceptor, upstream));
        Ok(ApiServerEndpoint { task })
    }
}

impl Drop for ApiServerEndpoint {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn relay_loop(listener: TcpListener, acceptor: TlsAcceptor, upstream: SocketAddr) {
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        // Reap finished relays so the set stays as small as the live connections.
        while connections.try_join_next().is_some() {}
        let (stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::debug!(error = %e, "testkit api endpoint: accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
        };
        let acceptor = acceptor.clone();
        // Owned by the set: aborting this loop drops every relay with it.
        connections.spawn(async move {
            let _permit = permit;
            if let Err(e) = relay(stream, acceptor, upstream).await {
                tracing::debug!(error = %e, "testkit api endpoint: relay ended");
            }
        });
    }
}

async fn relay(stream: TcpStream, acceptor: TlsAcceptor, upstream: SocketAddr) -> io::Result<()> {
    let _ = stream.set_nodelay(true);
    let mut tls = acceptor.accept(stream).await?;
    let mut plain = TcpStream::connect(upstream).await?;
    let _ = plain.set_nodelay(true);
    tokio::io::copy_bidirectional(&mut tls, &mut plain).await?;
    Ok(())
}
