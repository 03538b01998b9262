//! Key material `ballast install` writes: the mesh's trust anchor and issuer
//! (fresh from `ballast_identity::generate`, or read from files and checked
//! as `ballast identity` would load them), and the webhook's serving
//! certificate under a CA of its own (the API server trusts it through the
//! webhook configuration's `caBundle`).

use ballast_identity::{
    generate::{generate, GenerateConfig},
    issuer::{Issuer, Raw},
};
use std::{
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

/// The namespace part of the generated anchor's and issuer's own names
/// (`root.linkerd.TRUST_DOMAIN`, `identity.linkerd.TRUST_DOMAIN`), as
/// Linkerd's documentation generates them. Only leaf names are checked
/// against the control plane's namespace; these two are never.
pub const IDENTITY_CONTROL_NS: &str = "linkerd";

/// Lifetime of the webhook's CA and serving certificate (Linkerd's chart
/// makes both for 365 days); `ballast install` again renews them.
pub const WEBHOOK_CERT_LIFETIME: Duration = Duration::from_secs(365 * 86_400);

/// Files larger than this are not certificates or keys.
const MAX_PEM_FILE_BYTES: u64 = 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("cannot read {path}: {reason}")]
    File { path: PathBuf, reason: String },
    #[error("{anchors}, {cert} and {key} do not make a usable issuer: {reason}")]
    Invalid {
        anchors: PathBuf,
        cert: PathBuf,
        key: PathBuf,
        reason: String,
    },
    #[error("cannot generate {what}: {reason}")]
    Generate { what: &'static str, reason: String },
}

/// PEM texts of the mesh's trust anchors and issuer.
#[derive(Debug, Clone)]
pub struct IdentityPki {
    pub trust_anchors_pem: String,
    pub issuer_cert_pem: String,
    pub issuer_key_pem: String,
}

impl IdentityPki {
    /// A fresh anchor and issuer (ECDSA P-256; 10 and 1 years, Linkerd's
    /// documented lifetimes) for `trust_domain`.
    pub fn generate(trust_domain: &str) -> Result<Self, PkiError> {
        let generated = generate(&GenerateConfig {
            control_ns: IDENTITY_CONTROL_NS.into(),
            trust_domain: trust_domain.into(),
            ..GenerateConfig::default()
        })
        .map_err(|e| PkiError::Generate {
            what: "the trust anchor and issuer",
            reason: e.to_string(),
        })?;
        Ok(Self {
            trust_anchors_pem: generated.anchor_cert,
            issuer_cert_pem: generated.issuer_cert,
            issuer_key_pem: generated.issuer_key,
        })
    }

    /// Reads the three files and checks them as the identity controller
    /// loads them at `now`: they parse, the key is the certificate's, the
    /// issuer is a CA, valid now, and chains to the anchors.
    pub fn from_files(
        anchors: &Path,
        cert: &Path,
        key: &Path,
        now: SystemTime,
    ) -> Result<Self, PkiError> {
        let pki = Self {
            trust_anchors_pem: read_pem(anchors)?,
            issuer_cert_pem: read_pem(cert)?,
            issuer_key_pem: read_pem(key)?,
        };
        let raw = Raw {
            cert: pki.issuer_cert_pem.clone().into_bytes(),
            key: pki.issuer_key_pem.clone().into_bytes(),
            anchors: pki.trust_anchors_pem.clone().into_bytes(),
        };
        Issuer::load(&raw, now).map_err(|e| PkiError::Invalid {
            anchors: anchors.to_path_buf(),
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            reason: e.to_string(),
        })?;
        Ok(pki)
    }
}

fn read_pem(path: &Path) -> Result<String, PkiError> {
    let err = |reason: String| PkiError::File {
        path: path.to_path_buf(),
        reason,
    };
    let meta = std::fs::metadata(path).map_err(|e| err(e.to_string()))?;
    if meta.len() > MAX_PEM_FILE_BYTES {
        return Err(err(format!("larger than {MAX_PEM_FILE_BYTES} bytes")));
    }
    let bytes = std::fs::read(path).map_err(|e| err(e.to_string()))?;
    String::from_utf8(bytes).map_err(|_| err("not PEM text (not UTF-8)".into()))
}

/// The webhook's CA and its serving certificate and key (PEM).
#[derive(Debug, Clone)]
pub struct WebhookTls {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

impl WebhookTls {
    /// A CA and a serving certificate for the Service `service` in
    /// `namespace`, under the names the API server dials
    /// (`SERVICE.NAMESPACE.svc`, and the longer and shorter forms).
    pub fn generate(
        service: &str,
        namespace: &str,
        cluster_domain: &str,
        lifetime: Duration,
    ) -> Result<Self, PkiError> {
        let fail = |what: &'static str| {
            move |e: rcgen::Error| PkiError::Generate {
                what,
                reason: e.to_string(),
            }
        };
        let now = SystemTime::now();
        // Backdated a little, for an API server whose clock is behind.
        let not_before = now - Duration::from_secs(60);

        let ca_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
            .map_err(fail("the webhook CA key"))?;
        let mut ca = rcgen::CertificateParams::default();
        ca.distinguished_name = rcgen::DistinguishedName::new();
        ca.distinguished_name.push(
            rcgen::DnType::CommonName,
            format!("{service}.{namespace}.svc CA"),
        );
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
        ca.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        ca.not_before = not_before.into();
        ca.not_after = (now + lifetime).into();
        let ca_cert = ca.self_signed(&ca_key).map_err(fail("the webhook CA"))?;
        let ca_pem = ca_cert.pem();
        let issuer = rcgen::Issuer::new(ca, ca_key);

        let names = vec![
            format!("{service}.{namespace}.svc"),
            format!("{service}.{namespace}.svc.{cluster_domain}"),
            format!("{service}.{namespace}"),
        ];
        let mut leaf =
            rcgen::CertificateParams::new(names.clone()).map_err(fail("the webhook names"))?;
        leaf.distinguished_name = rcgen::DistinguishedName::new();
        leaf.distinguished_name
            .push(rcgen::DnType::CommonName, names[0].clone());
        leaf.is_ca = rcgen::IsCa::ExplicitNoCa;
        leaf.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
        leaf.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        leaf.not_before = not_before.into();
        leaf.not_after = (now + lifetime).into();
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
            .map_err(fail("the webhook key"))?;
        let cert = leaf
            .signed_by(&key, &issuer)
            .map_err(fail("the webhook certificate"))?;
        Ok(Self {
            ca_pem,
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn given_files_are_checked_as_the_identity_controller_loads_them() {
        let dir = tempfile::tempdir().unwrap();
        let a = IdentityPki::generate("cluster.local").unwrap();
        let b = IdentityPki::generate("cluster.local").unwrap();
        let anchors = write(dir.path(), "ca.crt", &a.trust_anchors_pem);
        let cert = write(dir.path(), "tls.crt", &a.issuer_cert_pem);
        let key = write(dir.path(), "tls.key", &a.issuer_key_pem);
        let now = SystemTime::now();
        let read = IdentityPki::from_files(&anchors, &cert, &key, now).unwrap();
        assert_eq!(read.issuer_cert_pem, a.issuer_cert_pem);

        // Another mesh's anchors: the issuer does not chain.
        let other = write(dir.path(), "other.crt", &b.trust_anchors_pem);
        let e = IdentityPki::from_files(&other, &cert, &key, now).unwrap_err();
        assert!(e.to_string().contains("does not chain"), "{e}");
        // Another issuer's key.
        let other_key = write(dir.path(), "other.key", &b.issuer_key_pem);
        let e = IdentityPki::from_files(&anchors, &cert, &other_key, now).unwrap_err();
        assert!(e.to_string().contains("does not match"), "{e}");
        // Expired at a later `now`.
        let later = now + Duration::from_secs(2 * 365 * 86_400);
        let e = IdentityPki::from_files(&anchors, &cert, &key, later).unwrap_err();
        assert!(e.to_string().contains("expired"), "{e}");
        // Not PEM, and missing.
        let junk = write(dir.path(), "junk", "hello");
        let e = IdentityPki::from_files(&anchors, &junk, &key, now).unwrap_err();
        assert!(e.to_string().contains("issuer certificate"), "{e}");
        let e = IdentityPki::from_files(&dir.path().join("nope"), &cert, &key, now).unwrap_err();
        assert!(e.to_string().starts_with("cannot read"), "{e}");
    }

    #[test]
    fn the_webhook_certificate_serves_its_service_names_under_its_ca() {
        use rustls::client::danger::ServerCertVerifier;
        let tls = WebhookTls::generate(
            "ballast-injector",
            "mesh",
            "cluster.local",
            WEBHOOK_CERT_LIFETIME,
        )
        .unwrap();
        let ca = ballast_meshtls::pem::certificates(tls.ca_pem.as_bytes()).unwrap();
        let chain = ballast_meshtls::pem::certificates(tls.cert_pem.as_bytes()).unwrap();
        let roots = ballast_meshtls::tls::root_store(&ca).unwrap();
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            roots,
            ballast_meshtls::tls::provider(),
        )
        .build()
        .unwrap();
        let now = rustls::pki_types::UnixTime::now();
        for name in [
            "ballast-injector.mesh.svc",
            "ballast-injector.mesh.svc.cluster.local",
        ] {
            let server = rustls::pki_types::ServerName::try_from(name.to_string()).unwrap();
            verifier
                .verify_server_cert(&chain[0], &[], &server, &[], now)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        let wrong = rustls::pki_types::ServerName::try_from("ballast-injector.other.svc").unwrap();
        assert!(verifier
            .verify_server_cert(&chain[0], &[], &wrong, &[], now)
            .is_err());
    }
}
