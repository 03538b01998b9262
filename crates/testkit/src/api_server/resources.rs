//! The resource types the emulation serves, and request paths to routes (pure).

/// One served resource type, as the API's discovery documents describe it.
#[derive(Debug)]
pub(crate) struct ResourceType {
    /// API group; `""` is the core group.
    pub group: &'static str,
    pub version: &'static str,
    pub plural: &'static str,
    pub singular: &'static str,
    pub kind: &'static str,
    pub short_names: &'static [&'static str],
    /// Field selector keys the real API server accepts for this type
    /// (besides `metadata.name` and `metadata.namespace`).
    pub field_labels: &'static [&'static str],
    /// Namespaced (`/namespaces/{ns}/{plural}`) or cluster-scoped (`/{plural}`).
    pub namespaced: bool,
}

impl ResourceType {
    /// `v1` or `group/version`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }
}

/// Every served type. A resource is referred to by its index here.
pub(crate) const RESOURCES: &[ResourceType] = &[
    ResourceType {
        group: "",
        version: "v1",
        plural: "pods",
        singular: "pod",
        kind: "Pod",
        short_names: &["po"],
        namespaced: true,
        field_labels: &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
    },
    ResourceType {
        group: "",
        version: "v1",
        plural: "services",
        singular: "service",
        kind: "Service",
        short_names: &["svc"],
        field_labels: &["spec.clusterIP", "spec.type"],
        namespaced: true,
    },
    ResourceType {
        group: "discovery.k8s.io",
        version: "v1",
        plural: "endpointslices",
        singular: "endpointslice",
        kind: "EndpointSlice",
        short_names: &[],
        field_labels: &["addressType"],
        namespaced: true,
    },
    // Policy resources (custom resources on a real cluster). Two share the
    // plural `httproutes`: Gateway API's comes first, so that the in-process
    // helpers that take a plural name it; Linkerd's is reached by its path or
    // by apiVersion and kind.
    ResourceType {
        group: "gateway.networking.k8s.io",
        version: "v1",
        plural: "httproutes",
        singular: "httproute",
        kind: "HTTPRoute",
        short_names: &[],
        field_labels: &[],
        namespaced: true,
    },
    ResourceType {
        group: "policy.linkerd.io",
        version: "v1beta3",
        plural: "httproutes",
        singular: "httproute",
        kind: "HTTPRoute",
        short_names: &[],
        field_labels: &[],
        namespaced: true,
    },
    ResourceType {
        group: "gateway.networking.k8s.io",
        version: "v1",
        plural: "grpcroutes",
        singular: "grpcroute",
        kind: "GRPCRoute",
        short_names: &[],
        field_labels: &[],
        namespaced: true,
    },
    ResourceType {
        group: "policy.linkerd.io",
        version: "v1beta3",
        plural: "servers",
        singular: "server",
        kind: "Server",
        short_names: &[],
        field_labels: &[],
        namespaced: true,
    },
    ResourceType {
        group: "policy.linkerd.io",
        version: "v1alpha1",
        plural: "authorizationpolicies",
        singular: "authorizationpolicy",
        kind: "AuthorizationPolicy",
        short_names: &[],
        field_labels: &[],
        namespaced: true,
    },
    ResourceType {
        group: "policy.linkerd.io",
        version: "v1alpha1",
        plural: "meshtlsauthentications",
        singular: "meshtlsauthentication",
        kind: "MeshTLSAuthentication",
        short_names: &[],
        field_labels: &[],
        namespaced: true,
    },
    ResourceType {
        group: "policy.linkerd.io",
        version: "v1alpha1",
        plural: "networkauthentications",
        singular: "networkauthentication",
        kind: "NetworkAuthentication",
        short_names: &[],
        field_labels: &[],
        namespaced: true,
    },
    ResourceType {
        group: "linkerd.io",
        version: "v1alpha2",
        plural: "serviceprofiles",
        singular: "serviceprofile",
        kind: "ServiceProfile",
        short_names: &[],
        field_labels: &[],
        namespaced: true,
    },
    // What `ballast check` reads besides the above.
    ResourceType {
        group: "",
        version: "v1",
        plural: "namespaces",
        singular: "namespace",
        kind: "Namespace",
        short_names: &["ns"],
        field_labels: &["status.phase"],
        namespaced: false,
    },
    ResourceType {
        group: "",
        version: "v1",
        plural: "nodes",
        singular: "node",
        kind: "Node",
        short_names: &["no"],
        field_labels: &["spec.unschedulable"],
        namespaced: false,
    },
    ResourceType {
        group: "",
        version: "v1",
        plural: "configmaps",
        singular: "configmap",
        kind: "ConfigMap",
        short_names: &["cm"],
        field_labels: &[],
        namespaced: true,
    },
    ResourceType {
        group: "",
        version: "v1",
        plural: "secrets",
        singular: "secret",
        kind: "Secret",
        short_names: &[],
        field_labels: &["type"],
        namespaced: true,
    },
    ResourceType {
        group: "",
        version: "v1",
        plural: "serviceaccounts",
        singular: "serviceaccount",
        kind: "ServiceAccount",
        short_names: &["sa"],
        field_labels: &[],
        namespaced: true,
    },
    ResourceType {
        group: "apps",
        version: "v1",
        plural: "deployments",
        singular: "deployment",
        kind: "Deployment",
        short_names: &["deploy"],
        field_labels: &[],
        namespaced: true,
    },
    ResourceType {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        plural: "clusterroles",
        singular: "clusterrole",
        kind: "ClusterRole",
        short_names: &[],
        field_labels: &[],
        namespaced: false,
    },
    ResourceType {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        plural: "clusterrolebindings",
        singular: "clusterrolebinding",
        kind: "ClusterRoleBinding",
        short_names: &[],
        field_labels: &[],
        namespaced: false,
    },
    ResourceType {
        group: "apiextensions.k8s.io",
        version: "v1",
        plural: "customresourcedefinitions",
        singular: "customresourcedefinition",
        kind: "CustomResourceDefinition",
        short_names: &["crd", "crds"],
        field_labels: &[],
        namespaced: false,
    },
    // What a cluster in a box runs: controllers' objects, admission, disruption
    // budgets, namespaced RBAC and events.
    ResourceType {
        group: "apps",
        version: "v1",
        plural: "replicasets",
        singular: "replicaset",
        kind: "ReplicaSet",
        short_names: &["rs"],
        field_labels: &[],
        namespaced: true,
    },
    ResourceType {
        group: "admissionregistration.k8s.io",
        version: "v1",
        plural: "mutatingwebhookconfigurations",
        singular: "mutatingwebhookconfiguration",
        kind: "MutatingWebhookConfiguration",
        short_names: &[],
        field_labels: &[],
        namespaced: false,
    },
    ResourceType {
        group: "admissionregistration.k8s.io",
        version: "v1",
        plural: "validatingwebhookconfigurations",
        singular: "validatingwebhookconfiguration",
        kind: "ValidatingWebhookConfiguration",
        short_names: &[],
        field_labels: &[],
        namespaced: false,
    },
    ResourceType {
        group: "policy",
        version: "v1",
        plural: "poddisruptionbudgets",
        singular: "poddisruptionbudget",
        kind: "PodDisruptionBudget",
        short_names: &["pdb"],
        field_labels: &[],
        namespaced: true,
    },
    ResourceType {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        plural: "roles",
        singular: "role",
        kind: "Role",
        short_names: &[],
        field_labels: &[],
        namespaced: true,
    },
    ResourceType {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        plural: "rolebindings",
        singular: "rolebinding",
        kind: "RoleBinding",
        short_names: &[],
        field_labels: &[],
        namespaced: true,
    },
    ResourceType {
        group: "",
        version: "v1",
        plural: "events",
        singular: "event",
        kind: "Event",
        short_names: &["ev"],
        field_labels: &[
            "involvedObject.kind",
            "involvedObject.name",
            "reason",
            "type",
        ],
        namespaced: true,
    },
];

/// Types with a `status` subresource: writes to the object keep its stored status,
/// and `.../NAME/status` writes change only the status.
const WITH_STATUS: &[&str] = &[
    "pods",
    "services",
    "namespaces",
    "nodes",
    "deployments",
    "replicasets",
    "poddisruptionbudgets",
    "customresourcedefinitions",
    "httproutes",
    "grpcroutes",
];

/// Does this type (index into [`RESOURCES`]) have a `status` subresource?
pub(crate) fn has_status(resource: usize) -> bool {
    RESOURCES
        .get(resource)
        .is_some_and(|r| WITH_STATUS.contains(&r.plural))
}

/// The index of the type with this `apiVersion` and `kind`.
pub(crate) fn by_kind(api_version: &str, kind: &str) -> Option<usize> {
    RESOURCES
        .iter()
        .position(|r| r.kind == kind && r.api_version() == api_version)
}

/// The index of the type with this plural name: for `httproutes`, Gateway API's.
pub(crate) fn by_plural(plural: &str) -> Option<usize> {
    RESOURCES.iter().position(|r| r.plural == plural)
}

/// What a request path names.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// `/version`
    Version,
    /// `/healthz`, `/readyz`, `/livez`
    Health,
    /// `/api`
    CoreVersions,
    /// `/apis`
    Groups,
    /// `/apis/{group}`
    Group(&'static str),
    /// `/api/v1` or `/apis/{group}/{version}`
    Resources {
        group: &'static str,
        version: &'static str,
    },
    /// A collection, in one namespace or (namespace `None`) across all.
    Collection {
        resource: usize,
        namespace: Option<String>,
    },
    /// One named object.
    Object {
        resource: usize,
        namespace: String,
        name: String,
    },
    /// One named object's `status` subresource.
    Status {
        resource: usize,
        namespace: String,
        name: String,
    },
    NotFound,
}

impl Route {
    pub fn resource(&self) -> Option<usize> {
        match self {
            Route::Collection { resource, .. }
            | Route::Object { resource, .. }
            | Route::Status { resource, .. } => Some(*resource),
            _ => None,
        }
    }
}

/// The served groups other than core, with their one version each.
pub(crate) fn named_groups() -> Vec<(&'static str, &'static str)> {
    let mut groups: Vec<(&'static str, &'static str)> = Vec::new();
    for r in RESOURCES {
        if !r.group.is_empty() && !groups.iter().any(|(g, _)| *g == r.group) {
            groups.push((r.group, r.version));
        }
    }
    groups
}

/// Parses a request path (without query). Empty segments are ignored.
pub(crate) fn route(path: &str) -> Route {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    match segs.as_slice() {
        ["version"] => Route::Version,
        ["healthz"] | ["readyz"] | ["livez"] => Route::Health,
        ["api"] => Route::CoreVersions,
        ["apis"] => Route::Groups,
        ["api", version, rest @ ..] => resource_route("", version, rest),
        ["apis", group, rest @ ..] => {
            let Some((group, _)) = named_groups().into_iter().find(|(g, _)| g == group) else {
                return Route::NotFound;
            };
            match rest {
                [] => Route::Group(group),
                [version, rest @ ..] => resource_route(group, version, rest),
            }
        }
        _ => Route::NotFound,
    }
}

fn resource_route(group: &'static str, version: &str, rest: &[&str]) -> Route {
    let in_group = |plural: &str, namespaced: bool| {
        RESOURCES.iter().position(|r| {
            r.group == group
                && r.version == version
                && r.plural == plural
                && r.namespaced == namespaced
        })
    };
    let any_scope = |plural: &str| {
        RESOURCES
            .iter()
            .position(|r| r.group == group && r.version == version && r.plural == plural)
    };
    let Some(version) = RESOURCES
        .iter()
        .find(|r| r.group == group && r.version == version)
        .map(|r| r.version)
    else {
        return Route::NotFound;
    };
    match rest {
        [] => Route::Resources { group, version },
        // Every type across namespaces, or a cluster-scoped type's collection.
        [plural] => match any_scope(plural) {
            Some(resource) => Route::Collection {
                resource,
                namespace: None,
            },
            None => Route::NotFound,
        },
        // One cluster-scoped object (a Namespace is `/api/v1/namespaces/NAME`).
        [plural, name] => match in_group(plural, false) {
            Some(resource) => Route::Object {
                resource,
                namespace: String::new(),
                name: name.to_string(),
            },
            None => Route::NotFound,
        },
        [plural, name, "status"] => match in_group(plural, false) {
            Some(resource) if has_status(resource) => Route::Status {
                resource,
                namespace: String::new(),
                name: name.to_string(),
            },
            _ => Route::NotFound,
        },
        ["namespaces", ns, plural, name, "status"] => match in_group(plural, true) {
            Some(resource) if has_status(resource) => Route::Status {
                resource,
                namespace: ns.to_string(),
                name: name.to_string(),
            },
            _ => Route::NotFound,
        },
        ["namespaces", ns, plural] => match in_group(plural, true) {
            Some(resource) => Route::Collection {
                resource,
                namespace: Some(ns.to_string()),
            },
            None => Route::NotFound,
        },
        ["namespaces", ns, plural, name] => match in_group(plural, true) {
            Some(resource) => Route::Object {
                resource,
                namespace: ns.to_string(),
                name: name.to_string(),
            },
            None => Route::NotFound,
        },
        _ => Route::NotFound,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_by_table() {
        let pods = by_plural("pods");
        let slices = by_plural("endpointslices");
        let cases: &[(&str, Route)] = &[
            ("/version", Route::Version),
            ("/api", Route::CoreVersions),
            ("/apis", Route::Groups),
            ("/apis/discovery.k8s.io", Route::Group("discovery.k8s.io")),
            (
                "/api/v1",
                Route::Resources {
                    group: "",
                    version: "v1",
                },
            ),
            (
                "/api/v1/pods",
                Route::Collection {
                    resource: pods.unwrap_or(99),
                    namespace: None,
                },
            ),
            (
                "/api/v1/namespaces/ns1/pods",
                Route::Collection {
                    resource: pods.unwrap_or(99),
                    namespace: Some("ns1".into()),
                },
            ),
            (
                "/api/v1/namespaces/ns1/pods/p1",
                Route::Object {
                    resource: pods.unwrap_or(99),
                    namespace: "ns1".into(),
                    name: "p1".into(),
                },
            ),
            (
                "/apis/discovery.k8s.io/v1/namespaces/ns1/endpointslices",
                Route::Collection {
                    resource: slices.unwrap_or(99),
                    namespace: Some("ns1".into()),
                },
            ),
            ("/api/v1/pods/p1", Route::NotFound),
            ("/api/v2/pods", Route::NotFound),
            ("/api/v1/endpointslices", Route::NotFound),
            ("/apis/discovery.k8s.io/v1/pods", Route::NotFound),
            ("/apis/batch/v1/jobs", Route::NotFound),
            (
                "/api/v1/namespaces",
                Route::Collection {
                    resource: by_plural("namespaces").unwrap_or(99),
                    namespace: None,
                },
            ),
            (
                "/api/v1/namespaces/shop",
                Route::Object {
                    resource: by_plural("namespaces").unwrap_or(99),
                    namespace: String::new(),
                    name: "shop".into(),
                },
            ),
            (
                "/apis/rbac.authorization.k8s.io/v1/clusterroles/r1",
                Route::Object {
                    resource: by_plural("clusterroles").unwrap_or(99),
                    namespace: String::new(),
                    name: "r1".into(),
                },
            ),
            (
                "/apis/apps/v1/namespaces/ns1/deployments",
                Route::Collection {
                    resource: by_plural("deployments").unwrap_or(99),
                    namespace: Some("ns1".into()),
                },
            ),
            (
                "/apis/rbac.authorization.k8s.io/v1/namespaces/ns1/clusterroles",
                Route::NotFound,
            ),
            ("/api/v1/pods/p1/extra", Route::NotFound),
            (
                "/api/v1/namespaces/ns1/pods/p1/status",
                Route::Status {
                    resource: pods.unwrap_or(99),
                    namespace: "ns1".into(),
                    name: "p1".into(),
                },
            ),
            (
                "/api/v1/namespaces/ns1/configmaps/c1/status",
                Route::NotFound,
            ),
            ("/", Route::NotFound),
            ("", Route::NotFound),
        ];
        for (path, want) in cases {
            assert_eq!(&route(path), want, "path {path}");
        }
    }

    #[test]
    fn kinds_resolve() {
        assert_eq!(by_kind("v1", "Pod"), by_plural("pods"));
        assert_eq!(
            by_kind("discovery.k8s.io/v1", "EndpointSlice"),
            by_plural("endpointslices")
        );
        assert_eq!(by_kind("v1", "EndpointSlice"), None);
    }
}
