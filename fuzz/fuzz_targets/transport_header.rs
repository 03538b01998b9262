//! Linkerd's opaque transport header, as an inbound proxy reads it.
//!
//! Properties: decoding never panics; a decoded header encodes to bytes that
//! decode to the same header; a prefix of a header's bytes asks for more,
//! never errs; the length bound holds.
#![no_main]

use ballast_meshtls::header::{TransportHeader, MAX_MESSAGE, PREFACE};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Half the inputs get the preface, so the message parser is reached.
    let mut input = Vec::new();
    if data.first().is_some_and(|b| b & 1 == 0) {
        input.extend_from_slice(PREFACE);
        input.extend_from_slice(&data[1..]);
    } else {
        input.extend_from_slice(data);
    }
    if let Ok(Some((header, used))) = TransportHeader::decode(&input) {
        assert!(used <= input.len());
        assert!(used - PREFACE.len() - 4 <= MAX_MESSAGE);
        assert_ne!(header.port, 0);
        let again = header.encode();
        let (back, n) = TransportHeader::decode(&again).unwrap().unwrap();
        assert_eq!(back, header);
        assert_eq!(n, again.len());
        for cut in 0..again.len() {
            assert_eq!(TransportHeader::decode(&again[..cut]), Ok(None), "prefix of {cut}");
        }
    }
});
