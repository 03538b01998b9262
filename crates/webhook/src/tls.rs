//! The webhook's serving certificate, from the files a mounted
//! `kubernetes.io/tls` Secret gives (`tls.crt`, `tls.key`), re-read every
//! reload interval: a renewed Secret is served without a restart, and a
//! broken one is refused (the last good certificate stays).

use arc_swap::ArcSwap;
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};
use rustls::{
    server::{ClientHello, ResolvesServerCert},
    sign::CertifiedKey,
    ServerConfig,
};
use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

/// Certificate and key files larger than this are refused.
const MAX_PEM_BYTES: u64 = 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("cannot read {path}: {reason}")]
    File { path: String, reason: String },
    #[error("{path}: {reason}")]
    Pem { path: String, reason: String },
}

#[derive(Clone, Debug)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

fn read(path: &Path) -> Result<Vec<u8>, CertError> {
    let err = |reason: String| CertError::File {
        path: path.display().to_string(),
        reason,
    };
    let meta = std::fs::metadata(path).map_err(|e| err(e.to_string()))?;
    if meta.len() > MAX_PEM_BYTES {
        return Err(err(format!("larger than {MAX_PEM_BYTES} bytes")));
    }
    std::fs::read(path).map_err(|e| err(e.to_string()))
}

impl CertFiles {
    fn read(&self) -> Result<(Vec<u8>, Vec<u8>), CertError> {
        Ok((read(&self.cert)?, read(&self.key)?))
    }

    fn load(&self, cert: &[u8], key: &[u8]) -> Result<CertifiedKey, CertError> {
        let pem_err = |path: &Path| {
            let path = path.display().to_string();
            move |reason: String| CertError::Pem {
                path: path.clone(),
                reason,
            }
        };
        let chain = ballast_meshtls::pem::certificates(cert)
            .map_err(|e| pem_err(&self.cert)(e.to_string()))?;
        let key = ballast_meshtls::pem::private_key(key)
            .map_err(|e| pem_err(&self.key)(e.to_string()))?;
        let provider = ballast_meshtls::tls::provider();
        let signing = provider
            .key_provider
            .load_private_key(key.into())
            .map_err(|e| pem_err(&self.key)(e.to_string()))?;
        let certified = CertifiedKey::new(chain, signing);
        certified
            .keys_match()
            .map_err(|e| pem_err(&self.key)(format!("does not match the certificate: {e}")))?;
        Ok(certified)
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReloadLabels {
    /// `ok` or `error`.
    pub result: &'static str,
}

/// Serves the newest good certificate.
#[derive(Debug)]
pub struct ReloadingCert {
    files: CertFiles,
    current: ArcSwap<CertifiedKey>,
    last: std::sync::Mutex<(Vec<u8>, Vec<u8>)>,
    pub reloads: Family<ReloadLabels, Counter>,
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

impl ReloadingCert {
    /// Reads the files; an error here stops the injector from starting.
    pub fn load(files: CertFiles) -> Result<Arc<Self>, CertError> {
        let (cert, key) = files.read()?;
        let certified = files.load(&cert, &key)?;
        Ok(Arc::new(Self {
            files,
            current: ArcSwap::from_pointee(certified),
            last: std::sync::Mutex::new((cert, key)),
            reloads: Family::default(),
        }))
    }

    pub fn register(&self, r: &mut Registry) {
        r.register(
            "injector_tls_certificate_reloads",
            "Changed certificate files read, by result (ok: now served; error: the previous one kept)",
            self.reloads.clone(),
        );
    }

    /// Re-reads the files; serves them if they changed and are good.
    pub fn reload(&self) {
        let read = match self.files.read() {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!("keeping the served certificate: {e}");
                self.reloads
                    .get_or_create(&ReloadLabels { result: "error" })
                    .inc();
                return;
            }
        };
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if *last == read {
            return;
        }
        match self.files.load(&read.0, &read.1) {
            Ok(certified) => {
                self.current.store(Arc::new(certified));
                tracing::info!(cert = %self.files.cert.display(), "serving the renewed certificate");
                self.reloads
                    .get_or_create(&ReloadLabels { result: "ok" })
                    .inc();
            }
            Err(e) => {
                tracing::warn!("keeping the served certificate: {e}");
                self.reloads
                    .get_or_create(&ReloadLabels { result: "error" })
                    .inc();
            }
        }
        // Not retried until the files change again (a half-written pair is
        // read again at the next change).
        *last = read;
    }

    /// Re-reads every `interval` until `stop`.
    pub async fn watch(self: Arc<Self>, interval: Duration, stop: impl std::future::Future) {
        let mut stop = std::pin::pin!(stop);
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = &mut stop => return,
                _ = tick.tick() => {
                    let this = self.clone();
                    // File reads off the async workers.
                    let _ = tokio::task::spawn_blocking(move || this.reload()).await;
                }
            }
        }
    }

    /// A TLS 1.3 server configuration (ring) serving this certificate over
    /// HTTP/1.1; the API server's webhook client speaks both.
    pub fn server_config(self: &Arc<Self>) -> Result<Arc<ServerConfig>, rustls::Error> {
        let mut config = ServerConfig::builder_with_provider(ballast_meshtls::tls::provider())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(name: &str) -> (String, String) {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let cert = rcgen::CertificateParams::new(vec![name.to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    }

    fn served(c: &ReloadingCert) -> Vec<u8> {
        c.current.load_full().cert[0].to_vec()
    }

    #[test]
    fn a_renewed_pair_is_served_and_a_broken_one_refused() {
        let dir = tempfile::tempdir().unwrap();
        let files = CertFiles {
            cert: dir.path().join("tls.crt"),
            key: dir.path().join("tls.key"),
        };
        let write = |(cert, key): &(String, String)| {
            std::fs::write(&files.cert, cert).unwrap();
            std::fs::write(&files.key, key).unwrap();
        };
        let a = pair("a.svc");
        write(&a);
        let c = ReloadingCert::load(files.clone()).unwrap();
        let first = served(&c);
        c.reload();
        assert_eq!(served(&c), first, "unchanged files, same certificate");

        let b = pair("b.svc");
        write(&b);
        c.reload();
        let second = served(&c);
        assert_ne!(second, first);
        assert_eq!(
            c.reloads
                .get_or_create(&ReloadLabels { result: "ok" })
                .get(),
            1
        );

        // A certificate with another pair's key: refused, the last kept.
        write(&(a.0.clone(), b.1.clone()));
        c.reload();
        assert_eq!(served(&c), second);
        std::fs::write(&files.key, "junk").unwrap();
        c.reload();
        assert_eq!(served(&c), second);
        assert_eq!(
            c.reloads
                .get_or_create(&ReloadLabels { result: "error" })
                .get(),
            2
        );

        // At start, a broken pair is an error naming the file.
        let e = ReloadingCert::load(files.clone()).unwrap_err();
        assert!(e.to_string().contains("tls.key"), "{e}");
    }
}
