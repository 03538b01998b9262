//! The ClientHello peek on a connection's first bytes.
//!
//! Properties: a decision never changes as more bytes arrive (a prefix
//! answers `NeedMore` or the same); a server name, when found, is lower
//! case, at most 253 bytes, and (ignoring case) appears in the bytes; a
//! record of more than the bound is never awaited.
#![no_main]

use ballast_meshtls::hello::{peek, Peek, MAX_RECORD};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let data = &data[..data.len().min(MAX_RECORD + 16)];
    let whole = peek(data);
    if let Peek::ClientHello { server_name: Some(name) } = &whole {
        assert!(name.len() <= 253);
        assert_eq!(name, &name.to_ascii_lowercase());
        let lower = data.to_ascii_lowercase();
        assert!(lower.windows(name.len()).any(|w| w == name.as_bytes()));
    }
    if data.len() >= MAX_RECORD {
        assert_ne!(whole, Peek::NeedMore, "undecided at the bound");
    }
    for n in (0..data.len()).step_by(1 + data.len() / 64) {
        let part = peek(&data[..n]);
        assert!(part == Peek::NeedMore || part == whole, "{n} bytes: {part:?}, all: {whole:?}");
    }
});
