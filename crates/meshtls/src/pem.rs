//! Certificates and keys from PEM, in the forms Linkerd's issuer Secret and
//! trust roots hold: `CERTIFICATE` blocks, and ECDSA P-256 keys as PKCS#8
//! (`PRIVATE KEY`) or SEC1 (`EC PRIVATE KEY`, what `step` writes).

use rustls::pki_types::{
    pem::{self, PemObject},
    CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer,
};

#[derive(Debug, thiserror::Error)]
pub enum PemError {
    #[error("no CERTIFICATE block")]
    NoCertificate,
    #[error("not PEM: {0}")]
    Syntax(String),
    #[error("no private key block (PRIVATE KEY or EC PRIVATE KEY)")]
    NoKey,
    #[error("the private key is {0}; only ECDSA P-256 keys are supported")]
    UnsupportedKey(&'static str),
    #[error("the EC private key does not parse")]
    BadKey,
}

fn syntax(e: pem::Error) -> PemError {
    match e {
        pem::Error::NoItemsFound => PemError::NoCertificate,
        other => PemError::Syntax(other.to_string()),
    }
}

/// Every `CERTIFICATE` block, in order; at least one.
pub fn certificates(bytes: &[u8]) -> Result<Vec<CertificateDer<'static>>, PemError> {
    let certs = CertificateDer::pem_slice_iter(bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(syntax)?;
    if certs.is_empty() {
        return Err(PemError::NoCertificate);
    }
    Ok(certs)
}

/// The first private key, as PKCS#8 (SEC1 keys are wrapped).
pub fn private_key(bytes: &[u8]) -> Result<PrivatePkcs8KeyDer<'static>, PemError> {
    let key = PrivateKeyDer::from_pem_slice(bytes).map_err(|e| match e {
        pem::Error::NoItemsFound => PemError::NoKey,
        other => PemError::Syntax(other.to_string()),
    })?;
    match key {
        PrivateKeyDer::Pkcs8(k) => Ok(k),
        PrivateKeyDer::Sec1(k) => sec1_to_pkcs8(k.secret_sec1_der()),
        PrivateKeyDer::Pkcs1(_) => Err(PemError::UnsupportedKey("RSA")),
        _ => Err(PemError::UnsupportedKey("of an unknown kind")),
    }
}

/// OID 1.2.840.10045.2.1 (id-ecPublicKey) and 1.2.840.10045.3.1.7 (P-256).
const EC_P256_ALGORITHM: &[u8] = &[
    0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a, 0x86, 0x48,
    0xce, 0x3d, 0x03, 0x01, 0x07,
];

/// Wraps an RFC 5915 ECPrivateKey in an RFC 5208 PrivateKeyInfo, the one
/// form ring loads. The key's own curve, when it names one, must be P-256.
fn sec1_to_pkcs8(sec1: &[u8]) -> Result<PrivatePkcs8KeyDer<'static>, PemError> {
    if sec1.len() > 1024 {
        return Err(PemError::BadKey);
    }
    const P256_OID: &[u8] = &[0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
    const P384_OID: &[u8] = &[0x06, 0x05, 0x2b, 0x81, 0x04, 0x00, 0x22];
    if contains(sec1, P384_OID) {
        return Err(PemError::UnsupportedKey("ECDSA P-384"));
    }
    if !contains(sec1, P256_OID) && sec1.len() > 130 {
        return Err(PemError::UnsupportedKey("on a curve other than P-256"));
    }
    let mut body = vec![0x02, 0x01, 0x00];
    body.extend_from_slice(EC_P256_ALGORITHM);
    body.push(0x04);
    push_len(&mut body, sec1.len());
    body.extend_from_slice(sec1);
    let mut out = vec![0x30];
    push_len(&mut out, body.len());
    out.extend_from_slice(&body);
    Ok(PrivatePkcs8KeyDer::from(out))
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn push_len(out: &mut Vec<u8>, len: usize) {
    if len < 0x80 {
        out.push(len as u8);
    } else if len < 0x100 {
        out.extend_from_slice(&[0x81, len as u8]);
    } else {
        out.extend_from_slice(&[0x82, (len >> 8) as u8, len as u8]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A P-256 key as `openssl ecparam -genkey -name prime256v1` writes it (SEC1).
    const SEC1: &str = "-----BEGIN EC PRIVATE KEY-----
MHcCAQEEINcByBXQH3HuvtxI9DNC+V/IZ2f4EFQaM49OyJxY9aDCoAoGCCqGSM49
AwEHoUQDQgAEcRJ6szPKUGwgWTuypWP5FRzWTh6k7pCobiDXEVsw3PqJ2ER8a5VL
iv3FTEBBC4libf53huXto8qdyADrImHxdg==
-----END EC PRIVATE KEY-----
";

    #[test]
    fn sec1_keys_load_as_pkcs8() {
        let key = private_key(SEC1.as_bytes()).unwrap();
        rcgen::KeyPair::from_pkcs8_der_and_sign_algo(&key, &rcgen::PKCS_ECDSA_P256_SHA256)
            .expect("ring loads the wrapped key");
    }

    #[test]
    fn pkcs8_keys_round_trip() {
        let generated = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let key = private_key(generated.serialize_pem().as_bytes()).unwrap();
        assert_eq!(key.secret_pkcs8_der(), generated.serialized_der());
    }

    #[test]
    fn bad_input_is_named() {
        assert!(matches!(private_key(b"hello"), Err(PemError::NoKey)));
        assert!(matches!(
            certificates(b"hello"),
            Err(PemError::NoCertificate)
        ));
        assert!(matches!(certificates(b""), Err(PemError::NoCertificate)));
    }
}
