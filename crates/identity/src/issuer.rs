//! The issuer: its certificate (plus any intermediates after it) and key,
//! under the trust anchors, read from Linkerd's files. Loading refuses an
//! issuer that is expired, not yet valid, or does not chain to the anchors;
//! signing makes Linkerd's leaf: the identity as DNS SAN (and the SPIFFE
//! URI), server and client auth, backdated by the clock-skew allowance,
//! living the issuance lifetime but never past the issuer's chain.

use ballast_meshtls::{name::IdentityName, pem, tls};
use rustls::{pki_types::CertificateDer, RootCertStore};
use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, SystemTime},
};

/// Linkerd's defaults.
pub const DEFAULT_ISSUANCE_LIFETIME: Duration = Duration::from_secs(24 * 60 * 60);
pub const DEFAULT_CLOCK_SKEW_ALLOWANCE: Duration = Duration::from_secs(20);
/// Issuer and anchor files are small; refuse what is not.
pub const MAX_PEM_BYTES: u64 = 1024 * 1024;

/// Where the issuer and anchors live: a mounted `linkerd-identity-issuer`
/// Secret (`tls.crt`/`tls.key`, or `crt.pem`/`key.pem`) and the trust roots
/// bundle.
#[derive(Debug, Clone)]
pub struct IssuerFiles {
    pub dir: PathBuf,
    pub anchors: PathBuf,
}

impl IssuerFiles {
    /// The certificate and key files in `dir`, in Linkerd's two layouts.
    pub fn cert_and_key(&self) -> (PathBuf, PathBuf) {
        let tls = (self.dir.join("tls.crt"), self.dir.join("tls.key"));
        if tls.0.exists() || !self.dir.join("crt.pem").exists() {
            tls
        } else {
            (self.dir.join("crt.pem"), self.dir.join("key.pem"))
        }
    }

    /// The raw bytes of the three files, to notice changes.
    pub fn read(&self) -> Result<Raw, IssuerError> {
        let (cert, key) = self.cert_and_key();
        Ok(Raw {
            cert: read(&cert)?,
            key: read(&key)?,
            anchors: read(&self.anchors)?,
        })
    }
}

fn read(path: &Path) -> Result<Vec<u8>, IssuerError> {
    let err = |reason: String| IssuerError::File {
        path: path.display().to_string(),
        reason,
    };
    let meta = std::fs::metadata(path).map_err(|e| err(e.to_string()))?;
    if meta.len() > MAX_PEM_BYTES {
        return Err(err(format!("over {MAX_PEM_BYTES} bytes")));
    }
    std::fs::read(path).map_err(|e| err(e.to_string()))
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Raw {
    pub cert: Vec<u8>,
    pub key: Vec<u8>,
    pub anchors: Vec<u8>,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum IssuerError {
    #[error("cannot read {path}: {reason}")]
    File { path: String, reason: String },
    #[error("issuer certificate: {0}")]
    Cert(String),
    #[error("issuer key: {0}")]
    Key(String),
    #[error("trust anchors: {0}")]
    Anchors(String),
    #[error("issuer certificate is not valid until {0} (now {1})")]
    NotYetValid(String, String),
    #[error("issuer certificate expired at {0} (now {1})")]
    Expired(String, String),
    #[error("issuer certificate is not a CA (basicConstraints CA:TRUE missing)")]
    NotCa,
    #[error("issuer does not chain to the trust anchors: {0}")]
    Chain(String),
    #[error("signing failed: {0}")]
    Sign(String),
}

/// What the issuer's certificate says of itself.
#[derive(Debug, Clone)]
pub struct CertInfo {
    pub subject: String,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
}

pub fn cert_info(der: &CertificateDer<'_>) -> Option<CertInfo> {
    use x509_parser::prelude::FromDer;
    let (_, c) = x509_parser::certificate::X509Certificate::from_der(der).ok()?;
    let at = |t: i64| SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(t).unwrap_or(0));
    Some(CertInfo {
        subject: c.subject().to_string(),
        not_before: at(c.validity().not_before.timestamp()),
        not_after: at(c.validity().not_after.timestamp()),
    })
}

fn is_ca(der: &CertificateDer<'_>) -> bool {
    use x509_parser::prelude::FromDer;
    x509_parser::certificate::X509Certificate::from_der(der)
        .ok()
        .and_then(|(_, c)| c.basic_constraints().ok().flatten().map(|b| b.value.ca))
        .unwrap_or(false)
}

/// Seconds since the epoch, for messages.
pub fn rfc3339(t: SystemTime) -> String {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    x509_parser::time::ASN1Time::from_timestamp(secs)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| format!("{secs}s after the epoch"))
}

pub struct Issuer {
    signer: rcgen::Issuer<'static, rcgen::KeyPair>,
    /// Issuer certificate first, then what followed it in its file.
    chain: Vec<CertificateDer<'static>>,
    pub info: CertInfo,
    pub anchors: Vec<CertInfo>,
    roots: Arc<RootCertStore>,
    /// The earliest expiry along the issuer's chain: no leaf outlives it.
    chain_not_after: SystemTime,
}

impl std::fmt::Debug for Issuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issuer").field("info", &self.info).finish()
    }
}

/// How to sign.
#[derive(Debug, Clone)]
pub struct SignConfig {
    pub lifetime: Duration,
    pub clock_skew: Duration,
    pub control_ns: String,
    pub trust_domain: String,
}

/// A signed leaf and its chain.
#[derive(Debug, Clone)]
pub struct Signed {
    pub leaf: CertificateDer<'static>,
    pub intermediates: Vec<CertificateDer<'static>>,
    pub not_after: SystemTime,
}

impl Issuer {
    /// Parses and checks `raw` at `now`.
    pub fn load(raw: &Raw, now: SystemTime) -> Result<Self, IssuerError> {
        let chain = pem::certificates(&raw.cert).map_err(|e| IssuerError::Cert(e.to_string()))?;
        let key = pem::private_key(&raw.key).map_err(|e| IssuerError::Key(e.to_string()))?;
        let anchors_der =
            pem::certificates(&raw.anchors).map_err(|e| IssuerError::Anchors(e.to_string()))?;
        let roots =
            tls::root_store(&anchors_der).map_err(|e| IssuerError::Anchors(e.to_string()))?;
        let anchors = anchors_der
            .iter()
            .map(|a| {
                cert_info(a)
                    .ok_or_else(|| IssuerError::Anchors("a certificate does not parse".into()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let info =
            cert_info(&chain[0]).ok_or_else(|| IssuerError::Cert("does not parse".into()))?;
        if now < info.not_before {
            return Err(IssuerError::NotYetValid(
                rfc3339(info.not_before),
                rfc3339(now),
            ));
        }
        if now >= info.not_after {
            return Err(IssuerError::Expired(rfc3339(info.not_after), rfc3339(now)));
        }
        if !is_ca(&chain[0]) {
            return Err(IssuerError::NotCa);
        }
        let key =
            rcgen::KeyPair::from_pkcs8_der_and_sign_algo(&key, &rcgen::PKCS_ECDSA_P256_SHA256)
                .map_err(|e| IssuerError::Key(format!("not an ECDSA P-256 key ({e})")))?;
        if rcgen::PublicKeyData::subject_public_key_info(&key)
            != tls::public_key_der(&chain[0]).unwrap_or_default()
        {
            return Err(IssuerError::Key(
                "does not match the issuer certificate".into(),
            ));
        }
        let signer = rcgen::Issuer::from_ca_cert_der(&chain[0], key)
            .map_err(|e| IssuerError::Cert(e.to_string()))?;
        let chain_not_after = chain
            .iter()
            .filter_map(|c| cert_info(c).map(|i| i.not_after))
            .min()
            .unwrap_or(info.not_after);
        let issuer = Self {
            signer,
            chain,
            info,
            anchors,
            roots,
            chain_not_after,
        };
        // The proof that proxies will accept what we sign: sign a probe and
        // verify it as a client would.
        let probe = IdentityName::parse("probe.ballast.serviceaccount.identity.ballast.local")
            .map_err(|e| IssuerError::Sign(e.to_string()))?;
        let probe_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
            .map_err(|e| IssuerError::Sign(e.to_string()))?;
        let signed = issuer.sign_at(
            &rcgen::PublicKeyData::subject_public_key_info(&probe_key),
            &probe,
            &SignConfig {
                lifetime: Duration::from_secs(60),
                clock_skew: Duration::from_secs(1),
                control_ns: "ballast".into(),
                trust_domain: "ballast.local".into(),
            },
            now,
        )?;
        let mut probe_chain = vec![signed.leaf];
        probe_chain.extend(signed.intermediates);
        tls::verify_server_chain(issuer.roots.clone(), &probe_chain, &probe, now)
            .map_err(|e| IssuerError::Chain(e.to_string()))?;
        Ok(issuer)
    }

    pub fn roots(&self) -> Arc<RootCertStore> {
        self.roots.clone()
    }

    /// Whether the issuer may sign at `now`.
    pub fn check_valid(&self, now: SystemTime) -> Result<(), IssuerError> {
        if now < self.info.not_before {
            return Err(IssuerError::NotYetValid(
                rfc3339(self.info.not_before),
                rfc3339(now),
            ));
        }
        if now >= self.chain_not_after {
            return Err(IssuerError::Expired(
                rfc3339(self.chain_not_after),
                rfc3339(now),
            ));
        }
        Ok(())
    }

    pub fn sign(
        &self,
        spki_der: &[u8],
        name: &IdentityName,
        config: &SignConfig,
    ) -> Result<Signed, IssuerError> {
        self.sign_at(spki_der, name, config, SystemTime::now())
    }

    pub fn sign_at(
        &self,
        spki_der: &[u8],
        name: &IdentityName,
        config: &SignConfig,
        now: SystemTime,
    ) -> Result<Signed, IssuerError> {
        self.check_valid(now)?;
        let err = |e: rcgen::Error| IssuerError::Sign(e.to_string());
        let public = rcgen::SubjectPublicKeyInfo::from_der(spki_der).map_err(err)?;
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name.as_str());
        params.subject_alt_names = vec![rcgen::SanType::DnsName(
            name.as_str().to_owned().try_into().map_err(err)?,
        )];
        if let Some(uri) = name.spiffe_uri(&config.control_ns, &config.trust_domain) {
            params
                .subject_alt_names
                .push(rcgen::SanType::URI(uri.try_into().map_err(err)?));
        }
        let not_before = now.checked_sub(config.clock_skew).unwrap_or(now);
        let not_after = (now + config.lifetime + config.clock_skew).min(self.chain_not_after);
        params.not_before = not_before.into();
        params.not_after = not_after.into();
        params.is_ca = rcgen::IsCa::ExplicitNoCa;
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::DigitalSignature,
            rcgen::KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.use_authority_key_identifier_extension = true;
        let mut serial = [0u8; 16];
        rand::Rng::fill(&mut rand::rng(), &mut serial[..]);
        serial[0] &= 0x7f;
        params.serial_number = Some(rcgen::SerialNumber::from_slice(&serial));
        let cert = params.signed_by(&public, &self.signer).map_err(err)?;
        // Second precision: what the certificate says.
        let not_after = tls::not_after(cert.der()).unwrap_or(not_after);
        Ok(Signed {
            leaf: cert.der().clone(),
            intermediates: self.chain.clone(),
            not_after,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::{generate, GenerateConfig};

    fn sign_config() -> SignConfig {
        SignConfig {
            lifetime: DEFAULT_ISSUANCE_LIFETIME,
            clock_skew: DEFAULT_CLOCK_SKEW_ALLOWANCE,
            control_ns: "linkerd".into(),
            trust_domain: "cluster.local".into(),
        }
    }

    /// A leaf for `name` on a fresh key, signed at `now`.
    fn sign(issuer: &Issuer, name: &IdentityName, now: SystemTime) -> Signed {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let spki = rcgen::PublicKeyData::subject_public_key_info(&key);
        issuer.sign_at(&spki, name, &sign_config(), now).unwrap()
    }

    #[test]
    fn signs_leaves_that_verify_for_their_name() {
        let g = generate(&GenerateConfig::default()).unwrap();
        let now = SystemTime::now();
        let issuer = Issuer::load(&g.raw(), now).unwrap();
        let name =
            IdentityName::parse("web.shop.serviceaccount.identity.linkerd.cluster.local").unwrap();
        let s = sign(&issuer, &name, now);
        let mut chain = vec![s.leaf.clone()];
        chain.extend(s.intermediates.clone());
        tls::verify_server_chain(issuer.roots(), &chain, &name, now).unwrap();
        let info = cert_info(&s.leaf).unwrap();
        let skew = DEFAULT_CLOCK_SKEW_ALLOWANCE;
        assert!(info.not_before <= now - skew + Duration::from_secs(1));
        assert!(info.not_before >= now - skew - Duration::from_secs(1));
        let life = info.not_after.duration_since(now).unwrap();
        assert!(
            life > DEFAULT_ISSUANCE_LIFETIME
                && life <= DEFAULT_ISSUANCE_LIFETIME + skew + Duration::from_secs(1)
        );
        assert_eq!(tls::dns_names(&s.leaf), vec![name.clone()]);
        let other =
            IdentityName::parse("db.shop.serviceaccount.identity.linkerd.cluster.local").unwrap();
        assert!(tls::verify_server_chain(issuer.roots(), &chain, &other, now).is_err());
    }

    #[test]
    fn leaves_never_outlive_the_issuer() {
        let g = generate(&GenerateConfig {
            issuer_lifetime: Duration::from_secs(3600),
            ..GenerateConfig::default()
        })
        .unwrap();
        let now = SystemTime::now();
        let issuer = Issuer::load(&g.raw(), now).unwrap();
        let name =
            IdentityName::parse("a.b.serviceaccount.identity.linkerd.cluster.local").unwrap();
        let s = sign(&issuer, &name, now);
        assert!(s.not_after <= issuer.info.not_after);
    }

    #[test]
    fn refuses_expired_future_and_foreign_issuers() {
        let g = generate(&GenerateConfig::default()).unwrap();
        let now = SystemTime::now();
        let later = now + Duration::from_secs(400 * 86_400);
        assert!(matches!(
            Issuer::load(&g.raw(), later),
            Err(IssuerError::Expired(..))
        ));
        let earlier = now - Duration::from_secs(86_400);
        assert!(matches!(
            Issuer::load(&g.raw(), earlier),
            Err(IssuerError::NotYetValid(..))
        ));
        let other = generate(&GenerateConfig::default()).unwrap();
        let mixed = Raw {
            anchors: other.raw().anchors,
            ..g.raw()
        };
        let e = Issuer::load(&mixed, now).unwrap_err();
        assert!(matches!(e, IssuerError::Chain(_)), "{e}");
        let wrong_key = Raw {
            key: other.raw().key,
            ..g.raw()
        };
        assert!(matches!(
            Issuer::load(&wrong_key, now),
            Err(IssuerError::Key(_))
        ));
        // The anchor is a CA too, but its own key is not given: refused.
        let garbage = Raw {
            cert: b"not pem".to_vec(),
            ..g.raw()
        };
        assert!(matches!(
            Issuer::load(&garbage, now),
            Err(IssuerError::Cert(_))
        ));
    }
}
