//! One Kubernetes object as the API server sends it (JSON), converted to the
//! resource the index holds.
//!
//! Properties: an object is used only for the kinds the index reads, under
//! the name and namespace its metadata gives (namespace `default` when
//! absent); anything else is skipped or refused with a bounded reason.
#![no_main]

use ballast_destination::resource::{Kind, Resource};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

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
            let want = match (api_version.as_deref(), kind.as_deref()) {
                (Some("v1"), Some("Pod")) => Kind::Pod,
                (Some("v1"), Some("Service")) => Kind::Service,
                (Some("discovery.k8s.io/v1"), Some("EndpointSlice")) => Kind::EndpointSlice,
                other => panic!("used an object of kind {other:?}"),
            };
            assert_eq!(resource.kind(), want);
            let key = resource.key();
            assert_eq!(meta.get("name").and_then(Value::as_str), Some(&*key.name));
            let ns = meta
                .get("namespace")
                .and_then(Value::as_str)
                .filter(|ns| !ns.is_empty())
                .unwrap_or("default");
            assert_eq!(&*key.namespace, ns);
        }
        Ok(None) => assert!(!matches!(
            (api_version.as_deref(), kind.as_deref()),
            (Some("v1"), Some("Pod" | "Service"))
                | (Some("discovery.k8s.io/v1"), Some("EndpointSlice"))
        )),
        Err(e) => {
            assert!(!e.field.is_empty() || !e.reason.is_empty());
            assert!(e.reason.len() <= 1024, "{} bytes: {e}", e.reason.len());
        }
    }
});
