//! deploy/examples/sidecar.yaml runs the sidecar image's `ballast-proxy`
//! with flags it has, and its init container and proxy agree on ports and
//! uid; deploy/Dockerfile builds that image from `ballast-proxy`.

use serde_json::Value;
use std::collections::BTreeSet;

fn repo_file(path: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn sidecar_pod() -> Value {
    let text = repo_file("deploy/examples/sidecar.yaml");
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
    let deployment = docs
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("the example holds a Deployment");
    deployment["spec"]["template"]["spec"].clone()
}

/// The container of `list` (e.g. `containers`) named `name`.
fn container<'a>(pod: &'a Value, list: &str, name: &str) -> &'a Value {
    pod[list]
        .as_array()
        .unwrap_or_else(|| panic!("the sidecar example has no {list}"))
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name} in {list}"))
}

/// The container runs the sidecar image's `ballast-proxy`, with `subcommand`
/// (none: the proxy), and every flag and environment variable it passes is
/// one `ballast-proxy [SUBCOMMAND]` has.
fn assert_runs_ballast_proxy(c: &Value, subcommand: Option<&str>) {
    assert_eq!(
        c["command"][0], "ballast-proxy",
        "the sidecar image's binary"
    );
    let args = c["args"].as_array().expect("args");
    let mut help = std::process::Command::new(env!("CARGO_BIN_EXE_ballast-proxy"));
    let flags = match subcommand {
        Some(sub) => {
            assert_eq!(args[0], sub, "first arg");
            help.arg(sub);
            &args[1..]
        }
        None => &args[..],
    };
    let help = help
        .arg("--help")
        .output()
        .expect("ballast-proxy --help runs");
    assert!(help.status.success());
    let help = String::from_utf8_lossy(&help.stdout);
    let what = format!("`ballast-proxy {}`", subcommand.unwrap_or(""));
    for arg in flags {
        let flag = arg.as_str().unwrap().split('=').next().unwrap();
        assert!(flag.starts_with("--"), "{what}: {flag} is not a flag");
        assert!(
            help.contains(&format!("{flag} ")) || help.contains(&format!("{flag}\n")),
            "{what} has no flag {flag}"
        );
    }
    for env in c["env"].as_array().into_iter().flatten() {
        let name = env["name"].as_str().unwrap();
        assert!(
            name == "BALLAST_LOG" || help.contains(name),
            "{what} reads no {name}"
        );
    }
}

/// The value of `--NAME=VALUE` in `c`'s args.
fn flag<'a>(c: &'a Value, name: &str) -> Option<&'a str> {
    c["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a.as_str()?.strip_prefix(name)?.strip_prefix('='))
        .next_back()
}

fn port_of(addr: &str) -> &str {
    addr.rsplit(':').next().unwrap()
}

#[test]
fn the_sidecar_example_passes_flags_the_proxy_has_and_is_probed() {
    let pod = sidecar_pod();
    let proxy = container(&pod, "containers", "linkerd-proxy");
    assert_eq!(proxy["livenessProbe"]["httpGet"]["path"], "/live");
    assert_eq!(proxy["readinessProbe"]["httpGet"]["path"], "/ready");
    assert!(proxy["resources"]["limits"]["memory"].is_string());
    assert_runs_ballast_proxy(proxy, None);
}

#[test]
fn the_sidecar_example_redirects_to_the_proxys_ports_and_exempts_its_uid() {
    let pod = sidecar_pod();
    let init = container(&pod, "initContainers", "linkerd-init");
    assert_runs_ballast_proxy(init, Some("init"));
    let security = &init["securityContext"];
    assert_eq!(security["runAsUser"], 0, "iptables needs root");
    let added: BTreeSet<&str> = security["capabilities"]["add"]
        .as_array()
        .expect("capabilities added")
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    assert_eq!(added, BTreeSet::from(["NET_ADMIN", "NET_RAW"]));
    assert_eq!(security["capabilities"]["drop"][0], "ALL");
    assert_eq!(security["privileged"], false);

    // The init container's ports and uid are the proxy's.
    let proxy = container(&pod, "containers", "linkerd-proxy");
    assert_eq!(
        proxy["securityContext"]["runAsUser"]
            .as_u64()
            .map(|u| u.to_string()),
        Some(flag(init, "--proxy-uid").unwrap_or("2102").to_string()),
        "the proxy runs as the uid init exempts"
    );
    assert_eq!(
        flag(init, "--outgoing-proxy-port").unwrap_or("4140"),
        port_of(flag(proxy, "--outbound-addr").unwrap_or("127.0.0.1:4140"))
    );
    assert_eq!(
        flag(init, "--incoming-proxy-port").unwrap_or("4143"),
        port_of(flag(proxy, "--inbound-addr").unwrap_or("0.0.0.0:4143"))
    );
    // The probes reach the admin port directly, not through the inbound proxy.
    let admin = port_of(flag(proxy, "--admin-addr").unwrap_or("127.0.0.1:4191"));
    let ignored = flag(init, "--inbound-ports-to-ignore").unwrap_or("4190,4191,4567,4568");
    assert!(
        ignored.split(',').any(|p| p == admin),
        "admin port {admin} not in --inbound-ports-to-ignore {ignored}"
    );
}

#[test]
fn the_sidecar_images_run_ballast_proxy() {
    let dockerfile = repo_file("deploy/Dockerfile");
    for target in ["init", "proxy"] {
        let stage = dockerfile
            .split("\nFROM ")
            .find(|s| {
                s.lines()
                    .next()
                    .is_some_and(|l| l.ends_with(&format!(" AS {target}")))
            })
            .unwrap_or_else(|| panic!("deploy/Dockerfile has no target {target}"));
        assert!(
            stage.contains("ENTRYPOINT [\"/usr/local/bin/ballast-proxy\"]"),
            "target {target} does not run ballast-proxy:\n{stage}"
        );
        assert!(
            !stage.contains("release/ballast "),
            "target {target} carries the controller's binary:\n{stage}"
        );
    }
}
