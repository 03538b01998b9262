//! The manifests in deploy/ parse, and grant each controller exactly what it
//! uses: the destination controller (and viz, which reads the same source)
//! get, list and watch on the kinds it watches; the identity controller create on tokenreviews; the injector get
//! on namespaces; nothing more. Every controller has a disruption budget.
//! (deploy/ is `ballast install --deploy-dir`: crates/ballast/tests/install.rs.)
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

/// (apiGroup, resource) pairs a ClusterRole grants, and the verbs of each rule.
fn grants(role: &Value) -> (BTreeSet<(String, String)>, Vec<BTreeSet<String>>) {
    let mut granted = BTreeSet::new();
    let mut verbs = Vec::new();
    for rule in role["rules"].as_array().expect("rules") {
        verbs.push(
            rule["verbs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap().to_string())
                .collect(),
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
    (granted, verbs)
}

fn named<'a>(docs: &'a [(String, Value)], kind: &str, name: &str) -> &'a Value {
    of_kind(docs, kind)
        .into_iter()
        .find(|d| d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

#[test]
fn rbac_grants_exactly_what_each_controller_uses() {
    let docs = deploy_documents();
    assert_eq!(
        of_kind(&docs, "ClusterRole").len(),
        4,
        "one ClusterRole per controller"
    );

    // The destination controller only reads, exactly the kinds it watches.
    let (granted, verbs) = grants(named(&docs, "ClusterRole", "ballast-destination"));
    for v in verbs {
        assert_eq!(
            v,
            BTreeSet::from(["get", "list", "watch"].map(String::from)),
            "read-only verbs"
        );
    }
    let watched: BTreeSet<(String, String)> = ballast_source_kube::WATCHED_RESOURCES
        .iter()
        .map(|(group, _version, plural)| (group.to_string(), plural.to_string()))
        .collect();
    assert_eq!(granted, watched);
    // The dashboard's collector builds its index from the same source.
    let viz = named(&docs, "ClusterRole", "ballast-viz");
    assert_eq!(
        grants(viz),
        grants(named(&docs, "ClusterRole", "ballast-destination"))
    );

    // The identity controller only creates TokenReviews.
    let (granted, verbs) = grants(named(&docs, "ClusterRole", "ballast-identity"));
    assert_eq!(verbs, vec![BTreeSet::from(["create".to_string()])]);
    assert_eq!(
        granted,
        BTreeSet::from([(
            "authentication.k8s.io".to_string(),
            "tokenreviews".to_string()
        )])
    );

    // The injector only reads namespaces, one at a time (their annotations).
    let (granted, verbs) = grants(named(&docs, "ClusterRole", "ballast-injector"));
    assert_eq!(verbs, vec![BTreeSet::from(["get".to_string()])]);
    assert_eq!(
        granted,
        BTreeSet::from([("".to_string(), "namespaces".to_string())])
    );

    // Each binding ties its role to its Deployment's service account.
    for name in [
        "ballast-destination",
        "ballast-identity",
        "ballast-injector",
        "ballast-viz",
    ] {
        let binding = named(&docs, "ClusterRoleBinding", name);
        assert_eq!(binding["roleRef"]["name"], name);
        let deployment = named(&docs, "Deployment", name);
        let sa = &deployment["spec"]["template"]["spec"]["serviceAccountName"];
        assert_eq!(&binding["subjects"][0]["name"], sa);
        assert!(of_kind(&docs, "ServiceAccount")
            .iter()
            .any(|s| &s["metadata"]["name"] == sa));
    }
}

#[test]
fn the_deployments_are_probed_bounded_and_unprivileged() {
    let docs = deploy_documents();
    let deployments = of_kind(&docs, "Deployment");
    assert_eq!(deployments.len(), 4);
    for deployment in deployments {
        let app = &deployment["metadata"]["labels"]["app.kubernetes.io/name"];
        let pod = &deployment["spec"]["template"]["spec"];
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
        // The Deployment's Services expose gRPC and metrics (and the
        // destination controller Linkerd's policy port) by its port names.
        let targets: BTreeSet<&str> = of_kind(&docs, "Service")
            .iter()
            .filter(|s| &s["spec"]["selector"]["app.kubernetes.io/name"] == app)
            .flat_map(|s| s["spec"]["ports"].as_array().unwrap())
            .map(|p| p["targetPort"].as_str().unwrap())
            .collect();
        let expected = match app.as_str() {
            Some("ballast-destination") => BTreeSet::from(["admin", "grpc", "policy"]),
            Some("ballast-injector") => BTreeSet::from(["admin", "webhook"]),
            Some("ballast-viz") => BTreeSet::from(["admin", "http"]),
            _ => BTreeSet::from(["admin", "grpc"]),
        };
        assert_eq!(targets, expected, "{app}");
        assert!(targets.is_subset(&ports));
        // The flags the Deployment passes are flags its subcommand has.
        let args: Vec<&str> = c["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        let help = std::process::Command::new(env!("CARGO_BIN_EXE_ballast"))
            .args([args[0], "--help"])
            .output()
            .unwrap();
        let help = String::from_utf8_lossy(&help.stdout);
        for arg in args.iter().filter(|a| a.starts_with("--")) {
            let flag = arg.split('=').next().unwrap();
            assert!(
                help.contains(flag),
                "{flag} is not a flag of ballast {}",
                args[0]
            );
        }
    }
}

#[test]
fn every_deployment_has_a_disruption_budget_that_never_blocks_a_drain() {
    let docs = deploy_documents();
    let budgets = of_kind(&docs, "PodDisruptionBudget");
    for deployment in of_kind(&docs, "Deployment") {
        let name = &deployment["metadata"]["name"];
        let selector = &deployment["spec"]["selector"]["matchLabels"];
        let budget = budgets
            .iter()
            .find(|b| &b["spec"]["selector"]["matchLabels"] == selector)
            .unwrap_or_else(|| panic!("no PodDisruptionBudget selects Deployment {name}"));
        assert_eq!(
            budget["metadata"]["namespace"],
            deployment["metadata"]["namespace"]
        );
        // One at a time: with two replicas one keeps serving during a drain,
        // and a budget of maxUnavailable 1 never blocks one.
        assert_eq!(budget["spec"]["maxUnavailable"], 1, "{name}");
        assert!(
            deployment["spec"]["replicas"].as_u64().unwrap() >= 2,
            "{name}"
        );
    }
}

#[test]
fn every_watched_custom_resource_has_a_definition_in_deploy_crds() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/crds");
    let mut defined: BTreeSet<(String, String, String)> = BTreeSet::new();
    for entry in std::fs::read_dir(&dir).expect("deploy/crds exists") {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
            .unwrap_or_else(|e| panic!("{} does not parse: {e}", path.display()));
        for crd in docs
            .iter()
            .filter(|d| d["kind"] == "CustomResourceDefinition")
        {
            let spec = &crd["spec"];
            let group = spec["group"].as_str().unwrap().to_string();
            let plural = spec["names"]["plural"].as_str().unwrap().to_string();
            assert_eq!(
                crd["metadata"]["name"].as_str().unwrap(),
                format!("{plural}.{group}"),
                "{}: a CRD's name is PLURAL.GROUP",
                path.display()
            );
            for v in spec["versions"].as_array().unwrap() {
                if v["served"] == true {
                    let version = v["name"].as_str().unwrap().to_string();
                    defined.insert((group.clone(), version, plural.clone()));
                }
            }
        }
    }
    let custom: Vec<_> = ballast_source_kube::WATCHED_RESOURCES
        .iter()
        .filter(|(group, _, _)| !["", "discovery.k8s.io"].contains(group))
        .collect();
    assert!(!custom.is_empty());
    for (group, version, plural) in custom {
        assert!(
            defined.contains(&(group.to_string(), version.to_string(), plural.to_string())),
            "no served definition of {plural}.{group}/{version} in deploy/crds"
        );
    }
}
