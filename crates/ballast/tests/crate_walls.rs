//! The crate graph and its walls: ARCHITECTURE.md's crate graph is cargo's;
//! the sidecar reaches no Kubernetes client, YAML or controller code; check
//! and the diagnostics client do not reach the controller; the controller's
//! core reaches no Kubernetes client, gRPC or file watcher, and its gRPC
//! servers no Kubernetes client or source; no product crate reaches the
//! test-only crates; the pure crates' manifests may name only decoding
//! crates (the index, the manifests walk and reader), request types (the
//! route matcher) or nothing at all (the authority grammar), never a
//! client, a runtime or a transport. A dependency
//! added there by mistake fails this test before it can leak IO into the
//! model.

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

/// Runs cargo in the workspace (offline: the lock file names everything,
/// and what the host builds is already fetched).
fn cargo(args: &[&str]) -> Vec<u8> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args(args)
        .arg("--offline")
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Every package `root` reaches through normal dependencies on this host,
/// by name (`cargo tree`).
fn reached(root: &str) -> std::collections::BTreeSet<String> {
    let out = cargo(&["tree", "-p", root, "-e", "normal", "--prefix", "none"]);
    String::from_utf8_lossy(&out)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

#[test]
fn the_crate_graph_in_architecture_md_is_cargo_s() {
    let meta: serde_json::Value =
        serde_json::from_slice(&cargo(&["metadata", "--format-version", "1", "--no-deps"]))
            .expect("cargo metadata prints JSON");
    let packages = meta["packages"].as_array().expect("packages");
    let ours: std::collections::BTreeSet<&str> = packages
        .iter()
        .map(|p| p["name"].as_str().expect("name"))
        .collect();
    let actual: std::collections::BTreeMap<String, Vec<String>> = packages
        .iter()
        .map(|p| {
            let mut deps: Vec<String> = p["dependencies"]
                .as_array()
                .expect("dependencies")
                .iter()
                .filter(|d| d["kind"].is_null())
                .map(|d| d["name"].as_str().expect("name").to_string())
                .filter(|n| ours.contains(n.as_str()))
                .collect();
            deps.sort();
            deps.dedup();
            (p["name"].as_str().expect("name").to_string(), deps)
        })
        .collect();
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../ARCHITECTURE.md"
    ))
    .expect("read ARCHITECTURE.md");
    let section = text
        .split("## Crate graph")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("ARCHITECTURE.md has a \"## Crate graph\" section");
    let written: std::collections::BTreeMap<String, Vec<String>> = section
        .lines()
        .filter_map(|l| l.strip_prefix("- `"))
        .filter_map(|l| l.split_once("`: "))
        .map(|(name, deps)| {
            let deps = match deps.trim() {
                "(none)" => Vec::new(),
                d => d.split(", ").map(str::to_string).collect(),
            };
            (name.to_string(), deps)
        })
        .collect();
    assert_eq!(
        written, actual,
        "ARCHITECTURE.md's crate graph differs from cargo metadata"
    );
}

#[test]
fn the_walls_hold_in_the_resolved_graph() {
    let sidecar = reached("ballast-sidecar");
    assert!(
        sidecar.contains("ballast-proxy"),
        "cargo tree was read: {sidecar:?}"
    );
    for foreign in [
        "kube",
        "kube-client",
        "kube-runtime",
        "k8s-openapi",
        "serde-saphyr",
        "ballast-destination",
        "ballast-store",
        "ballast-source-kube",
        "ballast-source-manifests",
        "ballast-index",
        "ballast-identity",
        "ballast-viz",
        "ballast-check",
    ] {
        assert!(
            !sidecar.contains(foreign),
            "the sidecar must not reach {foreign} (Kubernetes client, YAML or controller code)"
        );
    }
    let check = reached("ballast-check");
    assert!(
        check.contains("ballast-index"),
        "cargo tree was read: {check:?}"
    );
    assert!(
        !check.contains("ballast-destination"),
        "check must not depend on the controller"
    );
    // The controller split as Linkerd's policy controller is: the core
    // knows neither Kubernetes' client nor gRPC, the gRPC servers depend on
    // the core alone, only the Kubernetes source knows the Kubernetes client.
    let store = reached("ballast-store");
    assert!(
        store.contains("ballast-index"),
        "cargo tree was read: {store:?}"
    );
    let servers = reached("ballast-destination");
    assert!(
        servers.contains("ballast-store"),
        "cargo tree was read: {servers:?}"
    );
    for (name, reach, foreign) in [
        (
            "the core (ballast-store)",
            &store,
            &[
                "kube",
                "k8s-openapi",
                "notify",
                "serde-saphyr",
                "tonic",
                "hyper",
            ][..],
        ),
        (
            "the gRPC servers (ballast-destination)",
            &servers,
            &[
                "kube",
                "k8s-openapi",
                "notify",
                "serde-saphyr",
                "ballast-source-kube",
                "ballast-source-manifests",
            ][..],
        ),
    ] {
        for f in foreign {
            assert!(!reach.contains(*f), "{name} must not reach {f}");
        }
    }
    let diagnostics = reached("ballast-diagnostics");
    assert!(
        diagnostics.contains("linkerd2-proxy-api"),
        "cargo tree was read: {diagnostics:?}"
    );
    assert!(
        !diagnostics.contains("ballast-destination"),
        "the diagnostics client must not depend on the controller"
    );
    let product = reached("ballast");
    assert!(
        product.contains("ballast-sidecar") && product.contains("ballast-destination"),
        "cargo tree was read: {product:?}"
    );
    for test_only in ["ballast-testkit", "ballast-testsupport"] {
        assert!(
            !product.contains(test_only),
            "the product must not reach {test_only} (test-only code)"
        );
    }
    assert_eq!(
        reached("ballast-authority"),
        ["ballast-authority".to_string()].into(),
        "the authority grammar depends on std only"
    );
    // The manifests walk and reader: std and the two decoders, no runtime,
    // client or watcher.
    let manifests = dependencies("manifests");
    assert_eq!(
        manifests,
        ["serde_json", "serde-saphyr"],
        "ballast-manifests may name only the JSON and YAML decoders"
    );
    // The route matcher: request heads in, an index out.
    assert_eq!(
        dependencies("route"),
        ["http", "regex", "form_urlencoded"],
        "ballast-route may name only http, regex and form_urlencoded"
    );
    let route = reached("ballast-route");
    for f in ["tokio", "hyper", "tonic", "linkerd2-proxy-api"] {
        assert!(!route.contains(f), "ballast-route must not reach {f}");
    }
    let reach = reached("ballast-manifests");
    for f in ["tokio", "notify", "hyper", "kube", "ballast-index"] {
        assert!(!reach.contains(f), "ballast-manifests must not reach {f}");
    }
}
