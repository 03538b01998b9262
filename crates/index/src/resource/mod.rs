//! The slim projections of the Kubernetes objects the index reads.
//!
//! Each kind has a *wire* type shaped like the API's JSON (unknown fields are
//! ignored, so they are never allocated) and a *domain* type holding only what
//! the index uses. Conversion checks required fields and names the one missing.

mod authz;
mod duration;
mod endpoint_slice;
mod meta;
mod pod;
mod profile;
mod route;
mod service;

pub use authz::{
    namespace_key, AuthnRef, AuthorizationPolicy, AuthorizationPolicyWire, AuthzTarget,
    DefaultPolicy, IdentityMatch, IpNet, LabelSelector, MeshTlsAuthentication,
    MeshTlsAuthenticationWire, Namespace, NamespaceWire, Network, NetworkAuthentication,
    NetworkAuthenticationWire, SelectorExpression, Server, ServerPort, ServerProtocol, ServerWire,
    DEFAULT_INBOUND_POLICY_ANNOTATION,
};
pub use duration::{parse_annotation_duration, parse_gateway_duration, MAX_POLICY_DURATION};
pub use endpoint_slice::{EndpointSlice, SliceEndpoint, SlicePort};
pub use meta::{Labels, ObjectKey, Owner};
pub use pod::{ContainerPort, Phase, Pod, ProxyPorts};
pub use profile::{
    DstOverride, ProfileRoute, RequestCondition, ResponseClass, ResponseCondition, RetryBudget,
    ServiceProfile, ServiceProfileWire,
};
pub use route::{
    check_regex, BackendRef, GrpcMatch, GrpcRetryCode, HeaderMatch, HeaderModifier, HostMatch,
    HttpMatch, ParentKind, ParentRef, PathMatch, PathModifier, QueryParamMatch, Redirect, Route,
    RouteApi, RouteFilter, RouteMatch, RouteRetry, RouteRule, RouteTimeouts, RouteWire, ValueMatch,
    GATEWAY_GROUP, POLICY_GROUP,
};
pub use service::{FailureAccrual, Service, ServicePort, ServiceType, TargetPort};

pub use endpoint_slice::EndpointSliceWire;
pub use meta::ObjectMetaWire;
pub use pod::PodWire;
pub use service::ServiceWire;

use std::sync::Arc;

/// Annotation listing ports that carry opaque (non-HTTP) traffic.
pub const OPAQUE_PORTS_ANNOTATION: &str = "config.linkerd.io/opaque-ports";
/// Annotation listing ports on which a pod's proxy is bypassed.
pub const SKIP_INBOUND_PORTS_ANNOTATION: &str = "config.linkerd.io/skip-inbound-ports";
/// The annotations the index reads; all others are dropped when decoding.
pub const USED_ANNOTATIONS: &[&str] = &[
    OPAQUE_PORTS_ANNOTATION,
    SKIP_INBOUND_PORTS_ANNOTATION,
    DEFAULT_INBOUND_POLICY_ANNOTATION,
    route::RETRY_HTTP_ANNOTATION,
    route::RETRY_GRPC_ANNOTATION,
    route::RETRY_LIMIT_ANNOTATION,
    route::RETRY_TIMEOUT_ANNOTATION,
    route::TIMEOUT_REQUEST_ANNOTATION,
    route::TIMEOUT_RESPONSE_ANNOTATION,
    route::TIMEOUT_IDLE_ANNOTATION,
    service::FAILURE_ACCRUAL_ANNOTATION,
    service::FAILURE_ACCRUAL_MAX_FAILURES_ANNOTATION,
    service::FAILURE_ACCRUAL_MIN_PENALTY_ANNOTATION,
    service::FAILURE_ACCRUAL_MAX_PENALTY_ANNOTATION,
    service::FAILURE_ACCRUAL_JITTER_ANNOTATION,
];
/// Label set by Linkerd's proxy injector on meshed pods.
pub use ballast_controlplane::CONTROL_PLANE_NS_LABEL;

/// A Kubernetes object the index understands.
///
/// Objects are shared, not copied: a source that keeps the last good state of
/// a file and the index that serves it hold the same allocation.
#[derive(Clone, Debug, PartialEq)]
pub enum Resource {
    Pod(Arc<Pod>),
    Service(Arc<Service>),
    EndpointSlice(Arc<EndpointSlice>),
    Namespace(Arc<Namespace>),
    Route(Arc<Route>),
    Server(Arc<Server>),
    AuthorizationPolicy(Arc<AuthorizationPolicy>),
    MeshTlsAuthentication(Arc<MeshTlsAuthentication>),
    NetworkAuthentication(Arc<NetworkAuthentication>),
    ServiceProfile(Arc<ServiceProfile>),
}

/// The kinds of object the index holds.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Pod,
    Service,
    EndpointSlice,
    Namespace,
    /// `gateway.networking.k8s.io` `HTTPRoute`.
    HttpRoute,
    /// `gateway.networking.k8s.io` `GRPCRoute`.
    GrpcRoute,
    /// `policy.linkerd.io` `HTTPRoute` (a kind of its own: it may share a
    /// name with a Gateway API route).
    LinkerdHttpRoute,
    Server,
    AuthorizationPolicy,
    MeshTlsAuthentication,
    NetworkAuthentication,
    /// `linkerd.io` `ServiceProfile`.
    ServiceProfile,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Pod => "Pod",
            Kind::Service => "Service",
            Kind::EndpointSlice => "EndpointSlice",
            Kind::Namespace => "Namespace",
            Kind::HttpRoute => "HTTPRoute",
            Kind::GrpcRoute => "GRPCRoute",
            Kind::LinkerdHttpRoute => "HTTPRoute.policy.linkerd.io",
            Kind::Server => "Server",
            Kind::AuthorizationPolicy => "AuthorizationPolicy",
            Kind::MeshTlsAuthentication => "MeshTLSAuthentication",
            Kind::NetworkAuthentication => "NetworkAuthentication",
            Kind::ServiceProfile => "ServiceProfile",
        }
    }

    /// Every kind, in the order sources load them.
    pub const ALL: [Kind; 12] = [
        Kind::Pod,
        Kind::Service,
        Kind::EndpointSlice,
        Kind::Namespace,
        Kind::HttpRoute,
        Kind::GrpcRoute,
        Kind::LinkerdHttpRoute,
        Kind::Server,
        Kind::AuthorizationPolicy,
        Kind::MeshTlsAuthentication,
        Kind::NetworkAuthentication,
        Kind::ServiceProfile,
    ];

    /// Kinds that carry policy (routes and authorization), not endpoints.
    pub fn is_policy(self) -> bool {
        !matches!(self, Kind::Pod | Kind::Service | Kind::EndpointSlice)
    }
}

impl Resource {
    pub fn kind(&self) -> Kind {
        match self {
            Resource::Pod(_) => Kind::Pod,
            Resource::Service(_) => Kind::Service,
            Resource::EndpointSlice(_) => Kind::EndpointSlice,
            Resource::Namespace(_) => Kind::Namespace,
            Resource::Route(r) => match r.api {
                RouteApi::GatewayHttp => Kind::HttpRoute,
                RouteApi::GatewayGrpc => Kind::GrpcRoute,
                RouteApi::LinkerdHttp => Kind::LinkerdHttpRoute,
            },
            Resource::Server(_) => Kind::Server,
            Resource::AuthorizationPolicy(_) => Kind::AuthorizationPolicy,
            Resource::MeshTlsAuthentication(_) => Kind::MeshTlsAuthentication,
            Resource::NetworkAuthentication(_) => Kind::NetworkAuthentication,
            Resource::ServiceProfile(_) => Kind::ServiceProfile,
        }
    }

    pub fn key(&self) -> &ObjectKey {
        match self {
            Resource::Pod(p) => &p.key,
            Resource::Service(s) => &s.key,
            Resource::EndpointSlice(e) => &e.key,
            Resource::Namespace(n) => &n.key,
            Resource::Route(r) => &r.key,
            Resource::Server(s) => &s.key,
            Resource::AuthorizationPolicy(a) => &a.key,
            Resource::MeshTlsAuthentication(m) => &m.key,
            Resource::NetworkAuthentication(n) => &n.key,
            Resource::ServiceProfile(p) => &p.key,
        }
    }

    /// Converts one decoded object (any JSON-shaped value) into a resource.
    ///
    /// `Ok(None)` means the object is of a kind the index does not use.
    pub fn from_value(value: serde_json::Value) -> Result<Option<Resource>, InvalidObject> {
        let api_version = value
            .get("apiVersion")
            .and_then(|v| v.as_str())
            .unwrap_or_default();
        let kind = value
            .get("kind")
            .and_then(|v| v.as_str())
            .unwrap_or_default();
        match (api_version, kind) {
            ("v1", "Pod") => decode::<PodWire>(value).map(Some),
            ("v1", "Service") => decode::<ServiceWire>(value).map(Some),
            ("discovery.k8s.io/v1", "EndpointSlice") => {
                decode::<EndpointSliceWire>(value).map(Some)
            }
            ("v1", "Namespace") => decode::<NamespaceWire>(value).map(Some),
            ("linkerd.io/v1alpha2", "ServiceProfile") => {
                decode::<ServiceProfileWire>(value).map(Some)
            }
            (v, "HTTPRoute") if v.starts_with("gateway.networking.k8s.io/") => {
                decode::<HttpRouteWire>(value).map(Some)
            }
            (v, "GRPCRoute") if v.starts_with("gateway.networking.k8s.io/") => {
                decode::<GrpcRouteWire>(value).map(Some)
            }
            (v, kind) if v.starts_with("policy.linkerd.io/") => match kind {
                "HTTPRoute" => decode::<LinkerdHttpRouteWire>(value).map(Some),
                "Server" => decode::<ServerWire>(value).map(Some),
                "AuthorizationPolicy" => decode::<AuthorizationPolicyWire>(value).map(Some),
                "MeshTLSAuthentication" => decode::<MeshTlsAuthenticationWire>(value).map(Some),
                "NetworkAuthentication" => decode::<NetworkAuthenticationWire>(value).map(Some),
                _ => Ok(None),
            },
            _ => Ok(None),
        }
    }
}

/// One kind's wire type: the API's JSON decoded slim, then converted to the
/// domain object the index holds. Both sources decode through it.
pub trait Wire:
    serde::de::DeserializeOwned + Clone + std::fmt::Debug + Send + Sync + 'static
{
    const KIND: Kind;

    fn metadata(&self) -> &ObjectMetaWire;

    fn metadata_mut(&mut self) -> &mut ObjectMetaWire;

    /// Checks the object and converts it; the error names the field.
    fn into_resource(self) -> Result<Resource, InvalidObject>;
}

impl Wire for PodWire {
    const KIND: Kind = Kind::Pod;

    fn metadata(&self) -> &ObjectMetaWire {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMetaWire {
        &mut self.metadata
    }

    fn into_resource(self) -> Result<Resource, InvalidObject> {
        Ok(Resource::Pod(Arc::new(Pod::try_from(self)?)))
    }
}

impl Wire for ServiceWire {
    const KIND: Kind = Kind::Service;

    fn metadata(&self) -> &ObjectMetaWire {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMetaWire {
        &mut self.metadata
    }

    fn into_resource(self) -> Result<Resource, InvalidObject> {
        Ok(Resource::Service(Arc::new(Service::try_from(self)?)))
    }
}

impl Wire for EndpointSliceWire {
    const KIND: Kind = Kind::EndpointSlice;

    fn metadata(&self) -> &ObjectMetaWire {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMetaWire {
        &mut self.metadata
    }

    fn into_resource(self) -> Result<Resource, InvalidObject> {
        Ok(Resource::EndpointSlice(Arc::new(EndpointSlice::try_from(
            self,
        )?)))
    }
}

/// A wire type whose conversion is `TryFrom`, wrapped in its resource variant.
macro_rules! policy_wire {
    ($wire:ty, $kind:expr, $variant:ident, $domain:ty) => {
        impl Wire for $wire {
            const KIND: Kind = $kind;

            fn metadata(&self) -> &ObjectMetaWire {
                &self.metadata
            }

            fn metadata_mut(&mut self) -> &mut ObjectMetaWire {
                &mut self.metadata
            }

            fn into_resource(self) -> Result<Resource, InvalidObject> {
                Ok(Resource::$variant(Arc::new(<$domain>::try_from(self)?)))
            }
        }
    };
}

policy_wire!(NamespaceWire, Kind::Namespace, Namespace, Namespace);
policy_wire!(
    ServiceProfileWire,
    Kind::ServiceProfile,
    ServiceProfile,
    ServiceProfile
);
policy_wire!(ServerWire, Kind::Server, Server, Server);
policy_wire!(
    AuthorizationPolicyWire,
    Kind::AuthorizationPolicy,
    AuthorizationPolicy,
    AuthorizationPolicy
);
policy_wire!(
    MeshTlsAuthenticationWire,
    Kind::MeshTlsAuthentication,
    MeshTlsAuthentication,
    MeshTlsAuthentication
);
policy_wire!(
    NetworkAuthenticationWire,
    Kind::NetworkAuthentication,
    NetworkAuthentication,
    NetworkAuthentication
);

/// One route kind's wire type: the shared route wire, typed by the API it
/// is watched from (list items may omit `apiVersion` and `kind`).
macro_rules! route_wire {
    ($name:ident, $kind:expr, $api_version:expr, $api_kind:expr) => {
        #[derive(serde::Deserialize, Clone, Debug)]
        #[serde(transparent)]
        pub struct $name(pub RouteWire);

        impl Wire for $name {
            const KIND: Kind = $kind;

            fn metadata(&self) -> &ObjectMetaWire {
                &self.0.metadata
            }

            fn metadata_mut(&mut self) -> &mut ObjectMetaWire {
                &mut self.0.metadata
            }

            fn into_resource(mut self) -> Result<Resource, InvalidObject> {
                self.0.set_type($api_version, $api_kind);
                Ok(Resource::Route(Arc::new(Route::try_from(self.0)?)))
            }
        }
    };
}

route_wire!(
    HttpRouteWire,
    Kind::HttpRoute,
    "gateway.networking.k8s.io/v1",
    "HTTPRoute"
);
route_wire!(
    GrpcRouteWire,
    Kind::GrpcRoute,
    "gateway.networking.k8s.io/v1",
    "GRPCRoute"
);
route_wire!(
    LinkerdHttpRouteWire,
    Kind::LinkerdHttpRoute,
    "policy.linkerd.io/v1beta3",
    "HTTPRoute"
);

/// Longest reason an [`InvalidObject`] carries.
pub const MAX_REASON_BYTES: usize = 200;

/// Why an object could not be used: the field that is wrong, and how.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("field `{field}`: {reason}")]
pub struct InvalidObject {
    /// Dotted path of the offending field, e.g. `spec.ports[0].port`.
    pub field: String,
    pub reason: String,
}

impl InvalidObject {
    pub fn missing(field: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            reason: "required but missing".into(),
        }
    }

    /// The reason is cut to [`MAX_REASON_BYTES`]: reasons quote input
    /// values, and an error must stay small whatever the input.
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        let mut reason = reason.into();
        truncate(&mut reason, MAX_REASON_BYTES);
        Self {
            field: field.into(),
            reason,
        }
    }
}

fn decode<W: Wire>(value: serde_json::Value) -> Result<Resource, InvalidObject> {
    let wire: W = serde_path_to_error::deserialize(value).map_err(|e| {
        let field = e.path().to_string();
        // serde's messages can quote whole input values; keep the reason short.
        let mut reason = e.into_inner().to_string();
        truncate(&mut reason, 160);
        InvalidObject { field, reason }
    })?;
    wire.into_resource()
}

/// Shortens `s` to at most `max` bytes on a char boundary, marking the cut.
pub fn truncate(s: &mut String, max: usize) {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
}
