//! `ballast inject`, run as a user would: files, directories and stdin in,
//! manifests out; the sidecar it adds runs with flags the real proxy and
//! init parsers accept.

use clap::Parser;
use serde_json::Value;
use std::{
    io::Write,
    path::Path,
    process::{Command, Output, Stdio},
};

const NAMESPACE: &str = "\
# The shop's namespace: passed through byte for byte.
apiVersion: v1
kind: Namespace
metadata:
  name: shop   # inline comment
";

const WEB: &str = r#"# Web tier
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: shop
spec:
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
---
# The web deployment
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: shop
spec:
  replicas: 2
  selector:
    matchLabels:
      app: web
  template:
    metadata:
      labels:
        app: web
      annotations:
        config.linkerd.io/skip-outbound-ports: "5432"
        config.linkerd.io/opaque-ports: "3306,4000-4002"
        config.linkerd.io/proxy-cpu-limit: "1"
    spec:
      containers:
        - name: web
          image: nginx:1.27
          ports:
            - containerPort: 8080
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: web-settings
  namespace: shop
data:
  # keep me
  mode: "on"
"#;

const NIGHTLY: &str = r#"apiVersion: batch/v1
kind: CronJob
metadata:
  name: nightly
  namespace: shop
spec:
  schedule: "0 3 * * *"
  jobTemplate:
    spec:
      template:
        spec:
          restartPolicy: OnFailure
          containers:
            - name: report
              image: report:2
"#;

const DB: &str = r#"{
  "apiVersion": "apps/v1",
  "kind": "StatefulSet",
  "metadata": {"name": "db", "namespace": "shop"},
  "spec": {
    "serviceName": "db",
    "selector": {"matchLabels": {"app": "db"}},
    "template": {
      "metadata": {"labels": {"app": "db"}},
      "spec": {"containers": [{"name": "db", "image": "postgres:16"}]}
    }
  }
}
"#;

/// Trust anchors made once per run of this binary (`ballast identity
/// generate`), in cargo's scratch directory for integration tests: a fixed
/// path made afresh each run, so nothing is left behind in the system's
/// temporary directory (a static `TempDir` is never dropped).
fn anchors_file() -> &'static Path {
    static PKI: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    PKI.get_or_init(|| {
        let pki = Path::new(env!("CARGO_TARGET_TMPDIR")).join("inject-test-pki");
        match std::fs::remove_dir_all(&pki) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => panic!("{}: {e}", pki.display()),
        }
        let generated = Command::new(env!("CARGO_BIN_EXE_ballast"))
            .args(["identity", "generate", "--out"])
            .arg(&pki)
            .output()
            .expect("ballast runs");
        assert!(generated.status.success(), "{generated:?}");
        pki.join("ca.crt")
    })
}

/// `ballast inject ARGS`, given trust anchors by its environment (a flag wins).
fn ballast(args: &[&str], stdin: Option<&str>) -> Output {
    ballast_env(
        args,
        stdin,
        &[(
            "BALLAST_INJECT_IDENTITY_TRUST_ANCHORS_FILE",
            anchors_file().to_str().expect("UTF-8 path"),
        )],
    )
}

fn ballast_env(args: &[&str], stdin: Option<&str>, env: &[(&str, &str)]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ballast"))
        .arg("inject")
        .args(args)
        .envs(env.iter().copied())
        .env_remove("KUBECONFIG")
        .env("HOME", "/nonexistent")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ballast runs");
    let mut pipe = child.stdin.take().expect("stdin");
    pipe.write_all(stdin.unwrap_or_default().as_bytes())
        .expect("stdin written");
    drop(pipe);
    child.wait_with_output().expect("ballast ends")
}

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "ballast inject failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).expect("UTF-8 output")
}

fn manifests_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    for (name, text) in [
        ("00-namespace.yaml", NAMESPACE),
        ("10-web.yaml", WEB),
        ("20-db.json", DB),
        // Subdirectories are read too, as `linkerd inject` reads them.
        ("jobs/30-nightly.yml", NIGHTLY),
        ("README.md", "# not a manifest: ignored\n"),
        // An editor's leftover: skipped, as every reader of manifests skips it.
        (".10-web.yaml.swp", "kind: [not yaml\n"),
    ] {
        let path = dir.path().join(name);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("directory made");
        std::fs::write(path, text).expect("manifest written");
    }
    dir
}

fn docs(text: &str) -> Vec<Value> {
    serde_saphyr::from_multiple(text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn container<'a>(pod: &'a Value, list: &str, name: &str) -> &'a Value {
    pod["spec"][list]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no {name} in {list}"))
}

fn args(c: &Value) -> Vec<String> {
    c["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("string arg").to_string())
        .collect()
}

#[test]
fn a_directory_is_injected_and_what_is_not_a_workload_passes_through_unchanged() {
    let dir = manifests_dir();
    let out = ballast(&[dir.path().to_str().unwrap()], None);
    let text = stdout(&out);
    // Documents without workloads keep every byte, comments included.
    assert!(text.starts_with(NAMESPACE), "{text}");
    let service = WEB.split("---\n").next().unwrap();
    assert!(
        text.contains(&format!("---\n{service}---\n# The web deployment\n")),
        "{text}"
    );
    assert!(text.contains("  # keep me\n  mode: \"on\"\n"), "{text}");

    let docs = docs(&text);
    let names: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "Namespace",
            "Service",
            "Deployment",
            "ConfigMap",
            "StatefulSet",
            "CronJob"
        ]
    );
    for (kind, name, pod) in [
        ("Deployment", "web", "/spec/template"),
        ("StatefulSet", "db", "/spec/template"),
        ("CronJob", "nightly", "/spec/jobTemplate/spec/template"),
    ] {
        let pod = find(&docs, kind, name).pointer(pod).unwrap();
        assert_eq!(
            pod["spec"]["containers"][0]["name"], "linkerd-proxy",
            "{kind}"
        );
        assert_eq!(
            pod["spec"]["initContainers"][0]["name"], "linkerd-init",
            "{kind}"
        );
        assert_eq!(
            pod["metadata"]["labels"]["linkerd.io/control-plane-ns"],
            "ballast"
        );
    }
    // The JSON file's StatefulSet keeps JSON's syntax.
    assert!(
        text.contains("---\n{\n  \"apiVersion\": \"apps/v1\",\n  \"kind\": \"StatefulSet\""),
        "{text}"
    );

    let report = String::from_utf8_lossy(&out.stderr);
    for line in [
        "deployment \"web\" in namespace \"shop\" injected",
        "statefulset \"db\" in namespace \"shop\" injected",
        "cronjob \"nightly\" in namespace \"shop\" injected",
    ] {
        assert!(report.contains(line), "{report}");
    }
}

#[test]
fn annotations_reach_the_sidecar_and_its_flags_parse_with_the_real_parsers() {
    let dir = manifests_dir();
    let text = stdout(&ballast(
        &[dir.path().join("10-web.yaml").to_str().unwrap()],
        None,
    ));
    let docs = docs(&text);
    let pod = &find(&docs, "Deployment", "web")["spec"]["template"];
    let proxy = container(pod, "containers", "linkerd-proxy");
    let init = container(pod, "initContainers", "linkerd-init");
    assert!(args(proxy).contains(&"--inbound-opaque-ports=3306,4000,4001,4002".to_string()));
    assert!(args(proxy).contains(&"--workers=1".to_string()));
    assert!(args(init).contains(&"--outbound-ports-to-ignore=4567,4568,5432".to_string()));
    assert_eq!(proxy["resources"]["limits"]["cpu"], "1");

    #[derive(Parser)]
    struct ProxyCli {
        #[command(flatten)]
        args: ballast_sidecar::proxy::Args,
    }
    #[derive(Parser)]
    struct InitCli {
        #[command(flatten)]
        args: ballast_sidecar::init::Args,
    }
    assert_eq!(proxy["command"][0], "ballast-proxy");
    let mut proxy_args = args(proxy);
    // The plain environment values are the proxy's flags too.
    for env in proxy["env"].as_array().unwrap() {
        let name = env["name"].as_str().unwrap();
        if let (Some(flag), Some(value)) =
            (name.strip_prefix("BALLAST_PROXY_"), env["value"].as_str())
        {
            proxy_args.push(format!(
                "--{}={value}",
                flag.to_lowercase().replace('_', "-")
            ));
        }
    }
    assert!(
        proxy_args.contains(&"--pod-owner=deployment/web".to_string()),
        "{proxy_args:?}"
    );
    // The snapshot file is in the pod's volume, which the proxy mounts.
    assert!(
        proxy_args
            .contains(&"--snapshot-path=/var/run/ballast/snapshot/proxy.snapshot".to_string()),
        "{proxy_args:?}"
    );
    assert!(
        proxy["volumeMounts"]
            .as_array()
            .expect("mounts")
            .iter()
            .any(|m| {
                m["name"] == "ballast-proxy-snapshot"
                    && m["mountPath"] == "/var/run/ballast/snapshot"
            }),
        "{proxy}"
    );
    ProxyCli::try_parse_from(
        std::iter::once("ballast-proxy".to_string()).chain(proxy_args.clone()),
    )
    .unwrap_or_else(|e| panic!("the proxy refuses {proxy_args:?}: {e}"));
    let init_args = args(init);
    assert_eq!(init_args[0], "init");
    InitCli::try_parse_from(
        std::iter::once("init").chain(init_args[1..].iter().map(String::as_str)),
    )
    .unwrap_or_else(|e| panic!("init refuses {init_args:?}: {e}"));
    // The parsers are strict: a flag they lack is refused.
    assert!(ProxyCli::try_parse_from(["ballast-proxy", "--no-such-flag"]).is_err());
}

#[test]
fn injection_is_idempotent_and_uninject_restores_the_input() {
    let dir = manifests_dir();
    let once = stdout(&ballast(&[dir.path().to_str().unwrap()], None));
    let twice = ballast(&["-"], Some(&once));
    assert_eq!(stdout(&twice), once, "injecting twice changes nothing");
    let report = String::from_utf8_lossy(&twice.stderr);
    assert!(
        report.contains("deployment \"web\" in namespace \"shop\" already injected"),
        "{report}"
    );

    let back = stdout(&ballast(&["--uninject", "-"], Some(&once)));
    let original = [NAMESPACE, WEB, DB, NIGHTLY].join("---\n");
    assert_eq!(docs(&back), docs(&original));
    // What injection did not change, uninjection does not touch.
    assert!(back.starts_with(NAMESPACE), "{back}");
    assert!(back.contains("  # keep me\n  mode: \"on\"\n"), "{back}");
    assert!(
        !back.contains("linkerd-proxy") && !back.contains("linkerd.io/proxy-version"),
        "{back}"
    );
}

#[test]
fn stdin_works_and_json_stays_json() {
    let text = stdout(&ballast(&["-"], Some(DB)));
    let value: Value = serde_json::from_str(&text).expect("JSON out");
    assert_eq!(
        value["spec"]["template"]["spec"]["containers"][0]["name"],
        "linkerd-proxy"
    );
    let text = stdout(&ballast(&["-"], Some(NAMESPACE)));
    assert_eq!(text, NAMESPACE);
    // -o converts: every document, as JSON values one after the other.
    let dir = manifests_dir();
    let text = stdout(&ballast(
        &["-o", "json", dir.path().to_str().unwrap()],
        None,
    ));
    let values: Vec<Value> = serde_json::Deserializer::from_str(&text)
        .into_iter()
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(values.len(), 6, "{text}");
    assert_eq!(
        find(&values, "Deployment", "web")["spec"]["template"]["spec"]["containers"][0]["name"],
        "linkerd-proxy"
    );
    let text = stdout(&ballast(&["-o", "yaml", "-"], Some(DB)));
    assert!(
        text.starts_with("apiVersion: apps/v1\nkind: StatefulSet\n"),
        "{text}"
    );
}

#[test]
fn bad_input_exits_1_with_one_clear_line_and_prints_nothing() {
    let dir = manifests_dir();
    let bad = WEB.replace(
        "config.linkerd.io/proxy-cpu-limit: \"1\"",
        "config.linkerd.io/proxy-cpu-limit: \"lots\"",
    );
    let bad_path = dir.path().join("40-bad.yaml");
    std::fs::write(&bad_path, bad).unwrap();
    let out = ballast(&[dir.path().to_str().unwrap()], None);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty(), "nothing partial is printed");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "{}: document 2: deployment \"web\": annotation config.linkerd.io/proxy-cpu-limit: \"lots\" is invalid",
            bad_path.display()
        )),
        "{stderr}"
    );

    let malformed = ballast(&["-"], Some("kind: Service\n---\nkind: Pod\nspec: [\n"));
    assert_eq!(malformed.status.code(), Some(1));
    assert!(malformed.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&malformed.stderr);
    assert!(stderr.contains("<stdin>: document 2: line 4"), "{stderr}");
    assert_eq!(
        stderr.matches("unclosed bracket").count(),
        1,
        "said once: {stderr}"
    );

    let missing = ballast(&[Path::new("/nonexistent/x.yaml").to_str().unwrap()], None);
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("/nonexistent/x.yaml"));
    // A bad flag value is a usage error.
    let flag = ballast(&["--proxy-memory-limit", "10MB", "-"], None);
    assert_eq!(flag.status.code(), Some(2));
}

#[test]
fn trust_anchors_from_a_file_travel_inline_and_a_bad_file_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let pki = dir.path().join("pki");
    let generated = Command::new(env!("CARGO_BIN_EXE_ballast"))
        .args(["identity", "generate", "--out"])
        .arg(&pki)
        .output()
        .expect("ballast runs");
    assert!(generated.status.success(), "{generated:?}");
    let anchors = pki.join("ca.crt");
    let pem = std::fs::read_to_string(&anchors).expect("anchors written");

    let anchors_flag = format!("--identity-trust-anchors-file={}", anchors.display());
    let out = ballast(&[&anchors_flag, "-"], Some(WEB));
    let docs = docs(&stdout(&out));
    let pod = &find(&docs, "Deployment", "web")["spec"]["template"];
    let proxy = container(pod, "containers", "linkerd-proxy");
    let env = proxy["env"].as_array().expect("env");
    assert!(
        env.iter().any(|e| {
            e["name"] == "BALLAST_PROXY_IDENTITY_TRUST_ANCHORS_PEM" && e["value"] == pem.as_str()
        }),
        "{proxy}"
    );
    assert!(!args(proxy)
        .iter()
        .any(|a| a.starts_with("--identity-trust-anchors")));
    assert!(
        !pod["spec"]["volumes"]
            .as_array()
            .expect("volumes")
            .iter()
            .any(|v| v.get("configMap").is_some()),
        "no ConfigMap is mounted: {pod}"
    );

    let not_pem = dir.path().join("not.pem");
    std::fs::write(&not_pem, "hello").unwrap();
    let bad_flag = format!("--identity-trust-anchors-file={}", not_pem.display());
    let out = ballast(&[&bad_flag, "-"], Some(WEB));
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--identity-trust-anchors-file"), "{err}");
}

/// Defect: without anchors, injected pods mounted a ConfigMap of their own
/// namespace that `install` never creates there, and never started. Now the
/// anchors come from the flag, else the installed control plane's
/// ConfigMap (as `linkerd inject` reads its config), else a clear error.
#[tokio::test]
async fn trust_anchors_come_from_the_installed_control_plane_or_injection_refuses() {
    let api = ballast_testkit::ApiServer::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = api.write_kubeconfig(dir.path());
    let kubeconfig = kubeconfig.to_str().expect("UTF-8 path").to_string();
    let pem = std::fs::read_to_string(anchors_file()).expect("anchors");

    // No ConfigMap yet: refused, naming it and the flags that help.
    let run = |args: Vec<String>| {
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            ballast_env(&args, Some(WEB), &[])
        })
    };
    let out = run(vec![format!("--kubeconfig={kubeconfig}"), "-".into()])
        .await
        .expect("ran");
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("ballast/linkerd-identity-trust-roots")
            && err.contains("--identity-trust-anchors-file")
            && err.lines().count() == 1,
        "{err}"
    );

    api.apply(serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "linkerd-identity-trust-roots", "namespace": "ballast"},
        "data": {"ca-bundle.crt": pem},
    }));
    let out = run(vec![format!("--kubeconfig={kubeconfig}"), "-".into()])
        .await
        .expect("ran");
    let docs = docs(&stdout(&out));
    let pod = &find(&docs, "Deployment", "web")["spec"]["template"];
    let proxy = container(pod, "containers", "linkerd-proxy");
    assert!(
        proxy["env"].as_array().expect("env").iter().any(|e| {
            e["name"] == "BALLAST_PROXY_IDENTITY_TRUST_ANCHORS_PEM" && e["value"] == pem.as_str()
        }),
        "{proxy}"
    );
    assert!(
        !pod["spec"]["volumes"]
            .as_array()
            .expect("volumes")
            .iter()
            .any(|v| v.get("configMap").is_some()),
        "no ConfigMap is mounted: {pod}"
    );

    // Without a cluster at all: the same one-line refusal.
    let out = run(vec!["-".into()]).await.expect("ran");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--identity-trust-anchors-file"), "{err}");
    // Removing a sidecar needs no anchors.
    let injected = ballast(&["-"], Some(WEB));
    let injected = stdout(&injected);
    let out = tokio::task::spawn_blocking(move || {
        ballast_env(&["--uninject", "-"], Some(&injected), &[])
    })
    .await
    .expect("ran");
    assert!(out.status.success(), "{out:?}");
    // Proxies without identity need no anchors.
    let out = run(vec!["--identity-disabled".into(), "-".into()])
        .await
        .expect("ran");
    assert!(out.status.success(), "{out:?}");
}

/// Defect: the injected proxy dialled the controllers in TLS verifying
/// names the installed ones do not hold, and labelled pods for another
/// namespace than the controllers'. Both now follow from one namespace.
#[test]
fn injected_proxies_name_the_installed_control_planes_identities() {
    let text = stdout(&ballast(
        &["--control-plane-namespace=mesh", "-"],
        Some(WEB),
    ));
    let docs = docs(&text);
    let pod = &find(&docs, "Deployment", "web")["spec"]["template"];
    assert_eq!(
        pod["metadata"]["labels"]["linkerd.io/control-plane-ns"],
        "mesh"
    );
    let proxy = container(pod, "containers", "linkerd-proxy");
    for arg in [
        "--destination-addr=ballast-dst-headless.mesh.svc.cluster.local:8086",
        "--identity-addr=ballast-identity-headless.mesh.svc.cluster.local:8080",
        "--identity-controller-namespace=mesh",
        "--destination-server-name=ballast-destination.mesh.serviceaccount.identity.mesh.cluster.local",
        "--identity-server-name=linkerd-identity.mesh.serviceaccount.identity.mesh.cluster.local",
    ] {
        assert!(args(proxy).contains(&arg.to_string()), "{arg}: {:?}", args(proxy));
    }
    // And they are what `ballast install --namespace mesh` serves.
    let install = Command::new(env!("CARGO_BIN_EXE_ballast"))
        .args(["install", "--namespace", "mesh"])
        .output()
        .expect("ballast runs");
    assert!(install.status.success(), "{install:?}");
    let installed = String::from_utf8_lossy(&install.stdout);
    for arg in [
        "--controller-namespace=mesh",
        "--service-account=ballast-destination",
        "--identity-trust-anchors=",
    ] {
        assert!(installed.contains(arg), "install renders {arg}");
    }
    assert!(!installed.contains("--controller-namespace=linkerd"));
}

/// Another mesh's pod is left alone, as Linkerd's injector does.
#[test]
fn a_pod_with_another_meshs_sidecar_is_not_injected() {
    let istio = WEB.replace(
        "        - name: web\n          image: nginx:1.27\n",
        "        - name: web\n          image: nginx:1.27\n        - name: istio-proxy\n          image: istio/proxyv2\n",
    );
    assert_ne!(istio, WEB);
    let out = ballast(&["-"], Some(&istio));
    let text = stdout(&out);
    assert!(!text.contains("linkerd-proxy"), "{text}");
    let report = String::from_utf8_lossy(&out.stderr);
    assert!(report.contains("istio-proxy"), "{report}");
}

/// Defect: viz recognised only a container named `linkerd-proxy`, and inject
/// named it otherwise, so the dashboard showed nothing for injected pods.
/// The pod `ballast inject` writes is one the index (viz's model) finds the
/// proxy of, at the admin and tap ports injection declares.
#[test]
fn an_injected_pod_is_one_viz_finds_the_proxy_of() {
    let pod = "apiVersion: v1\nkind: Pod\nmetadata: {name: web-1, namespace: shop}\n\
               spec:\n  containers: [{name: web, image: nginx}]\n";
    let text = stdout(&ballast(&["-"], Some(pod)));
    let mut injected: Value = serde_saphyr::from_str(&text).expect("one pod");
    injected["status"] = serde_json::json!({"phase": "Running", "podIP": "10.0.0.1"});
    let wire: ballast_store::resource::PodWire =
        serde_json::from_value(injected).expect("a pod the index reads");
    let pod = ballast_store::resource::Pod::try_from(wire).expect("valid");
    let ports = pod.proxy_ports.expect("the index sees a meshed pod");
    assert_eq!((ports.admin, ports.tap), (4191, 4190));
}
