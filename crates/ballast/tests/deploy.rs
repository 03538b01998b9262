//! The manifests in deploy/ parse, and grant the controller exactly what its
//! watchers read: get, list and watch on the kinds they watch, nothing more.
//! (The sidecar example is checked against `ballast-proxy` in
//! crates/sidecar/tests/deploy.rs.)

use serde_json::Value;
use std::collections::BTreeSet;

fn deploy_documents() -> Vec<(String, Value)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy");
    let mut docs = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("deploy/ exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "deploy/ holds manifests");
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let parsed: Vec<Value> = serde_saphyr::from_multiple(&text)
            .unwrap_or_else(|e| panic!("{} does not parse: {e}", file.display()));
        for (i, doc) in parsed.into_iter().enumerate() {
            if doc.is_null() {
                continue;
            }
            let place = format!("{} document {}", file.display(), i + 1);
            for field in ["apiVersion", "kind"] {
                assert!(doc[field].is_string(), "{place}: {field} missing");
            }
            assert!(
                doc["metadata"]["name"].is_string(),
                "{place}: metadata.name missing"
            );
            docs.push((place, doc));
        }
    }
    docs
}

fn of_kind<'a>(docs: &'a [(String, Value)], kind: &str) -> Vec<&'a Value> {
    docs.iter()
        .filter(|(_, d)| d["kind"] == kind)
        .map(|(_, d)| d)
        .collect()
}

#[test]
fn rbac_grants_exactly_what_the_watchers_read() {
    let docs = deploy_documents();
    let roles = of_kind(&docs, "ClusterRole");
    assert_eq!(roles.len(), 1, "one ClusterRole");
    let mut granted = BTreeSet::new();
    for rule in roles[0]["rules"].as_array().expect("rules") {
        let verbs: BTreeSet<&str> = rule["verbs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert_eq!(
            verbs,
            BTreeSet::from(["get", "list", "watch"]),
            "read-only verbs"
        );
        for group in rule["apiGroups"].as_array().unwrap() {
            for resource in rule["resources"].as_array().unwrap() {
                granted.insert((
                    group.as_str().unwrap().to_string(),
                    resource.as_str().unwrap().to_string(),
                ));
            }
        }
    }
    let watched: BTreeSet<(String, String)> = ballast_destination::source::kube::WATCHED_RESOURCES
        .iter()
        .map(|(group, _version, plural)| (group.to_string(), plural.to_string()))
        .collect();
    assert_eq!(granted, watched);

    // The binding ties that role to the Deployment's service account.
    let bindings = of_kind(&docs, "ClusterRoleBinding");
    assert_eq!(bindings.len(), 1);
    assert_eq!(bindings[0]["roleRef"]["name"], roles[0]["metadata"]["name"]);
    let deployment = of_kind(&docs, "Deployment")[0];
    let sa = &deployment["spec"]["template"]["spec"]["serviceAccountName"];
    let subject = &bindings[0]["subjects"][0];
    assert_eq!(&subject["name"], sa);
    assert!(of_kind(&docs, "ServiceAccount")
        .iter()
        .any(|s| &s["metadata"]["name"] == sa));
}

#[test]
fn the_deployment_is_probed_bounded_and_unprivileged() {
    let docs = deploy_documents();
    let deployments = of_kind(&docs, "Deployment");
    assert_eq!(deployments.len(), 1);
    let pod = &deployments[0]["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    let c = &pod["containers"][0];
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/live");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/ready");
    assert!(
        c["resources"]["limits"]["memory"].is_string(),
        "a memory limit"
    );
    assert!(
        c["resources"]["requests"]["memory"].is_string(),
        "a memory request"
    );
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
    let ports: BTreeSet<&str> = c["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    // Services expose gRPC and metrics by the container's port names.
    let targets: BTreeSet<&str> = of_kind(&docs, "Service")
        .iter()
        .flat_map(|s| s["spec"]["ports"].as_array().unwrap())
        .map(|p| p["targetPort"].as_str().unwrap())
        .collect();
    assert_eq!(targets, BTreeSet::from(["admin", "grpc"]));
    assert!(targets.is_subset(&ports));
    // The flags the Deployment passes are flags `ballast destination` has.
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_ballast"))
        .args(["destination", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for arg in args.iter().filter(|a| a.starts_with("--")) {
        let flag = arg.split('=').next().unwrap();
        assert!(
            help.contains(flag),
            "{flag} is not a flag of ballast destination"
        );
    }
}
