//! What the watchers decode, and how their events become store operations.
//!
//! [`Watched<W>`] is the type each kube watcher deserializes: the kind's slim
//! wire type (the same one the manifests source decodes, so fields the index
//! never reads are skipped by the decoder and never allocated), plus the
//! identity kube's watcher needs (`name`, `namespace`, `resourceVersion`,
//! `uid`) as a `k8s_openapi` `ObjectMeta`. Labels, the used annotations and
//! owner references stay in the wire type: the conversion reads them once,
//! and nothing is held twice.
//!
//! [`Translator`] turns one kind's watcher events into [`Op`]s. It does no
//! IO, so it is tested without a cluster.

use ballast_store::{
    resource::{
        truncate, AuthorizationPolicyWire, EndpointSliceWire, GrpcRouteWire, HttpRouteWire,
        InvalidObject, Kind, LinkerdHttpRouteWire, MeshTlsAuthenticationWire, NamespaceWire,
        NetworkAuthenticationWire, ObjectKey, PodWire, Resource, ServerWire, ServiceProfileWire,
        ServiceWire, Wire,
    },
    store::Op,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::watcher::Event;
use serde::{Deserialize, Deserializer};
use std::{borrow::Cow, collections::HashSet};

/// Invalid objects remembered per kind (so each is logged once); past it,
/// further ones are logged at debug level only.
const MAX_TRACKED_INVALID: usize = 10_000;
/// Longest reason logged for an invalid object.
const REASON_MAX: usize = 200;

/// Where a kind lives in the API.
pub(crate) trait ApiKind: Wire {
    const GROUP: &'static str;
    const VERSION: &'static str;
    /// The resource name in URLs, and the `kind` label of the kube metrics.
    const PLURAL: &'static str;
}

impl ApiKind for PodWire {
    const GROUP: &'static str = "";
    const VERSION: &'static str = "v1";
    const PLURAL: &'static str = "pods";
}

impl ApiKind for ServiceWire {
    const GROUP: &'static str = "";
    const VERSION: &'static str = "v1";
    const PLURAL: &'static str = "services";
}

impl ApiKind for EndpointSliceWire {
    const GROUP: &'static str = "discovery.k8s.io";
    const VERSION: &'static str = "v1";
    const PLURAL: &'static str = "endpointslices";
}

/// Policy kinds: their CRDs may not be installed (a LIST answered 404 is
/// then taken as an empty list, and retried on the backoff schedule).
macro_rules! api_kind {
    ($wire:ty, $group:expr, $version:expr, $plural:expr) => {
        impl ApiKind for $wire {
            const GROUP: &'static str = $group;
            const VERSION: &'static str = $version;
            const PLURAL: &'static str = $plural;
        }
    };
}

api_kind!(NamespaceWire, "", "v1", "namespaces");
api_kind!(
    HttpRouteWire,
    "gateway.networking.k8s.io",
    "v1",
    "httproutes"
);
api_kind!(
    GrpcRouteWire,
    "gateway.networking.k8s.io",
    "v1",
    "grpcroutes"
);
api_kind!(
    LinkerdHttpRouteWire,
    "policy.linkerd.io",
    "v1beta3",
    "httproutes"
);
api_kind!(ServerWire, "policy.linkerd.io", "v1beta3", "servers");
api_kind!(
    AuthorizationPolicyWire,
    "policy.linkerd.io",
    "v1alpha1",
    "authorizationpolicies"
);
api_kind!(
    MeshTlsAuthenticationWire,
    "policy.linkerd.io",
    "v1alpha1",
    "meshtlsauthentications"
);
api_kind!(
    NetworkAuthenticationWire,
    "policy.linkerd.io",
    "v1alpha1",
    "networkauthentications"
);

api_kind!(
    ServiceProfileWire,
    "linkerd.io",
    "v1alpha2",
    "serviceprofiles"
);

/// The resources the source watches, as `(group, version, plural)`: what its
/// RBAC role must allow `get`, `list` and `watch` on (the list lives with the
/// installed names, so that `check` and `install` need no controller code).
pub use ballast_controlplane::WATCHED_RESOURCES;

/// One object as a watcher decodes it: see the module documentation.
#[derive(Clone, Debug)]
pub(crate) struct Watched<W> {
    meta: ObjectMeta,
    wire: W,
}

impl<W: Wire> Watched<W> {
    /// The object's key, as the index files it.
    fn key(&self) -> Result<ObjectKey, InvalidObject> {
        self.wire.metadata().key()
    }

    #[cfg(test)]
    pub(crate) fn wire(&self) -> &W {
        &self.wire
    }
}

impl<'de, W: Wire> Deserialize<'de> for Watched<W> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut wire = W::deserialize(d)?;
        let m = wire.metadata_mut();
        let meta = ObjectMeta {
            name: m.name.clone(),
            namespace: m.namespace.clone(),
            resource_version: m.resource_version.take(),
            uid: m.uid.take(),
            ..ObjectMeta::default()
        };
        Ok(Self { meta, wire })
    }
}

impl<W: ApiKind> kube::Resource for Watched<W> {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        W::KIND.as_str().into()
    }

    fn group(_: &()) -> Cow<'_, str> {
        W::GROUP.into()
    }

    fn version(_: &()) -> Cow<'_, str> {
        W::VERSION.into()
    }

    fn plural(_: &()) -> Cow<'_, str> {
        W::PLURAL.into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.meta
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.meta
    }
}

/// What one watcher event did.
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    /// The change for the store, if any.
    pub op: Option<Op>,
    /// A full list completed (`InitDone`).
    pub listed: bool,
    /// A list started after a completed one: a relist.
    pub relist: bool,
    /// The event shows the watch delivering changes (`Apply`, `Delete`).
    pub progress: bool,
}

/// One kind's watcher events to store operations.
///
/// - `Init` starts a buffer; `InitApply` converts and buffers; `InitDone`
///   replaces the kind's objects with the buffer in one [`Op::Reset`] (the
///   store deletes what is missing and sends nothing for what is unchanged).
/// - `Apply` converts to [`Op::Apply`]; `Delete` is [`Op::Delete`] by key.
/// - An object that fails conversion is logged once (kind, namespace/name,
///   field, bounded reason) and left out. For `Apply` that means
///   [`Op::Delete`] of its key: the index then holds exactly the usable
///   objects, the same state a relist would reach, and never a stale
///   version of an object that has changed.
#[derive(Debug)]
pub(crate) struct Translator {
    kind: Kind,
    plural: &'static str,
    /// Objects of the list in progress (`Init` to `InitDone`).
    buffer: Option<Vec<Resource>>,
    /// Invalid objects found by the list in progress.
    buffer_invalid: HashSet<ObjectKey>,
    /// A list completed since the last `Init`.
    listed: bool,
    /// Objects currently left out as invalid (each logged once).
    invalid: HashSet<ObjectKey>,
}

impl Translator {
    pub fn new<W: ApiKind>() -> Self {
        Self {
            kind: W::KIND,
            plural: W::PLURAL,
            buffer: None,
            buffer_invalid: HashSet::new(),
            listed: false,
            invalid: HashSet::new(),
        }
    }

    /// Objects currently left out as invalid.
    pub fn invalid_count(&self) -> usize {
        self.invalid.len()
    }

    pub fn on_event<W: Wire>(&mut self, event: Event<Watched<W>>) -> Outcome {
        debug_assert_eq!(W::KIND, self.kind);
        match event {
            Event::Init => {
                let relist = std::mem::replace(&mut self.listed, false);
                self.buffer = Some(Vec::new());
                self.buffer_invalid.clear();
                Outcome {
                    relist,
                    ..Outcome::default()
                }
            }
            Event::InitApply(obj) => {
                let key = obj.key();
                match obj.wire.into_resource() {
                    Ok(r) => self.buffer.get_or_insert_with(Vec::new).push(r),
                    Err(e) => {
                        if let Ok(key) = key {
                            if !self.invalid.contains(&key) {
                                self.log_invalid(&key, &e, "left out of the index");
                            }
                            if self.buffer_invalid.len() < MAX_TRACKED_INVALID {
                                self.buffer_invalid.insert(key);
                            }
                        } else {
                            self.log_unnamed(&e);
                        }
                    }
                }
                Outcome::default()
            }
            Event::InitDone => {
                let objects = self.buffer.take().unwrap_or_default();
                self.invalid = std::mem::take(&mut self.buffer_invalid);
                self.listed = true;
                Outcome {
                    op: Some(Op::Reset(self.kind, objects)),
                    listed: true,
                    ..Outcome::default()
                }
            }
            Event::Apply(obj) => {
                let key = obj.key();
                let op = match (obj.wire.into_resource(), key) {
                    (Ok(r), _) => {
                        self.invalid.remove(r.key());
                        Some(Op::Apply(r))
                    }
                    (Err(e), Ok(key)) => {
                        if !self.invalid.contains(&key) {
                            self.log_invalid(&key, &e, "removed from the index");
                            if self.invalid.len() < MAX_TRACKED_INVALID {
                                self.invalid.insert(key.clone());
                            }
                        }
                        Some(Op::Delete(self.kind, key))
                    }
                    (Err(e), Err(_)) => {
                        self.log_unnamed(&e);
                        None
                    }
                };
                Outcome {
                    op,
                    progress: true,
                    ..Outcome::default()
                }
            }
            Event::Delete(obj) => {
                let op = match obj.key() {
                    Ok(key) => {
                        self.invalid.remove(&key);
                        Some(Op::Delete(self.kind, key))
                    }
                    Err(_) => None,
                };
                Outcome {
                    op,
                    progress: true,
                    ..Outcome::default()
                }
            }
        }
    }

    fn log_invalid(&self, key: &ObjectKey, e: &InvalidObject, action: &str) {
        let mut reason = e.reason.clone();
        truncate(&mut reason, REASON_MAX);
        let mut field = e.field.clone();
        truncate(&mut field, REASON_MAX);
        if self.invalid.len() < MAX_TRACKED_INVALID {
            tracing::warn!(
                kind = self.plural,
                object = %key,
                field = %field,
                reason = %reason,
                "Kubernetes object cannot be used; {action}"
            );
        } else {
            tracing::debug!(
                kind = self.plural,
                object = %key,
                field = %field,
                reason = %reason,
                "Kubernetes object cannot be used; {action}"
            );
        }
    }

    fn log_unnamed(&self, e: &InvalidObject) {
        let mut reason = e.to_string();
        truncate(&mut reason, REASON_MAX);
        tracing::debug!(kind = self.plural, %reason, "Kubernetes object without a name skipped");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn api<W: ApiKind>() -> (&'static str, &'static str, &'static str) {
        (W::GROUP, W::VERSION, W::PLURAL)
    }

    #[test]
    fn the_watched_list_is_exactly_what_the_watchers_read() {
        let watched: HashSet<_> = WATCHED_RESOURCES.iter().copied().collect();
        let read: HashSet<_> = [
            api::<PodWire>(),
            api::<ServiceWire>(),
            api::<EndpointSliceWire>(),
            api::<NamespaceWire>(),
            api::<HttpRouteWire>(),
            api::<GrpcRouteWire>(),
            api::<LinkerdHttpRouteWire>(),
            api::<ServerWire>(),
            api::<AuthorizationPolicyWire>(),
            api::<MeshTlsAuthenticationWire>(),
            api::<NetworkAuthenticationWire>(),
            api::<ServiceProfileWire>(),
        ]
        .into_iter()
        .collect();
        assert_eq!(watched, read);
        assert_eq!(watched.len(), WATCHED_RESOURCES.len(), "no entry twice");
    }

    fn pod_json(name: &str, ip: &str, rv: &str) -> serde_json::Value {
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": "ns",
                "resourceVersion": rv,
                "uid": format!("uid-{name}"),
                "labels": {"app": "web"},
            },
            "spec": {"containers": [{"name": "app", "ports": [{"containerPort": 8080}]}]},
            "status": {"phase": "Running", "podIP": ip},
        })
    }

    fn pod(name: &str, ip: &str, rv: &str) -> Watched<PodWire> {
        serde_json::from_value(pod_json(name, ip, rv)).unwrap()
    }

    fn bad_pod(name: &str) -> Watched<PodWire> {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "resourceVersion": "9"},
            "status": {"phase": "Dancing"},
        }))
        .unwrap()
    }

    fn key(name: &str) -> ObjectKey {
        ObjectKey::new("ns", name)
    }

    fn keys(objects: &[Resource]) -> Vec<String> {
        objects.iter().map(|r| r.key().to_string()).collect()
    }

    #[test]
    fn slim_decoding_skips_managed_fields_annotations_and_env() {
        let big = "x".repeat(256 * 1024);
        let value = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "web-0",
                "namespace": "ns",
                "resourceVersion": "42",
                "uid": "u-1",
                "generation": 3,
                "finalizers": ["a/b"],
                "managedFields": [{
                    "manager": "kubectl",
                    "operation": "Update",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:app": {}}}},
                }],
                "labels": {"app": "web"},
                "annotations": {
                    "kubectl.kubernetes.io/last-applied-configuration": big,
                    "config.linkerd.io/opaque-ports": "3306",
                },
                "ownerReferences": [{
                    "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-abc",
                    "uid": "u-2", "controller": true, "blockOwnerDeletion": true,
                }],
                "creationTimestamp": "2024-01-01T00:00:00Z",
            },
            "spec": {
                "volumes": [{"name": "data", "emptyDir": {}}],
                "containers": [
                    {
                        "name": "app",
                        "image": "example/web:1",
                        "env": [{"name": "SECRET_BLOB", "value": big}],
                        "ports": [{"name": "http", "containerPort": 8080}],
                    },
                    {
                        "name": "linkerd-proxy",
                        "image": "linkerd/proxy",
                        "env": [
                            {"name": "LINKERD2_PROXY_LOG", "value": "warn"},
                            {"name": "LINKERD2_PROXY_INBOUND_LISTEN_ADDR", "value": "0.0.0.0:4143"},
                        ],
                    },
                ],
            },
            "status": {
                "phase": "Running",
                "podIP": "10.0.0.1",
                "conditions": [{"type": "Ready", "status": "True", "message": big}],
                "containerStatuses": [{"name": "app", "image": "example/web:1", "ready": true}],
            },
        });
        let text = serde_json::to_string(&value).unwrap();
        let watched: Watched<PodWire> = serde_json::from_str(&text).unwrap();

        use kube::Resource as _;
        let meta = watched.meta();
        assert_eq!(meta.name.as_deref(), Some("web-0"));
        assert_eq!(meta.namespace.as_deref(), Some("ns"));
        assert_eq!(meta.resource_version.as_deref(), Some("42"));
        assert_eq!(meta.uid.as_deref(), Some("u-1"));
        assert!(meta.managed_fields.is_none());
        assert!(meta.annotations.is_none());
        assert!(meta.finalizers.is_none());

        let wire_meta = watched.wire().metadata();
        let annotations: Vec<_> = wire_meta.annotations.keys().cloned().collect();
        assert_eq!(annotations, ["config.linkerd.io/opaque-ports"]);
        // Nothing decoded holds the large values.
        let debug = format!("{watched:?}");
        assert!(!debug.contains("xxxxxxxx"), "a large value was kept");
        assert!(
            !debug.contains("kubectl"),
            "managedFields or the annotation was kept"
        );
        assert!(!debug.contains("LINKERD2_PROXY_LOG"));
        assert!(!debug.contains("example/web"), "an image was kept");

        let Ok(Resource::Pod(p)) = watched.wire.into_resource() else {
            panic!("pod did not convert");
        };
        assert_eq!(p.proxy_inbound_port, Some(4143));
        assert_eq!(p.annotations.len(), 1);
        assert_eq!(p.owner.as_ref().map(|o| o.name.as_str()), Some("web-abc"));
        assert!(p.ready);
        assert_eq!(p.container_port_named("http"), Some(8080));
    }

    #[test]
    fn watched_types_name_their_api() {
        use kube::Resource as _;
        assert_eq!(
            Watched::<PodWire>::url_path(&(), Some("ns")),
            "/api/v1/namespaces/ns/pods"
        );
        assert_eq!(
            Watched::<ServiceWire>::url_path(&(), None),
            "/api/v1/services"
        );
        assert_eq!(
            Watched::<EndpointSliceWire>::url_path(&(), None),
            "/apis/discovery.k8s.io/v1/endpointslices"
        );
        assert_eq!(Watched::<EndpointSliceWire>::kind(&()), "EndpointSlice");
        assert_eq!(
            Watched::<EndpointSliceWire>::api_version(&()),
            "discovery.k8s.io/v1"
        );
    }

    #[test]
    fn initial_list_is_one_reset() {
        let mut t = Translator::new::<PodWire>();
        let o = t.on_event::<PodWire>(Event::Init);
        assert!(o.op.is_none() && !o.relist && !o.listed);
        for (i, name) in ["a", "b"].iter().enumerate() {
            let o = t.on_event(Event::InitApply(pod(name, &format!("10.0.0.{i}"), "1")));
            assert!(o.op.is_none());
        }
        let o = t.on_event::<PodWire>(Event::InitDone);
        assert!(o.listed && !o.relist);
        match o.op {
            Some(Op::Reset(Kind::Pod, objects)) => assert_eq!(keys(&objects), ["ns/a", "ns/b"]),
            other => panic!("expected a reset, got {other:?}"),
        }
    }

    #[test]
    fn watch_events_are_applies_and_deletes() {
        let mut t = Translator::new::<PodWire>();
        t.on_event::<PodWire>(Event::Init);
        t.on_event::<PodWire>(Event::InitDone);
        let o = t.on_event(Event::Apply(pod("a", "10.0.0.1", "2")));
        assert!(o.progress);
        assert!(matches!(o.op, Some(Op::Apply(Resource::Pod(ref p))) if p.key == key("a")));
        let o = t.on_event(Event::Delete(pod("a", "10.0.0.1", "3")));
        assert!(o.progress);
        assert!(matches!(o.op, Some(Op::Delete(Kind::Pod, ref k)) if *k == key("a")));
    }

    #[test]
    fn a_second_list_is_a_relist_and_a_failed_list_is_not() {
        let mut t = Translator::new::<PodWire>();
        assert!(!t.on_event::<PodWire>(Event::Init).relist);
        // A list that fails before InitDone restarts with another Init: the
        // same initial list, not a relist.
        assert!(!t.on_event::<PodWire>(Event::Init).relist);
        t.on_event::<PodWire>(Event::InitDone);
        assert!(t.on_event::<PodWire>(Event::Init).relist);
        t.on_event(Event::InitApply(pod("b", "10.0.0.2", "5")));
        let o = t.on_event::<PodWire>(Event::InitDone);
        match o.op {
            Some(Op::Reset(Kind::Pod, objects)) => assert_eq!(keys(&objects), ["ns/b"]),
            other => panic!("expected a reset, got {other:?}"),
        }
    }

    #[test]
    fn invalid_objects_are_left_out_and_removed() {
        let mut t = Translator::new::<PodWire>();
        t.on_event::<PodWire>(Event::Init);
        t.on_event(Event::InitApply(pod("a", "10.0.0.1", "1")));
        t.on_event(Event::InitApply(bad_pod("bad")));
        match t.on_event::<PodWire>(Event::InitDone).op {
            Some(Op::Reset(_, objects)) => assert_eq!(keys(&objects), ["ns/a"]),
            other => panic!("expected a reset, got {other:?}"),
        }
        assert_eq!(t.invalid_count(), 1);
        // A valid object turning invalid is deleted, not kept stale.
        let o = t.on_event(Event::Apply(bad_pod("a")));
        assert!(matches!(o.op, Some(Op::Delete(Kind::Pod, ref k)) if *k == key("a")));
        assert_eq!(t.invalid_count(), 2);
        // Fixed again: applied, and no longer counted.
        let o = t.on_event(Event::Apply(pod("a", "10.0.0.1", "7")));
        assert!(matches!(o.op, Some(Op::Apply(_))));
        assert_eq!(t.invalid_count(), 1);
        let o = t.on_event(Event::Delete(bad_pod("bad")));
        assert!(matches!(o.op, Some(Op::Delete(Kind::Pod, ref k)) if *k == key("bad")));
        assert_eq!(t.invalid_count(), 0);
    }

    #[test]
    fn services_and_slices_translate() {
        let svc: Watched<ServiceWire> = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "ns", "resourceVersion": "3"},
            "spec": {"clusterIP": "10.96.0.10", "ports": [{"port": 80}]},
        }))
        .unwrap();
        let mut t = Translator::new::<ServiceWire>();
        let o = t.on_event(Event::Apply(svc));
        assert!(matches!(o.op, Some(Op::Apply(Resource::Service(_)))));

        let slice: Watched<EndpointSliceWire> = serde_json::from_value(json!({
            "metadata": {
                "name": "web-abc", "namespace": "ns", "resourceVersion": "4",
                "labels": {"kubernetes.io/service-name": "web"},
            },
            "addressType": "IPv4",
            "ports": [{"port": 8080}],
            "endpoints": [{"addresses": ["10.0.0.1"]}],
        }))
        .unwrap();
        let mut t = Translator::new::<EndpointSliceWire>();
        match t.on_event(Event::Apply(slice)).op {
            Some(Op::Apply(Resource::EndpointSlice(s))) => {
                assert_eq!(s.service, Some(ObjectKey::new("ns", "web")));
            }
            other => panic!("expected a slice, got {other:?}"),
        }
    }
}
