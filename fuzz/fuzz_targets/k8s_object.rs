//! One Kubernetes object as the API server sends it (JSON), converted to the
//! resource the index holds.
//!
//! Properties: an object is used only for the kinds the index reads, under
//! the name and namespace its metadata gives (namespace `default` when
//! absent); anything else is skipped or refused with a bounded reason.
#![no_main]

use ballast_store::resource::{Kind, Resource};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

/// The kind the index files an object of this `apiVersion` and `kind` under.
fn used_kind(api_version: Option<&str>, kind: Option<&str>) -> Option<Kind> {
    let (api_version, kind) = (api_version?, kind?);
    let group = api_version.split('/').next().unwrap_or_default();
    Some(match (api_version, group, kind) {
        ("v1", _, "Pod") => Kind::Pod,
        ("v1", _, "Service") => Kind::Service,
        ("v1", _, "Namespace") => Kind::Namespace,
        ("discovery.k8s.io/v1", _, "EndpointSlice") => Kind::EndpointSlice,
        ("linkerd.io/v1alpha2", _, "ServiceProfile") => Kind::ServiceProfile,
        (v, "gateway.networking.k8s.io", "HTTPRoute") if v.contains('/') => Kind::HttpRoute,
        (v, "gateway.networking.k8s.io", "GRPCRoute") if v.contains('/') => Kind::GrpcRoute,
        (v, "policy.linkerd.io", k) if v.contains('/') => match k {
            "HTTPRoute" => Kind::LinkerdHttpRoute,
            "Server" => Kind::Server,
            "AuthorizationPolicy" => Kind::AuthorizationPolicy,
            "MeshTLSAuthentication" => Kind::MeshTlsAuthentication,
            "NetworkAuthentication" => Kind::NetworkAuthentication,
            _ => return None,
        },
        _ => return None,
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(value) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let api_version = value
        .get("apiVersion")
        .and_then(Value::as_str)
        .map(str::to_string);
    let kind = value
        .get("kind")
        .and_then(Value::as_str)
        .map(str::to_string);
    let meta = value.get("metadata").cloned().unwrap_or(Value::Null);
    match Resource::from_value(value) {
        Ok(Some(resource)) => {
            let want = used_kind(api_version.as_deref(), kind.as_deref());
            assert_eq!(Some(resource.kind()), want, "used an object of kind {kind:?}");
            let key = resource.key();
            assert_eq!(meta.get("name").and_then(Value::as_str), Some(&*key.name));
            let ns = if want == Some(Kind::Namespace) {
                // Namespaces have no namespace.
                ""
            } else {
                meta.get("namespace")
                    .and_then(Value::as_str)
                    .filter(|ns| !ns.is_empty())
                    .unwrap_or("default")
            };
            assert_eq!(&*key.namespace, ns);
        }
        Ok(None) => assert_eq!(
            used_kind(api_version.as_deref(), kind.as_deref()),
            None,
            "an object of a used kind was skipped"
        ),
        Err(e) => {
            assert!(!e.field.is_empty() || !e.reason.is_empty());
            assert!(e.reason.len() <= 1024, "{} bytes: {e}", e.reason.len());
        }
    }
});
