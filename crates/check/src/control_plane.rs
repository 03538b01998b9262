//! Checks of the control plane: its namespace, its pods, the RBAC grants its
//! controllers need (evaluated here, from the ClusterRoles and bindings, so
//! a manifests directory is checked the same way as a cluster), and the
//! CRDs the destination controller watches.

use crate::report::{CheckResult, Finding, ObjectRef, Source};
use crate::snapshot::{array, name, namespace, object_ref, string_map, text, Snapshot};
use crate::Config;
use serde_json::Value;
use std::collections::BTreeMap;

const CATEGORY: &str = "control-plane";

pub const NAMESPACE: &str = "control plane namespace exists";
pub const PODS: &str = "control plane pods are ready";
pub const RBAC: &str = "controllers' RBAC grants what they need";
pub const CRDS: &str = "policy CRDs are installed";

/// The destination controller's Deployment.
pub const DESTINATION: &str = "ballast-destination";
/// The identity controller's Deployment.
pub const IDENTITY: &str = "ballast-identity";
/// The injection webhook's Deployment (optional).
pub const INJECTOR: &str = "ballast-injector";
/// The dashboard and metrics collector's Deployment (optional).
pub const VIZ: &str = "ballast-viz";

/// One API permission: `verb` on `group`/`resource`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Permission {
    pub group: String,
    pub resource: String,
    pub verb: &'static str,
}

/// What each controller's service account must be allowed, by Deployment.
/// viz builds its own index from the same watches as the destination
/// controller.
pub fn needs() -> Vec<(&'static str, Vec<Permission>)> {
    let destination: Vec<Permission> = ballast_controlplane::WATCHED_RESOURCES
        .iter()
        .flat_map(|(group, _, plural)| {
            ["get", "list", "watch"].map(|verb| Permission {
                group: group.to_string(),
                resource: plural.to_string(),
                verb,
            })
        })
        .collect();
    let identity = vec![Permission {
        group: "authentication.k8s.io".into(),
        resource: "tokenreviews".into(),
        verb: "create",
    }];
    vec![
        (VIZ, destination.clone()),
        (DESTINATION, destination),
        (IDENTITY, identity),
    ]
}

/// The control plane's Deployments, and whether each must exist (the
/// injector and viz are optional).
const DEPLOYMENTS: [(&str, bool); 4] = [
    (DESTINATION, true),
    (IDENTITY, true),
    (INJECTOR, false),
    (VIZ, false),
];

/// API groups served by Kubernetes itself (no CRD).
const BUILT_IN_GROUPS: [&str; 2] = ["", "discovery.k8s.io"];

pub fn namespace_exists(snap: &Snapshot, config: &Config) -> CheckResult {
    let ns = &config.namespace;
    let findings = if snap.find("Namespace", "", ns).is_some() {
        Vec::new()
    } else {
        vec![Finding::fail(
            format!("namespace {ns} does not exist"),
            vec![ObjectRef::new("Namespace", None, ns)],
        )]
    };
    CheckResult::ran(CATEGORY, format!("{NAMESPACE} ({ns})"), findings)
}

/// Every non-terminating pod of each control plane Deployment is running
/// and ready. A manifests directory usually holds no pods: that is a
/// warning there, a failure on a cluster.
pub fn pods_ready(snap: &Snapshot, config: &Config) -> CheckResult {
    let ns = config.namespace.as_str();
    let mut findings = Vec::new();
    let mut ready_total = 0;
    for (deployment, required) in DEPLOYMENTS {
        let Some(d) = snap.find("Deployment", ns, deployment) else {
            if required {
                findings.push(Finding::fail(
                    format!("deployment {ns}/{deployment} does not exist"),
                    vec![ObjectRef::new("Deployment", Some(ns), deployment)],
                ));
            }
            continue;
        };
        let selector = string_map(d, "/spec/selector/matchLabels");
        let pods: Vec<&Value> = snap
            .of_kind("Pod")
            .filter(|p| namespace(p) == ns && !crate::pods::is_terminating(p))
            .filter(|p| crate::snapshot::selects(&selector, &crate::snapshot::labels(p)))
            .collect();
        if pods.is_empty() {
            let message = format!("deployment {ns}/{deployment} has no pods");
            findings.push(match snap.source {
                Source::Cluster => Finding::fail(message, vec![object_ref(d)]),
                Source::Manifests => Finding::warn(
                    format!("{message} in the manifests: readiness not checked"),
                    vec![object_ref(d)],
                ),
            });
            continue;
        }
        for pod in pods {
            match not_ready(pod) {
                None => ready_total += 1,
                Some(why) => findings.push(Finding::fail(
                    format!("{} ({deployment}) is not ready: {why}", object_ref(pod)),
                    vec![object_ref(pod), object_ref(d)],
                )),
            }
        }
    }
    CheckResult::ran(CATEGORY, PODS, findings).with_detail(format!("{ready_total} ready pods"))
}

/// Why a pod is not ready, if it is not.
fn not_ready(pod: &Value) -> Option<String> {
    let phase = text(pod, "/status/phase");
    let ready = array(pod, "/status/conditions")
        .iter()
        .any(|c| text(c, "/type") == "Ready" && text(c, "/status") == "True");
    if phase == "Running" && ready {
        return None;
    }
    let waiting: Vec<String> = array(pod, "/status/containerStatuses")
        .iter()
        .filter(|s| s.get("ready").and_then(Value::as_bool) != Some(true))
        .map(|s| {
            let reason = ["/state/waiting/reason", "/state/terminated/reason"]
                .iter()
                .map(|p| text(s, p))
                .find(|r| !r.is_empty())
                .unwrap_or("not ready");
            format!("container {} {reason}", text(s, "/name"))
        })
        .collect();
    let phase = if phase.is_empty() { "no phase" } else { phase };
    if waiting.is_empty() {
        Some(format!("phase {phase}"))
    } else {
        Some(format!("phase {phase}, {}", waiting.join(", ")))
    }
}

fn allows(rule: &Value, p: &Permission) -> bool {
    let has = |field: &str, want: &str| {
        array(rule, field)
            .iter()
            .filter_map(Value::as_str)
            .any(|v| v == want || v == "*")
    };
    has("/apiGroups", &p.group) && has("/resources", &p.resource) && has("/verbs", p.verb)
}

/// The ClusterRoles bound to each controller's ServiceAccount grant what
/// it needs (`needs()`); RoleBindings are not counted, as the controllers
/// read across namespaces.
pub fn rbac(snap: &Snapshot, config: &Config) -> CheckResult {
    let ns = config.namespace.as_str();
    let mut findings = Vec::new();
    for (deployment, wanted) in needs() {
        let Some(d) = snap.find("Deployment", ns, deployment) else {
            continue;
        };
        let sa = [
            "/spec/template/spec/serviceAccountName",
            "/spec/template/spec/serviceAccount",
        ]
        .iter()
        .map(|p| text(d, p))
        .find(|s| !s.is_empty())
        .unwrap_or("default");
        let sa_ref = ObjectRef::new("ServiceAccount", Some(ns), sa);
        if snap.find("ServiceAccount", ns, sa).is_none() && sa != "default" {
            findings.push(Finding::fail(
                format!("{sa_ref} (of deployment {ns}/{deployment}) does not exist"),
                vec![sa_ref.clone(), object_ref(d)],
            ));
        }
        let roles: Vec<&Value> = snap
            .of_kind("ClusterRoleBinding")
            .filter(|b| {
                array(b, "/subjects").iter().any(|s| {
                    text(s, "/kind") == "ServiceAccount"
                        && text(s, "/name") == sa
                        && text(s, "/namespace") == ns
                })
            })
            .filter(|b| text(b, "/roleRef/kind") == "ClusterRole")
            .filter_map(|b| snap.find("ClusterRole", "", text(b, "/roleRef/name")))
            .collect();
        let missing: Vec<&Permission> = wanted
            .iter()
            .filter(|p| {
                !roles
                    .iter()
                    .any(|r| array(r, "/rules").iter().any(|rule| allows(rule, p)))
            })
            .collect();
        if missing.is_empty() {
            continue;
        }
        // `get, list, watch policy.linkerd.io/servers`, one entry per resource.
        let mut by_resource: BTreeMap<String, Vec<&str>> = BTreeMap::new();
        for p in &missing {
            let resource = if p.group.is_empty() {
                p.resource.clone()
            } else {
                format!("{}/{}", p.group, p.resource)
            };
            by_resource.entry(resource).or_default().push(p.verb);
        }
        let grants: Vec<String> = by_resource
            .iter()
            .map(|(r, verbs)| format!("{} {r}", verbs.join(", ")))
            .collect();
        let bound: Vec<&str> = roles.iter().map(|r| name(r)).collect();
        let bound = if bound.is_empty() {
            "no ClusterRole is bound to it".to_string()
        } else {
            format!("bound ClusterRoles: {}", bound.join(", "))
        };
        let mut objects = vec![sa_ref.clone(), object_ref(d)];
        objects.extend(roles.iter().map(|r| object_ref(r)));
        findings.push(Finding::fail(
            format!(
                "{sa_ref} ({deployment}) may not {} ({bound})",
                grants.join("; ")
            ),
            objects,
        ));
    }
    CheckResult::ran(CATEGORY, RBAC, findings)
}

/// The policy CRDs the destination controller watches. A missing one is a
/// warning: the controller serves none of that kind until it appears.
pub fn crds(snap: &Snapshot) -> CheckResult {
    let mut findings = Vec::new();
    // What is installed, next to what Ballast reads, for every kind.
    let mut detail = Vec::new();
    for (group, version, plural) in ballast_controlplane::WATCHED_RESOURCES {
        if BUILT_IN_GROUPS.contains(group) {
            continue;
        }
        let crd_name = format!("{plural}.{group}");
        let crd_ref = ObjectRef::new("CustomResourceDefinition", None, &crd_name);
        let Some(crd) = snap.find("CustomResourceDefinition", "", &crd_name) else {
            findings.push(Finding::warn(
                format!("{crd_ref} is not installed: the destination controller serves no {plural}.{group}"),
                vec![crd_ref],
            ));
            continue;
        };
        let installed: Vec<&str> = array(crd, "/spec/versions")
            .iter()
            .filter(|v| v.get("served").and_then(Value::as_bool) == Some(true))
            .map(|v| text(v, "/name"))
            .collect();
        let served = installed.contains(version);
        detail.push(format!(
            "{crd_name}: reads {version}, served {}",
            if installed.is_empty() {
                "none".to_string()
            } else {
                installed.join(", ")
            }
        ));
        if !served {
            findings.push(Finding::warn(
                format!("{crd_ref} does not serve version {version}, which the destination controller reads"),
                vec![crd_ref],
            ));
        }
    }
    let result = CheckResult::ran(CATEGORY, CRDS, findings);
    if detail.is_empty() {
        result
    } else {
        result.with_detail(detail.join("\n"))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::report::Status;
    use serde_json::json;

    pub fn deployment(name: &str, sa: &str) -> Value {
        // The flags `ballast install` gives each controller that name the mesh.
        let mut args = vec!["--controller-namespace=ballast".to_string()];
        if name == DESTINATION {
            args.extend([
                "--service-account=ballast-destination".into(),
                "--namespace=ballast".into(),
                "--identity-trust-anchors=/var/run/linkerd/identity/trust-roots/ca-bundle.crt"
                    .into(),
            ]);
        }
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": "ballast"},
            "spec": {"selector": {"matchLabels": {"app.kubernetes.io/name": name}},
                     "template": {"metadata": {"labels": {"app.kubernetes.io/name": name}},
                                  "spec": {"serviceAccountName": sa, "containers": [{"name": "c", "args": args}]}}}})
    }

    pub fn ready_pod(deployment: &str, n: usize) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("{deployment}-{n}"), "namespace": "ballast",
                         "labels": {"app.kubernetes.io/name": deployment}},
            "spec": {"containers": [{"name": "c"}]},
            "status": {"phase": "Running", "podIP": format!("10.1.{n}.{}", deployment.len()),
                       "conditions": [{"type": "Ready", "status": "True"}],
                       "containerStatuses": [{"name": "c", "ready": true}]}})
    }

    fn sa(name: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": "ballast"}})
    }

    fn role_and_binding(name: &str, sa: &str, rules: Value) -> [Value; 2] {
        [
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                   "metadata": {"name": name}, "rules": rules}),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                   "metadata": {"name": name},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                   "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": "ballast"}]}),
        ]
    }

    /// The destination's rules, built from what it watches.
    pub fn destination_rules() -> Value {
        let mut by_group: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (g, _, p) in ballast_controlplane::WATCHED_RESOURCES {
            by_group.entry(g).or_default().push(p);
        }
        Value::Array(
            by_group
                .into_iter()
                .map(|(g, ps)| json!({"apiGroups": [g], "resources": ps, "verbs": ["get", "list", "watch"]}))
                .collect(),
        )
    }

    pub fn crd_objects() -> Vec<Value> {
        let mut out: BTreeMap<String, Value> = BTreeMap::new();
        for (g, v, p) in ballast_controlplane::WATCHED_RESOURCES {
            if g.is_empty() || *g == "discovery.k8s.io" {
                continue;
            }
            let name = format!("{p}.{g}");
            let crd = out.entry(name.clone()).or_insert_with(|| {
                json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                       "metadata": {"name": name}, "spec": {"group": g, "versions": []}})
            });
            crd["spec"]["versions"]
                .as_array_mut()
                .expect("versions")
                .push(json!({"name": v, "served": true, "storage": false}));
        }
        out.into_values().collect()
    }

    /// A healthy control plane, shaped like deploy/.
    pub fn control_plane() -> Vec<Value> {
        let mut v = vec![
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ballast"}}),
            deployment(DESTINATION, "ballast-destination"),
            deployment(IDENTITY, "linkerd-identity"),
            ready_pod(DESTINATION, 1),
            ready_pod(DESTINATION, 2),
            ready_pod(IDENTITY, 1),
            sa("ballast-destination"),
            sa("linkerd-identity"),
        ];
        v.extend(role_and_binding(
            "ballast-destination",
            "ballast-destination",
            destination_rules(),
        ));
        v.extend(role_and_binding(
            "ballast-identity",
            "linkerd-identity",
            json!([{"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]}]),
        ));
        v.extend(crd_objects());
        v
    }

    fn snap(objects: Vec<Value>) -> Snapshot {
        Snapshot::new(Source::Cluster, objects)
    }

    fn names(c: &CheckResult) -> Vec<Vec<String>> {
        c.findings
            .iter()
            .map(|f| f.objects.iter().map(|o| o.to_string()).collect())
            .collect()
    }

    #[test]
    fn a_healthy_control_plane_passes() {
        let s = snap(control_plane());
        let cfg = Config::default();
        for c in [
            namespace_exists(&s, &cfg),
            pods_ready(&s, &cfg),
            rbac(&s, &cfg),
            crds(&s),
        ] {
            assert_eq!(c.status, Status::Ok, "{}: {:?}", c.name, c.findings);
        }
    }

    #[test]
    fn a_missing_namespace_or_deployment_fails() {
        let objects: Vec<Value> = control_plane()
            .into_iter()
            .filter(|o| !matches!(text(o, "/kind"), "Namespace") && name(o) != IDENTITY)
            .collect();
        let s = snap(objects);
        let cfg = Config::default();
        assert_eq!(names(&namespace_exists(&s, &cfg)), [["namespace ballast"]]);
        let c = pods_ready(&s, &cfg);
        assert_eq!(c.status, Status::Fail);
        assert_eq!(names(&c), [["deployment ballast/ballast-identity"]]);
    }

    #[test]
    fn an_unready_control_plane_pod_fails_naming_it() {
        let mut objects = control_plane();
        let pod = objects
            .iter_mut()
            .find(|o| name(o) == "ballast-destination-2")
            .expect("pod");
        pod["status"]["conditions"][0]["status"] = json!("False");
        pod["status"]["containerStatuses"][0] = json!({"name": "c", "ready": false, "state": {"waiting": {"reason": "CrashLoopBackOff"}}});
        let c = pods_ready(&snap(objects), &Config::default());
        assert_eq!(c.status, Status::Fail);
        assert_eq!(
            names(&c),
            [[
                "pod ballast/ballast-destination-2",
                "deployment ballast/ballast-destination"
            ]]
        );
        assert!(c.findings[0].message.contains("CrashLoopBackOff"));
    }

    #[test]
    fn no_pods_fail_on_a_cluster_and_warn_on_manifests() {
        let objects: Vec<Value> = control_plane()
            .into_iter()
            .filter(|o| text(o, "/kind") != "Pod")
            .collect();
        assert_eq!(
            pods_ready(&snap(objects.clone()), &Config::default()).status,
            Status::Fail
        );
        let m = Snapshot::new(Source::Manifests, objects);
        assert_eq!(pods_ready(&m, &Config::default()).status, Status::Warn);
    }

    #[test]
    fn missing_grants_fail_naming_the_service_account_and_role() {
        let mut objects = control_plane();
        let role = objects
            .iter_mut()
            .find(|o| text(o, "/kind") == "ClusterRole" && name(o) == "ballast-destination")
            .expect("role");
        // Drop the policy.linkerd.io rule.
        let rules: Vec<Value> = array(role, "/rules")
            .iter()
            .filter(|r| r["apiGroups"][0] != "policy.linkerd.io")
            .cloned()
            .collect();
        role["rules"] = Value::Array(rules);
        // And unbind identity entirely.
        objects.retain(|o| {
            !(text(o, "/kind") == "ClusterRoleBinding" && name(o) == "ballast-identity")
        });
        let c = rbac(&snap(objects), &Config::default());
        assert_eq!(c.status, Status::Fail);
        assert_eq!(
            names(&c),
            [
                vec![
                    "serviceaccount ballast/ballast-destination",
                    "deployment ballast/ballast-destination",
                    "clusterrole ballast-destination"
                ],
                vec![
                    "serviceaccount ballast/linkerd-identity",
                    "deployment ballast/ballast-identity"
                ]
            ]
        );
        assert!(
            c.findings[0]
                .message
                .contains("get, list, watch policy.linkerd.io/servers"),
            "{}",
            c.findings[0].message
        );
        assert!(c.findings[1]
            .message
            .contains("create authentication.k8s.io/tokenreviews"));
        assert!(c.findings[1].message.contains("no ClusterRole is bound"));
    }

    #[test]
    fn viz_is_optional_but_checked_when_installed() {
        let cfg = Config::default();
        // Installed, unready and without its grants: both checks name it.
        let mut objects = control_plane();
        objects.push(deployment(VIZ, "ballast-viz"));
        objects.push(sa("ballast-viz"));
        let mut pod = ready_pod(VIZ, 1);
        pod["status"]["conditions"][0]["status"] = json!("False");
        objects.push(pod);
        let s = snap(objects.clone());
        let c = pods_ready(&s, &cfg);
        assert_eq!(c.status, Status::Fail);
        assert_eq!(
            names(&c),
            [[
                "pod ballast/ballast-viz-1",
                "deployment ballast/ballast-viz"
            ]]
        );
        let c = rbac(&s, &cfg);
        assert_eq!(c.status, Status::Fail);
        assert_eq!(
            names(&c),
            [[
                "serviceaccount ballast/ballast-viz",
                "deployment ballast/ballast-viz"
            ]]
        );
        assert!(
            c.findings[0].message.contains("get, list, watch pods;"),
            "{}",
            c.findings[0].message
        );
        // Ready and bound to the destination's watches: both pass.
        objects.retain(|o| name(o) != "ballast-viz-1");
        objects.push(ready_pod(VIZ, 1));
        objects.extend(role_and_binding(
            "ballast-viz",
            "ballast-viz",
            destination_rules(),
        ));
        let s = snap(objects);
        assert_eq!(pods_ready(&s, &cfg).status, Status::Ok);
        assert_eq!(rbac(&s, &cfg).status, Status::Ok);
    }

    #[test]
    fn wildcards_grant_everything() {
        let rule = json!({"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]});
        let p = Permission {
            group: "x".into(),
            resource: "y".into(),
            verb: "watch",
        };
        assert!(allows(&rule, &p));
        assert!(!allows(
            &json!({"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}),
            &p
        ));
    }

    #[test]
    fn a_missing_crd_warns_naming_it() {
        let objects: Vec<Value> = control_plane()
            .into_iter()
            .filter(|o| name(o) != "servers.policy.linkerd.io")
            .collect();
        let c = crds(&snap(objects));
        assert_eq!(c.status, Status::Warn);
        assert_eq!(
            names(&c),
            [["customresourcedefinition servers.policy.linkerd.io"]]
        );
    }
}
