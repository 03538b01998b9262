//! The `grpc-status` of a response (trailers, or headers of a
//! trailers-only response), which decides how the response is classified.
//!
//! Input: the raw values of `grpc-status` headers, separated by `\n`.
//! Properties: only the first value counts; a status is read exactly when
//! that value is a decimal number that fits (surrounding whitespace and a `+`
//! tolerated), and it is that number.
#![no_main]

use http::header::{HeaderMap, HeaderValue};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut headers = HeaderMap::new();
    for value in data.split(|&b| b == b'\n') {
        if let Ok(v) = HeaderValue::from_bytes(value) {
            headers.append("grpc-status", v);
        }
    }
    let got = ballast_proxy::http::grpc_status(&headers);
    let want = headers
        .get("grpc-status")
        .and_then(|v| expected(v.as_bytes()));
    assert_eq!(got, want, "{headers:?}");
});

fn expected(value: &[u8]) -> Option<u32> {
    // Visible ASCII only (a header value's text form); then the number.
    if !value
        .iter()
        .all(|&b| b == b'\t' || (0x20..0x7f).contains(&b))
    {
        return None;
    }
    let mut v = value;
    while let [b' ' | b'\t', rest @ ..] = v {
        v = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = v {
        v = rest;
    }
    let digits = v.strip_prefix(b"+").unwrap_or(v);
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    digits.iter().try_fold(0u32, |n, &d| {
        n.checked_mul(10)?.checked_add(u32::from(d - b'0'))
    })
}
