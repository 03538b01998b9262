//! The names the installed control plane and its injected proxies must agree
//! on, derived from three settings: the control plane's namespace, the
//! cluster's DNS domain and the identity trust domain.
//!
//! `ballast install` renders the controllers from these, `ballast inject` and
//! the injector configure proxies from these, and `ballast check` compares
//! what is deployed against these: so the pieces agree by construction, and a
//! hand-edited deployment that does not is named by `check`. Pure: no IO, no
//! dependencies.
//!
//! Identity names follow Linkerd's scheme,
//! `SA.NS.serviceaccount.identity.CONTROL_NS.TRUST_DOMAIN`, with Ballast's
//! control plane namespace in the `CONTROL_NS` place (Linkerd's is `linkerd`).

#![forbid(unsafe_code)]

/// The resources the destination controller's Kubernetes source watches, as
/// `(group, version, plural)`: what its RBAC role must allow `get`, `list`
/// and `watch` on, and what `ballast check` verifies it may. Here, not in the
/// controller, so that `check` and `install` need no controller code; the
/// source's test keeps its watchers' types in step with this list.
pub const WATCHED_RESOURCES: &[(&str, &str, &str)] = &[
    ("", "v1", "namespaces"),
    ("gateway.networking.k8s.io", "v1", "httproutes"),
    ("gateway.networking.k8s.io", "v1", "grpcroutes"),
    ("policy.linkerd.io", "v1beta3", "httproutes"),
    ("policy.linkerd.io", "v1beta3", "servers"),
    ("policy.linkerd.io", "v1alpha1", "authorizationpolicies"),
    ("policy.linkerd.io", "v1alpha1", "meshtlsauthentications"),
    ("policy.linkerd.io", "v1alpha1", "networkauthentications"),
    ("linkerd.io", "v1alpha2", "serviceprofiles"),
    ("", "v1", "pods"),
    ("", "v1", "services"),
    ("discovery.k8s.io", "v1", "endpointslices"),
];

/// The control plane's namespace when none is given.
pub const DEFAULT_NAMESPACE: &str = "ballast";
/// The cluster's DNS domain (`NAME.NS.svc.CLUSTER_DOMAIN`) when none is given.
pub const DEFAULT_CLUSTER_DOMAIN: &str = "cluster.local";
/// The last part of identity names when none is given (Linkerd's default).
pub const DEFAULT_TRUST_DOMAIN: &str = "cluster.local";

/// The label injection writes on meshed pods: the control plane's namespace.
/// The destination controller gives an identity (so mutual TLS) only to
/// endpoints whose label equals its `--controller-namespace`.
pub const CONTROL_PLANE_NS_LABEL: &str = "linkerd.io/control-plane-ns";

/// What injection adds to a pod, in Linkerd's names: tools, dashboards and
/// habits built for Linkerd (`kubectl logs -c linkerd-proxy`, viz, check)
/// find Ballast's proxy where they find Linkerd's.
pub mod pod {
    /// The proxy container.
    pub const PROXY_CONTAINER: &str = "linkerd-proxy";
    /// The init container (iptables).
    pub const INIT_CONTAINER: &str = "linkerd-init";
    /// The proxy's admin port (/live, /ready, /metrics), which probes and viz use.
    pub const ADMIN_PORT_NAME: &str = "linkerd-admin";
    /// The proxy's Tap API port, which viz dials.
    pub const TAP_PORT_NAME: &str = "linkerd-tap";
    /// Other meshes' sidecar and init containers: a pod holding one is never
    /// injected (two proxies would each redirect the other's traffic).
    pub const OTHER_MESH_CONTAINERS: [&str; 2] = ["istio-proxy", "istio-init"];
}

/// The control plane's objects' names (fixed; only the namespace varies).
pub mod object {
    pub const DESTINATION: &str = "ballast-destination";
    pub const IDENTITY: &str = "ballast-identity";
    pub const INJECTOR: &str = "ballast-injector";
    pub const VIZ: &str = "ballast-viz";
    /// The identity controller's service account: Linkerd's name, so that
    /// its identity reads as Linkerd's identity service's.
    pub const IDENTITY_SERVICE_ACCOUNT: &str = "linkerd-identity";
    /// The Services proxies dial (headless: streams spread over replicas).
    pub const DESTINATION_HEADLESS: &str = "ballast-dst-headless";
    pub const IDENTITY_HEADLESS: &str = "ballast-identity-headless";
    /// Linkerd's names for the trust anchors ConfigMap and the issuer Secret.
    pub const TRUST_ROOTS_CONFIG_MAP: &str = "linkerd-identity-trust-roots";
    pub const TRUST_ROOTS_KEY: &str = "ca-bundle.crt";
    pub const ISSUER_SECRET: &str = "linkerd-identity-issuer";
}

/// Linkerd's ports for the control plane's gRPC APIs.
pub mod port {
    pub const DESTINATION: u16 = 8086;
    pub const POLICY: u16 = 8090;
    pub const IDENTITY: u16 = 8080;
    /// The dashboard and its JSON API (Linkerd viz's web port).
    pub const VIZ: u16 = 8084;
}

/// What the destination controller's answers hold that its clients
/// (`ballast diagnostics`) read back: here so that the client needs no
/// controller code.
pub mod destination_api {
    /// The most addresses one `Update` carries; a larger set is split over
    /// several messages.
    pub const MAX_ADDRS_PER_UPDATE: usize = 1_000;
    /// Linkerd's default retry budget, answered for a service without a
    /// ServiceProfile: 20% extra load, at least 10 retries per second, over
    /// a 10 second window.
    pub const DEFAULT_RETRY_RATIO: f32 = 0.2;
    pub const DEFAULT_MIN_RETRIES_PER_SECOND: u32 = 10;
    pub const DEFAULT_RETRY_TTL: std::time::Duration = std::time::Duration::from_secs(10);
}

/// The three settings every other name follows from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControlPlane {
    pub namespace: String,
    pub cluster_domain: String,
    pub trust_domain: String,
}

impl Default for ControlPlane {
    fn default() -> Self {
        ControlPlane {
            namespace: DEFAULT_NAMESPACE.into(),
            cluster_domain: DEFAULT_CLUSTER_DOMAIN.into(),
            trust_domain: DEFAULT_TRUST_DOMAIN.into(),
        }
    }
}

impl ControlPlane {
    /// `NAME.NS.svc.CLUSTER_DOMAIN:PORT` of a Service in the control plane's namespace.
    pub fn service_addr(&self, service: &str, port: u16) -> String {
        format!(
            "{service}.{}.svc.{}:{port}",
            self.namespace, self.cluster_domain
        )
    }

    /// Where proxies dial the destination controller (Destination and policy APIs).
    pub fn destination_addr(&self) -> String {
        self.service_addr(object::DESTINATION_HEADLESS, port::DESTINATION)
    }

    /// Where proxies and controllers dial the identity controller.
    pub fn identity_addr(&self) -> String {
        self.service_addr(object::IDENTITY_HEADLESS, port::IDENTITY)
    }

    /// The identity of `service_account` in `namespace`.
    pub fn identity_of(&self, service_account: &str, namespace: &str) -> String {
        format!(
            "{service_account}.{namespace}.serviceaccount.identity.{}.{}",
            self.namespace, self.trust_domain
        )
    }

    /// The identity of a control plane component's service account.
    pub fn component_identity(&self, service_account: &str) -> String {
        self.identity_of(service_account, &self.namespace)
    }

    /// The destination controller's identity: proxies verify it when they dial it.
    pub fn destination_identity(&self) -> String {
        self.component_identity(object::DESTINATION)
    }

    /// The identity controller's identity: proxies verify it when they dial it.
    pub fn identity_service_identity(&self) -> String {
        self.component_identity(object::IDENTITY_SERVICE_ACCOUNT)
    }

    /// viz's identity: the only client proxies' tap ports serve.
    pub fn viz_identity(&self) -> String {
        self.component_identity(object::VIZ)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_namespace_and_domains() {
        let cp = ControlPlane {
            namespace: "mesh".into(),
            cluster_domain: "corp.local".into(),
            trust_domain: "example.org".into(),
        };
        assert_eq!(
            cp.destination_addr(),
            "ballast-dst-headless.mesh.svc.corp.local:8086"
        );
        assert_eq!(
            cp.identity_addr(),
            "ballast-identity-headless.mesh.svc.corp.local:8080"
        );
        assert_eq!(
            cp.destination_identity(),
            "ballast-destination.mesh.serviceaccount.identity.mesh.example.org"
        );
        assert_eq!(
            cp.identity_service_identity(),
            "linkerd-identity.mesh.serviceaccount.identity.mesh.example.org"
        );
        assert_eq!(
            cp.identity_of("default", "shop"),
            "default.shop.serviceaccount.identity.mesh.example.org"
        );
    }

    #[test]
    fn the_defaults_are_the_installed_ones() {
        let cp = ControlPlane::default();
        assert_eq!(
            cp.destination_addr(),
            "ballast-dst-headless.ballast.svc.cluster.local:8086"
        );
        assert_eq!(
            cp.viz_identity(),
            "ballast-viz.ballast.serviceaccount.identity.ballast.cluster.local"
        );
    }
}
