//! `ballast install` as a process: deploy/ is its `--deploy-dir` output
//! (file by file), its full output parses as the documents `kubectl apply`
//! takes, is the same twice but for generated key material, carries given
//! identity files verbatim and refuses bad ones with one clear line.

use serde_json::Value;
use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

const REGENERATE: &str = "cargo run -- install --deploy-dir deploy/";

fn ballast(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ballast"))
        .args(args)
        .output()
        .expect("ballast runs")
}

fn ok_stdout(args: &[&str]) -> String {
    let out = ballast(args);
    assert!(
        out.status.success(),
        "ballast {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

/// Every YAML file under `dir` (one level of subdirectories), relative.
fn yaml_files(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for sub in ["", "crds"] {
        let Ok(entries) = std::fs::read_dir(dir.join(sub)) else {
            continue;
        };
        for e in entries {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "yaml") {
                let name = p.file_name().unwrap().to_string_lossy().to_string();
                found.push(if sub.is_empty() {
                    name
                } else {
                    format!("{sub}/{name}")
                });
            }
        }
    }
    found.sort();
    found
}

/// The documents of a YAML stream, each with apiVersion, kind and name.
fn documents(text: &str) -> Vec<Value> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(text)
        .unwrap_or_else(|e| panic!("the output does not parse: {e}"));
    let docs: Vec<Value> = docs.into_iter().filter(|d| !d.is_null()).collect();
    for d in &docs {
        for field in ["apiVersion", "kind"] {
            assert!(d[field].is_string(), "{field} missing: {d}");
        }
        assert!(d["metadata"]["name"].is_string(), "no name: {d}");
    }
    docs
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

#[test]
fn deploy_is_the_install_without_key_material() {
    let tmp = tempfile::tempdir().unwrap();
    ok_stdout(&["install", "--deploy-dir", tmp.path().to_str().unwrap()]);
    let generated = yaml_files(tmp.path());
    assert!(generated.contains(&"injector.yaml".to_string()));
    let committed = yaml_files(&deploy_dir());
    assert_eq!(
        committed, generated,
        "deploy/ holds other files than `ballast install` makes; regenerate with `{REGENERATE}` (and remove stale files)"
    );
    for file in &generated {
        let want = std::fs::read_to_string(tmp.path().join(file)).unwrap();
        let have = std::fs::read_to_string(deploy_dir().join(file)).unwrap();
        assert!(
            want == have,
            "deploy/{file} differs from `ballast install` output; regenerate with `{REGENERATE}`"
        );
        documents(&want);
    }
    // No key material in deploy/.
    for file in &generated {
        let text = std::fs::read_to_string(tmp.path().join(file)).unwrap();
        assert!(
            !text.contains("PRIVATE KEY") && !text.contains("BEGIN CERT"),
            "{file}"
        );
    }
}

/// A generated anchor and issuer (`ballast identity generate`).
fn pki(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    ok_stdout(&["identity", "generate", "--out", dir.to_str().unwrap()]);
    (
        dir.join("ca.crt"),
        dir.join("issuer/tls.crt"),
        dir.join("issuer/tls.key"),
    )
}

/// The output with the webhook's generated key material blanked.
fn without_webhook_keys(mut docs: Vec<Value>) -> Vec<Value> {
    for d in &mut docs {
        if d["kind"] == "Secret" && d["metadata"]["name"] == "ballast-injector-k8s-tls" {
            d["data"] = Value::Null;
        }
        if d["kind"] == "MutatingWebhookConfiguration" {
            d["webhooks"][0]["clientConfig"]["caBundle"] = Value::Null;
        }
    }
    docs
}

#[test]
fn install_carries_given_identity_files_and_is_otherwise_deterministic() {
    let tmp = tempfile::tempdir().unwrap();
    let (anchors, cert, key) = pki(tmp.path());
    let args = [
        "install",
        "--namespace",
        "mesh",
        "--identity-trust-anchors-file",
        anchors.to_str().unwrap(),
        "--identity-issuer-certificate-file",
        cert.to_str().unwrap(),
        "--identity-issuer-key-file",
        key.to_str().unwrap(),
    ];
    let first = documents(&ok_stdout(&args));
    let second = documents(&ok_stdout(&args));
    assert_eq!(
        without_webhook_keys(first.clone()),
        without_webhook_keys(second)
    );

    let roots = find(&first, "ConfigMap", "linkerd-identity-trust-roots");
    assert_eq!(
        roots["data"]["ca-bundle.crt"],
        std::fs::read_to_string(&anchors).unwrap()
    );
    assert_eq!(roots["metadata"]["namespace"], "mesh");
    let issuer = find(&first, "Secret", "linkerd-identity-issuer");
    assert_eq!(issuer["type"], "kubernetes.io/tls");
    for (field, file) in [("tls.crt", &cert), ("tls.key", &key)] {
        assert_eq!(
            decode(&issuer["data"][field]),
            std::fs::read_to_string(file).unwrap(),
            "{field}"
        );
    }
    // The webhook's CA vouches for the serving certificate's Secret.
    let hook = &find(
        &first,
        "MutatingWebhookConfiguration",
        "ballast-proxy-injector-webhook-config",
    )["webhooks"][0];
    let ca = decode(&hook["clientConfig"]["caBundle"]);
    assert!(ca.starts_with("-----BEGIN CERTIFICATE-----"));
    assert_eq!(hook["clientConfig"]["service"]["namespace"], "mesh");
    assert_eq!(hook["clientConfig"]["service"]["path"], "/inject");
    assert_eq!(hook["failurePolicy"], "Ignore", "Linkerd's default");
    let tls = find(&first, "Secret", "ballast-injector-k8s-tls");
    assert!(decode(&tls["data"]["tls.key"]).contains("PRIVATE KEY"));

    // Fresh material when no files are given: two runs, two anchors.
    let a = documents(&ok_stdout(&["install"]));
    let b = documents(&ok_stdout(&["install"]));
    let anchor = |d: &[Value]| find(d, "ConfigMap", "linkerd-identity-trust-roots")["data"].clone();
    assert_ne!(anchor(&a), anchor(&b));
}

fn decode(v: &Value) -> String {
    use base64::Engine;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(v.as_str().expect("base64 text"))
        .expect("base64");
    String::from_utf8(bytes).expect("PEM text")
}

#[test]
fn ha_and_failure_policy_flags_shape_the_output() {
    let docs = documents(&ok_stdout(&[
        "install",
        "--ha",
        "--webhook-failure-policy",
        "Fail",
    ]));
    for app in [
        "ballast-destination",
        "ballast-identity",
        "ballast-injector",
        "ballast-viz",
    ] {
        let d = find(&docs, "Deployment", app);
        assert_eq!(d["spec"]["replicas"], 3, "{app}");
        let term = &d["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
            ["requiredDuringSchedulingIgnoredDuringExecution"][0];
        assert_eq!(term["topologyKey"], "kubernetes.io/hostname", "{app}");
        assert_eq!(
            find(&docs, "PodDisruptionBudget", app)["spec"]["maxUnavailable"],
            1
        );
    }
    let hook = &find(
        &docs,
        "MutatingWebhookConfiguration",
        "ballast-proxy-injector-webhook-config",
    )["webhooks"][0];
    assert_eq!(hook["failurePolicy"], "Fail");
    let injector = find(&docs, "Deployment", "ballast-injector");
    let args = injector["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(args.contains("--failure-policy=Fail"), "{args}");
}

#[test]
fn secrets_only_is_what_deploy_leaves_out() {
    let docs = documents(&ok_stdout(&["install", "--secrets-only"]));
    let kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "ConfigMap",
            "Secret",
            "Secret",
            "MutatingWebhookConfiguration"
        ]
    );
}

#[test]
fn bad_identity_files_and_values_are_refused_with_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let (anchors, cert, key) = pki(&tmp.path().join("a"));
    let (other_anchors, _, _) = pki(&tmp.path().join("b"));
    let run = |anchors: &Path, cert: &Path| {
        ballast(&[
            "install",
            "--identity-trust-anchors-file",
            anchors.to_str().unwrap(),
            "--identity-issuer-certificate-file",
            cert.to_str().unwrap(),
            "--identity-issuer-key-file",
            key.to_str().unwrap(),
        ])
    };
    let out = run(&other_anchors, &cert);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty(), "nothing printed on failure");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("does not chain to the trust anchors"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");

    let out = run(&anchors, &tmp.path().join("missing.crt"));
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("missing.crt"), "{err}");

    // An anchor alone cannot sign an issuer: all three or none.
    let out = ballast(&[
        "install",
        "--identity-trust-anchors-file",
        anchors.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));

    for bad in [
        &["--namespace", "Bad_NS"][..],
        &["--cluster-domain", ""],
        &["--webhook-failure-policy", "Maybe"],
        &["--webhook-timeout", "0"],
    ] {
        let out = ballast(&[&["install"], bad].concat());
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
    }
}

#[test]
fn destination_size_flags_shape_its_deployment_and_bad_sizes_are_refused() {
    let docs = documents(&ok_stdout(&[
        "install",
        "--destination-cpu-request",
        "2",
        "--destination-memory-request",
        "512Mi",
        "--destination-memory-limit",
        "1Gi",
        "--destination-max-streams",
        "50000",
    ]));
    let container = &find(&docs, "Deployment", "ballast-destination")["spec"]["template"]["spec"]
        ["containers"][0];
    let resources = &container["resources"];
    // A quantity is a string in the API ("2", not 2).
    assert_eq!(resources["requests"]["cpu"], "2", "{resources}");
    assert_eq!(resources["requests"]["memory"], "512Mi", "{resources}");
    assert_eq!(resources["limits"]["memory"], "1Gi", "{resources}");
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(args.contains(&"--max-streams=50000"), "{args:?}");
    assert!(args.contains(&"--max-policy-streams=50000"), "{args:?}");
    // `ballast destination` parses every flag and value rendered (clap stops
    // at the first it refuses, before the trailing --help).
    let out = ballast(&args.iter().copied().chain(["--help"]).collect::<Vec<_>>());
    assert!(
        out.status.success(),
        "ballast {args:?} is refused: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The identity controller keeps its own size.
    let identity =
        &find(&docs, "Deployment", "ballast-identity")["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(identity["resources"]["requests"]["cpu"], "100m");

    // Refused with one line naming the flag, nothing printed.
    for (bad, says) in [
        (
            &["--destination-memory-limit", "lots"][..],
            "--destination-memory-limit",
        ),
        (
            &["--destination-cpu-request", "1x"],
            "--destination-cpu-request",
        ),
        (&["--destination-memory-limit", "32Mi"], "under 64Mi"),
        (
            &[
                "--destination-memory-request",
                "1Gi",
                "--destination-memory-limit",
                "512Mi",
            ],
            "must not be more than --destination-memory-limit",
        ),
        (
            &["--destination-max-streams", "0"],
            "--destination-max-streams",
        ),
    ] {
        let out = ballast(&[&["install"], bad].concat());
        // A usage error, as clap's own.
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        assert!(out.stdout.is_empty(), "{bad:?}: nothing printed on failure");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{bad:?}: {err}");
    }
}

#[test]
fn the_viz_deployment_runs_ballast_viz_with_flags_it_accepts() {
    let docs = documents(&ok_stdout(&["install", "--namespace", "mesh"]));
    let viz = find(&docs, "Deployment", "ballast-viz");
    let pod = &viz["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "ballast-viz");
    find(&docs, "ServiceAccount", "ballast-viz");
    assert_eq!(
        find(&docs, "ClusterRole", "ballast-viz")["rules"],
        find(&docs, "ClusterRole", "ballast-destination")["rules"]
    );
    assert_eq!(
        find(&docs, "Service", "ballast-viz")["spec"]["ports"][0]["port"],
        8084
    );
    let args: Vec<String> = pod["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    assert_eq!(args[0], "viz");
    // clap reads the arguments in order and stops at the first unknown flag
    // or bad value, before it gets to the trailing --help: exit 0 means
    // `ballast viz` parses every flag and value the Deployment passes.
    let out = ballast(
        &args
            .iter()
            .map(String::as_str)
            .chain(["--help"])
            .collect::<Vec<_>>(),
    );
    assert!(
        out.status.success(),
        "ballast {args:?} is refused: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The check can fail: a flag `ballast viz` lacks is refused the same way.
    let out = ballast(&["viz", "--no-such-flag", "--help"]);
    assert_eq!(out.status.code(), Some(2));
}

/// `ballast version` says its own version, and each installed controller's
/// (from the label install writes); a cluster it cannot reach is said, not
/// an error.
#[tokio::test]
async fn version_reports_the_client_and_the_installed_control_plane() {
    let version = env!("CARGO_PKG_VERSION");
    let out = ballast(&["version", "--client"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("Client version: {version}\n")
    );
    let api = ballast_testkit::ApiServer::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = api.write_kubeconfig(dir.path());
    let kubeconfig = kubeconfig.to_str().expect("UTF-8 path").to_string();
    let run = |args: Vec<String>| {
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            ballast(&args)
        })
    };
    let out = run(vec![
        "version".into(),
        "--kubeconfig".into(),
        kubeconfig.clone(),
    ])
    .await
    .expect("ran");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success() && text.contains("Server version: unavailable"),
        "{text}"
    );
    let installed = ok_stdout(&["install"]);
    for doc in serde_saphyr::from_multiple::<Value>(&installed).expect("parses") {
        if doc["kind"] == "Deployment" {
            api.apply(doc);
        }
    }
    let out = run(vec!["version".into(), "--kubeconfig".into(), kubeconfig])
        .await
        .expect("ran");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        text.contains(&format!(
            "Server version: ballast-destination {version} (ballast:latest)"
        )),
        "{text}"
    );
    assert_eq!(text.matches("Server version: ").count(), 4, "{text}");
}

/// `ballast uninstall` names what `install` made, for `kubectl delete -f -`.
#[test]
fn uninstall_names_the_installed_objects_and_keeps_the_crds_unless_asked() {
    let text = ok_stdout(&["uninstall", "--namespace", "mesh"]);
    let refs: Vec<Value> = serde_saphyr::from_multiple(&text).expect("parses");
    assert_eq!(refs[0]["kind"], "MutatingWebhookConfiguration");
    assert!(refs
        .iter()
        .any(|r| r["kind"] == "Deployment" && r["metadata"]["namespace"] == "mesh"));
    assert!(!refs.iter().any(|r| r["kind"] == "CustomResourceDefinition"));
    let with = ok_stdout(&["uninstall", "--include-crds"]);
    assert!(with.contains("kind: CustomResourceDefinition"));
}
