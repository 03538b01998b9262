//! Manifest files (YAML documents, or JSON) read by the file source.
//!
//! Properties: every object is filed under its own kind and key, with a name
//! and (but for a cluster-scoped Namespace) a namespace; every place names a document that exists in the text;
//! every problem prints as one bounded line (a file may hold anything, and
//! problems go to logs and status output); and parsing is deterministic.
#![no_main]

use ballast_source_manifests::documents::{parse, Place};
use libfuzzer_sys::fuzz_target;

/// Longest printed problem: place, two quoted names, a field and a reason,
/// each bounded by the parser.
const MAX_PROBLEM_BYTES: usize = 1024;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let parsed = parse(text);
    // Lines end at LF, CRLF or a lone CR, as YAML has it; documents are one
    // more than the `---` lines at most.
    let lines: Vec<&str> = text
        .split("\r\n")
        .flat_map(|l| l.split(['\n', '\r']))
        .collect();
    let max_document = lines.iter().filter(|l| l.starts_with("---")).count() + 1;
    let max_line = lines.len() as u64 + 1;
    let check_place = |p: &Place| {
        assert!(p.document >= 1 && p.document <= max_document, "{p:?}");
        assert!(p.line.is_none_or(|l| l >= 1 && l <= max_line), "{p:?}");
    };

    for ((kind, key), resource) in &parsed.objects {
        assert_eq!(*kind, resource.kind());
        assert_eq!(key, resource.key());
        assert!(!key.name.is_empty());
        // A Namespace is cluster-scoped: its key is ("", name) by design.
        assert!(
            !key.namespace.is_empty() || kind.as_str() == "Namespace",
            "{kind:?} {key:?}"
        );
    }
    for d in &parsed.duplicates {
        check_place(&d.first);
        check_place(&d.again);
        assert!(parsed.objects.contains_key(&d.id));
        assert!(d.first.document < d.again.document || d.first.item < d.again.item);
    }
    for p in &parsed.problems {
        if let Some(place) = &p.place {
            check_place(place);
        }
        let line = p.to_string();
        assert!(
            line.len() <= MAX_PROBLEM_BYTES,
            "{} bytes: {line:?}",
            line.len()
        );
        assert!(!line.contains(['\n', '\r']), "{line:?}");
    }

    let again = parse(text);
    assert_eq!(
        format!("{:?}", parsed.objects),
        format!("{:?}", again.objects)
    );
    assert_eq!(parsed.problems, again.problems);
});
