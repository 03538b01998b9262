//! The index's wall: its manifest may name only decoding crates, never a
//! client, a runtime or a transport. A dependency added here by mistake fails
//! this test before it can leak IO into the model.

const ALLOWED: &[&str] = &[
    "serde",
    "serde_json",
    "serde_path_to_error",
    "thiserror",
    "regex-syntax",
    // The installed names (no dependencies of its own).
    "ballast-controlplane",
];

#[test]
fn index_depends_on_no_io_crate() {
    let manifest = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"))
        .expect("read the index's Cargo.toml");
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
        !named.is_empty(),
        "no [dependencies] found: the parser is stale"
    );
    let foreign: Vec<_> = named
        .iter()
        .filter(|n| !ALLOWED.contains(&n.as_str()))
        .collect();
    assert!(
        foreign.is_empty(),
        "ballast-index must stay pure; these dependencies are not allowed: {foreign:?}"
    );
}
