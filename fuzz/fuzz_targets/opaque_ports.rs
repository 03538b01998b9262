//! `config.linkerd.io/opaque-ports` / `skip-inbound-ports` annotation values,
//! as the API server or a manifest delivers them.
//!
//! Properties: a parsed set holds exactly the ports the value lists (numbers,
//! ranges, and names resolved by the caller); the names it asks about are
//! entries of the value; and a malformed range is refused.
#![no_main]

use ballast_store::index::PortSet;
use libfuzzer_sys::fuzz_target;
use std::cell::RefCell;

fuzz_target!(|data: &[u8]| {
    let Ok(value) = std::str::from_utf8(data) else {
        return;
    };
    let entries: Vec<&str> = value
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .collect();
    let set = match PortSet::parse(value) {
        Ok(set) => set,
        Err(e) => {
            // Refused only for an entry that is neither ports nor a name.
            assert!(entries.iter().any(|e| bad_entry(e)), "{value:?}: {e}");
            return;
        }
    };
    assert!(!entries.iter().any(|e| bad_entry(e)), "{value:?} accepted");

    let mut ranges = Vec::new();
    let mut names = Vec::new();
    for e in &entries {
        match numeric(e) {
            Some(r) => ranges.push(r),
            None => names.push(*e),
        }
    }
    // Ports worth asking about: each bound, its neighbours, the extremes.
    let mut ports = vec![0u16, 1, u16::MAX];
    for r in &ranges {
        for p in [*r.start(), *r.end()] {
            ports.extend([p.saturating_sub(1), p, p.saturating_add(1)]);
        }
    }
    for &port in &ports {
        let want = ranges.iter().any(|r| r.contains(&port));
        assert_eq!(set.contains(port, |_| None), want, "{value:?} port {port}");
    }

    // Each name the value lists resolves; nothing else is asked about.
    let asked = RefCell::new(Vec::<String>::new());
    for (i, name) in names.iter().enumerate() {
        let port = 40_000 + i as u16 % 20_000;
        let hit = set.contains(port, |n| {
            asked.borrow_mut().push(n.to_string());
            (n == *name).then_some(port)
        });
        assert!(
            hit || ranges.iter().any(|r| r.contains(&port)),
            "{name:?} in {value:?}"
        );
    }
    for n in asked.borrow().iter() {
        assert!(
            names.contains(&n.as_str()),
            "asked about {n:?} for {value:?}"
        );
    }
});

/// A number, or a `lo-hi` range of numbers.
fn numeric(e: &str) -> Option<std::ops::RangeInclusive<u16>> {
    if let Ok(p) = e.parse::<u16>() {
        return Some(p..=p);
    }
    let (lo, hi) = e.split_once('-')?;
    let (lo, hi) = (
        lo.trim().parse::<u16>().ok()?,
        hi.trim().parse::<u16>().ok()?,
    );
    Some(lo..=hi)
}

/// An entry the annotation's grammar refuses: a range with a bad bound, or
/// something that is neither a range nor a port name.
fn bad_entry(e: &str) -> bool {
    if e.parse::<u16>().is_ok() {
        return false;
    }
    match e.split_once('-') {
        Some((lo, hi)) => match (lo.trim().parse::<u16>(), hi.trim().parse::<u16>()) {
            (Ok(lo), Ok(hi)) => lo > hi,
            (Ok(_), Err(_)) | (Err(_), Ok(_)) => true,
            (Err(_), Err(_)) => false,
        },
        None => !e.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'),
    }
}
