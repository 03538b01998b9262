//! Protocol detection on a client's first bytes.
//!
//! Properties: the caller reads at most `MAX_DETECT_BYTES`, so a decision is
//! always made by then; a decision never changes as more bytes arrive; and
//! each decision is what the bytes say (H2 only on the full preface, HTTP/1
//! only on a request line, undecided only while the bytes could still be
//! either).
#![no_main]

use ballast_proxy::detect::{detect, Protocol, H2_PREFACE, MAX_DETECT_BYTES};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let data = &data[..data.len().min(MAX_DETECT_BYTES)];

    // The lengths to look at: every short prefix, both sides of each line
    // end, and the whole input; bounded so one run stays linear-ish.
    let mut lengths: Vec<usize> = (0..=data.len().min(64)).collect();
    for (i, _) in data
        .iter()
        .enumerate()
        .filter(|(_, &b)| b == b'\n')
        .take(32)
    {
        lengths.extend([i, i + 1, (i + 2).min(data.len())]);
    }
    lengths.push(data.len());
    lengths.sort_unstable();
    lengths.dedup();

    let mut decided: Option<(usize, Protocol)> = None;
    for &n in &lengths {
        let got = detect(&data[..n]);
        check(&data[..n], got);
        match (decided, got) {
            (Some((at, was)), now) => assert_eq!(
                now,
                Some(was),
                "decided {was:?} at {at} bytes, then {now:?} at {n}"
            ),
            (None, Some(p)) => decided = Some((n, p)),
            (None, None) => {}
        }
    }

    // Padded to the bound with bytes that keep a request line going (the
    // slowest case), detection must have decided.
    let mut padded = data.to_vec();
    padded.resize(MAX_DETECT_BYTES, b'a');
    let at_bound = detect(&padded);
    assert!(at_bound.is_some(), "undecided at the bound");
    if let Some((_, was)) = decided {
        assert_eq!(at_bound, Some(was), "padding changed the decision");
    }
});

fn check(buf: &[u8], got: Option<Protocol>) {
    match got {
        Some(Protocol::H2) => assert!(buf.starts_with(H2_PREFACE)),
        Some(Protocol::Http1) => {
            let end = buf.iter().position(|&b| b == b'\n').expect("a line end");
            let line = buf[..end].strip_suffix(b"\r").unwrap_or(&buf[..end]);
            assert!(line.ends_with(b" HTTP/1.1") || line.ends_with(b" HTTP/1.0"));
            assert!(line.iter().all(|&b| b.is_ascii_graphic() || b == b' '));
            let method_end = line.iter().position(|&b| b == b' ').expect("a method");
            assert!(method_end > 0);
            assert!(line[..method_end]
                .iter()
                .all(|b| b.is_ascii_alphabetic() || *b == b'-'));
        }
        Some(Protocol::Opaque) => assert!(!buf.starts_with(H2_PREFACE)),
        None => {
            assert!(buf.len() < MAX_DETECT_BYTES);
            let preface_so_far = H2_PREFACE.starts_with(buf);
            assert!(preface_so_far || !buf.contains(&b'\n'));
            // A CR may end what has arrived of a request line.
            let line = buf.strip_suffix(b"\r").unwrap_or(buf);
            assert!(line
                .iter()
                .take(32)
                .all(|&b| b.is_ascii_graphic() || b == b' ' || preface_so_far));
        }
    }
}
