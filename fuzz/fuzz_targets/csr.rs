//! Certify's certificate signing request check, on untrusted bytes.
//!
//! Properties: never panics; a request it accepts names exactly the
//! requested identity and its returned key is a P-256 public key the signer
//! accepts.
#![no_main]

use ballast_identity::csr::check;
use ballast_meshtls::IdentityName;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let name = IdentityName::parse("web.shop.serviceaccount.identity.linkerd.cluster.local").unwrap();
    if let Ok(spki) = check(data, &name) {
        rcgen::SubjectPublicKeyInfo::from_der(&spki).expect("an accepted key loads");
    }
});
