//! Writes as the API server makes them: create, update (the object or its status),
//! patch (merge, JSON Patch, apply) and delete (graceful for Pods, Terminating for
//! Namespaces). HTTP requests and the in-process methods take this one path, so
//! admission and defaulting apply to both.

use std::fmt;
use std::sync::Arc;

use rand::Rng;
use serde_json::{json, Map, Value};

use super::admission::{self, Operation};
use super::patch::{self, PatchType};
use super::resources::{self, RESOURCES};
use super::selector::bounded;
use super::store::{now_rfc3339, rfc3339_after, Key};
use super::{lock, Shared};

/// The most objects stored; creates beyond are refused as etcd refuses writes past
/// its quota (in-process [`crate::ApiServer::apply`] is not bounded).
pub const MAX_OBJECTS: usize = 100_000;

/// How often a write that raced another one is retried before it answers 409, as the
/// API server's `GuaranteedUpdate` retries.
const RACE_RETRIES: usize = 16;

/// A refused request, as a Kubernetes `Status`: the HTTP code, the reason
/// (`NotFound`, `AlreadyExists`, `Conflict`, `Invalid`, `InternalError`, ...) and a
/// short message naming the object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub code: u16,
    pub reason: String,
    pub message: String,
}

impl ApiError {
    pub(crate) fn new(code: u16, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            reason: super::status::reason(code).to_string(),
            message: message.into(),
        }
    }

    pub(crate) fn with_reason(code: u16, reason: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            reason: reason.to_string(),
            message: message.into(),
        }
    }

    /// The `Status` object the API server answers with.
    pub fn to_status(&self) -> Value {
        super::status::status(self.code, &self.reason, &self.message)
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}

/// How a delete proceeds (the `DeleteOptions` body and query parameters).
#[derive(Debug, Clone, Default)]
pub struct DeleteOptions {
    /// Seconds a Pod gets to stop; `None` takes `spec.terminationGracePeriodSeconds`
    /// (else 30); 0 removes it at once.
    pub grace_period_seconds: Option<i64>,
    /// `Background` (default), `Foreground` (treated as background) or `Orphan`
    /// (dependents lose their owner reference to the deleted object).
    pub propagation_policy: Option<String>,
}

/// Which part of an object a write changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Part {
    /// The object; its stored status is kept for types with a status subresource.
    Object,
    /// Only `status` (the `/status` subresource).
    Status,
}

/// `pods "web-1"`, `deployments.apps "web"`: how the API server names an object in
/// messages.
pub(crate) fn qualified(resource: usize, name: &str) -> String {
    let rt = &RESOURCES[resource];
    if rt.group.is_empty() {
        format!("{} {:?}", rt.plural, bounded(name))
    } else {
        format!("{}.{} {:?}", rt.plural, rt.group, bounded(name))
    }
}

pub(crate) fn not_found(resource: usize, name: &str) -> ApiError {
    ApiError::new(404, format!("{} not found", qualified(resource, name)))
}

fn conflict(resource: usize, name: &str) -> ApiError {
    ApiError::new(
        409,
        format!(
            "Operation cannot be fulfilled on {}: the object has been modified; please apply your changes to the latest version and try again",
            qualified(resource, name)
        ),
    )
}

fn invalid(resource: usize, name: &str, why: &str) -> ApiError {
    ApiError::new(
        422,
        format!("{} is invalid: {why}", qualified(resource, name)),
    )
}

fn text<'a>(v: &'a Value, pointer: &str) -> Option<&'a str> {
    v.pointer(pointer).and_then(Value::as_str)
}

/// Checks a written object against the request: an object, of the request's type
/// (`apiVersion`/`kind` filled in when missing), named (a `generateName` gets a
/// random suffix), in the request's namespace. Returns its key.
fn shape(
    resource: usize,
    path_namespace: Option<&str>,
    path_name: Option<&str>,
    obj: &mut Value,
) -> Result<Key, ApiError> {
    let rt = &RESOURCES[resource];
    let Some(map) = obj.as_object_mut() else {
        return Err(ApiError::new(
            400,
            format!("the body of a {} write must be a JSON object", rt.kind),
        ));
    };
    let api_version = rt.api_version();
    match map.get("apiVersion").and_then(Value::as_str) {
        None => {
            map.insert("apiVersion".into(), Value::String(api_version.clone()));
        }
        Some(v) if v == api_version => {}
        Some(v) => {
            return Err(ApiError::new(
                400,
                format!("the API version in the data ({}) does not match the expected API version ({api_version})", bounded(v)),
            ))
        }
    }
    match map.get("kind").and_then(Value::as_str) {
        None => {
            map.insert("kind".into(), Value::String(rt.kind.to_string()));
        }
        Some(k) if k == rt.kind => {}
        Some(k) => {
            return Err(ApiError::new(
                400,
                format!(
                    "the kind in the data ({}) does not match the expected kind ({})",
                    bounded(k),
                    rt.kind
                ),
            ))
        }
    }
    let meta = map
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    let Some(meta) = meta.as_object_mut() else {
        return Err(ApiError::new(400, "metadata must be an object"));
    };
    let mut name = meta
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if name.is_empty() {
        if let Some(prefix) = meta.get("generateName").and_then(Value::as_str) {
            name = format!("{prefix}{}", random_suffix());
        }
    }
    if let Some(path_name) = path_name {
        if name.is_empty() {
            name = path_name.to_string();
        } else if name != path_name {
            return Err(ApiError::new(
                400,
                format!(
                    "the name of the object ({}) does not match the name on the URL ({})",
                    bounded(&name),
                    bounded(path_name)
                ),
            ));
        }
    }
    if name.is_empty() || name.len() > 253 || name.contains('/') {
        return Err(invalid(
            resource,
            &name,
            "metadata.name: Required value: a name of 1 to 253 characters without '/'",
        ));
    }
    meta.insert("name".into(), Value::String(name.clone()));
    let namespace = if rt.namespaced {
        let body_ns = meta.get("namespace").and_then(Value::as_str).unwrap_or("");
        let ns = match (path_namespace, body_ns) {
            (Some(p), "") => p.to_string(),
            (Some(p), b) if p == b => p.to_string(),
            (Some(_), _) => {
                return Err(ApiError::new(
                    400,
                    "the namespace of the provided object does not match the namespace sent on the request",
                ))
            }
            (None, "") => "default".to_string(),
            (None, b) => b.to_string(),
        };
        meta.insert("namespace".into(), Value::String(ns.clone()));
        ns
    } else {
        meta.remove("namespace");
        String::new()
    };
    Ok((namespace, name))
}

/// Five characters as the API server's name generator picks them.
pub(crate) fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::rng();
    (0..5)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

fn meta_mut(obj: &mut Value) -> Option<&mut Map<String, Value>> {
    obj.get_mut("metadata").and_then(Value::as_object_mut)
}

/// What the API server sets on create before admission: fresh identity, the first
/// generation, the kind's initial status, a Namespace's name label.
fn defaults_on_create(resource: usize, obj: &mut Value) {
    let plural = RESOURCES[resource].plural;
    if let Some(meta) = meta_mut(obj) {
        for field in [
            "uid",
            "resourceVersion",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
        ] {
            meta.remove(field);
        }
        if resources::has_status(resource) {
            meta.insert("generation".into(), json!(1));
        }
    }
    if resources::has_status(resource) {
        let status = match plural {
            "pods" => json!({"phase": "Pending"}),
            "namespaces" => json!({"phase": "Active"}),
            _ => json!({}),
        };
        if let Some(map) = obj.as_object_mut() {
            map.insert("status".into(), status);
        }
    }
    defaults_of_kind(plural, obj);
    if plural == "namespaces" {
        let name = text(obj, "/metadata/name").unwrap_or("").to_string();
        if let Some(meta) = meta_mut(obj) {
            let labels = meta
                .entry("labels")
                .or_insert_with(|| Value::Object(Map::new()));
            if let Some(labels) = labels.as_object_mut() {
                labels.insert("kubernetes.io/metadata.name".into(), Value::String(name));
            }
        }
    }
}

/// Sets `pointer` (under an existing object) to `value` when it is absent.
fn default_at(obj: &mut Value, parent: &str, field: &str, value: Value) {
    if let Some(map) = obj.pointer_mut(parent).and_then(Value::as_object_mut) {
        map.entry(field.to_string()).or_insert(value);
    }
}

/// The API server's defaulting of the fields controllers and kubelets read (and the
/// ServiceAccount admission plugin's `serviceAccountName`), so objects look as on a
/// real cluster whatever the manifest left out.
fn defaults_of_kind(plural: &str, obj: &mut Value) {
    let each_port =
        |obj: &mut Value, list: &str, f: &dyn Fn(&mut serde_json::Map<String, Value>)| {
            if let Some(items) = obj.pointer_mut(list).and_then(Value::as_array_mut) {
                for item in items.iter_mut().filter_map(Value::as_object_mut) {
                    f(item);
                }
            }
        };
    match plural {
        "pods" => {
            for (field, value) in [
                ("restartPolicy", json!("Always")),
                ("terminationGracePeriodSeconds", json!(30)),
                ("dnsPolicy", json!("ClusterFirst")),
                ("schedulerName", json!("default-scheduler")),
                ("serviceAccountName", json!("default")),
            ] {
                default_at(obj, "/spec", field, value);
            }
            for list in ["initContainers", "containers"] {
                let count = obj
                    .pointer(&format!("/spec/{list}"))
                    .and_then(Value::as_array)
                    .map_or(0, Vec::len);
                for i in 0..count {
                    each_port(obj, &format!("/spec/{list}/{i}/ports"), &|p| {
                        p.entry("protocol").or_insert(json!("TCP"));
                    });
                }
            }
        }
        "services" => {
            default_at(obj, "/spec", "type", json!("ClusterIP"));
            default_at(obj, "/spec", "sessionAffinity", json!("None"));
            each_port(obj, "/spec/ports", &|p| {
                p.entry("protocol").or_insert(json!("TCP"));
                if let Some(port) = p.get("port").cloned() {
                    p.entry("targetPort").or_insert(port);
                }
            });
        }
        "deployments" => {
            default_at(obj, "/spec", "replicas", json!(1));
            default_at(obj, "/spec", "revisionHistoryLimit", json!(10));
            default_at(obj, "/spec", "progressDeadlineSeconds", json!(600));
            default_at(obj, "/spec", "strategy", json!({}));
            default_at(obj, "/spec/strategy", "type", json!("RollingUpdate"));
            if text(obj, "/spec/strategy/type") == Some("RollingUpdate") {
                default_at(obj, "/spec/strategy", "rollingUpdate", json!({}));
                default_at(
                    obj,
                    "/spec/strategy/rollingUpdate",
                    "maxSurge",
                    json!("25%"),
                );
                default_at(
                    obj,
                    "/spec/strategy/rollingUpdate",
                    "maxUnavailable",
                    json!("25%"),
                );
            }
        }
        "customresourcedefinitions" => {
            // Established at once: there is no name conflict to wait for here.
            let stored: Vec<Value> = obj
                .pointer("/spec/versions")
                .and_then(Value::as_array)
                .map(|vs| {
                    vs.iter()
                        .filter(|v| v.get("storage") == Some(&json!(true)))
                        .filter_map(|v| v.get("name").cloned())
                        .collect()
                })
                .unwrap_or_default();
            let names = obj.pointer("/spec/names").cloned().unwrap_or(json!({}));
            if let Some(map) = obj.as_object_mut() {
                map.insert(
                    "status".into(),
                    json!({
                        "acceptedNames": names,
                        "conditions": [
                            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts"},
                            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted"},
                        ],
                        "storedVersions": stored,
                    }),
                );
            }
        }
        _ => {}
    }
}

/// The first free address of 10.96.0.0/16 above 10.96.0.1 (the `kubernetes`
/// Service's), as the Service IP allocator gives one on create.
fn allocate_cluster_ip(used: &std::collections::HashSet<String>) -> Option<String> {
    (2u32..65_535)
        .map(|n| format!("10.96.{}.{}", n >> 8, n & 0xff))
        .find(|ip| !used.contains(ip))
}

fn wants_cluster_ip(obj: &Value) -> bool {
    let ty = text(obj, "/spec/type").unwrap_or("ClusterIP");
    let ip = text(obj, "/spec/clusterIP").unwrap_or("");
    ty != "ExternalName" && ip.is_empty()
}

/// What a write of the object keeps from the stored one: identity, deletion marks,
/// the generation (bumped when anything but metadata and status changed), the status
/// (types with a status subresource), a Service's cluster IPs.
fn carry_over(resource: usize, current: &Value, new: &mut Value, part: Part) {
    if part == Part::Status {
        // Only the status changes: everything else is the stored object's.
        let status = new.get("status").cloned().unwrap_or(Value::Null);
        *new = current.clone();
        if let Some(map) = new.as_object_mut() {
            map.insert("status".into(), status);
        }
        return;
    }
    if resources::has_status(resource) {
        if let Some(map) = new.as_object_mut() {
            match current.get("status") {
                Some(s) => map.insert("status".into(), s.clone()),
                None => map.remove("status"),
            };
        }
    }
    if RESOURCES[resource].plural == "services" {
        for field in ["clusterIP", "clusterIPs"] {
            let missing = new
                .pointer(&format!("/spec/{field}"))
                .is_none_or(|v| v.is_null() || v == "");
            if let (true, Some(v)) = (missing, current.pointer(&format!("/spec/{field}"))) {
                if let Some(spec) = new.get_mut("spec").and_then(Value::as_object_mut) {
                    spec.insert(field.into(), v.clone());
                }
            }
        }
    }
    let changed = without_meta_and_status(current) != without_meta_and_status(new);
    let Some(stored_meta) = current.get("metadata").and_then(Value::as_object) else {
        return;
    };
    let Some(meta) = meta_mut(new) else {
        return;
    };
    for field in [
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
    ] {
        match stored_meta.get(field) {
            Some(v) => meta.insert(field.into(), v.clone()),
            None => meta.remove(field),
        };
    }
    if let Some(generation) = stored_meta.get("generation").and_then(Value::as_i64) {
        let next = if changed { generation + 1 } else { generation };
        meta.insert("generation".into(), json!(next));
    }
}

fn without_meta_and_status(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(map) = v.as_object_mut() {
        map.remove("metadata");
        map.remove("status");
    }
    v
}

/// What a commit expects of the stored object.
enum Expect {
    Absent,
    /// Stored at this resourceVersion (the one the write was computed from).
    Revision(String),
}

enum Committed {
    Done(Value),
    /// Another write came between the read and the commit.
    Raced,
}

/// Stores the object if the store still is as the write expected, allocating what is
/// allocated at commit (a Service's cluster IP) and broadcasting the change.
fn commit(
    shared: &Shared,
    resource: usize,
    key: &Key,
    mut obj: Value,
    expect: Expect,
    dry_run: bool,
) -> Result<Committed, ApiError> {
    let stored = {
        let mut store = lock(&shared.store);
        let current = store.get(resource, key);
        match (&expect, &current) {
            (Expect::Absent, Some(_)) => {
                return Err(ApiError::with_reason(
                    409,
                    "AlreadyExists",
                    format!("{} already exists", qualified(resource, &key.1)),
                ))
            }
            (Expect::Revision(_), None) => return Err(not_found(resource, &key.1)),
            (Expect::Absent, None) if store.total() >= MAX_OBJECTS => {
                return Err(ApiError::new(
                    500,
                    format!(
                        "etcdserver: mvcc: database space exceeded ({MAX_OBJECTS} objects stored)"
                    ),
                ))
            }
            (Expect::Revision(rv), Some(c)) if text(c, "/metadata/resourceVersion") != Some(rv) => {
                return Ok(Committed::Raced)
            }
            _ => {}
        }
        if RESOURCES[resource].plural == "services" && wants_cluster_ip(&obj) {
            let services = resources::by_plural("services").unwrap_or(resource);
            let used: std::collections::HashSet<String> = store
                .page(services, store.rv(), None, None, 0, |_| true)
                .map(|p| {
                    p.items
                        .iter()
                        .filter_map(|s| text(s, "/spec/clusterIP").map(String::from))
                        .collect()
                })
                .unwrap_or_default();
            let Some(ip) = allocate_cluster_ip(&used) else {
                return Err(ApiError::new(500, "no Service IP left in 10.96.0.0/16"));
            };
            if let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) {
                spec.insert("clusterIP".into(), json!(ip));
                spec.insert("clusterIPs".into(), json!([ip]));
            }
        }
        if dry_run {
            // Everything a write checks and allocates, nothing stored.
            return Ok(Committed::Done(obj));
        }
        let (stored, change) = store.apply(obj).map_err(|e| ApiError::new(400, e))?;
        if let Some(change) = change {
            shared.publish(change);
        }
        stored
    };
    shared.notify();
    Ok(Committed::Done((*stored).clone()))
}

fn get_current(shared: &Shared, resource: usize, key: &Key) -> Option<Value> {
    lock(&shared.store).get(resource, key).map(|o| (*o).clone())
}

fn refuse_in_terminating_namespace(
    shared: &Shared,
    resource: usize,
    namespace: &str,
) -> Result<(), ApiError> {
    if !RESOURCES[resource].namespaced {
        return Ok(());
    }
    let Some(namespaces) = resources::by_plural("namespaces") else {
        return Ok(());
    };
    let ns = get_current(shared, namespaces, &(String::new(), namespace.to_string()));
    if ns.is_some_and(|n| n.pointer("/metadata/deletionTimestamp").is_some()) {
        return Err(ApiError::new(
            403,
            format!(
                "unable to create new content in namespace {} because it is being terminated",
                bounded(namespace)
            ),
        ));
    }
    Ok(())
}

/// POST: creates an object (409 AlreadyExists when there is one), through admission.
pub(crate) async fn create(
    shared: &Arc<Shared>,
    resource: usize,
    path_namespace: Option<&str>,
    mut obj: Value,
    dry_run: bool,
) -> Result<Value, ApiError> {
    let key = shape(resource, path_namespace, None, &mut obj)?;
    if get_current(shared, resource, &key).is_some() {
        return Err(ApiError::with_reason(
            409,
            "AlreadyExists",
            format!("{} already exists", qualified(resource, &key.1)),
        ));
    }
    refuse_in_terminating_namespace(shared, resource, &key.0)?;
    defaults_on_create(resource, &mut obj);
    let obj = admission::admit(shared, resource, Operation::Create, obj, None, dry_run).await?;
    // A webhook may not rename or move the object.
    if text(&obj, "/metadata/name") != Some(key.1.as_str()) {
        return Err(ApiError::new(
            500,
            format!(
                "admission changed the name of {}",
                qualified(resource, &key.1)
            ),
        ));
    }
    match commit(shared, resource, &key, obj, Expect::Absent, dry_run)? {
        Committed::Done(v) => Ok(v),
        Committed::Raced => Err(conflict(resource, &key.1)),
    }
}

/// PUT: replaces an object or (`Part::Status`) its status. A `metadata.resourceVersion`
/// in the body must be the stored one (409 Conflict otherwise).
pub(crate) async fn update(
    shared: &Arc<Shared>,
    resource: usize,
    path_namespace: Option<&str>,
    path_name: Option<&str>,
    mut obj: Value,
    part: Part,
    dry_run: bool,
) -> Result<Value, ApiError> {
    let key = shape(resource, path_namespace, path_name, &mut obj)?;
    let given_rv = text(&obj, "/metadata/resourceVersion").map(String::from);
    for _ in 0..RACE_RETRIES {
        let Some(current) = get_current(shared, resource, &key) else {
            return Err(not_found(resource, &key.1));
        };
        let current_rv = text(&current, "/metadata/resourceVersion")
            .unwrap_or("")
            .to_string();
        if given_rv.as_ref().is_some_and(|rv| *rv != current_rv) {
            return Err(conflict(resource, &key.1));
        }
        match replace(shared, resource, &key, &current, obj.clone(), part, dry_run).await? {
            Committed::Done(v) => return Ok(v),
            Committed::Raced if given_rv.is_some() => return Err(conflict(resource, &key.1)),
            Committed::Raced => {}
        }
    }
    Err(conflict(resource, &key.1))
}

/// The shared tail of update and patch: carry over what the write may not change,
/// admit, commit against the read revision.
async fn replace(
    shared: &Arc<Shared>,
    resource: usize,
    key: &Key,
    current: &Value,
    mut new: Value,
    part: Part,
    dry_run: bool,
) -> Result<Committed, ApiError> {
    let current_rv = text(current, "/metadata/resourceVersion")
        .unwrap_or("")
        .to_string();
    carry_over(resource, current, &mut new, part);
    if let Some(meta) = meta_mut(&mut new) {
        meta.insert("resourceVersion".into(), Value::String(current_rv.clone()));
    }
    let new = if part == Part::Object {
        admission::admit(
            shared,
            resource,
            Operation::Update,
            new,
            Some(current),
            dry_run,
        )
        .await?
    } else {
        new
    };
    if text(&new, "/metadata/name") != Some(key.1.as_str()) {
        return Err(ApiError::new(
            500,
            format!(
                "admission changed the name of {}",
                qualified(resource, &key.1)
            ),
        ));
    }
    commit(
        shared,
        resource,
        key,
        new,
        Expect::Revision(current_rv),
        dry_run,
    )
}

/// PATCH: applies a patch to the stored object or its status. An apply patch
/// creates the object when there is none.
pub(crate) async fn patch(
    shared: &Arc<Shared>,
    resource: usize,
    key: &Key,
    kind: PatchType,
    body: &Value,
    part: Part,
    dry_run: bool,
) -> Result<(Value, bool), ApiError> {
    let (namespace, name) = (key.0.as_str(), key.1.as_str());
    for _ in 0..RACE_RETRIES {
        let Some(current) = get_current(shared, resource, key) else {
            if kind == PatchType::Apply && part == Part::Object {
                let ns = RESOURCES[resource].namespaced.then_some(namespace);
                let mut obj = body.clone();
                shape(resource, ns, Some(name), &mut obj)?;
                return create(shared, resource, ns, obj, dry_run)
                    .await
                    .map(|v| (v, true));
            }
            return Err(not_found(resource, name));
        };
        let current_rv = text(&current, "/metadata/resourceVersion")
            .unwrap_or("")
            .to_string();
        let mut patched = current.clone();
        patch::apply(kind, &mut patched, body).map_err(|(code, m)| ApiError::new(code, m))?;
        let patched_rv = text(&patched, "/metadata/resourceVersion").map(String::from);
        // A patch that names another resourceVersion asks for optimistic concurrency;
        // one that removes it writes unconditionally.
        if patched_rv.as_deref().is_some_and(|rv| rv != current_rv) {
            return Err(conflict(resource, name));
        }
        let ns = RESOURCES[resource].namespaced.then_some(namespace);
        shape(resource, ns, Some(name), &mut patched)?;
        match replace(shared, resource, key, &current, patched, part, dry_run).await? {
            Committed::Done(v) => return Ok((v, false)),
            Committed::Raced => {}
        }
    }
    Err(conflict(resource, name))
}

/// DELETE: a Pod with a grace period above zero (and a node) is marked
/// (`deletionTimestamp`, `deletionGracePeriodSeconds`) and kept for its kubelet to
/// remove; a Namespace turns Terminating and is kept for the namespace controller;
/// everything else goes at once. Returns the object as last stored.
pub(crate) fn delete(
    shared: &Shared,
    resource: usize,
    namespace: &str,
    name: &str,
    opts: &DeleteOptions,
    dry_run: bool,
) -> Result<Value, ApiError> {
    if let Some(g) = opts.grace_period_seconds {
        if g < 0 {
            return Err(ApiError::new(
                422,
                "gracePeriodSeconds must not be negative",
            ));
        }
    }
    let key: Key = (namespace.to_string(), name.to_string());
    for _ in 0..RACE_RETRIES {
        let Some(current) = get_current(shared, resource, &key) else {
            return Err(not_found(resource, name));
        };
        let rv = text(&current, "/metadata/resourceVersion")
            .unwrap_or("")
            .to_string();
        let marked = match RESOURCES[resource].plural {
            "pods" => mark_pod(&current, opts),
            "namespaces" => mark_namespace(&current),
            _ => None,
        };
        let Some(marked) = marked else {
            if dry_run {
                return Ok(current);
            }
            let removed = remove_now(shared, resource, &key);
            if opts.propagation_policy.as_deref() == Some("Orphan") {
                orphan(shared, &current);
            }
            return removed.ok_or_else(|| not_found(resource, name));
        };
        if marked == current {
            return Ok(current);
        }
        match commit(
            shared,
            resource,
            &key,
            marked,
            Expect::Revision(rv),
            dry_run,
        )? {
            Committed::Done(v) => return Ok(v),
            Committed::Raced => {}
        }
    }
    Err(conflict(resource, name))
}

/// The Pod marked for graceful deletion, or `None` to remove it now (grace 0, or a
/// Pod no node runs, as the API server does).
fn mark_pod(current: &Value, opts: &DeleteOptions) -> Option<Value> {
    let grace = opts
        .grace_period_seconds
        .or_else(|| {
            current
                .pointer("/spec/terminationGracePeriodSeconds")
                .and_then(Value::as_i64)
        })
        .unwrap_or(30);
    let scheduled = text(current, "/spec/nodeName").is_some_and(|n| !n.is_empty());
    if grace <= 0 || !scheduled {
        return None;
    }
    let mut marked = current.clone();
    let meta = meta_mut(&mut marked)?;
    if let Some(existing) = meta
        .get("deletionGracePeriodSeconds")
        .and_then(Value::as_i64)
    {
        // A second delete may only shorten the grace period.
        if grace >= existing {
            return Some(current.clone());
        }
    }
    meta.insert("deletionTimestamp".into(), json!(rfc3339_after(grace)));
    meta.insert("deletionGracePeriodSeconds".into(), json!(grace));
    Some(marked)
}

fn mark_namespace(current: &Value) -> Option<Value> {
    if current.pointer("/metadata/deletionTimestamp").is_some() {
        return Some(current.clone());
    }
    let mut marked = current.clone();
    meta_mut(&mut marked)?.insert("deletionTimestamp".into(), json!(now_rfc3339()));
    if let Some(map) = marked.as_object_mut() {
        map.insert("status".into(), json!({"phase": "Terminating"}));
    }
    Some(marked)
}

/// Removes an object at once, whatever its kind; returns its last state.
pub(crate) fn remove_now(shared: &Shared, resource: usize, key: &Key) -> Option<Value> {
    let removed = {
        let mut store = lock(&shared.store);
        let change = store.delete(resource, key);
        let last = change.as_ref().map(|c| (*c.object).clone());
        if let Some(change) = change {
            shared.publish(change);
        }
        last
    };
    shared.notify();
    removed
}

/// Drops owner references to a deleted object from its dependents (propagation
/// policy `Orphan`).
fn orphan(shared: &Shared, owner: &Value) {
    let Some(uid) = text(owner, "/metadata/uid") else {
        return;
    };
    let namespace = text(owner, "/metadata/namespace").unwrap_or("");
    for resource in 0..RESOURCES.len() {
        let dependents: Vec<Value> = {
            let store = lock(&shared.store);
            let ns = (!namespace.is_empty()).then_some(namespace);
            store
                .page(resource, store.rv(), ns, None, 0, |o| owned_by(o, uid))
                .map(|p| p.items.iter().map(|o| (**o).clone()).collect())
                .unwrap_or_default()
        };
        for mut d in dependents {
            let Some(refs) = d
                .pointer_mut("/metadata/ownerReferences")
                .and_then(Value::as_array_mut)
            else {
                continue;
            };
            refs.retain(|r| r.get("uid").and_then(Value::as_str) != Some(uid));
            let key = (
                text(&d, "/metadata/namespace").unwrap_or("").to_string(),
                text(&d, "/metadata/name").unwrap_or("").to_string(),
            );
            let rv = text(&d, "/metadata/resourceVersion")
                .unwrap_or("")
                .to_string();
            // A dependent changed meanwhile keeps its reference; the collector then
            // deletes it, which is what a lost race with Orphan does on a real cluster.
            let _ = commit(shared, resource, &key, d, Expect::Revision(rv), false);
        }
    }
}

fn owned_by(obj: &Value, uid: &str) -> bool {
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .is_some_and(|refs| {
            refs.iter()
                .any(|r| r.get("uid").and_then(Value::as_str) == Some(uid))
        })
}
