//! What a certificate signing request must be for Certify to sign it: a
//! PKCS#10 request whose signature verifies, with an ECDSA P-256 key, exactly
//! one DNS name equal to the requested identity, a common name that is empty
//! or that identity, and no e-mail, IP or URI names (Linkerd's rules).

use ballast_meshtls::IdentityName;
use x509_parser::{
    certification_request::X509CertificationRequest,
    extensions::{GeneralName, ParsedExtension},
    oid_registry::{OID_EC_P256, OID_KEY_TYPE_EC_PUBLIC_KEY},
    prelude::FromDer,
};

/// The largest CSR read; a P-256 request is about 300 bytes.
pub const MAX_CSR_BYTES: usize = 8 * 1024;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CsrError {
    #[error("certificate signing request is over {MAX_CSR_BYTES} bytes")]
    TooLarge,
    #[error("certificate signing request does not parse")]
    Parse,
    #[error("certificate signing request signature does not verify")]
    Signature,
    #[error("CSR must contain an ECDSA P-256 public key")]
    KeyType,
    #[error("CSR must have exactly one DNSName")]
    DnsNames,
    #[error("CSR name does not match requested identity: csr={csr}; req={requested}")]
    Mismatch { csr: String, requested: String },
    #[error("invalid CommonName: {0}")]
    CommonName(String),
    #[error("cannot validate email addresses")]
    Email,
    #[error("cannot validate IP addresses")]
    Ip,
    #[error("cannot validate URIs")]
    Uri,
}

impl CsrError {
    /// Linkerd answers a request it cannot parse with InvalidArgument, and a
    /// parsed one that asks for the wrong thing with FailedPrecondition.
    pub fn is_malformed(&self) -> bool {
        matches!(self, Self::TooLarge | Self::Parse | Self::Signature)
    }
}

fn short(s: &str) -> String {
    s.chars().take(256).collect()
}

/// Checks `der` for `requested`; returns the subject public key info (DER).
pub fn check(der: &[u8], requested: &IdentityName) -> Result<Vec<u8>, CsrError> {
    if der.len() > MAX_CSR_BYTES {
        return Err(CsrError::TooLarge);
    }
    let (rest, csr) = X509CertificationRequest::from_der(der).map_err(|_| CsrError::Parse)?;
    if !rest.is_empty() {
        return Err(CsrError::Parse);
    }
    let info = &csr.certification_request_info;
    let spki = &info.subject_pki;
    let is_p256 = spki.algorithm.algorithm == OID_KEY_TYPE_EC_PUBLIC_KEY
        && spki
            .algorithm
            .parameters
            .as_ref()
            .and_then(|p| p.as_oid().ok())
            .is_some_and(|oid| oid == OID_EC_P256);
    if !is_p256 {
        return Err(CsrError::KeyType);
    }
    csr.verify_signature().map_err(|_| CsrError::Signature)?;

    let mut dns = Vec::new();
    for ext in csr.requested_extensions().into_iter().flatten() {
        if let ParsedExtension::SubjectAlternativeName(san) = ext {
            for name in &san.general_names {
                match name {
                    GeneralName::DNSName(d) => dns.push(d.to_string()),
                    GeneralName::RFC822Name(_) => return Err(CsrError::Email),
                    GeneralName::IPAddress(_) => return Err(CsrError::Ip),
                    GeneralName::URI(_) => return Err(CsrError::Uri),
                    _ => {}
                }
            }
        }
    }
    let [name] = dns.as_slice() else {
        return Err(CsrError::DnsNames);
    };
    if !name.eq_ignore_ascii_case(requested.as_str()) {
        return Err(CsrError::Mismatch {
            csr: short(name),
            requested: short(requested.as_str()),
        });
    }
    for cn in info.subject.iter_common_name() {
        let cn = cn.as_str().unwrap_or("<not a string>");
        if !cn.is_empty() && !cn.eq_ignore_ascii_case(requested.as_str()) {
            return Err(CsrError::CommonName(short(cn)));
        }
    }
    Ok(spki.raw.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> IdentityName {
        IdentityName::parse(s).unwrap()
    }

    fn csr(
        alg: &'static rcgen::SignatureAlgorithm,
        sans: Vec<rcgen::SanType>,
        cn: Option<&str>,
    ) -> Vec<u8> {
        let key = rcgen::KeyPair::generate_for(alg).unwrap();
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.subject_alt_names = sans;
        if let Some(cn) = cn {
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, cn);
        }
        params.serialize_request(&key).unwrap().der().to_vec()
    }

    fn dns(s: &str) -> rcgen::SanType {
        rcgen::SanType::DnsName(s.try_into().unwrap())
    }

    const ID: &str = "web.shop.serviceaccount.identity.linkerd.cluster.local";

    #[test]
    fn accepts_linkerds_request() {
        let p256 = &rcgen::PKCS_ECDSA_P256_SHA256;
        assert!(check(&csr(p256, vec![dns(ID)], Some(ID)), &name(ID)).is_ok());
        assert!(check(&csr(p256, vec![dns(ID)], None), &name(ID)).is_ok());
    }

    #[test]
    fn refuses_what_linkerd_refuses() {
        let p256 = &rcgen::PKCS_ECDSA_P256_SHA256;
        let id = name(ID);
        assert_eq!(check(b"garbage", &id), Err(CsrError::Parse));
        assert_eq!(
            check(&vec![0; MAX_CSR_BYTES + 1], &id),
            Err(CsrError::TooLarge)
        );
        assert_eq!(
            check(
                &csr(&rcgen::PKCS_ECDSA_P384_SHA384, vec![dns(ID)], None),
                &id
            ),
            Err(CsrError::KeyType)
        );
        assert_eq!(
            check(&csr(&rcgen::PKCS_ED25519, vec![dns(ID)], None), &id),
            Err(CsrError::KeyType)
        );
        assert_eq!(
            check(&csr(p256, vec![], None), &id),
            Err(CsrError::DnsNames)
        );
        assert_eq!(
            check(&csr(p256, vec![dns(ID), dns("other.x")], None), &id),
            Err(CsrError::DnsNames)
        );
        assert!(matches!(
            check(
                &csr(
                    p256,
                    vec![dns(
                        "other.shop.serviceaccount.identity.linkerd.cluster.local"
                    )],
                    None
                ),
                &id
            ),
            Err(CsrError::Mismatch { .. })
        ));
        assert!(matches!(
            check(&csr(p256, vec![dns(ID)], Some("admin")), &id),
            Err(CsrError::CommonName(_))
        ));
        assert_eq!(
            check(
                &csr(
                    p256,
                    vec![dns(ID), rcgen::SanType::IpAddress([10, 0, 0, 1].into())],
                    None
                ),
                &id
            ),
            Err(CsrError::Ip)
        );
        assert_eq!(
            check(
                &csr(
                    p256,
                    vec![
                        dns(ID),
                        rcgen::SanType::URI("spiffe://x/y".try_into().unwrap())
                    ],
                    None
                ),
                &id
            ),
            Err(CsrError::Uri)
        );
    }

    #[test]
    fn a_tampered_request_fails_its_signature() {
        let mut der = csr(&rcgen::PKCS_ECDSA_P256_SHA256, vec![dns(ID)], None);
        // Flip a bit inside the DNS name: still parses, no longer verifies.
        let at = der.windows(3).position(|w| w == b"web").unwrap();
        der[at] ^= 0x01;
        assert_eq!(check(&der, &name(ID)), Err(CsrError::Signature));
    }
}
