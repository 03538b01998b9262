//! `ballast identity` as a real process on OS-picked ports, its PKI made by
//! `ballast identity generate`, and Certify clients (plaintext or TLS).

use crate::{ballast_bin, eventually, http_get, proxy::Logged};
use ballast_certify::LocalKey;
use ballast_meshtls::{io, pem, tls, IdentityName};
use hyper_util::rt::TokioIo;
use linkerd2_proxy_api::identity::{
    identity_client::IdentityClient, CertifyRequest, CertifyResponse,
};
use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
};
use tokio::process::Command;
use tonic::transport::{Channel, Endpoint};

pub const TRUST_DOMAIN: &str = "cluster.local";
pub const CONTROL_NS: &str = "linkerd";

/// A meshed pod `NAME-1` (it carries the control plane's label) running as
/// service account `sa` at `addr`, behind a service `NAME` on port 80 at
/// `cluster_ip`, in the proxies' namespace: one manifest.
pub fn meshed_service_yaml(name: &str, sa: &str, addr: SocketAddr, cluster_ip: &str) -> String {
    let ns = crate::proxy::NS;
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}-1\n  namespace: {ns}\n  labels: {{app: {name}, linkerd.io/control-plane-ns: {CONTROL_NS}}}\n\
         spec:\n  serviceAccountName: {sa}\n  containers: [{{name: main, ports: [{{name: http, containerPort: {port}}}]}}]\n\
         status: {{phase: Running, podIP: {ip}, hostIP: 127.99.0.1}}\n---\n\
         apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: {ns}}}\n\
         spec:\n  clusterIP: {cluster_ip}\n  selector: {{app: {name}}}\n  ports: [{{name: http, port: 80, targetPort: http}}]\n",
        port = addr.port(),
        ip = addr.ip(),
    )
}

/// The flags that have a proxy certified by the identity controller at
/// `ca` as service account `sa` of the proxies' namespace, with the token
/// in `token`; trust anchors inline (as injected pods get them) or from
/// the PKI's file.
pub fn proxy_identity_flags(
    pki: &Pki,
    ca: SocketAddr,
    sa: &str,
    token: &Path,
    inline_anchors: bool,
    extra: &[&str],
) -> Vec<String> {
    let anchors = if inline_anchors {
        let pem = std::fs::read_to_string(pki.anchors()).expect("the trust anchors");
        ["--identity-trust-anchors-pem".to_string(), pem]
    } else {
        [
            "--identity-trust-anchors".to_string(),
            pki.anchors().display().to_string(),
        ]
    };
    let mut flags: Vec<String> = anchors.into();
    for (flag, value) in [
        ("--identity-addr", ca.to_string()),
        ("--identity-token-file", token.display().to_string()),
        ("--pod-namespace", crate::proxy::NS.to_string()),
        ("--pod-service-account", sa.to_string()),
        ("--control-backoff-max", "500ms".to_string()),
    ] {
        flags.push(flag.into());
        flags.push(value);
    }
    flags.extend(extra.iter().map(|s| s.to_string()));
    flags
}

/// `SA.NS.serviceaccount.identity.linkerd.cluster.local`.
pub fn identity(sa: &str, ns: &str) -> IdentityName {
    IdentityName::for_service_account(sa, ns, CONTROL_NS, TRUST_DOMAIN).unwrap()
}

/// What the controller serves TLS as.
pub fn controller_identity() -> IdentityName {
    identity("linkerd-identity", CONTROL_NS)
}

/// A service-account token Secret, as the manifests source reads it.
pub fn token_secret(ns: &str, sa: &str, token: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Secret\ntype: kubernetes.io/service-account-token\nmetadata:\n  name: {sa}-token\n  namespace: {ns}\n  annotations:\n    kubernetes.io/service-account.name: {sa}\nstringData:\n  token: {token}\n"
    )
}

/// Trust anchor and issuer written by `ballast identity generate`.
pub struct Pki {
    pub dir: PathBuf,
}

impl Pki {
    pub async fn generate(dir: &Path) -> Pki {
        run_generate(dir, &[]).await;
        Pki {
            dir: dir.to_owned(),
        }
    }

    /// A new issuer under the same anchor.
    pub async fn rotate_issuer(&self) {
        run_generate(&self.dir, &["--rotate-issuer"]).await;
    }

    pub fn anchors(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    pub fn issuer_dir(&self) -> PathBuf {
        self.dir.join("issuer")
    }

    pub fn issuer_cert(&self) -> Vec<u8> {
        std::fs::read(self.issuer_dir().join("tls.crt")).unwrap()
    }

    pub fn roots(&self) -> Arc<rustls::RootCertStore> {
        let anchors = pem::certificates(&std::fs::read(self.anchors()).unwrap()).unwrap();
        tls::root_store(&anchors).unwrap()
    }
}

async fn run_generate(dir: &Path, extra: &[&str]) {
    let out = Command::new(ballast_bin())
        .args(["identity", "generate", "--out"])
        .arg(dir)
        .args(extra)
        .output()
        .await
        .expect("run ballast identity generate");
    assert!(
        out.status.success(),
        "ballast identity generate failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A running `ballast identity`.
pub struct IdentityCa {
    pub process: Logged,
    pub grpc: SocketAddr,
    pub admin: SocketAddr,
}

impl IdentityCa {
    /// Starts it on the PKI's files, checking tokens against `manifests`, and
    /// waits for /ready.
    pub async fn start(pki: &Pki, manifests: &Path, extra: &[&str]) -> IdentityCa {
        let ca = Self::spawn(pki, manifests, extra).await;
        eventually("the identity controller's /ready", || async {
            (http_get(ca.admin, "/ready").await.0 == 200).then_some(())
        })
        .await;
        ca
    }

    /// Starts it without waiting for /ready.
    pub async fn spawn(pki: &Pki, manifests: &Path, extra: &[&str]) -> IdentityCa {
        Self::spawn_at(pki, manifests, "127.0.0.1:0".parse().unwrap(), extra).await
    }

    /// Starts it on `addr` (to restart it where proxies look for it).
    pub async fn spawn_at(
        pki: &Pki,
        manifests: &Path,
        addr: SocketAddr,
        extra: &[&str],
    ) -> IdentityCa {
        let mut cmd = Command::new(ballast_bin());
        cmd.arg("identity")
            .args(["--addr", &addr.to_string(), "--admin-addr", "127.0.0.1:0"])
            .arg("--issuer-dir")
            .arg(pki.issuer_dir())
            .arg("--trust-anchors")
            .arg(pki.anchors())
            .arg("--manifests")
            .arg(manifests)
            .args(["--reload-interval", "100ms"])
            .args(extra);
        let mut process = Logged::spawn(cmd);
        let grpc = process.listening("identity gRPC listening on ", 1).await[0];
        let admin = process.listening("admin listening on ", 1).await[0];
        IdentityCa {
            process,
            grpc,
            admin,
        }
    }

    pub async fn ready(&self) -> u16 {
        http_get(self.admin, "/ready").await.0
    }
}

/// A Certify client over plaintext.
pub async fn plaintext_client(addr: SocketAddr) -> IdentityClient<Channel> {
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .expect("connect to the identity controller");
    IdentityClient::new(channel)
}

/// A Certify client over TLS, verifying the server as `name` under `roots`.
pub async fn tls_client(
    addr: SocketAddr,
    roots: Arc<rustls::RootCertStore>,
    name: IdentityName,
) -> Result<IdentityClient<Channel>, tonic::transport::Error> {
    let config = tls::client_config(roots, None, &[]).unwrap();
    let connector = tower::service_fn(move |_: http::Uri| {
        let config = config.clone();
        let name = name.clone();
        async move {
            let tcp = tokio::net::TcpStream::connect(addr).await?;
            io::connect(tcp, Some((&config, &name)))
                .await
                .map(TokioIo::new)
        }
    });
    let channel = Endpoint::from_static("http://identity.invalid")
        .connect_with_connector(connector)
        .await?;
    Ok(IdentityClient::new(channel))
}

/// A Certify request for `name` with `token` and a fresh key's CSR.
pub fn request(name: &IdentityName, token: &str) -> (LocalKey, CertifyRequest) {
    let key = LocalKey::generate(name.clone()).unwrap();
    let req = CertifyRequest {
        identity: name.to_string(),
        token: token.as_bytes().to_vec(),
        certificate_signing_request: key.csr_der().to_vec(),
    };
    (key, req)
}

/// The chain of a response, leaf first.
pub fn chain(rsp: &CertifyResponse) -> Vec<rustls::pki_types::CertificateDer<'static>> {
    let mut chain = vec![rsp.leaf_certificate.clone().into()];
    chain.extend(
        rsp.intermediate_certificates
            .iter()
            .map(|c| c.clone().into()),
    );
    chain
}
