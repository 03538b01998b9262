//! The control plane's objects, as JSON values: what each controller needs
//! and nothing more (RBAC checked by crates/ballast/tests/deploy.rs).

use crate::{Document, FailurePolicy, InstallConfig, Part};
use serde_json::{json, Value};

/// Every Deployment's container runs as this non-root uid (distroless'
/// `nonroot`).
const RUN_AS: u32 = 65532;

// The names every piece must agree on come from one place.
pub use ballast_controlplane::object::{
    DESTINATION, IDENTITY, IDENTITY_SERVICE_ACCOUNT, INJECTOR, ISSUER_SECRET,
    TRUST_ROOTS_CONFIG_MAP, VIZ,
};
/// The webhook's serving certificate (Linkerd: `linkerd-proxy-injector-k8s-tls`).
pub const INJECTOR_TLS_SECRET: &str = "ballast-injector-k8s-tls";
pub const WEBHOOK_CONFIGURATION: &str = "ballast-proxy-injector-webhook-config";
/// The path the injector serves AdmissionReviews on.
pub const WEBHOOK_PATH: &str = "/inject";
/// Ports: Linkerd's proxy-injector (8443, admin 9995); the controllers' as deploy/ had them.
pub const INJECTOR_PORT: u16 = 8443;
pub const INJECTOR_ADMIN_PORT: u16 = 9995;
/// Linkerd viz web's port (the dashboard and JSON API), and viz's admin port.
pub const VIZ_PORT: u16 = ballast_controlplane::port::VIZ;
pub const VIZ_ADMIN_PORT: u16 = 9994;
/// The label (on a namespace or a pod) that keeps the webhook away, as Linkerd's.
pub const WEBHOOKS_LABEL: &str = "config.linkerd.io/admission-webhooks";

const TRUST_ROOTS_KEY: &str = ballast_controlplane::object::TRUST_ROOTS_KEY;
const ISSUER_MOUNT: &str = "/var/run/linkerd/identity/issuer";
const TRUST_ROOTS_MOUNT: &str = "/var/run/linkerd/identity/trust-roots";
const INJECTOR_TLS_MOUNT: &str = "/var/run/ballast/injector/tls";
/// Where viz and the destination controller read their service-account
/// token for the identity controller (Linkerd's audience and file name, as
/// injected proxies have it).
const TOKEN_MOUNT: &str = "/var/run/secrets/tokens";
const IDENTITY_TOKEN_FILE: &str = "linkerd-identity-token";
const IDENTITY_TOKEN_AUDIENCE: &str = "identity.l5d.io";

/// The trust anchors ConfigMap, mounted read-only (mount, volume).
fn trust_roots_volume() -> (Value, Value) {
    (
        json!({"name": "trust-roots", "mountPath": TRUST_ROOTS_MOUNT, "readOnly": true}),
        json!({"name": "trust-roots", "configMap": {"name": TRUST_ROOTS_CONFIG_MAP}}),
    )
}

/// The projected service-account token a controller sends the identity
/// controller for its own certificate (mount, volume).
fn identity_token_volume() -> (Value, Value) {
    (
        json!({"name": "identity-token", "mountPath": TOKEN_MOUNT, "readOnly": true}),
        json!({"name": "identity-token", "projected": {"sources": [{"serviceAccountToken": {
            "audience": IDENTITY_TOKEN_AUDIENCE,
            "expirationSeconds": 86400,
            "path": IDENTITY_TOKEN_FILE,
        }}]}}),
    )
}

/// Every object's labels; the version is what `ballast version` reports.
fn labels(app: &str) -> Value {
    json!({
        "app.kubernetes.io/name": app,
        "app.kubernetes.io/part-of": "ballast",
        "app.kubernetes.io/version": env!("CARGO_PKG_VERSION"),
    })
}

fn metadata(app: &str, name: &str, ns: Option<&str>) -> Value {
    let mut m = json!({"name": name, "labels": labels(app)});
    if let Some(ns) = ns {
        m["namespace"] = json!(ns);
    }
    m
}

fn doc(part: Part, comment: &str, value: Value) -> Document {
    Document {
        part,
        comment: comment.to_string(),
        value,
    }
}

pub fn namespace(c: &InstallConfig) -> Vec<Document> {
    vec![doc(
        Part::Deploy("namespace.yaml"),
        "The control plane's namespace. The webhook never calls for its pods (the label,\n\
         and the webhook's namespaceSelector): the injector cannot wait on itself.",
        json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": c.namespace,
                "labels": {
                    "app.kubernetes.io/part-of": "ballast",
                    WEBHOOKS_LABEL: "disabled",
                },
            },
        }),
    )]
}

fn service_account(c: &InstallConfig, part: Part, app: &str, name: &str) -> Document {
    doc(
        part,
        "",
        json!({
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": metadata(app, name, Some(&c.namespace)),
        }),
    )
}

fn cluster_role(part: Part, comment: &str, app: &str, rules: Value) -> Document {
    doc(
        part,
        comment,
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": metadata(app, app, None),
            "rules": rules,
        }),
    )
}

fn binding(c: &InstallConfig, part: Part, app: &str, service_account: &str) -> Document {
    doc(
        part,
        "",
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": metadata(app, app, None),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": app},
            "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": c.namespace}],
        }),
    )
}

/// get, list and watch on the kinds the destination source watches
/// (`ballast_controlplane::WATCHED_RESOURCES`; tests/deploy.rs
/// checks the two agree). `ballast destination` and `ballast viz` both build
/// their index from that source, so both get exactly these rules.
fn watched_rules() -> Value {
    let read = json!(["get", "list", "watch"]);
    json!([
        {"apiGroups": [""], "resources": ["pods", "services", "namespaces"], "verbs": read},
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": read},
        {"apiGroups": ["gateway.networking.k8s.io"], "resources": ["httproutes", "grpcroutes"], "verbs": read},
        {"apiGroups": ["policy.linkerd.io"], "resources": ["httproutes", "servers", "authorizationpolicies", "meshtlsauthentications", "networkauthentications"], "verbs": read},
        {"apiGroups": ["linkerd.io"], "resources": ["serviceprofiles"], "verbs": read},
    ])
}

/// The destination controller's RBAC: get, list and watch on exactly the
/// kinds its watchers use.
pub fn destination_rbac(c: &InstallConfig) -> Vec<Document> {
    let part = Part::Deploy("rbac.yaml");
    vec![
        service_account(c, part, DESTINATION, DESTINATION),
        cluster_role(
            part,
            "The destination controller only reads: get/list/watch on the kinds its\n\
             watchers use (endpoints, and the policy resources of deploy/crds/).",
            DESTINATION,
            watched_rules(),
        ),
        binding(c, part, DESTINATION, DESTINATION),
    ]
}

/// What a controller's Deployment differs in.
struct Controller<'a> {
    app: &'a str,
    container: &'a str,
    service_account: &'a str,
    args: Vec<String>,
    /// (name, port)
    ports: Vec<(&'a str, u16)>,
    cpu_request: &'a str,
    memory_request: &'a str,
    memory_limit: &'a str,
    volumes: Vec<(Value, Value)>,
    /// Environment beside `BALLAST_LOG`.
    env: Vec<(&'a str, &'a str)>,
}

fn deployment(c: &InstallConfig, part: Part, comment: &str, ctl: Controller<'_>) -> Document {
    let selector = json!({"app.kubernetes.io/name": ctl.app});
    let hostname_term = json!({"labelSelector": {"matchLabels": selector}, "topologyKey": "kubernetes.io/hostname"});
    // HA: never two replicas on a node, spread over zones when possible;
    // otherwise only a preference, so that one-node clusters schedule both.
    let affinity = if c.ha {
        json!({"podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [hostname_term],
            "preferredDuringSchedulingIgnoredDuringExecution": [{
                "weight": 100,
                "podAffinityTerm": {"labelSelector": {"matchLabels": selector}, "topologyKey": "topology.kubernetes.io/zone"},
            }],
        }})
    } else {
        json!({"podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": hostname_term}],
        }})
    };
    let mut container = json!({
        "name": ctl.container,
        "image": c.controller_image,
        "imagePullPolicy": c.image_pull_policy,
        "args": ctl.args,
        "env": std::iter::once(("BALLAST_LOG", c.log_level.as_str()))
            .chain(ctl.env.iter().copied())
            .map(|(name, value)| json!({"name": name, "value": value}))
            .collect::<Vec<_>>(),
        "ports": ctl.ports.iter().map(|(name, port)| json!({"name": name, "containerPort": port})).collect::<Vec<_>>(),
        "livenessProbe": {"httpGet": {"path": "/live", "port": "admin"}, "periodSeconds": 10, "failureThreshold": 3},
        "readinessProbe": {"httpGet": {"path": "/ready", "port": "admin"}, "periodSeconds": 5, "failureThreshold": 2},
        "resources": {
            "requests": {"cpu": ctl.cpu_request, "memory": ctl.memory_request},
            "limits": {"memory": ctl.memory_limit},
        },
        "securityContext": {
            "allowPrivilegeEscalation": false,
            "readOnlyRootFilesystem": true,
            "capabilities": {"drop": ["ALL"]},
        },
    });
    let mut pod = json!({
        "serviceAccountName": ctl.service_account,
        "automountServiceAccountToken": true,
        "affinity": affinity,
        "securityContext": {
            "runAsNonRoot": true,
            "runAsUser": RUN_AS,
            "runAsGroup": RUN_AS,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "terminationGracePeriodSeconds": 30,
    });
    if !ctl.volumes.is_empty() {
        container["volumeMounts"] = ctl.volumes.iter().map(|(m, _)| m.clone()).collect();
        pod["volumes"] = ctl.volumes.iter().map(|(_, v)| v.clone()).collect();
    }
    pod["containers"] = json!([container]);
    doc(
        part,
        comment,
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": metadata(ctl.app, ctl.app, Some(&c.namespace)),
            "spec": {
                "replicas": c.replicas(),
                "selector": {"matchLabels": selector},
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 1}},
                "template": {
                    "metadata": {"labels": labels(ctl.app)},
                    "spec": pod,
                },
            },
        }),
    )
}

/// One disruption at a time: with two or more replicas a drain keeps the
/// others serving; it never blocks a drain.
fn disruption_budget(c: &InstallConfig, part: Part, app: &str) -> Document {
    doc(
        part,
        "Voluntary disruptions (drains, upgrades) take one replica at a time.",
        json!({
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": metadata(app, app, Some(&c.namespace)),
            "spec": {
                "maxUnavailable": 1,
                "selector": {"matchLabels": {"app.kubernetes.io/name": app}},
            },
        }),
    )
}

fn service(
    c: &InstallConfig,
    part: Part,
    comment: &str,
    app: &str,
    name: &str,
    headless: bool,
    ports: &[(&str, u16, &str)],
) -> Document {
    let mut spec = json!({
        "selector": {"app.kubernetes.io/name": app},
        "ports": ports.iter().map(|(n, p, t)| json!({"name": n, "port": p, "targetPort": t})).collect::<Vec<_>>(),
    });
    if headless {
        spec["clusterIP"] = json!("None");
    }
    doc(
        part,
        comment,
        json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": metadata(app, name, Some(&c.namespace)),
            "spec": spec,
        }),
    )
}

pub fn destination(c: &InstallConfig) -> Vec<Document> {
    let part = Part::Deploy("destination.yaml");
    let ports = [("grpc", 8086, "grpc"), ("policy", 8090, "policy")];
    vec![
        deployment(
            c,
            part,
            "The destination controller. Memory is sized from bench/RESULTS.md: about\n\
             43 MiB with 10,000 pods, 2,000 Services and 500 routes loaded, and 2 KB per\n\
             open stream; its budget is three quarters of the limit and refuses new\n\
             streams past 85% of that: 256Mi holds the default 20,000 + 20,000 streams\n\
             (10,000 proxies). `ballast install --destination-memory-limit` and\n\
             `--destination-max-streams` size it for more.",
            Controller {
                app: DESTINATION,
                container: "destination",
                service_account: DESTINATION,
                args: vec![
                    "destination".into(),
                    "--addr=0.0.0.0:8086".into(),
                    "--admin-addr=0.0.0.0:9996".into(),
                    "--policy-addr=0.0.0.0:8090".into(),
                    format!("--cluster-domain={}", c.cluster_domain),
                    format!("--controller-namespace={}", c.namespace),
                    format!("--identity-trust-domain={}", c.trust_domain),
                    // Injected proxies dial it in TLS, verifying
                    // ballast-destination.NS.serviceaccount.identity.NS.TRUST_DOMAIN:
                    // it serves that identity, certified by the identity controller.
                    format!("--service-account={DESTINATION}"),
                    format!("--namespace={}", c.namespace),
                    format!("--identity-trust-anchors={TRUST_ROOTS_MOUNT}/{TRUST_ROOTS_KEY}"),
                    format!("--identity-addr={}", c.control_plane().identity_addr()),
                    format!("--identity-token-file={TOKEN_MOUNT}/{IDENTITY_TOKEN_FILE}"),
                ]
                .into_iter()
                .chain(c.destination.max_streams.into_iter().flat_map(|n| {
                    [
                        format!("--max-streams={n}"),
                        format!("--max-policy-streams={n}"),
                    ]
                }))
                .collect(),
                ports: vec![("grpc", 8086), ("policy", 8090), ("admin", 9996)],
                cpu_request: &c.destination.cpu_request,
                memory_request: &c.destination.memory_request,
                memory_limit: &c.destination.memory_limit,
                volumes: vec![trust_roots_volume(), identity_token_volume()],
                env: if c.controller_huge_pages {
                    vec![crate::HEAP_HUGE_PAGES_ENV]
                } else {
                    Vec::new()
                },
            },
        ),
        service(
            c,
            part,
            "Proxies resolve destinations through this service (Linkerd's proxies use\n\
             LINKERD2_PROXY_DESTINATION_SVC_ADDR; point it here).",
            DESTINATION,
            "ballast-dst",
            false,
            &ports,
        ),
        service(
            c,
            part,
            "Headless, so that clients can spread their streams across replicas.",
            DESTINATION,
            "ballast-dst-headless",
            true,
            &ports,
        ),
        service(
            c,
            part,
            "",
            DESTINATION,
            "ballast-destination-metrics",
            false,
            &[("admin", 9996, "admin")],
        ),
        disruption_budget(c, part, DESTINATION),
    ]
}

pub fn identity(c: &InstallConfig) -> Vec<Document> {
    let part = Part::Deploy("identity.yaml");
    vec![
        service_account(c, part, IDENTITY, IDENTITY_SERVICE_ACCOUNT),
        cluster_role(
            part,
            "The identity controller checks proxies' tokens with TokenReviews: its RBAC\n\
             is exactly `create` on tokenreviews.",
            IDENTITY,
            json!([{"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]}]),
        ),
        binding(c, part, IDENTITY, IDENTITY_SERVICE_ACCOUNT),
        deployment(
            c,
            part,
            "The identity controller (`ballast identity`): a CA speaking Linkerd's Identity\n\
             API. It reads Linkerd's issuer Secret and trust roots ConfigMap. The service\n\
             account is named as Linkerd's, so proxies that expect\n\
             `linkerd-identity.linkerd.serviceaccount.identity.linkerd.<trust domain>` find it.",
            Controller {
                app: IDENTITY,
                container: "identity",
                service_account: IDENTITY_SERVICE_ACCOUNT,
                args: vec![
                    "identity".into(),
                    "--addr=0.0.0.0:8080".into(),
                    "--admin-addr=0.0.0.0:9990".into(),
                    format!("--issuer-dir={ISSUER_MOUNT}"),
                    format!("--trust-anchors={TRUST_ROOTS_MOUNT}/{TRUST_ROOTS_KEY}"),
                    format!("--controller-namespace={}", c.namespace),
                    format!("--trust-domain={}", c.trust_domain),
                    "--issuance-lifetime=24h".into(),
                    "--clock-skew-allowance=20s".into(),
                ],
                ports: vec![("grpc", 8080), ("admin", 9990)],
                cpu_request: "100m",
                memory_request: "32Mi",
                memory_limit: "128Mi",
                volumes: vec![
                    (
                        json!({"name": "issuer", "mountPath": ISSUER_MOUNT, "readOnly": true}),
                        json!({"name": "issuer", "secret": {"secretName": ISSUER_SECRET}}),
                    ),
                    trust_roots_volume(),
                ],
                env: Vec::new(),
            },
        ),
        service(
            c,
            part,
            "",
            IDENTITY,
            IDENTITY,
            false,
            &[("grpc", 8080, "grpc")],
        ),
        service(
            c,
            part,
            "Proxies dial this (Linkerd's LINKERD2_PROXY_IDENTITY_SVC_ADDR).",
            IDENTITY,
            "ballast-identity-headless",
            true,
            &[("grpc", 8080, "grpc")],
        ),
        service(
            c,
            part,
            "",
            IDENTITY,
            "ballast-identity-metrics",
            false,
            &[("admin", 9990, "admin")],
        ),
        disruption_budget(c, part, IDENTITY),
    ]
}

/// The injector's flags that configure injected proxies (`ballast inject`'s).
fn injector_proxy_args(c: &InstallConfig) -> Vec<String> {
    vec![
        format!("--proxy-image={}", c.proxy_image),
        format!("--init-image={}", c.init_image),
        format!("--image-pull-policy={}", c.image_pull_policy),
        // The controllers' addresses and identities follow from these three,
        // as they do in this install (ballast_controlplane::ControlPlane).
        format!("--control-plane-namespace={}", c.namespace),
        format!("--cluster-domain={}", c.cluster_domain),
        format!("--identity-trust-domain={}", c.trust_domain),
        // Proxies get the anchors inline, so meshed namespaces need no copy.
        format!("--identity-trust-anchors-file={TRUST_ROOTS_MOUNT}/{TRUST_ROOTS_KEY}"),
    ]
}

pub fn injector(c: &InstallConfig) -> Vec<Document> {
    let part = Part::Deploy("injector.yaml");
    let mut args = vec![
        "injector".to_string(),
        format!("--addr=0.0.0.0:{INJECTOR_PORT}"),
        format!("--admin-addr=0.0.0.0:{INJECTOR_ADMIN_PORT}"),
        format!("--tls-cert={INJECTOR_TLS_MOUNT}/tls.crt"),
        format!("--tls-key={INJECTOR_TLS_MOUNT}/tls.key"),
        format!("--failure-policy={}", c.webhook_failure_policy.as_str()),
    ];
    args.extend(injector_proxy_args(c));
    vec![
        service_account(c, part, INJECTOR, INJECTOR),
        cluster_role(
            part,
            "The injector reads the namespace of each pod it is asked about (its\n\
             `linkerd.io/inject` and `config.linkerd.io/*` annotations): `get` on\n\
             namespaces, nothing more.",
            INJECTOR,
            json!([{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]}]),
        ),
        binding(c, part, INJECTOR, INJECTOR),
        deployment(
            c,
            part,
            "The injection webhook (`ballast injector`): the API server sends it each pod\n\
             created outside the control plane's namespace; it answers with the patch\n\
             that adds the proxy, as `ballast inject` would. Its serving certificate is\n\
             the Secret below the webhook configuration's caBundle vouches for.",
            Controller {
                app: INJECTOR,
                container: "injector",
                service_account: INJECTOR,
                args,
                ports: vec![("webhook", INJECTOR_PORT), ("admin", INJECTOR_ADMIN_PORT)],
                cpu_request: "100m",
                memory_request: "32Mi",
                // Reviews are read whole: --max-concurrent-reviews (8) times
                // --max-body-bytes (3 MiB) and their parsed forms.
                memory_limit: "256Mi",
                volumes: vec![
                    (
                        json!({"name": "tls", "mountPath": INJECTOR_TLS_MOUNT, "readOnly": true}),
                        json!({"name": "tls", "secret": {"secretName": INJECTOR_TLS_SECRET}}),
                    ),
                    trust_roots_volume(),
                ],
                env: Vec::new(),
            },
        ),
        service(
            c,
            part,
            "The API server calls the webhook here (HTTPS).",
            INJECTOR,
            INJECTOR,
            false,
            &[("webhook", 443, "webhook")],
        ),
        service(
            c,
            part,
            "",
            INJECTOR,
            "ballast-injector-metrics",
            false,
            &[("admin", INJECTOR_ADMIN_PORT, "admin")],
        ),
        disruption_budget(c, part, INJECTOR),
    ]
}

/// The metrics collector and dashboard (`ballast viz`): its own Deployment,
/// so its memory and CPU never touch the destination controller's.
pub fn viz(c: &InstallConfig) -> Vec<Document> {
    let part = Part::Deploy("viz.yaml");
    vec![
        service_account(c, part, VIZ, VIZ),
        cluster_role(
            part,
            "The collector builds its index of meshed pods from the same source as the\n\
             destination controller: get/list/watch on the same kinds, nothing more.",
            VIZ,
            watched_rules(),
        ),
        binding(c, part, VIZ, VIZ),
        deployment(
            c,
            part,
            "The metrics collector and dashboard (`ballast viz`): it scrapes each meshed\n\
             pod's proxy /metrics every 10 s (64 at a time, pages of at most 8 MiB, 15\n\
             minutes of history) and serves the dashboard and JSON API on 8084. Memory is\n\
             sized from bench/RESULTS.md (viz-bench): the request covers a few thousand\n\
             pods; the limit adds 64 pages of 8 MiB in flight at once.",
            Controller {
                app: VIZ,
                container: "viz",
                service_account: VIZ,
                args: vec![
                    "viz".into(),
                    format!("--addr=0.0.0.0:{VIZ_PORT}"),
                    format!("--admin-addr=0.0.0.0:{VIZ_ADMIN_PORT}"),
                    format!("--cluster-domain={}", c.cluster_domain),
                    format!("--controller-namespace={}", c.namespace),
                    format!("--identity-trust-domain={}", c.trust_domain),
                    // Its identity, which proxies' tap ports admit:
                    // ballast-viz.NS.serviceaccount.identity.linkerd.TRUST_DOMAIN,
                    // certified by the identity controller for its token.
                    format!("--service-account={VIZ}"),
                    format!("--namespace={}", c.namespace),
                    format!("--identity-trust-anchors={TRUST_ROOTS_MOUNT}/{TRUST_ROOTS_KEY}"),
                    format!("--identity-addr={}", c.control_plane().identity_addr()),
                    format!("--identity-token-file={TOKEN_MOUNT}/{IDENTITY_TOKEN_FILE}"),
                ],
                ports: vec![("http", VIZ_PORT), ("admin", VIZ_ADMIN_PORT)],
                cpu_request: "100m",
                memory_request: "64Mi",
                memory_limit: "768Mi",
                volumes: vec![trust_roots_volume(), identity_token_volume()],
                env: Vec::new(),
            },
        ),
        service(
            c,
            part,
            "The dashboard and JSON API (`ballast stat`, `edges`, `tap` talk to it):\n\
             `kubectl -n NS port-forward svc/ballast-viz 8084` and open http://127.0.0.1:8084/.",
            VIZ,
            VIZ,
            false,
            &[("http", VIZ_PORT, "http")],
        ),
        service(
            c,
            part,
            "",
            VIZ,
            "ballast-viz-metrics",
            false,
            &[("admin", VIZ_ADMIN_PORT, "admin")],
        ),
        disruption_budget(c, part, VIZ),
    ]
}

/// The key material: the trust roots, the issuer, the webhook's certificate.
pub fn secrets(c: &InstallConfig, m: &crate::KeyMaterial) -> Vec<Document> {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    vec![
        doc(
            Part::Secret,
            "The trust anchors (PEM), in Linkerd's ConfigMap; proxies verify peers against them.",
            json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": metadata(IDENTITY, TRUST_ROOTS_CONFIG_MAP, Some(&c.namespace)),
                "data": {"ca-bundle.crt": m.identity.trust_anchors_pem},
            }),
        ),
        doc(
            Part::Secret,
            "The issuer's certificate and key, in Linkerd's `linkerd-identity-issuer` layout\n\
             (`ballast identity --issuer-dir` reads tls.crt and tls.key).",
            json!({
                "apiVersion": "v1",
                "kind": "Secret",
                "type": "kubernetes.io/tls",
                "metadata": metadata(IDENTITY, ISSUER_SECRET, Some(&c.namespace)),
                "data": {
                    "tls.crt": b64(&m.identity.issuer_cert_pem),
                    "tls.key": b64(&m.identity.issuer_key_pem),
                },
            }),
        ),
        doc(
            Part::Secret,
            "The webhook's serving certificate, for the injector Service's names.",
            json!({
                "apiVersion": "v1",
                "kind": "Secret",
                "type": "kubernetes.io/tls",
                "metadata": metadata(INJECTOR, INJECTOR_TLS_SECRET, Some(&c.namespace)),
                "data": {
                    "tls.crt": b64(&m.webhook.cert_pem),
                    "tls.key": b64(&m.webhook.key_pem),
                },
            }),
        ),
        webhook_configuration(c, &b64(&m.webhook.ca_pem)),
    ]
}

fn webhook_configuration(c: &InstallConfig, ca_bundle: &str) -> Document {
    let not_disabled = json!({"key": WEBHOOKS_LABEL, "operator": "NotIn", "values": ["disabled"]});
    let comment = match c.webhook_failure_policy {
        FailurePolicy::Ignore => {
            "Pods are sent to the injector when created, except in kube-system, the\n\
             control plane's namespace, and namespaces or pods labelled\n\
             config.linkerd.io/admission-webhooks=disabled. failurePolicy Ignore (Linkerd's\n\
             default): if the injector cannot answer, pods start without a proxy."
        }
        FailurePolicy::Fail => {
            "Pods are sent to the injector when created, except in kube-system, the\n\
             control plane's namespace, and namespaces or pods labelled\n\
             config.linkerd.io/admission-webhooks=disabled. failurePolicy Fail: if the\n\
             injector cannot answer, pods outside those are not created."
        }
    };
    doc(
        Part::Secret,
        comment,
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": metadata(INJECTOR, WEBHOOK_CONFIGURATION, None),
            "webhooks": [{
                "name": "ballast-proxy-injector.ballast.io",
                "clientConfig": {
                    "service": {"name": INJECTOR, "namespace": c.namespace, "path": WEBHOOK_PATH, "port": 443},
                    "caBundle": ca_bundle,
                },
                "rules": [{
                    "operations": ["CREATE"],
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "resources": ["pods"],
                    "scope": "Namespaced",
                }],
                "namespaceSelector": {"matchExpressions": [
                    not_disabled,
                    {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", c.namespace]},
                ]},
                "objectSelector": {"matchExpressions": [not_disabled]},
                "failurePolicy": c.webhook_failure_policy.as_str(),
                "matchPolicy": "Equivalent",
                "reinvocationPolicy": "Never",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": c.webhook_timeout_seconds,
            }],
        }),
    )
}
