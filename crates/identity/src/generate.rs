//! A fresh trust anchor and issuer (ECDSA P-256, PEM), as Linkerd's docs
//! make them with `step`: anchor `root.linkerd.cluster.local`, issuer
//! `identity.linkerd.cluster.local`, a CA with path length 0 under it.

use crate::issuer::Raw;
use std::time::{Duration, SystemTime};

#[derive(Debug, Clone)]
pub struct GenerateConfig {
    pub control_ns: String,
    pub trust_domain: String,
    pub anchor_lifetime: Duration,
    pub issuer_lifetime: Duration,
}

impl Default for GenerateConfig {
    fn default() -> Self {
        Self {
            control_ns: "linkerd".into(),
            trust_domain: "cluster.local".into(),
            // Linkerd's docs: 87600h and 8760h.
            anchor_lifetime: Duration::from_secs(10 * 365 * 86_400),
            issuer_lifetime: Duration::from_secs(365 * 86_400),
        }
    }
}

/// PEM texts.
#[derive(Debug, Clone)]
pub struct Generated {
    pub anchor_cert: String,
    pub anchor_key: String,
    pub issuer_cert: String,
    pub issuer_key: String,
}

impl Generated {
    /// As the issuer would read them from files.
    pub fn raw(&self) -> Raw {
        Raw {
            cert: self.issuer_cert.clone().into_bytes(),
            key: self.issuer_key.clone().into_bytes(),
            anchors: self.anchor_cert.clone().into_bytes(),
        }
    }
}

fn ca_params(cn: &str, lifetime: Duration, path_len: Option<u8>) -> rcgen::CertificateParams {
    let mut p = rcgen::CertificateParams::default();
    p.distinguished_name = rcgen::DistinguishedName::new();
    p.distinguished_name.push(rcgen::DnType::CommonName, cn);
    p.is_ca = match path_len {
        Some(n) => rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(n)),
        None => rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained),
    };
    p.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let now = SystemTime::now();
    // Backdated a little: a freshly made anchor is valid on a peer whose
    // clock is slightly behind.
    p.not_before = (now - Duration::from_secs(60)).into();
    p.not_after = (now + lifetime).into();
    p
}

pub fn generate(config: &GenerateConfig) -> Result<Generated, rcgen::Error> {
    let anchor_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let anchor_params = ca_params(
        &format!("root.{}.{}", config.control_ns, config.trust_domain),
        config.anchor_lifetime,
        None,
    );
    let anchor_cert = anchor_params.self_signed(&anchor_key)?;
    let anchor_pem = anchor_cert.pem();
    let key_pem = anchor_key.serialize_pem();
    let (issuer_cert, issuer_key) = issue_issuer(&anchor_pem, &key_pem, config)?;
    Ok(Generated {
        anchor_cert: anchor_pem,
        anchor_key: key_pem,
        issuer_cert,
        issuer_key,
    })
}

/// A new issuer under an existing anchor (rotation): certificate and key PEM.
pub fn issue_issuer(
    anchor_cert_pem: &str,
    anchor_key_pem: &str,
    config: &GenerateConfig,
) -> Result<(String, String), rcgen::Error> {
    let anchor_key = rcgen::KeyPair::from_pem(anchor_key_pem)?;
    let anchor = rcgen::Issuer::from_ca_cert_pem(anchor_cert_pem, anchor_key)?;
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let params = ca_params(
        &format!("identity.{}.{}", config.control_ns, config.trust_domain),
        config.issuer_lifetime,
        Some(0),
    );
    let cert = params.signed_by(&key, &anchor)?;
    Ok((cert.pem(), key.serialize_pem()))
}
