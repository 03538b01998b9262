//! The walls of the pure crates: their manifests may name only decoding
//! crates (the index) or nothing at all (the authority grammar, the manifests walk), never a
//! client, a runtime or a transport. A dependency added there by mistake
//! fails this test before it can leak IO into the model.

/// What the index may depend on.
const INDEX_ALLOWED: &[&str] = &[
    "serde",
    "serde_json",
    "serde_path_to_error",
    "thiserror",
    "regex-syntax",
    // The installed names (no dependencies of its own).
    "ballast-controlplane",
];

/// The crates a sibling crate's manifest names under `[dependencies]`.
fn dependencies(krate: &str) -> Vec<String> {
    let path = format!("{}/../{krate}/Cargo.toml", env!("CARGO_MANIFEST_DIR"));
    let manifest = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {path}: {e}"));
    let mut section = String::new();
    let mut named = Vec::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line.to_string();
            continue;
        }
        if section != "[dependencies]" || line.is_empty() || line.starts_with('#') {
            continue;
        }
        let name = line.split(['=', '.', ' ']).next().unwrap_or_default();
        named.push(name.to_string());
    }
    assert!(
        manifest.contains("[dependencies]"),
        "{path}: no [dependencies] section: the parser is stale"
    );
    named
}

#[test]
fn index_depends_on_no_io_crate() {
    let named = dependencies("index");
    assert!(!named.is_empty(), "the index's dependencies were not read");
    let foreign: Vec<_> = named
        .iter()
        .filter(|n| !INDEX_ALLOWED.contains(&n.as_str()))
        .collect();
    assert!(
        foreign.is_empty(),
        "ballast-index must stay pure; these dependencies are not allowed: {foreign:?}"
    );
}

#[test]
fn the_shared_grammars_depend_on_nothing() {
    // The authority grammar (controller and proxy) and the manifests walk
    // (controller, check, inject, identity): std only.
    for krate in ["authority", "manifests"] {
        assert_eq!(
            dependencies(krate),
            Vec::<String>::new(),
            "ballast-{krate} is shared by several crates: it must depend on std only"
        );
    }
}
