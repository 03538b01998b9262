//! Do the installed pieces agree? The controllers, the injector and the
//! proxies it injected each carry the control plane's namespace, trust
//! domain and identities in their own flags; when one of them disagrees the
//! mesh still starts and reports Ready, but silently loses mutual TLS (an
//! endpoint without identity) or its controller (a proxy dialling TLS to a
//! plaintext controller, or verifying a name the controller does not hold).
//! Each of those is a failure here, naming the flag to change.
//!
//! The names they must agree on are `ballast_controlplane`'s, from the
//! namespace the control plane is installed in.

use crate::pods::{self, setting};
use crate::report::{CheckResult, Finding, Source};
use crate::snapshot::{array, labels, name, namespace, object_ref, text, Snapshot};
use crate::Config;
use ballast_controlplane::{pod as injected, CONTROL_PLANE_NS_LABEL};
use serde_json::Value;
use std::collections::BTreeSet;

const CATEGORY: &str = "control-plane";

pub const AGREE: &str = "control plane and proxies agree on namespace, identities and TLS";

/// The controllers' own defaults where their flags are silent (Linkerd's:
/// `linkerd` as the control plane namespace).
const BINARY_DEFAULT_CONTROL_NS: &str = "linkerd";
const BINARY_DEFAULT_TRUST_DOMAIN: &str = "cluster.local";

/// At most this many pods are named in one finding.
const MAX_NAMED: usize = 5;

/// The first container of a Deployment's pod template.
fn deployment_container<'a>(snap: &'a Snapshot, ns: &str, deployment: &str) -> Option<&'a Value> {
    let d = snap.find("Deployment", ns, deployment)?;
    array(d, "/spec/template/spec/containers").first()
}

/// A controller's view of the mesh, from its flags (with the binary's defaults).
struct Controller<'a> {
    deployment: &'static str,
    container: &'a Value,
    env_prefix: &'static str,
}

impl<'a> Controller<'a> {
    fn setting(&self, flag: &str) -> Option<&'a str> {
        let env = format!(
            "{}_{}",
            self.env_prefix,
            flag.trim_start_matches('-')
                .replace('-', "_")
                .to_uppercase()
        );
        setting(self.container, flag, &[&env])
    }

    fn control_ns(&self) -> &'a str {
        self.setting("--controller-namespace")
            .unwrap_or(BINARY_DEFAULT_CONTROL_NS)
    }
}

/// A Ballast proxy's view of its controllers, from its flags (with the
/// proxy's defaults). Proxies configured otherwise (Linkerd's, by its
/// environment) are not read.
struct Proxy<'a> {
    container: &'a Value,
}

impl<'a> Proxy<'a> {
    fn of(pod: &'a Value) -> Option<Proxy<'a>> {
        let container = pods::proxy_container(pod)?;
        let ballast = !array(container, "/args").is_empty()
            || array(container, "/env")
                .iter()
                .any(|e| text(e, "/name").starts_with("BALLAST_PROXY_"));
        ballast.then_some(Proxy { container })
    }

    fn setting(&self, flag: &str) -> Option<&'a str> {
        let env = format!(
            "BALLAST_PROXY_{}",
            flag.trim_start_matches('-')
                .replace('-', "_")
                .to_uppercase()
        );
        setting(self.container, flag, &[&env])
    }

    fn identity_on(&self) -> bool {
        let flag = pods::flag_values(self.container, "--identity-disabled");
        let given = array(self.container, "/args")
            .iter()
            .chain(array(self.container, "/command"))
            .any(|a| a.as_str() == Some("--identity-disabled"));
        let env = pods::env_value(self.container, "BALLAST_PROXY_IDENTITY_DISABLED")
            .is_some_and(|v| v == "true" || v == "1");
        flag.is_empty() && !given && !env
    }

    fn identity_ns(&self) -> &'a str {
        self.setting("--identity-controller-namespace")
            .unwrap_or(BINARY_DEFAULT_CONTROL_NS)
    }

    fn trust_domain(&self) -> &'a str {
        self.setting("--identity-trust-domain")
            .unwrap_or(BINARY_DEFAULT_TRUST_DOMAIN)
    }

    /// The name it verifies the destination controller by; `None`: it
    /// dials the controller in plaintext.
    fn destination_server_name(&self) -> Option<String> {
        if !self.identity_on() {
            return None;
        }
        let addr = self.setting("--destination-addr").unwrap_or("");
        match self.setting("--destination-server-name") {
            Some("") => None,
            Some(name) => Some(name.to_string()),
            None if is_loopback_addr(addr) => None,
            None => {
                let ns = self.identity_ns();
                Some(format!(
                    "linkerd-destination.{ns}.serviceaccount.identity.{ns}.{}",
                    self.trust_domain()
                ))
            }
        }
    }
}

fn is_loopback_addr(addr: &str) -> bool {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// `ns/name` of the first few pods, and how many more.
fn named(pods: &[&Value]) -> String {
    let mut names: Vec<String> = pods
        .iter()
        .take(MAX_NAMED)
        .map(|p| format!("{}/{}", namespace(p), name(p)))
        .collect();
    if pods.len() > MAX_NAMED {
        names.push(format!("and {} more", pods.len() - MAX_NAMED));
    }
    names.join(", ")
}

pub fn agree(snap: &Snapshot, config: &Config) -> CheckResult {
    let ns = config.namespace.as_str();
    let mut findings = Vec::new();
    let destination =
        deployment_container(snap, ns, crate::control_plane::DESTINATION).map(|container| {
            Controller {
                deployment: crate::control_plane::DESTINATION,
                container,
                env_prefix: "BALLAST_DESTINATION",
            }
        });
    let identity =
        deployment_container(snap, ns, crate::control_plane::IDENTITY).map(|container| {
            Controller {
                deployment: crate::control_plane::IDENTITY,
                container,
                env_prefix: "BALLAST_IDENTITY",
            }
        });
    let viz =
        deployment_container(snap, ns, crate::control_plane::VIZ).map(|container| Controller {
            deployment: crate::control_plane::VIZ,
            container,
            env_prefix: "BALLAST_VIZ",
        });
    let deployment_ref = |c: &Controller| {
        snap.find("Deployment", ns, c.deployment)
            .map(object_ref)
            .into_iter()
            .collect::<Vec<_>>()
    };

    // 1. Every controller names the namespace it is installed in: the
    // destination controller gives identities only to pods labelled with
    // its namespace, and identity names carry it.
    for c in [&destination, &identity, &viz].into_iter().flatten() {
        let theirs = c.control_ns();
        if theirs != ns {
            findings.push(Finding::fail(
                format!(
                    "deployment {ns}/{} runs with --controller-namespace={theirs}, but the control plane is \
                     installed in {ns}: pods injected for it (label {CONTROL_PLANE_NS_LABEL}={ns}) get no \
                     identity from it, so no mutual TLS; set --controller-namespace={ns} (`ballast install` renders it)",
                    c.deployment
                ),
                deployment_ref(c),
            ));
        }
    }
    // The trust domain of identity names, as each controller has it.
    let trust_domain = identity
        .as_ref()
        .and_then(|c| c.setting("--trust-domain"))
        .unwrap_or(BINARY_DEFAULT_TRUST_DOMAIN);
    if let Some(d) = &destination {
        let theirs = d
            .setting("--identity-trust-domain")
            .unwrap_or(BINARY_DEFAULT_TRUST_DOMAIN);
        if theirs != trust_domain {
            findings.push(Finding::fail(
                format!(
                    "deployment {ns}/{} has --identity-trust-domain={theirs} while the identity controller \
                     certifies names under {trust_domain}: proxies reject the identities it hands out; set both alike",
                    d.deployment
                ),
                deployment_ref(d),
            ));
        }
    }

    // 2. The injector configures new proxies for this control plane.
    if let Some(container) = deployment_container(snap, ns, crate::control_plane::INJECTOR) {
        let theirs = setting(
            container,
            "--control-plane-namespace",
            &["BALLAST_INJECT_CONTROL_PLANE_NAMESPACE"],
        )
        .unwrap_or(ballast_controlplane::DEFAULT_NAMESPACE);
        if theirs != ns {
            findings.push(Finding::fail(
                format!(
                    "deployment {ns}/{} injects proxies for control plane namespace {theirs}, but the control \
                     plane is in {ns}: set --control-plane-namespace={ns}",
                    crate::control_plane::INJECTOR
                ),
                snap.find("Deployment", ns, crate::control_plane::INJECTOR)
                    .map(object_ref)
                    .into_iter()
                    .collect(),
            ));
        }
    }

    // 3. Meshed pods: their label, the names their proxies verify, and
    // whether the controller they dial in TLS serves TLS.
    let meshed: Vec<&Value> = snap
        .of_kind("Pod")
        .filter(|p| pods::proxy_container(p).is_some() && !pods::is_terminating(p))
        .collect();
    let mut wrong_label = Vec::new();
    let mut wrong_identity_ns = Vec::new();
    let mut wrong_destination_name = Vec::new();
    let mut dial_tls = Vec::new();
    let mut not_seen_by_viz = Vec::new();
    let destination_name = destination.as_ref().map(|d| {
        let sa = d
            .setting("--service-account")
            .unwrap_or("linkerd-destination");
        let own_ns = d.setting("--namespace").unwrap_or(d.control_ns());
        format!(
            "{sa}.{own_ns}.serviceaccount.identity.{}.{trust_domain}",
            d.control_ns()
        )
    });
    for pod in &meshed {
        if let Some(label) = labels(pod).get(CONTROL_PLANE_NS_LABEL) {
            if *label != ns {
                wrong_label.push(*pod);
            }
        }
        if pods::proxy_container(pod).is_some_and(|c| text(c, "/name") != injected::PROXY_CONTAINER)
        {
            not_seen_by_viz.push(*pod);
        }
        let Some(proxy) = Proxy::of(pod) else {
            continue;
        };
        if !proxy.identity_on() {
            continue;
        }
        if proxy.identity_ns() != ns || proxy.trust_domain() != trust_domain {
            wrong_identity_ns.push(*pod);
        }
        if let Some(verified) = proxy.destination_server_name() {
            dial_tls.push(*pod);
            if destination_name.as_deref().is_some_and(|d| d != verified) {
                wrong_destination_name.push(*pod);
            }
        }
    }
    let refs = |pods: &[&Value]| pods.iter().take(MAX_NAMED).map(|p| object_ref(p)).collect();
    if !wrong_label.is_empty() {
        findings.push(Finding::fail(
            format!(
                "{} meshed pod(s) are labelled {CONTROL_PLANE_NS_LABEL} with another namespace than {ns} ({}): \
                 the destination controller gives them no identity, so nothing reaches them over mutual TLS; \
                 re-inject them with --control-plane-namespace={ns}",
                wrong_label.len(),
                named(&wrong_label)
            ),
            refs(&wrong_label),
        ));
    }
    if !wrong_identity_ns.is_empty() {
        findings.push(Finding::fail(
            format!(
                "{} meshed pod(s) expect identities under another control plane namespace or trust domain than \
                 {ns} and {trust_domain} ({}): their certificates and their peers' do not verify; re-inject them \
                 (`ballast inject` sets --identity-controller-namespace and --identity-trust-domain)",
                wrong_identity_ns.len(),
                named(&wrong_identity_ns)
            ),
            refs(&wrong_identity_ns),
        ));
    }
    if let (Some(d), false) = (&destination, dial_tls.is_empty()) {
        let serves_tls = d.setting("--identity-trust-anchors").is_some();
        if !serves_tls {
            findings.push(Finding::fail(
                format!(
                    "deployment {ns}/{} serves plaintext only (no --identity-trust-anchors), while {} meshed \
                     proxies dial it in TLS ({}): their lookups fail, and traffic by cluster IP goes without mutual \
                     TLS; give it --identity-trust-anchors (`ballast install` renders it)",
                    d.deployment,
                    dial_tls.len(),
                    named(&dial_tls)
                ),
                deployment_ref(d),
            ));
        }
    }
    if let (Some(expected), false) = (&destination_name, wrong_destination_name.is_empty()) {
        findings.push(Finding::fail(
            format!(
                "{} meshed proxies verify the destination controller by another name than the {expected} it \
                 serves ({}): every lookup fails its TLS handshake; re-inject them (--destination-server-name)",
                wrong_destination_name.len(),
                named(&wrong_destination_name)
            ),
            refs(&wrong_destination_name),
        ));
    }
    if !not_seen_by_viz.is_empty() && viz.is_some() {
        findings.push(Finding::warn(
            format!(
                "{} meshed pod(s) name their proxy container otherwise than {} ({}): viz, the dashboard and \
                 `ballast stat` do not see them; re-inject them",
                not_seen_by_viz.len(),
                injected::PROXY_CONTAINER,
                named(&not_seen_by_viz)
            ),
            refs(&not_seen_by_viz),
        ));
    }

    // 4. A trust anchors ConfigMap a meshed pod mounts must exist in its
    // own namespace, or the pod never starts.
    let mut missing: BTreeSet<(String, String)> = BTreeSet::new();
    let mut missing_pods = Vec::new();
    for pod in &meshed {
        for cm in trust_anchor_config_maps(pod) {
            if snap.find("ConfigMap", namespace(pod), cm).is_none() {
                missing.insert((namespace(pod).to_string(), cm.to_string()));
                missing_pods.push(*pod);
            }
        }
    }
    if !missing.is_empty() {
        let what: Vec<String> = missing.iter().map(|(n, c)| format!("{n}/{c}")).collect();
        let message = format!(
            "{} meshed pod(s) mount trust anchors from ConfigMaps that do not exist in their namespace ({}): \
             such pods never start; re-inject them (`ballast inject` gives the anchors inline) or create the \
             ConfigMaps ({})",
            missing_pods.len(),
            what.join(", "),
            named(&missing_pods)
        );
        findings.push(match snap.source {
            Source::Cluster => Finding::fail(message, refs(&missing_pods)),
            Source::Manifests => Finding::warn(
                format!("{message}; not in the manifests"),
                refs(&missing_pods),
            ),
        });
    }
    CheckResult::ran(CATEGORY, AGREE, findings)
}

/// The ConfigMaps a pod's proxy reads its trust anchors from (the volume
/// mounted at the anchors' directory).
pub fn trust_anchor_config_maps(pod: &Value) -> Vec<&str> {
    let Some(proxy) = pods::proxy_container(pod) else {
        return Vec::new();
    };
    let Some(anchors) = pods::flag_values(proxy, "--identity-trust-anchors")
        .last()
        .copied()
        .or_else(|| pods::env_value(proxy, "BALLAST_PROXY_IDENTITY_TRUST_ANCHORS"))
    else {
        return Vec::new();
    };
    let mounts: Vec<&str> = array(proxy, "/volumeMounts")
        .iter()
        .filter(|m| {
            let path = text(m, "/mountPath");
            !path.is_empty() && anchors.starts_with(&format!("{}/", path.trim_end_matches('/')))
        })
        .map(|m| text(m, "/name"))
        .collect();
    array(pod, "/spec/volumes")
        .iter()
        .filter(|v| mounts.contains(&text(v, "/name")))
        .filter(|v| v.pointer("/configMap/optional") != Some(&Value::Bool(true)))
        .map(|v| text(v, "/configMap/name"))
        .filter(|n| !n.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control_plane::tests::{control_plane, deployment};
    use crate::data_plane::tests::{meshed, pod};
    use crate::report::Status;
    use serde_json::json;

    fn check(objects: Vec<Value>) -> CheckResult {
        agree(&Snapshot::new(Source::Cluster, objects), &Config::default())
    }

    fn healthy() -> Vec<Value> {
        let mut objects = control_plane();
        objects.push(meshed(pod("shop", "web-1", "10.0.0.1"), "0.1.0"));
        objects
    }

    /// `objects` with the first object named `name` changed by `f`.
    fn with(mut objects: Vec<Value>, name: &str, f: impl FnOnce(&mut Value)) -> Vec<Value> {
        let o = objects
            .iter_mut()
            .find(|o| super::name(o) == name)
            .expect("object in the fixture");
        f(o);
        objects
    }

    fn set_args(o: &mut Value, pointer: &str, args: &[&str]) {
        *o.pointer_mut(pointer).expect("container") = json!(args);
    }

    fn failed_with(c: &CheckResult, words: &str) {
        assert_eq!(c.status, Status::Fail, "{c:?}");
        assert!(
            c.findings.iter().any(|f| f.message.contains(words)),
            "no finding saying {words:?}: {c:?}"
        );
    }

    #[test]
    fn what_install_and_inject_render_agrees() {
        let c = check(healthy());
        assert_eq!(c.status, Status::Ok, "{c:?}");
    }

    #[test]
    fn a_controller_namespace_no_pod_uses_fails() {
        let objects = with(healthy(), "ballast-destination", |d| {
            set_args(
                d,
                "/spec/template/spec/containers/0/args",
                &[
                    "--controller-namespace=nowhere",
                    "--identity-trust-anchors=/a.crt",
                ],
            )
        });
        failed_with(&check(objects), "--controller-namespace=nowhere");
    }

    #[test]
    fn pods_labelled_for_another_control_plane_fail() {
        let objects = with(healthy(), "web-1", |p| {
            p["metadata"]["labels"]["linkerd.io/control-plane-ns"] = json!("linkerd");
        });
        failed_with(&check(objects), "labelled linkerd.io/control-plane-ns");
    }

    #[test]
    fn a_plaintext_destination_dialled_in_tls_fails() {
        let objects = with(healthy(), "ballast-destination", |d| {
            set_args(
                d,
                "/spec/template/spec/containers/0/args",
                &["--controller-namespace=ballast"],
            )
        });
        failed_with(&check(objects), "serves plaintext only");
        // Proxies without identity dial it in plaintext: nothing to say.
        let objects = with(
            with(healthy(), "ballast-destination", |d| {
                set_args(
                    d,
                    "/spec/template/spec/containers/0/args",
                    &["--controller-namespace=ballast"],
                )
            }),
            "web-1",
            |p| {
                p["spec"]["containers"][1]["args"]
                    .as_array_mut()
                    .expect("args")
                    .push(json!("--identity-disabled"))
            },
        );
        assert_eq!(check(objects).status, Status::Ok);
    }

    #[test]
    fn a_proxy_verifying_another_destination_name_fails() {
        let objects = with(healthy(), "web-1", |p| {
            let args = p["spec"]["containers"][1]["args"]
                .as_array_mut()
                .expect("args");
            args.retain(|a| {
                !a.as_str()
                    .unwrap_or("")
                    .starts_with("--destination-server-name")
            });
        });
        // The proxy's own default is Linkerd's linkerd-destination.
        failed_with(
            &check(objects),
            "verify the destination controller by another name",
        );
    }

    #[test]
    fn proxies_under_another_identity_namespace_fail() {
        let objects = with(healthy(), "web-1", |p| {
            let args = p["spec"]["containers"][1]["args"]
                .as_array_mut()
                .expect("args");
            args.retain(|a| {
                !a.as_str()
                    .unwrap_or("")
                    .starts_with("--identity-controller")
            });
        });
        failed_with(&check(objects), "expect identities under another");
    }

    #[test]
    fn a_proxy_container_viz_cannot_see_warns() {
        let mut objects = with(healthy(), "web-1", |p| {
            p["spec"]["containers"][1]["name"] = json!("ballast-proxy");
        });
        objects.push(deployment("ballast-viz", "ballast-viz"));
        let c = check(objects);
        assert_eq!(c.status, Status::Warn, "{c:?}");
    }

    #[test]
    fn a_missing_trust_anchors_config_map_fails_and_a_present_one_passes() {
        let mount = |p: &mut Value| {
            let proxy = &mut p["spec"]["containers"][1];
            proxy["args"].as_array_mut().expect("args").push(json!(
                "--identity-trust-anchors=/var/run/linkerd/identity/trust-roots/ca-bundle.crt"
            ));
            proxy["volumeMounts"] =
                json!([{"name": "roots", "mountPath": "/var/run/linkerd/identity/trust-roots"}]);
            p["spec"]["volumes"] =
                json!([{"name": "roots", "configMap": {"name": "linkerd-identity-trust-roots"}}]);
        };
        let objects = with(healthy(), "web-1", mount);
        failed_with(&check(objects.clone()), "shop/linkerd-identity-trust-roots");
        let mut objects = objects;
        objects.push(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "linkerd-identity-trust-roots", "namespace": "shop"}}));
        assert_eq!(check(objects).status, Status::Ok);
    }

    #[test]
    fn an_injector_for_another_namespace_fails() {
        let mut objects = healthy();
        let mut injector = deployment("ballast-injector", "ballast-injector");
        set_args(
            &mut injector,
            "/spec/template/spec/containers/0/args",
            &["injector", "--control-plane-namespace=linkerd"],
        );
        objects.push(injector);
        failed_with(
            &check(objects),
            "injects proxies for control plane namespace linkerd",
        );
    }
}
