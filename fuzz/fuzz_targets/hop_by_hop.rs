//! Removing hop-by-hop headers before a request or response is forwarded.
//!
//! Input: header lines `name: value`, separated by `\n`; lines that are not
//! a valid header are left out. Properties: afterwards no hop-by-hop header
//! is left, neither a fixed one nor one that a `Connection` header names; and
//! every other header is kept, with all its values in order.
#![no_main]

use http::header::{HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;

const FIXED: [&str; 7] = [
    "connection",
    "transfer-encoding",
    "upgrade",
    "proxy-authorization",
    "te",
    "keep-alive",
    "proxy-connection",
];

fuzz_target!(|data: &[u8]| {
    let mut headers = HeaderMap::new();
    for line in data.split(|&b| b == b'\n') {
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let name = HeaderName::from_bytes(&line[..colon]);
        let value = HeaderValue::from_bytes(trim(&line[colon + 1..]));
        if let (Ok(name), Ok(value)) = (name, value) {
            headers.append(name, value);
        }
    }
    let before = headers.clone();
    ballast_proxy::http::strip_hop_by_hop(&mut headers);

    // What a Connection header names: comma-separated tokens (RFC 9110,
    // section 7.6.1), read from the bytes as a peer sent them.
    let mut hop: Vec<HeaderName> = FIXED.iter().map(|n| HeaderName::from_static(n)).collect();
    for value in before.get_all(http::header::CONNECTION) {
        for token in value.as_bytes().split(|&b| b == b',') {
            if let Ok(name) = HeaderName::from_bytes(trim(token)) {
                hop.push(name);
            }
        }
    }
    for name in &hop {
        assert!(
            !headers.contains_key(name),
            "{name} left in {headers:?} (from {before:?})"
        );
    }
    for name in before.keys() {
        if hop.contains(name) {
            continue;
        }
        let was: Vec<_> = before.get_all(name).iter().collect();
        let now: Vec<_> = headers.get_all(name).iter().collect();
        assert_eq!(was, now, "{name} changed");
    }
    assert!(headers.keys().all(|n| before.contains_key(n)));
});

/// Optional whitespace (space, tab) off both ends.
fn trim(mut b: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = b {
        b = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = b {
        b = rest;
    }
    b
}
