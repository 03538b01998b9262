//! `ballast install`: every manifest a cluster needs, rendered from flags.
//!
//! - [`manifests`]: the objects (namespace, RBAC, Deployments, Services,
//!   disruption budgets, the webhook configuration, the key material's
//!   ConfigMap and Secrets), as JSON values.
//! - [`pki`]: the trust anchor and issuer (fresh, or read and checked) and
//!   the webhook's serving certificate.
//! - [`yaml`]: JSON values as deterministic block YAML.
//!
//! Output is deterministic but for key material: the same flags and files
//! give the same text. `deploy/` is [`deploy_files`]: everything but the key
//! material (the trust roots ConfigMap, the issuer and webhook Secrets, and
//! the webhook configuration, which carries its CA), which
//! [`secrets_yaml`] renders alone.

#![forbid(unsafe_code)]

pub mod installed;
pub mod manifests;
pub mod pki;
pub mod yaml;

use pki::{IdentityPki, WebhookTls};
use serde_json::Value;
use std::str::FromStr;

/// The custom resource definitions Ballast reads, passed through as written
/// (deploy/crds/ is their source).
pub const CRDS: &[(&str, &str)] = &[
    (
        "crds/gateway-api.yaml",
        include_str!("../../../deploy/crds/gateway-api.yaml"),
    ),
    (
        "crds/linkerd.yaml",
        include_str!("../../../deploy/crds/linkerd.yaml"),
    ),
];

/// Replicas of each controller: two (a drain or a crash leaves one serving),
/// three with `--ha`.
pub const REPLICAS: u32 = 2;
pub const HA_REPLICAS: u32 = 3;

/// What the API server does when the webhook cannot answer (timeout, error,
/// unreachable): `Ignore` admits the pod unchanged (Linkerd's default),
/// `Fail` refuses it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FailurePolicy {
    #[default]
    Ignore,
    Fail,
}

impl FailurePolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ignore => "Ignore",
            Self::Fail => "Fail",
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not a failure policy: Ignore or Fail")]
pub struct InvalidFailurePolicy(String);

impl FromStr for FailurePolicy {
    type Err = InvalidFailurePolicy;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "Ignore" => Ok(Self::Ignore),
            "Fail" => Ok(Self::Fail),
            other => Err(InvalidFailurePolicy(other.to_string())),
        }
    }
}

/// Everything `ballast install` renders from.
#[derive(Clone, Debug)]
pub struct InstallConfig {
    /// The control plane's namespace.
    pub namespace: String,
    /// The `ballast` image the controllers and the injector run.
    pub controller_image: String,
    /// Images injected proxies and init containers run.
    pub proxy_image: String,
    pub init_image: String,
    pub image_pull_policy: String,
    pub cluster_domain: String,
    pub trust_domain: String,
    /// The controllers' `BALLAST_LOG`.
    pub log_level: String,
    /// Three replicas each, never two on a node.
    pub ha: bool,
    pub webhook_failure_policy: FailurePolicy,
    pub webhook_timeout_seconds: u32,
    /// Print the CRDs with the rest (`install_yaml`). Off for clusters that
    /// have Gateway API or Linkerd's own, which ours would replace.
    pub crds: bool,
    /// The destination controller's heap in transparent huge pages
    /// ([`HEAP_HUGE_PAGES_ENV`]): a faster fan-out for a little more
    /// resident memory. On by default.
    pub controller_huge_pages: bool,
    /// What the destination controller is given as the mesh grows.
    pub destination: DestinationSize,
}

/// The destination controller's container resources and stream limits: the
/// settings that grow with the mesh (its memory budget is three quarters of
/// the memory limit; a stream costs about 2 KB, bench/RESULTS.md). Checked
/// by the command that takes them, as Kubernetes quantities.
#[derive(Clone, Debug, PartialEq)]
pub struct DestinationSize {
    pub cpu_request: String,
    pub memory_request: String,
    pub memory_limit: String,
    /// Rendered as both `--max-streams` and `--max-policy-streams`; `None`
    /// leaves the controller's own defaults (20,000 each).
    pub max_streams: Option<u32>,
}

impl Default for DestinationSize {
    fn default() -> Self {
        Self {
            cpu_request: "100m".into(),
            memory_request: "64Mi".into(),
            memory_limit: "256Mi".into(),
            max_streams: None,
        }
    }
}

/// The environment variable, and its value, that puts a `ballast` process's
/// heap (jemalloc, with its `_rjem_` prefix) in transparent huge pages,
/// its metadata included, in one arena: with an arena per thread (the
/// default, four per CPU) each arena takes whole 2 MiB pages and an idle
/// controller's resident memory doubled; with one it grows by about 2 MiB
/// (bench/RESULTS.md). The kernel must allow huge pages (`always` or
/// `madvise` in /sys/kernel/mm/transparent_hugepage/enabled); where it does
/// not, the heap stays in 4 KiB pages.
pub const HEAP_HUGE_PAGES_ENV: (&str, &str) = (
    "_RJEM_MALLOC_CONF",
    "thp:always,metadata_thp:always,narenas:1",
);

impl Default for InstallConfig {
    fn default() -> Self {
        Self {
            namespace: ballast_controlplane::DEFAULT_NAMESPACE.into(),
            controller_image: "ballast:latest".into(),
            proxy_image: "ballast-proxy:latest".into(),
            init_image: "ballast-init:latest".into(),
            image_pull_policy: "IfNotPresent".into(),
            cluster_domain: "cluster.local".into(),
            trust_domain: "cluster.local".into(),
            log_level: "info".into(),
            ha: false,
            webhook_failure_policy: FailurePolicy::Ignore,
            webhook_timeout_seconds: 10,
            crds: true,
            controller_huge_pages: true,
            destination: DestinationSize::default(),
        }
    }
}

impl InstallConfig {
    /// The names the installed pieces agree on.
    pub fn control_plane(&self) -> ballast_controlplane::ControlPlane {
        ballast_controlplane::ControlPlane {
            namespace: self.namespace.clone(),
            cluster_domain: self.cluster_domain.clone(),
            trust_domain: self.trust_domain.clone(),
        }
    }

    pub fn replicas(&self) -> u32 {
        if self.ha {
            HA_REPLICAS
        } else {
            REPLICAS
        }
    }
}

/// Where a document goes: a file of deploy/, or with the key material.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    Deploy(&'static str),
    Secret,
}

/// One manifest, with the comment written above it.
#[derive(Clone, Debug)]
pub struct Document {
    pub part: Part,
    pub comment: String,
    pub value: Value,
}

impl Document {
    fn write(&self, out: &mut String) {
        for line in self.comment.lines() {
            out.push_str(if line.is_empty() { "#" } else { "# " });
            out.push_str(line);
            out.push('\n');
        }
        out.push_str(&yaml::to_yaml(&self.value));
    }
}

/// The key material a full install carries.
#[derive(Clone, Debug)]
pub struct KeyMaterial {
    pub identity: IdentityPki,
    pub webhook: WebhookTls,
}

/// The documents without key material, in apply order (CRDs apart).
pub fn documents(c: &InstallConfig) -> Vec<Document> {
    let mut docs = manifests::namespace(c);
    docs.extend(manifests::destination_rbac(c));
    docs.extend(manifests::identity(c));
    docs.extend(manifests::destination(c));
    docs.extend(manifests::injector(c));
    docs.extend(manifests::viz(c));
    docs
}

/// Every manifest, for `kubectl apply -f -`: the namespace, the CRDs, RBAC,
/// the key material, the controllers, and last the webhook configuration
/// (so that the injector exists before the API server calls it).
pub fn install_yaml(c: &InstallConfig, material: &KeyMaterial) -> String {
    let mut out = String::from(
        "# Ballast's control plane, from `ballast install`: apply with `kubectl apply -f -`.\n",
    );
    let docs = documents(c);
    let (namespace, rest) = docs.split_at(1);
    let secrets = manifests::secrets(c, material);
    let (webhook, key_material): (Vec<_>, Vec<_>) = secrets
        .iter()
        .partition(|d| d.value["kind"] == "MutatingWebhookConfiguration");
    namespace[0].write(&mut out);
    for (_, text) in CRDS.iter().filter(|_| c.crds) {
        out.push_str("---\n");
        out.push_str(text);
        if !text.ends_with('\n') {
            out.push('\n');
        }
    }
    for d in key_material.into_iter().chain(rest).chain(webhook) {
        out.push_str("---\n");
        d.write(&mut out);
    }
    out
}

/// What `ballast uninstall` prints for `kubectl delete -f -`: a reference
/// (apiVersion, kind, name, namespace) to every object `install` makes,
/// the webhook configuration first (so that no pod creation waits on an
/// injector being deleted) and the namespace last. The CRDs only with
/// `include_crds`: deleting them deletes every route and policy object in
/// the cluster, whoever made it.
pub fn uninstall_yaml(c: &InstallConfig, include_crds: bool) -> String {
    // Names only: the key material's contents do not matter here.
    let material_free = [
        (
            "v1",
            "ConfigMap",
            Some(c.namespace.as_str()),
            manifests::TRUST_ROOTS_CONFIG_MAP,
        ),
        (
            "v1",
            "Secret",
            Some(c.namespace.as_str()),
            manifests::ISSUER_SECRET,
        ),
        (
            "v1",
            "Secret",
            Some(c.namespace.as_str()),
            manifests::INJECTOR_TLS_SECRET,
        ),
    ];
    let reference = |api_version: &str, kind: &str, ns: Option<&str>, name: &str| {
        let mut metadata = serde_json::json!({ "name": name });
        if let Some(ns) = ns {
            metadata["namespace"] = ns.into();
        }
        serde_json::json!({"apiVersion": api_version, "kind": kind, "metadata": metadata})
    };
    let of = |v: &Value| {
        reference(
            v["apiVersion"].as_str().unwrap_or(""),
            v["kind"].as_str().unwrap_or(""),
            v["metadata"]["namespace"].as_str(),
            v["metadata"]["name"].as_str().unwrap_or(""),
        )
    };
    let mut refs = vec![reference(
        "admissionregistration.k8s.io/v1",
        "MutatingWebhookConfiguration",
        None,
        manifests::WEBHOOK_CONFIGURATION,
    )];
    let docs = documents(c);
    let (namespace, rest) = docs.split_at(1);
    refs.extend(rest.iter().rev().map(|d| of(&d.value)));
    refs.extend(
        material_free
            .iter()
            .map(|(a, k, ns, name)| reference(a, k, *ns, name)),
    );
    if include_crds {
        for (_, text) in CRDS {
            for name in text
                .lines()
                .filter_map(|l| l.strip_prefix("  name: "))
                .filter(|n| n.contains('.'))
            {
                refs.push(reference(
                    "apiextensions.k8s.io/v1",
                    "CustomResourceDefinition",
                    None,
                    name.trim(),
                ));
            }
        }
    }
    refs.extend(namespace.iter().map(|d| of(&d.value)));
    let mut out = String::from(
        "# Ballast's control plane, from `ballast uninstall`: delete with `kubectl delete -f -`.\n",
    );
    for (i, r) in refs.iter().enumerate() {
        if i > 0 {
            out.push_str("---\n");
        }
        out.push_str(&yaml::to_yaml(r));
    }
    out
}

/// The key material alone (the trust roots ConfigMap, the issuer and
/// webhook Secrets, the webhook configuration with its CA), to apply after
/// deploy/.
pub fn secrets_yaml(c: &InstallConfig, material: &KeyMaterial) -> String {
    let mut out = String::from(
        "# Ballast's key material, from `ballast install --secrets-only`: apply after deploy/.\n",
    );
    for (i, d) in manifests::secrets(c, material).iter().enumerate() {
        if i > 0 {
            out.push_str("---\n");
        }
        d.write(&mut out);
    }
    out
}

const DEPLOY_HEADER: &str = "\
# Generated by `cargo run -- install --deploy-dir deploy/` (crates/install): do not
# edit; crates/ballast/tests/install.rs keeps these files equal to its output.
# deploy/ holds no key material: after `kubectl apply -f deploy/crds/ -f deploy/`,
# create it with `ballast install --secrets-only | kubectl apply -f -` (see
# identity.yaml and injector.yaml), or apply `ballast install` alone instead.
";

/// Extra header lines of some files.
fn file_note(file: &str) -> &'static str {
    match file {
        "identity.yaml" => {
            "#\n\
             # The identity controller needs the issuer Secret `linkerd-identity-issuer`\n\
             # (tls.crt, tls.key) and the ConfigMap `linkerd-identity-trust-roots`\n\
             # (ca-bundle.crt). `ballast install --secrets-only` makes both (fresh, or from\n\
             # --identity-trust-anchors-file, --identity-issuer-certificate-file and\n\
             # --identity-issuer-key-file); from your own PKI:\n\
             #   kubectl -n ballast create secret tls linkerd-identity-issuer --cert=issuer.crt --key=issuer.key\n\
             #   kubectl -n ballast create configmap linkerd-identity-trust-roots --from-file=ca-bundle.crt=ca.crt\n"
        }
        "injector.yaml" => {
            "#\n\
             # The webhook configuration (MutatingWebhookConfiguration\n\
             # `ballast-proxy-injector-webhook-config`) and the injector's serving\n\
             # certificate (Secret `ballast-injector-k8s-tls`) carry key material: they\n\
             # come from `ballast install --secrets-only`.\n"
        }
        "viz.yaml" => {
            "#\n\
             # viz taps proxies over mutual TLS as `ballast-viz`: it reads the ConfigMap\n\
             # `linkerd-identity-trust-roots` (from `ballast install --secrets-only`, see\n\
             # identity.yaml) and gets its certificate from the identity controller.\n"
        }
        _ => "",
    }
}

/// deploy/'s files (path relative to deploy/, contents): everything but the
/// key material, one file per component, and the CRDs as written.
pub fn deploy_files(c: &InstallConfig) -> Vec<(String, String)> {
    let mut files: Vec<(&'static str, Vec<Document>)> = Vec::new();
    for d in documents(c) {
        let Part::Deploy(file) = d.part else { continue };
        match files.iter_mut().find(|(f, _)| *f == file) {
            Some((_, docs)) => docs.push(d),
            None => files.push((file, vec![d])),
        }
    }
    let mut out: Vec<(String, String)> = files
        .into_iter()
        .map(|(file, docs)| {
            let mut text = String::from(DEPLOY_HEADER);
            text.push_str(file_note(file));
            for (i, d) in docs.iter().enumerate() {
                if i > 0 {
                    text.push_str("---\n");
                }
                d.write(&mut text);
            }
            (file.to_string(), text)
        })
        .collect();
    out.extend(CRDS.iter().map(|(f, t)| (f.to_string(), t.to_string())));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn material(c: &InstallConfig) -> KeyMaterial {
        KeyMaterial {
            identity: IdentityPki::generate(&c.trust_domain).unwrap(),
            webhook: WebhookTls::generate(
                manifests::INJECTOR,
                &c.namespace,
                &c.cluster_domain,
                pki::WEBHOOK_CERT_LIFETIME,
            )
            .unwrap(),
        }
    }

    fn parse(text: &str) -> Vec<Value> {
        serde_saphyr::from_multiple::<Value>(text)
            .unwrap_or_else(|e| panic!("does not parse: {e}\n{text}"))
            .into_iter()
            .filter(|d| !d.is_null())
            .collect()
    }

    fn kinds(docs: &[Value]) -> Vec<String> {
        docs.iter()
            .map(|d| {
                format!(
                    "{}/{}",
                    d["kind"].as_str().unwrap(),
                    d["metadata"]["name"].as_str().unwrap()
                )
            })
            .collect()
    }

    #[test]
    fn install_holds_every_object_in_apply_order() {
        let c = InstallConfig {
            namespace: "mesh".into(),
            ..InstallConfig::default()
        };
        let m = material(&c);
        let docs = parse(&install_yaml(&c, &m));
        let kinds = kinds(&docs);
        let at = |k: &str| {
            kinds
                .iter()
                .position(|x| x == k)
                .unwrap_or_else(|| panic!("no {k} in {kinds:?}"))
        };
        assert_eq!(at("Namespace/mesh"), 0);
        let webhook = at("MutatingWebhookConfiguration/ballast-proxy-injector-webhook-config");
        assert_eq!(webhook, kinds.len() - 1, "the webhook last");
        for crd in [
            "httproutes.gateway.networking.k8s.io",
            "servers.policy.linkerd.io",
        ] {
            assert!(
                at(&format!("CustomResourceDefinition/{crd}"))
                    < at("ClusterRole/ballast-destination")
            );
        }
        for app in [
            "ballast-destination",
            "ballast-identity",
            "ballast-injector",
            "ballast-viz",
        ] {
            assert!(at(&format!("Deployment/{app}")) < webhook);
            assert!(at(&format!("PodDisruptionBudget/{app}")) > 0);
        }
        assert!(at("Secret/linkerd-identity-issuer") < at("Deployment/ballast-identity"));
        assert!(at("ConfigMap/linkerd-identity-trust-roots") < at("Deployment/ballast-identity"));
        assert!(at("Secret/ballast-injector-k8s-tls") < at("Deployment/ballast-injector"));

        // Everything namespaced lives in the control plane's namespace.
        for d in &docs {
            let ns = &d["metadata"]["namespace"];
            assert!(ns.is_null() || ns == "mesh", "{d}");
        }
        // The key material is what was given.
        let cm = &docs[at("ConfigMap/linkerd-identity-trust-roots")];
        assert_eq!(cm["data"]["ca-bundle.crt"], m.identity.trust_anchors_pem);
        use base64::Engine;
        let decode = |v: &Value| {
            String::from_utf8(
                base64::engine::general_purpose::STANDARD
                    .decode(v.as_str().unwrap())
                    .unwrap(),
            )
            .unwrap()
        };
        let issuer = &docs[at("Secret/linkerd-identity-issuer")];
        assert_eq!(
            decode(&issuer["data"]["tls.crt"]),
            m.identity.issuer_cert_pem
        );
        assert_eq!(
            decode(&issuer["data"]["tls.key"]),
            m.identity.issuer_key_pem
        );
        let hook = &docs[webhook]["webhooks"][0];
        assert_eq!(decode(&hook["clientConfig"]["caBundle"]), m.webhook.ca_pem);
        assert_eq!(hook["clientConfig"]["service"]["namespace"], "mesh");
        assert_eq!(hook["failurePolicy"], "Ignore");
        assert_eq!(hook["sideEffects"], "None");
        assert_eq!(hook["admissionReviewVersions"], serde_json::json!(["v1"]));
        let excluded = &hook["namespaceSelector"]["matchExpressions"][1]["values"];
        assert_eq!(excluded, &serde_json::json!(["kube-system", "mesh"]));
    }

    #[test]
    fn ha_gives_three_spread_replicas_and_every_controller_a_budget() {
        for ha in [false, true] {
            let c = InstallConfig {
                ha,
                ..InstallConfig::default()
            };
            let docs: Vec<Value> = documents(&c).into_iter().map(|d| d.value).collect();
            let deployments: Vec<&Value> =
                docs.iter().filter(|d| d["kind"] == "Deployment").collect();
            assert_eq!(deployments.len(), 4);
            for d in deployments {
                let name = d["metadata"]["name"].as_str().unwrap();
                assert_eq!(d["spec"]["replicas"], if ha { 3 } else { 2 }, "{name}");
                let anti = &d["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"];
                let required = &anti["requiredDuringSchedulingIgnoredDuringExecution"];
                assert_eq!(
                    required.is_array(),
                    ha,
                    "{name}: hard anti-affinity only in HA"
                );
                let pdb = docs
                    .iter()
                    .find(|p| p["kind"] == "PodDisruptionBudget" && p["metadata"]["name"] == name)
                    .unwrap_or_else(|| panic!("{name} has no disruption budget"));
                assert_eq!(pdb["spec"]["maxUnavailable"], 1);
                assert_eq!(
                    pdb["spec"]["selector"]["matchLabels"],
                    d["spec"]["selector"]["matchLabels"]
                );
            }
        }
    }

    #[test]
    fn huge_pages_are_asked_for_the_destination_controller_only_and_only_when_set() {
        for huge in [false, true] {
            let c = InstallConfig {
                controller_huge_pages: huge,
                ..InstallConfig::default()
            };
            for d in documents(&c).into_iter().map(|d| d.value) {
                if d["kind"] != "Deployment" {
                    continue;
                }
                let name = d["metadata"]["name"].as_str().unwrap().to_string();
                let env = &d["spec"]["template"]["spec"]["containers"][0]["env"];
                let (key, value) = HEAP_HUGE_PAGES_ENV;
                let asked = env
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|e| e["name"] == key && e["value"] == value);
                let want = huge && name == manifests::DESTINATION;
                assert_eq!(asked, want, "{name}: {env}");
                assert!(env[0]["name"] == "BALLAST_LOG", "{name}: {env}");
            }
        }
    }

    #[test]
    fn the_destination_controllers_size_is_its_own_and_the_others_keep_theirs() {
        let sized = DestinationSize {
            cpu_request: "1500m".into(),
            memory_request: "256Mi".into(),
            memory_limit: "1Gi".into(),
            max_streams: Some(50_000),
        };
        for size in [DestinationSize::default(), sized] {
            let c = InstallConfig {
                destination: size.clone(),
                ..InstallConfig::default()
            };
            for d in documents(&c).into_iter().map(|d| d.value) {
                if d["kind"] != "Deployment" {
                    continue;
                }
                let name = d["metadata"]["name"].as_str().unwrap().to_string();
                let container = &d["spec"]["template"]["spec"]["containers"][0];
                let resources = &container["resources"];
                let args: Vec<&str> = container["args"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter_map(Value::as_str)
                    .collect();
                let limits: Vec<&&str> = args
                    .iter()
                    .filter(|a| a.starts_with("--max-streams") || a.starts_with("--max-policy"))
                    .collect();
                if name == manifests::DESTINATION {
                    assert_eq!(resources["requests"]["cpu"], size.cpu_request.as_str());
                    assert_eq!(
                        resources["requests"]["memory"],
                        size.memory_request.as_str()
                    );
                    assert_eq!(resources["limits"]["memory"], size.memory_limit.as_str());
                    let want = match size.max_streams {
                        Some(n) => vec![
                            format!("--max-streams={n}"),
                            format!("--max-policy-streams={n}"),
                        ],
                        None => Vec::new(),
                    };
                    assert_eq!(
                        limits.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
                        want
                    );
                } else {
                    // The other controllers do not grow with streams.
                    assert_eq!(resources["requests"]["cpu"], "100m", "{name}");
                    assert!(limits.is_empty(), "{name}: {args:?}");
                }
            }
        }
    }

    #[test]
    fn output_is_deterministic_but_for_key_material() {
        let c = InstallConfig::default();
        let m = material(&c);
        assert_eq!(install_yaml(&c, &m), install_yaml(&c, &m));
        assert_eq!(deploy_files(&c), deploy_files(&c));
        // deploy/'s files hold no key material, and the rest of the install.
        let deploy = deploy_files(&c)
            .into_iter()
            .map(|(_, t)| t)
            .collect::<Vec<_>>()
            .join("---\n");
        assert!(!deploy.contains("BEGIN"));
        let deploy_docs = parse(&deploy);
        let all = parse(&install_yaml(&c, &m));
        let secret_docs = parse(&secrets_yaml(&c, &m));
        assert_eq!(all.len(), deploy_docs.len() + secret_docs.len());
        for d in deploy_docs.iter().chain(&secret_docs) {
            assert!(all.contains(d), "missing from the install: {d}");
        }
    }

    #[test]
    fn viz_reads_what_the_destination_reads_and_serves_the_dashboard() {
        let c = InstallConfig {
            namespace: "mesh".into(),
            trust_domain: "example.org".into(),
            ..InstallConfig::default()
        };
        let docs: Vec<Value> = documents(&c).into_iter().map(|d| d.value).collect();
        let find = |kind: &str, name: &str| {
            docs.iter()
                .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
                .unwrap_or_else(|| panic!("no {kind}/{name}"))
        };
        // The same source, the same read-only rules.
        assert_eq!(
            find("ClusterRole", "ballast-viz")["rules"],
            find("ClusterRole", "ballast-destination")["rules"]
        );
        let binding = find("ClusterRoleBinding", "ballast-viz");
        assert_eq!(binding["roleRef"]["name"], "ballast-viz");
        assert_eq!(
            binding["subjects"][0],
            serde_json::json!({"kind": "ServiceAccount", "name": "ballast-viz", "namespace": "mesh"})
        );
        assert_eq!(
            find("ServiceAccount", "ballast-viz")["metadata"]["namespace"],
            "mesh"
        );

        let pod = &find("Deployment", "ballast-viz")["spec"]["template"]["spec"];
        // Its service account is its identity's name.
        assert_eq!(pod["serviceAccountName"], "ballast-viz");
        let container = &pod["containers"][0];
        let args: Vec<&str> = container["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert_eq!(args[0], "viz");
        for want in [
            "--addr=0.0.0.0:8084",
            "--admin-addr=0.0.0.0:9994",
            "--identity-trust-domain=example.org",
            "--service-account=ballast-viz",
            "--namespace=mesh",
        ] {
            assert!(args.contains(&want), "{want} not in {args:?}");
        }
        // Certified by the identity controller: the anchors and a token for it.
        assert!(args.contains(
            &"--identity-trust-anchors=/var/run/linkerd/identity/trust-roots/ca-bundle.crt"
        ));
        assert!(
            args.contains(&"--identity-addr=ballast-identity-headless.mesh.svc.cluster.local:8080")
        );
        let token = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find_map(|v| v["projected"]["sources"][0]["serviceAccountToken"].as_object())
            .expect("a projected token");
        assert_eq!(token["audience"], "identity.l5d.io");
        let token_file = format!(
            "/var/run/secrets/tokens/{}",
            token["path"].as_str().unwrap()
        );
        assert!(args.contains(&format!("--identity-token-file={token_file}").as_str()));
        assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/ready");
        assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/live");
        assert_eq!(
            container["ports"],
            serde_json::json!([{"name": "http", "containerPort": 8084}, {"name": "admin", "containerPort": 9994}])
        );
        let svc = find("Service", "ballast-viz");
        assert_eq!(
            svc["spec"]["ports"],
            serde_json::json!([{"name": "http", "port": 8084, "targetPort": "http"}])
        );
        assert_eq!(
            svc["spec"]["selector"]["app.kubernetes.io/name"],
            "ballast-viz"
        );
    }

    #[test]
    fn failure_policy_parses_only_its_two_values() {
        assert_eq!(
            "Fail".parse::<FailurePolicy>().unwrap(),
            FailurePolicy::Fail
        );
        assert_eq!(
            "Ignore".parse::<FailurePolicy>().unwrap(),
            FailurePolicy::Ignore
        );
        assert!("fail".parse::<FailurePolicy>().is_err());
    }

    #[test]
    fn crds_can_be_left_out_and_keep_upstreams_versions() {
        let c = InstallConfig::default();
        let m = material(&c);
        let with = install_yaml(&c, &m);
        let without = install_yaml(
            &InstallConfig {
                crds: false,
                ..c.clone()
            },
            &m,
        );
        assert!(with.contains("kind: CustomResourceDefinition"));
        assert!(!without.contains("kind: CustomResourceDefinition"));
        assert!(without.contains("kind: Deployment"));
        // Every version upstream serves is served, one stored: objects a
        // cluster already holds under an older version stay readable.
        let docs: Vec<serde_json::Value> =
            serde_saphyr::from_multiple(&with).expect("install output parses");
        let versions = |name: &str| -> (Vec<String>, Vec<String>) {
            let crd = docs
                .iter()
                .find(|d| d["kind"] == "CustomResourceDefinition" && d["metadata"]["name"] == name)
                .unwrap_or_else(|| panic!("no CRD {name}"));
            let all = crd["spec"]["versions"].as_array().expect("versions");
            let names = |f: &dyn Fn(&serde_json::Value) -> bool| {
                all.iter()
                    .filter(|v| f(v))
                    .map(|v| v["name"].as_str().unwrap_or("").to_string())
                    .collect()
            };
            (
                names(&|v| v["served"] == true),
                names(&|v| v["storage"] == true),
            )
        };
        assert_eq!(
            versions("servers.policy.linkerd.io"),
            (
                vec![
                    "v1alpha1".into(),
                    "v1beta1".into(),
                    "v1beta2".into(),
                    "v1beta3".into()
                ],
                vec!["v1beta3".into()]
            )
        );
        assert_eq!(
            versions("httproutes.gateway.networking.k8s.io"),
            (vec!["v1beta1".into(), "v1".into()], vec!["v1".into()])
        );
        assert_eq!(
            versions("serviceprofiles.linkerd.io"),
            (
                vec!["v1alpha1".into(), "v1alpha2".into()],
                vec!["v1alpha2".into()]
            )
        );
    }

    #[test]
    fn uninstall_names_every_installed_object_webhook_first_namespace_last() {
        let c = InstallConfig::default();
        let installed: Vec<Value> =
            serde_saphyr::from_multiple(&install_yaml(&c, &material(&c))).expect("parses");
        let key = |v: &Value| {
            format!(
                "{} {} {}/{}",
                v["apiVersion"].as_str().unwrap_or(""),
                v["kind"].as_str().unwrap_or(""),
                v["metadata"]["namespace"].as_str().unwrap_or(""),
                v["metadata"]["name"].as_str().unwrap_or("")
            )
        };
        for include_crds in [false, true] {
            let text = uninstall_yaml(&c, include_crds);
            let refs: Vec<Value> = serde_saphyr::from_multiple(&text).expect("parses");
            assert_eq!(refs[0]["kind"], "MutatingWebhookConfiguration");
            assert_eq!(
                refs.last().map(|r| &r["kind"]),
                Some(&Value::from("Namespace"))
            );
            let mut want: Vec<String> = installed
                .iter()
                .filter(|v| include_crds || v["kind"] != "CustomResourceDefinition")
                .map(key)
                .collect();
            let mut got: Vec<String> = refs.iter().map(key).collect();
            want.sort();
            got.sort();
            assert_eq!(got, want, "include_crds {include_crds}");
            // References only: no spec, no key material.
            assert!(refs
                .iter()
                .all(|r| r.get("spec").is_none() && r.get("data").is_none()));
        }
    }
}
