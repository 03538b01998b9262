//! Injection of one Pod-shaped object (`{metadata, spec}`: a Pod, or a
//! workload's `spec.template`), and its reverse.

use crate::{
    config::{Config, DEFAULT_INBOUND_PORTS_TO_IGNORE, DEFAULT_OUTBOUND_PORTS_TO_IGNORE},
    values::{self, InvalidValue},
    InjectError,
};
use serde_json::{json, Map, Value};
use std::fmt;

use ballast_controlplane::pod::{ADMIN_PORT_NAME, OTHER_MESH_CONTAINERS, TAP_PORT_NAME};
/// The proxy and init containers' names (Linkerd's: viz, check and Linkerd
/// users' habits find the proxy by them).
pub use ballast_controlplane::pod::{INIT_CONTAINER, PROXY_CONTAINER};
/// The volume holding iptables' lock file (`/run` of the init container).
pub const XTABLES_LOCK_VOLUME: &str = "ballast-xtables-lock";
/// The volume the proxy keeps its snapshot of the controller's answers in:
/// an emptyDir, so that a restarted proxy container finds what its
/// predecessor wrote (it lives as long as the pod).
pub const SNAPSHOT_VOLUME: &str = "ballast-proxy-snapshot";
/// Where the snapshot volume is mounted in the proxy.
pub const SNAPSHOT_DIR: &str = "/var/run/ballast/snapshot";
/// The proxy's environment variable naming its snapshot file (its
/// `--snapshot-path`).
pub const SNAPSHOT_PATH_ENV: &str = "BALLAST_PROXY_SNAPSHOT_PATH";
/// The snapshot's file name in [`SNAPSHOT_DIR`].
const SNAPSHOT_FILE: &str = "proxy.snapshot";
/// The snapshot volume's bound (past it kubelet evicts the pod): room for
/// the file and the copy that replaces it at the proxy's default
/// `--snapshot-max-bytes` (8 MiB).
const SNAPSHOT_SIZE_LIMIT: &str = "32Mi";
/// The volume of the trust anchors ConfigMap (identity on).
pub const TRUST_ANCHORS_VOLUME: &str = "ballast-identity-trust-roots";
/// The proxy's environment variable holding inline trust anchors (PEM).
pub const TRUST_ANCHORS_PEM_ENV: &str = "BALLAST_PROXY_IDENTITY_TRUST_ANCHORS_PEM";
/// The volume of the projected service-account token sent to the identity
/// controller (identity on).
pub const IDENTITY_TOKEN_VOLUME: &str = "ballast-identity-token";
/// Where the trust anchors are mounted in the proxy.
pub const TRUST_ANCHORS_DIR: &str = "/var/run/linkerd/identity/trust-roots";
/// Where the identity token is mounted in the proxy (the proxy's default
/// `--identity-token-file` is `linkerd-identity-token` in it).
pub const IDENTITY_TOKEN_DIR: &str = "/var/run/secrets/tokens";
/// The token's file name, and Linkerd's TokenReview audience.
const IDENTITY_TOKEN_FILE: &str = "linkerd-identity-token";
const IDENTITY_TOKEN_AUDIENCE: &str = "identity.l5d.io";

/// Annotations read from the pod, then its namespace (Linkerd's names).
pub mod annotations {
    pub const INJECT: &str = "linkerd.io/inject";
    pub const SKIP_INBOUND_PORTS: &str = "config.linkerd.io/skip-inbound-ports";
    pub const SKIP_OUTBOUND_PORTS: &str = "config.linkerd.io/skip-outbound-ports";
    pub const OPAQUE_PORTS: &str = "config.linkerd.io/opaque-ports";
    pub const PROXY_CPU_REQUEST: &str = "config.linkerd.io/proxy-cpu-request";
    pub const PROXY_CPU_LIMIT: &str = "config.linkerd.io/proxy-cpu-limit";
    pub const PROXY_MEMORY_REQUEST: &str = "config.linkerd.io/proxy-memory-request";
    pub const PROXY_MEMORY_LIMIT: &str = "config.linkerd.io/proxy-memory-limit";
    pub const PROXY_LOG_LEVEL: &str = "config.linkerd.io/proxy-log-level";
    pub const PROXY_IMAGE: &str = "config.linkerd.io/proxy-image";
    pub const PROXY_VERSION: &str = "config.linkerd.io/proxy-version";
    pub const PROXY_UID: &str = "config.linkerd.io/proxy-uid";
    /// `enabled` (default) or `disabled`: whether the app waits for the proxy.
    pub const PROXY_AWAIT: &str = "config.linkerd.io/proxy-await";
    /// Written by injection: the proxy's version.
    pub const PROXY_VERSION_INJECTED: &str = "linkerd.io/proxy-version";
    /// Written by injection: `default` or `disabled`.
    pub const IDENTITY_MODE: &str = "linkerd.io/identity-mode";
    /// Label written by injection: the control plane's namespace.
    pub const CONTROL_PLANE_NS_LABEL: &str = "linkerd.io/control-plane-ns";
}

/// Who decides that a pod is injected.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `ballast inject`: every pod, unless its `linkerd.io/inject` (else its
    /// namespace's) is `disabled`.
    Manual,
    /// The admission webhook: only pods whose `linkerd.io/inject` (else
    /// their namespace's) is `enabled`; a pod's `disabled` wins over its
    /// namespace's `enabled`.
    Webhook,
}

/// The workload a pod belongs to, for the proxy's `dst_*` metric labels
/// (`BALLAST_PROXY_POD_OWNER`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    /// A kind the proxy knows: deployment, statefulset, daemonset, replicaset or job.
    pub kind: String,
    pub name: String,
}

impl Owner {
    /// The owner of pods of a workload of `kind` named `name`, if the proxy
    /// names such owners (not CronJobs' or ReplicationControllers' pods:
    /// their owner's name is not in the manifest).
    pub fn of_workload(kind: &str, name: &str) -> Option<Owner> {
        let kind = kind.to_ascii_lowercase();
        let known = [
            "deployment",
            "statefulset",
            "daemonset",
            "replicaset",
            "job",
        ];
        (known.contains(&kind.as_str()) && !name.is_empty()).then(|| Owner {
            kind,
            name: name.to_string(),
        })
    }

    /// The owner named by a pod's controller `ownerReferences`; a
    /// ReplicaSet named after the pod's `pod-template-hash` is taken for
    /// its Deployment, as Kubernetes names them.
    pub fn of_pod(pod: &Value) -> Option<Owner> {
        let controller = pod["metadata"]["ownerReferences"]
            .as_array()?
            .iter()
            .find(|r| r["controller"] == true)?;
        let kind = controller["kind"].as_str()?;
        let name = controller["name"].as_str()?;
        let hash = pod["metadata"]["labels"]["pod-template-hash"].as_str();
        if kind == "ReplicaSet" {
            if let Some(deployment) = hash.and_then(|h| name.strip_suffix(&format!("-{h}"))) {
                return Owner::of_workload("deployment", deployment);
            }
        }
        Owner::of_workload(kind, name)
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.kind, self.name)
    }
}

/// Why a pod was left alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SkipReason {
    /// `hostNetwork: true`: iptables rules would redirect the node's traffic.
    HostNetwork,
    /// `linkerd.io/inject: disabled` on the pod (or its namespace).
    Disabled,
    /// Webhook mode, and neither the pod nor its namespace says `enabled`.
    NotEnabled,
    /// `linkerd.io/inject: ingress`: Linkerd's ingress mode, which Ballast's proxy has not.
    IngressMode,
    /// The pod already has another mesh's sidecar (`istio-proxy`,
    /// `istio-init`): two proxies would each capture the other's traffic.
    OtherMesh { container: String },
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SkipReason::HostNetwork => "it uses the host's network (hostNetwork: true)",
            SkipReason::Disabled => "linkerd.io/inject is disabled",
            SkipReason::NotEnabled => "linkerd.io/inject is not enabled on it or its namespace",
            SkipReason::IngressMode => "linkerd.io/inject: ingress is not supported",
            SkipReason::OtherMesh { container } => {
                return write!(f, "it already has another mesh's sidecar ({container})")
            }
        })
    }
}

/// What injection (or uninjection) did to a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The proxy and init containers were added.
    Injected,
    /// The pod already had the proxy; it is unchanged.
    AlreadyInjected,
    /// The pod is unchanged, for this reason.
    Skipped { reason: SkipReason },
    /// The proxy and everything injection added were removed.
    Uninjected,
    /// Uninjection found no proxy; the pod is unchanged.
    NotInjected,
}

impl Outcome {
    /// Whether the pod was changed.
    pub fn changed(&self) -> bool {
        matches!(self, Outcome::Injected | Outcome::Uninjected)
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Injected => f.write_str("injected"),
            Outcome::AlreadyInjected => f.write_str("already injected"),
            Outcome::Skipped { reason } => write!(f, "skipped: {reason}"),
            Outcome::Uninjected => f.write_str("uninjected"),
            Outcome::NotInjected => f.write_str("not injected"),
        }
    }
}

/// Injects `pod` (a Pod or a workload's `spec.template`), its owner taken
/// from its `ownerReferences` (see [`Owner::of_pod`]).
pub fn inject_pod(
    pod: &mut Value,
    namespace_annotations: Option<&Map<String, Value>>,
    mode: Mode,
    config: &Config,
) -> Result<Outcome, InjectError> {
    let owner = Owner::of_pod(pod);
    inject_pod_owned(pod, owner.as_ref(), namespace_annotations, mode, config)
}

/// Injects `pod`, whose workload is `owner` (none: unnamed). On an error,
/// `pod` is unchanged.
pub fn inject_pod_owned(
    pod: &mut Value,
    owner: Option<&Owner>,
    namespace_annotations: Option<&Map<String, Value>>,
    mode: Mode,
    config: &Config,
) -> Result<Outcome, InjectError> {
    let spec = pod
        .get("spec")
        .filter(|s| s.is_object())
        .ok_or_else(|| InjectError::NotAPod("it has no spec".into()))?;
    let containers = match spec.get("containers") {
        Some(Value::Array(containers)) => containers,
        _ => return Err(InjectError::NotAPod("spec.containers is not a list".into())),
    };
    if containers.iter().any(|c| c["name"] == PROXY_CONTAINER) {
        return Ok(Outcome::AlreadyInjected);
    }
    let lookup = Lookup {
        pod: pod["metadata"]["annotations"].as_object(),
        namespace: namespace_annotations,
    };
    let decision = match lookup.get(annotations::INJECT)? {
        None => None,
        Some(value) => Some(match value.as_str() {
            "enabled" => true,
            "disabled" => false,
            "ingress" => {
                return Ok(Outcome::Skipped {
                    reason: SkipReason::IngressMode,
                })
            }
            _ => {
                return Err(InjectError::InvalidAnnotation {
                    annotation: annotations::INJECT.into(),
                    value,
                    reason: InvalidValue::new("expected enabled or disabled"),
                })
            }
        }),
    };
    let skip = match (mode, decision) {
        (_, Some(false)) => Some(SkipReason::Disabled),
        (Mode::Webhook, None) => Some(SkipReason::NotEnabled),
        _ => None,
    };
    if let Some(reason) = skip {
        return Ok(Outcome::Skipped { reason });
    }
    if spec["hostNetwork"] == true {
        return Ok(Outcome::Skipped {
            reason: SkipReason::HostNetwork,
        });
    }
    // As Linkerd's injector: a pod another mesh already captures is left alone.
    let other_mesh = ["containers", "initContainers"]
        .iter()
        .filter_map(|list| spec[list].as_array())
        .flatten()
        .filter_map(|c| c["name"].as_str())
        .find(|name| OTHER_MESH_CONTAINERS.contains(name));
    if let Some(container) = other_mesh {
        return Ok(Outcome::Skipped {
            reason: SkipReason::OtherMesh {
                container: container.to_string(),
            },
        });
    }
    if !config.identity_disabled
        && config.trust_anchors_pem.is_none()
        && config.trust_anchors_config_map.is_none()
    {
        return Err(InjectError::InvalidConfig {
            field: "trust_anchors".into(),
            reason: InvalidValue::new(
                "identity is on but no trust anchors are given (inline PEM or a ConfigMap in the pod's namespace)",
            ),
        });
    }
    conflicts(spec)?;
    for (what, value) in [
        ("metadata", &pod["metadata"]),
        ("metadata.annotations", &pod["metadata"]["annotations"]),
        ("metadata.labels", &pod["metadata"]["labels"]),
    ] {
        if !value.is_null() && !value.is_object() {
            return Err(InjectError::NotAPod(format!("{what} is not a map")));
        }
    }
    let settings = Settings::read(&lookup, config)?;

    // Everything is checked: from here on the pod only grows.
    let spec = pod["spec"].as_object_mut().expect("checked above");
    let init = settings.init_container(config);
    list_mut(spec, "initContainers").insert(0, init);
    let proxy = settings.proxy_container(config, owner);
    list_mut(spec, "containers").insert(0, proxy);
    let volumes = list_mut(spec, "volumes");
    volumes.push(json!({"name": XTABLES_LOCK_VOLUME, "emptyDir": {}}));
    volumes.push(json!({
        "name": SNAPSHOT_VOLUME,
        "emptyDir": {"sizeLimit": SNAPSHOT_SIZE_LIMIT},
    }));
    if !config.identity_disabled {
        if let (None, Some(config_map)) =
            (&config.trust_anchors_pem, &config.trust_anchors_config_map)
        {
            volumes.push(json!({
                "name": TRUST_ANCHORS_VOLUME,
                "configMap": {"name": config_map},
            }));
        }
        volumes.push(json!({
            "name": IDENTITY_TOKEN_VOLUME,
            "projected": {"sources": [{"serviceAccountToken": {
                "audience": IDENTITY_TOKEN_AUDIENCE,
                "expirationSeconds": 86400,
                "path": IDENTITY_TOKEN_FILE,
            }}]},
        }));
    }
    let metadata = object_mut(pod.as_object_mut().expect("has a spec"), "metadata");
    let identity_mode = if config.identity_disabled {
        "disabled"
    } else {
        "default"
    };
    let annotations = object_mut(metadata, "annotations");
    annotations.insert(
        annotations::PROXY_VERSION_INJECTED.into(),
        settings.version.clone().into(),
    );
    annotations.insert(annotations::IDENTITY_MODE.into(), identity_mode.into());
    object_mut(metadata, "labels").insert(
        annotations::CONTROL_PLANE_NS_LABEL.into(),
        config.control_plane.namespace.clone().into(),
    );
    Ok(Outcome::Injected)
}

/// Removes what injection added: the proxy and init containers, their
/// volumes, the annotations and label it wrote, and the lists and maps it
/// created that are left empty. Everything else is kept.
pub fn uninject_pod(pod: &mut Value) -> Result<Outcome, InjectError> {
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else {
        return Err(InjectError::NotAPod("it has no spec".into()));
    };
    let has_proxy = spec
        .get("containers")
        .and_then(Value::as_array)
        .is_some_and(|cs| cs.iter().any(|c| c["name"] == PROXY_CONTAINER));
    if !has_proxy {
        return Ok(Outcome::NotInjected);
    }
    remove_named(spec, "containers", &[PROXY_CONTAINER], false);
    remove_named(spec, "initContainers", &[INIT_CONTAINER], true);
    remove_named(
        spec,
        "volumes",
        &[
            XTABLES_LOCK_VOLUME,
            SNAPSHOT_VOLUME,
            TRUST_ANCHORS_VOLUME,
            IDENTITY_TOKEN_VOLUME,
        ],
        true,
    );
    if let Some(metadata) = pod.get_mut("metadata").and_then(Value::as_object_mut) {
        for (map, keys) in [
            (
                "annotations",
                &[
                    annotations::PROXY_VERSION_INJECTED,
                    annotations::IDENTITY_MODE,
                ][..],
            ),
            ("labels", &[annotations::CONTROL_PLANE_NS_LABEL][..]),
        ] {
            if let Some(Value::Object(entries)) = metadata.get_mut(map) {
                for key in keys {
                    entries.remove(*key);
                }
                if entries.is_empty() {
                    metadata.remove(map);
                }
            }
        }
        if metadata.is_empty() {
            pod.as_object_mut().expect("has a spec").remove("metadata");
        }
    }
    Ok(Outcome::Uninjected)
}

/// A half-injected pod (one of our names taken, no proxy) is refused
/// rather than given a second container or volume of the same name.
fn conflicts(spec: &Value) -> Result<(), InjectError> {
    for (list, name) in [
        ("initContainers", INIT_CONTAINER),
        ("volumes", XTABLES_LOCK_VOLUME),
        ("volumes", SNAPSHOT_VOLUME),
        ("volumes", TRUST_ANCHORS_VOLUME),
        ("volumes", IDENTITY_TOKEN_VOLUME),
    ] {
        let taken = spec[list]
            .as_array()
            .is_some_and(|items| items.iter().any(|i| i["name"] == name));
        if taken {
            return Err(InjectError::NotAPod(format!(
                "it has no {PROXY_CONTAINER} container but already has {list} {name:?} \
                 (remove it, or uninject first)"
            )));
        }
        if !spec[list].is_null() && !spec[list].is_array() {
            return Err(InjectError::NotAPod(format!("spec.{list} is not a list")));
        }
    }
    Ok(())
}

fn list_mut<'a>(map: &'a mut Map<String, Value>, key: &str) -> &'a mut Vec<Value> {
    let value = map
        .entry(key)
        .and_modify(|v| {
            if v.is_null() {
                *v = Value::Array(Vec::new());
            }
        })
        .or_insert_with(|| Value::Array(Vec::new()));
    match value {
        Value::Array(items) => items,
        _ => unreachable!("checked to be a list or absent"),
    }
}

fn object_mut<'a>(map: &'a mut Map<String, Value>, key: &str) -> &'a mut Map<String, Value> {
    let value = map.entry(key).or_insert_with(|| Value::Object(Map::new()));
    if !value.is_object() {
        *value = Value::Object(Map::new());
    }
    value.as_object_mut().expect("made an object")
}

fn remove_named(map: &mut Map<String, Value>, key: &str, names: &[&str], drop_empty: bool) {
    if let Some(Value::Array(items)) = map.get_mut(key) {
        items.retain(|i| !names.iter().any(|n| i["name"] == *n));
        if drop_empty && items.is_empty() {
            map.remove(key);
        }
    }
}

/// Annotations of the pod, then of its namespace.
struct Lookup<'a> {
    pod: Option<&'a Map<String, Value>>,
    namespace: Option<&'a Map<String, Value>>,
}

impl Lookup<'_> {
    /// The annotation's value; numbers and booleans (unquoted in YAML) are
    /// taken as their text.
    fn get(&self, key: &str) -> Result<Option<String>, InjectError> {
        let value = self
            .pod
            .and_then(|a| a.get(key))
            .or_else(|| self.namespace.and_then(|a| a.get(key)));
        match value {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.trim().to_string())),
            Some(v @ (Value::Number(_) | Value::Bool(_))) => Ok(Some(v.to_string())),
            Some(other) => Err(InjectError::InvalidAnnotation {
                annotation: key.into(),
                value: other.to_string(),
                reason: InvalidValue::new("an annotation's value is a string"),
            }),
        }
    }

    /// The annotation's value, checked by `parse`.
    fn parsed<T>(
        &self,
        key: &str,
        parse: impl FnOnce(&str) -> Result<T, InvalidValue>,
    ) -> Result<Option<(String, T)>, InjectError> {
        let Some(value) = self.get(key)? else {
            return Ok(None);
        };
        match parse(&value) {
            Ok(parsed) => Ok(Some((value, parsed))),
            Err(reason) => Err(InjectError::InvalidAnnotation {
                annotation: key.into(),
                value,
                reason,
            }),
        }
    }
}

/// The pod's settings: the configuration with its annotations applied.
struct Settings {
    proxy_image: String,
    version: String,
    uid: u32,
    log_level: String,
    cpu_request: Option<String>,
    cpu_limit: Option<(String, f64)>,
    memory_request: Option<String>,
    memory_limit: Option<String>,
    inbound_ports_to_ignore: String,
    outbound_ports_to_ignore: String,
    opaque_ports: Option<Vec<u16>>,
    /// The proxy's postStart hook waits for /ready (`config.linkerd.io/proxy-await`).
    await_ready: bool,
}

impl Settings {
    fn read(lookup: &Lookup<'_>, config: &Config) -> Result<Settings, InjectError> {
        use annotations::*;
        let quantity = |key: &str, default: &Option<String>| -> Result<_, InjectError> {
            Ok(match lookup.parsed(key, values::parse_quantity)? {
                Some((text, q)) => Some((text, q.value)),
                None => match default {
                    Some(text) => {
                        let q = values::parse_quantity(text).map_err(|reason| {
                            InjectError::InvalidConfig {
                                field: key.rsplit('/').next().unwrap_or(key).into(),
                                reason,
                            }
                        })?;
                        Some((text.clone(), q.value))
                    }
                    None => None,
                },
            })
        };
        let cpu_request = quantity(PROXY_CPU_REQUEST, &config.cpu_request)?;
        let cpu_limit = quantity(PROXY_CPU_LIMIT, &config.cpu_limit)?;
        let memory_request = quantity(PROXY_MEMORY_REQUEST, &config.memory_request)?;
        let memory_limit = quantity(PROXY_MEMORY_LIMIT, &config.memory_limit)?;
        for (what, request, limit) in [
            ("cpu", &cpu_request, &cpu_limit),
            ("memory", &memory_request, &memory_limit),
        ] {
            if let (Some((r, rv)), Some((l, lv))) = (request, limit) {
                if rv > lv {
                    return Err(InjectError::RequestOverLimit {
                        resource: what,
                        request: r.clone(),
                        limit: l.clone(),
                    });
                }
            }
        }
        let ports = |key: &str, defaults: &str| -> Result<String, InjectError> {
            let mut list = values::parse_port_ranges(defaults).expect("valid defaults");
            if let Some((_, extra)) = lookup.parsed(key, values::parse_port_ranges)? {
                for range in extra {
                    if !list.contains(&range) {
                        list.push(range);
                    }
                }
            }
            Ok(list
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(","))
        };
        let opaque_ports = lookup
            .parsed(OPAQUE_PORTS, |s| {
                values::expand_port_ranges(&values::parse_port_ranges(s)?)
            })?
            .map(|(_, ports)| ports);
        let log_level = match lookup.parsed(PROXY_LOG_LEVEL, values::check_log_level)? {
            Some((text, ())) => text,
            None => config.log_level.clone(),
        };
        let invalid_config = |field: &str, reason| InjectError::InvalidConfig {
            field: field.into(),
            reason,
        };
        if config.proxy_uid == 0 {
            return Err(invalid_config(
                "proxy_uid",
                InvalidValue::new("the proxy must not run as root"),
            ));
        }
        values::check_log_level(&config.log_level).map_err(|e| invalid_config("log_level", e))?;
        let uid = match lookup.parsed(PROXY_UID, |s| {
            values::parse_uid(s).and_then(|uid| match uid {
                0 => Err(InvalidValue::new("the proxy must not run as root")),
                uid => Ok(uid),
            })
        })? {
            Some((_, uid)) => uid,
            None => config.proxy_uid,
        };
        let image_ref = |key: &str| -> Result<Option<String>, InjectError> {
            Ok(lookup
                .parsed(key, |s| {
                    if s.is_empty() || s.chars().any(|c| c.is_whitespace() || c.is_control()) {
                        Err(InvalidValue::new("not an image reference or tag"))
                    } else {
                        Ok(())
                    }
                })?
                .map(|(text, ())| text))
        };
        let version_override = image_ref(PROXY_VERSION)?;
        let mut proxy_image = image_ref(PROXY_IMAGE)?.unwrap_or_else(|| config.proxy_image.clone());
        if let Some(version) = &version_override {
            proxy_image = format!("{}:{version}", image_repository(&proxy_image));
        }
        let await_ready = match lookup.parsed(PROXY_AWAIT, |s| match s {
            "enabled" => Ok(true),
            "disabled" => Ok(false),
            _ => Err(InvalidValue::new("expected enabled or disabled")),
        })? {
            Some((_, on)) => on,
            None => true,
        };
        Ok(Settings {
            await_ready,
            proxy_image,
            version: version_override.unwrap_or_else(|| config.proxy_version.clone()),
            uid,
            log_level,
            cpu_request: cpu_request.map(|(text, _)| text),
            cpu_limit,
            memory_request: memory_request.map(|(text, _)| text),
            memory_limit: memory_limit.map(|(text, _)| text),
            inbound_ports_to_ignore: ports(SKIP_INBOUND_PORTS, DEFAULT_INBOUND_PORTS_TO_IGNORE)?,
            outbound_ports_to_ignore: ports(SKIP_OUTBOUND_PORTS, DEFAULT_OUTBOUND_PORTS_TO_IGNORE)?,
            opaque_ports,
        })
    }

    fn init_container(&self, config: &Config) -> Value {
        json!({
            "name": INIT_CONTAINER,
            "image": config.init_image,
            "imagePullPolicy": config.image_pull_policy,
            "command": ["ballast-proxy"],
            "args": [
                "init",
                format!("--incoming-proxy-port={}", config.inbound_port),
                format!("--outgoing-proxy-port={}", config.outbound_port),
                format!("--proxy-uid={}", self.uid),
                format!("--inbound-ports-to-ignore={}", self.inbound_ports_to_ignore),
                format!("--outbound-ports-to-ignore={}", self.outbound_ports_to_ignore),
            ],
            "env": [{"name": "BALLAST_INIT_IPTABLES_MODE", "value": "plain"}],
            "resources": {
                "requests": {"cpu": "10m", "memory": "16Mi"},
                "limits": {"memory": "64Mi"},
            },
            // iptables needs root in the pod's network namespace, and no more.
            "securityContext": {
                "runAsUser": 0,
                "runAsNonRoot": false,
                "privileged": false,
                "allowPrivilegeEscalation": false,
                "readOnlyRootFilesystem": true,
                "capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN", "NET_RAW"]},
            },
            // iptables' lock file lives in /run.
            "volumeMounts": [{"name": XTABLES_LOCK_VOLUME, "mountPath": "/run"}],
        })
    }

    fn proxy_container(&self, config: &Config, owner: Option<&Owner>) -> Value {
        let mut args = vec![
            format!("--destination-addr={}", config.destination_addr),
            format!("--outbound-addr=127.0.0.1:{}", config.outbound_port),
            format!("--inbound-addr=0.0.0.0:{}", config.inbound_port),
            // On every address, so that kubelet's probes reach it.
            format!("--admin-addr=0.0.0.0:{}", config.admin_port),
            // The Tap API, for `ballast viz` (mutual TLS for its identity).
            format!("--tap-addr=0.0.0.0:{}", config.tap_port),
        ];
        // What the controller last said, kept across the proxy container's
        // restarts: a proxy restarted while the controller is away routes on it.
        let mut mounts = vec![json!({"name": SNAPSHOT_VOLUME, "mountPath": SNAPSHOT_DIR})];
        if config.identity_disabled {
            args.push("--identity-disabled".into());
        } else {
            // The controllers are dialled in TLS verifying the identities
            // the installed control plane serves (ballast_controlplane).
            let cp = &config.control_plane;
            args.push(format!("--identity-addr={}", config.identity_addr));
            args.push(format!("--identity-controller-namespace={}", cp.namespace));
            args.push(format!("--identity-trust-domain={}", cp.trust_domain));
            args.push(format!(
                "--identity-server-name={}",
                cp.identity_service_identity()
            ));
            args.push(format!(
                "--destination-server-name={}",
                cp.destination_identity()
            ));
            // Anchors given inline travel in the proxy's environment (as
            // Linkerd's do), so a meshed namespace needs no ConfigMap copy.
            if config.trust_anchors_pem.is_none() && config.trust_anchors_config_map.is_some() {
                args.push(format!(
                    "--identity-trust-anchors={TRUST_ANCHORS_DIR}/{}",
                    config.trust_anchors_key
                ));
                mounts.push(json!({"name": TRUST_ANCHORS_VOLUME, "mountPath": TRUST_ANCHORS_DIR, "readOnly": true}));
            }
            args.push(format!(
                "--identity-token-file={IDENTITY_TOKEN_DIR}/{IDENTITY_TOKEN_FILE}"
            ));
            mounts.push(json!({"name": IDENTITY_TOKEN_VOLUME, "mountPath": IDENTITY_TOKEN_DIR, "readOnly": true}));
        }
        if let Some(ports) = &self.opaque_ports {
            let ports: Vec<String> = ports.iter().map(ToString::to_string).collect();
            args.push(format!("--inbound-opaque-ports={}", ports.join(",")));
        }
        if let Some((_, cores)) = self.cpu_limit {
            // As Linkerd sizes its proxy's runtime by the CPU limit.
            let workers = cores.ceil().clamp(1.0, 256.0) as u16;
            args.push(format!("--workers={workers}"));
        }
        let field = |name: &str, path: &str| json!({"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}});
        let mut env = vec![
            json!({"name": "BALLAST_LOG", "value": self.log_level}),
            field("BALLAST_PROXY_POD_NAMESPACE", "metadata.namespace"),
            field("BALLAST_PROXY_POD_NAME", "metadata.name"),
            field(
                "BALLAST_PROXY_POD_SERVICE_ACCOUNT",
                "spec.serviceAccountName",
            ),
            field(
                "BALLAST_PROXY_POD_TEMPLATE_HASH",
                "metadata.labels['pod-template-hash']",
            ),
        ];
        if let Some(owner) = owner {
            env.push(json!({"name": "BALLAST_PROXY_POD_OWNER", "value": owner.to_string()}));
        }
        let snapshot = format!("{SNAPSHOT_DIR}/{SNAPSHOT_FILE}");
        env.push(json!({"name": SNAPSHOT_PATH_ENV, "value": snapshot}));
        if let (false, Some(pem)) = (config.identity_disabled, &config.trust_anchors_pem) {
            env.push(json!({"name": TRUST_ANCHORS_PEM_ENV, "value": pem}));
        }
        let cpu_limit = self.cpu_limit.as_ref().map(|(text, _)| text.clone());
        let entries = |pairs: [(&str, &Option<String>); 2]| -> Map<String, Value> {
            pairs
                .into_iter()
                .filter_map(|(key, value)| Some((key.to_string(), value.clone()?.into())))
                .collect()
        };
        let mut resources = Map::new();
        for (key, entries) in [
            (
                "requests",
                entries([("cpu", &self.cpu_request), ("memory", &self.memory_request)]),
            ),
            (
                "limits",
                entries([("cpu", &cpu_limit), ("memory", &self.memory_limit)]),
            ),
        ] {
            if !entries.is_empty() {
                resources.insert(key.into(), entries.into());
            }
        }
        let probe = |path: &str, period: u32| json!({"httpGet": {"path": path, "port": ADMIN_PORT_NAME}, "periodSeconds": period});
        let mut proxy = json!({
            "name": PROXY_CONTAINER,
            "image": self.proxy_image,
            "imagePullPolicy": config.image_pull_policy,
            // With no subcommand, ballast-proxy runs the proxy.
            "command": ["ballast-proxy"],
            "args": args,
            "env": env,
            "ports": [
                {"name": ADMIN_PORT_NAME, "containerPort": config.admin_port},
                {"name": TAP_PORT_NAME, "containerPort": config.tap_port},
            ],
            "livenessProbe": probe("/live", 10),
            "readinessProbe": probe("/ready", 5),
            "resources": resources,
            // The uid `ballast-proxy init --proxy-uid` exempts from redirection.
            "securityContext": {
                "runAsNonRoot": true,
                "runAsUser": self.uid,
                "allowPrivilegeEscalation": false,
                "readOnlyRootFilesystem": true,
                "capabilities": {"drop": ["ALL"]},
            },
        });
        proxy["volumeMounts"] = mounts.into();
        if self.await_ready {
            // Kubelet starts the next container only once this hook returns:
            // the app's first connections find a ready proxy (Linkerd's
            // linkerd-await does the same).
            proxy["lifecycle"] = json!({"postStart": {"exec": {"command": [
                "ballast-proxy",
                "await",
                format!("--admin-addr=127.0.0.1:{}", config.admin_port),
                "--timeout=2m",
            ]}}});
        }
        proxy
    }
}

/// `registry:5000/ballast-proxy:v1` without its tag or digest.
fn image_repository(image: &str) -> &str {
    let image = image.split('@').next().unwrap_or(image);
    let name_start = image.rfind('/').map_or(0, |i| i + 1);
    match image[name_start..].find(':') {
        Some(colon) => &image[..name_start + colon],
        None => image,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(annotations: Value) -> Value {
        json!({
            "metadata": {"name": "web-1", "annotations": annotations},
            "spec": {"containers": [{"name": "web", "image": "nginx"}]},
        })
    }

    fn container<'a>(pod: &'a Value, list: &str, name: &str) -> &'a Value {
        pod["spec"][list]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["name"] == name))
            .unwrap_or_else(|| panic!("no {name} in {list}: {pod}"))
    }

    fn args(c: &Value) -> Vec<&str> {
        c["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect()
    }

    #[test]
    fn injection_puts_the_proxy_first_and_init_first_and_marks_the_pod() {
        let mut p = json!({
            "metadata": {"name": "web-1", "labels": {"app": "web"}},
            "spec": {
                "initContainers": [{"name": "migrate", "image": "m"}],
                "containers": [{"name": "web", "image": "nginx"}],
                "volumes": [{"name": "data", "emptyDir": {}}],
            },
        });
        let owner = Owner::of_workload("Deployment", "web");
        let out = inject_pod_owned(
            &mut p,
            owner.as_ref(),
            None,
            Mode::Manual,
            &crate::config::test_config(),
        );
        assert_eq!(out.unwrap(), Outcome::Injected);
        assert_eq!(p["spec"]["containers"][0]["name"], PROXY_CONTAINER);
        assert_eq!(p["spec"]["containers"][1]["name"], "web");
        assert_eq!(p["spec"]["initContainers"][0]["name"], INIT_CONTAINER);
        assert_eq!(p["spec"]["initContainers"][1]["name"], "migrate");
        let volumes: Vec<&str> = p["spec"]["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            volumes,
            // The anchors travel inline: no ConfigMap the pod's namespace lacks.
            [
                "data",
                XTABLES_LOCK_VOLUME,
                SNAPSHOT_VOLUME,
                IDENTITY_TOKEN_VOLUME
            ]
        );
        assert_eq!(
            p["spec"]["volumes"][2],
            json!({"name": "ballast-proxy-snapshot", "emptyDir": {"sizeLimit": "32Mi"}})
        );
        assert_eq!(
            p["metadata"]["annotations"]["linkerd.io/proxy-version"],
            crate::config::PROXY_VERSION
        );
        assert_eq!(
            p["metadata"]["labels"]["linkerd.io/control-plane-ns"],
            "ballast"
        );
        let proxy = container(&p, "containers", PROXY_CONTAINER);
        let env = proxy["env"].as_array().unwrap();
        assert!(env
            .iter()
            .any(|e| e["name"] == "BALLAST_PROXY_POD_OWNER" && e["value"] == "deployment/web"));
        assert!(env.iter().any(|e| e["name"] == TRUST_ANCHORS_PEM_ENV));
        // The snapshot file lives in the pod's volume, not the container.
        assert!(env
            .iter()
            .any(|e| e["name"] == "BALLAST_PROXY_SNAPSHOT_PATH"
                && e["value"] == "/var/run/ballast/snapshot/proxy.snapshot"));
        assert_eq!(
            proxy["volumeMounts"],
            json!([
                {"name": SNAPSHOT_VOLUME, "mountPath": "/var/run/ballast/snapshot"},
                {"name": IDENTITY_TOKEN_VOLUME, "mountPath": IDENTITY_TOKEN_DIR, "readOnly": true},
            ])
        );
        // The controllers are dialled verifying the identities the
        // installed control plane (namespace ballast) serves.
        for arg in [
            "--destination-addr=ballast-dst-headless.ballast.svc.cluster.local:8086",
            "--identity-addr=ballast-identity-headless.ballast.svc.cluster.local:8080",
            "--identity-controller-namespace=ballast",
            "--identity-trust-domain=cluster.local",
            "--destination-server-name=ballast-destination.ballast.serviceaccount.identity.ballast.cluster.local",
            "--identity-server-name=linkerd-identity.ballast.serviceaccount.identity.ballast.cluster.local",
        ] {
            assert!(args(proxy).contains(&arg), "{arg} in {:?}", args(proxy));
        }
        assert_eq!(proxy["readinessProbe"]["httpGet"]["path"], "/ready");
        assert_eq!(proxy["readinessProbe"]["httpGet"]["port"], "linkerd-admin");
        assert_eq!(proxy["livenessProbe"]["httpGet"]["path"], "/live");
        assert_eq!(proxy["resources"]["limits"]["memory"], "128Mi");
        assert_eq!(proxy["securityContext"]["runAsUser"], 2102);
        let init = container(&p, "initContainers", INIT_CONTAINER);
        assert!(args(init).contains(&"--inbound-ports-to-ignore=4190,4191,4567,4568"));
    }

    #[test]
    fn the_proxy_serves_tap_on_the_declared_linkerd_tap_port() {
        let mut p = json!({
            "metadata": {"name": "web-1"},
            "spec": {"containers": [{"name": "web", "image": "nginx"}]},
        });
        let config = Config {
            tap_port: 4999,
            ..crate::config::test_config()
        };
        let out = inject_pod_owned(&mut p, None, None, Mode::Manual, &config);
        assert_eq!(out.unwrap(), Outcome::Injected);
        let proxy = container(&p, "containers", PROXY_CONTAINER);
        assert!(args(proxy).contains(&"--tap-addr=0.0.0.0:4999"));
        let ports: Vec<(&str, u64)> = proxy["ports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p["name"].as_str().unwrap(),
                    p["containerPort"].as_u64().unwrap(),
                )
            })
            .collect();
        assert_eq!(ports, [("linkerd-admin", 4191), ("linkerd-tap", 4999)]);
        // Inbound redirection leaves Linkerd's tap port alone by default.
        assert_eq!(crate::config::DEFAULT_TAP_PORT, 4190);
        assert!(DEFAULT_INBOUND_PORTS_TO_IGNORE
            .split(',')
            .any(|p| p == "4190"));
    }

    #[test]
    fn injecting_twice_changes_nothing_and_uninject_restores_the_pod() {
        let original = json!({
            "metadata": {"name": "web-1", "labels": {"app": "web"},
                         "annotations": {"linkerd.io/inject": "enabled"}},
            "spec": {"containers": [{"name": "web", "image": "nginx"}]},
        });
        let mut p = original.clone();
        assert_eq!(
            inject_pod(&mut p, None, Mode::Manual, &crate::config::test_config()).unwrap(),
            Outcome::Injected
        );
        let once = p.clone();
        assert_eq!(
            inject_pod(&mut p, None, Mode::Manual, &crate::config::test_config()).unwrap(),
            Outcome::AlreadyInjected
        );
        assert_eq!(p, once);
        assert_eq!(uninject_pod(&mut p).unwrap(), Outcome::Uninjected);
        assert_eq!(p, original);
        assert_eq!(uninject_pod(&mut p).unwrap(), Outcome::NotInjected);
        assert_eq!(p, original);
    }

    #[test]
    fn identity_disabled_mounts_only_the_snapshot() {
        let config = Config {
            identity_disabled: true,
            ..crate::config::test_config()
        };
        let mut p = pod(json!({}));
        inject_pod(&mut p, None, Mode::Manual, &config).unwrap();
        let proxy = container(&p, "containers", PROXY_CONTAINER);
        assert!(args(proxy).contains(&"--identity-disabled"));
        assert!(!args(proxy).iter().any(|a| a.starts_with("--identity-addr")));
        assert_eq!(
            proxy["volumeMounts"],
            json!([{"name": SNAPSHOT_VOLUME, "mountPath": SNAPSHOT_DIR}])
        );
        // Without identity, the snapshot still serves a restarted proxy.
        let volumes: Vec<&str> = p["spec"]["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|v| v["name"].as_str())
            .collect();
        assert_eq!(volumes, [XTABLES_LOCK_VOLUME, SNAPSHOT_VOLUME]);
        assert_eq!(
            p["metadata"]["annotations"]["linkerd.io/identity-mode"],
            "disabled"
        );
    }

    #[test]
    fn the_app_waits_for_the_proxy_unless_the_annotation_says_not_to() {
        let mut p = pod(json!({}));
        inject_pod(&mut p, None, Mode::Manual, &crate::config::test_config()).unwrap();
        let proxy = container(&p, "containers", PROXY_CONTAINER);
        let hook = &proxy["lifecycle"]["postStart"]["exec"]["command"];
        assert_eq!(hook[0], "ballast-proxy");
        assert_eq!(hook[1], "await");
        assert_eq!(hook[2], "--admin-addr=127.0.0.1:4191");

        let mut p = pod(json!({annotations::PROXY_AWAIT: "disabled"}));
        inject_pod(&mut p, None, Mode::Manual, &crate::config::test_config()).unwrap();
        let proxy = container(&p, "containers", PROXY_CONTAINER);
        assert!(proxy.get("lifecycle").is_none(), "{proxy}");

        let mut p = pod(json!({annotations::PROXY_AWAIT: "sometimes"}));
        let err =
            inject_pod(&mut p, None, Mode::Manual, &crate::config::test_config()).unwrap_err();
        assert!(err.to_string().contains("proxy-await"), "{err}");
    }

    #[test]
    fn inline_trust_anchors_travel_in_the_environment_not_a_config_map() {
        let pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        let config = Config {
            trust_anchors_pem: Some(pem.into()),
            ..crate::config::test_config()
        };
        let mut p = pod(json!({"team": "shop"}));
        inject_pod(&mut p, None, Mode::Manual, &config).unwrap();
        let proxy = container(&p, "containers", PROXY_CONTAINER);
        let env = proxy["env"].as_array().unwrap();
        assert!(env
            .iter()
            .any(|e| e["name"] == TRUST_ANCHORS_PEM_ENV && e["value"] == pem));
        assert!(!args(proxy)
            .iter()
            .any(|a| a.starts_with("--identity-trust-anchors")));
        let volumes = p["spec"]["volumes"].as_array().unwrap();
        assert!(!volumes.iter().any(|v| v["name"] == TRUST_ANCHORS_VOLUME));
        // The token is still mounted: Certify needs it.
        assert!(volumes.iter().any(|v| v["name"] == IDENTITY_TOKEN_VOLUME));
        let mut again = p.clone();
        uninject_pod(&mut again).unwrap();
        assert_eq!(again, pod(json!({"team": "shop"})));
    }

    #[test]
    fn annotations_configure_the_proxy_and_init() {
        let mut p = pod(json!({
            "config.linkerd.io/skip-inbound-ports": "8443,9000-9010",
            "config.linkerd.io/skip-outbound-ports": "5432",
            "config.linkerd.io/opaque-ports": "3306,4000-4002",
            "config.linkerd.io/proxy-cpu-request": "200m",
            "config.linkerd.io/proxy-cpu-limit": "1500m",
            "config.linkerd.io/proxy-memory-request": "32Mi",
            "config.linkerd.io/proxy-memory-limit": "256Mi",
            "config.linkerd.io/proxy-log-level": "warn,ballast=debug",
            "config.linkerd.io/proxy-version": "v9",
            "config.linkerd.io/proxy-uid": "3000",
        }));
        inject_pod(&mut p, None, Mode::Manual, &crate::config::test_config()).unwrap();
        let proxy = container(&p, "containers", PROXY_CONTAINER);
        let init = container(&p, "initContainers", INIT_CONTAINER);
        assert!(
            args(init).contains(&"--inbound-ports-to-ignore=4190,4191,4567,4568,8443,9000-9010")
        );
        assert!(args(init).contains(&"--outbound-ports-to-ignore=4567,4568,5432"));
        assert!(args(init).contains(&"--proxy-uid=3000"));
        assert!(args(proxy).contains(&"--inbound-opaque-ports=3306,4000,4001,4002"));
        assert!(args(proxy).contains(&"--workers=2"));
        assert_eq!(
            proxy["resources"],
            json!({"requests": {"cpu": "200m", "memory": "32Mi"},
                   "limits": {"cpu": "1500m", "memory": "256Mi"}})
        );
        assert_eq!(
            proxy["env"][0],
            json!({"name": "BALLAST_LOG", "value": "warn,ballast=debug"})
        );
        assert_eq!(proxy["image"], "ballast-proxy:v9");
        assert_eq!(proxy["securityContext"]["runAsUser"], 3000);
        assert_eq!(
            p["metadata"]["annotations"]["linkerd.io/proxy-version"],
            "v9"
        );
    }

    #[test]
    fn namespace_annotations_apply_unless_the_pod_says_otherwise() {
        let ns = json!({
            "config.linkerd.io/proxy-memory-limit": "64Mi",
            "config.linkerd.io/proxy-log-level": "debug",
        });
        let mut p = pod(json!({"config.linkerd.io/proxy-log-level": "warn"}));
        inject_pod(
            &mut p,
            ns.as_object(),
            Mode::Manual,
            &crate::config::test_config(),
        )
        .unwrap();
        let proxy = container(&p, "containers", PROXY_CONTAINER);
        assert_eq!(proxy["resources"]["limits"]["memory"], "64Mi");
        assert_eq!(proxy["env"][0]["value"], "warn");
    }

    #[test]
    fn bad_annotation_values_are_errors_naming_them_and_leave_the_pod_alone() {
        for (key, value) in [
            ("config.linkerd.io/skip-inbound-ports", "70000"),
            ("config.linkerd.io/skip-outbound-ports", "10-5"),
            ("config.linkerd.io/opaque-ports", "abc"),
            ("config.linkerd.io/opaque-ports", "1-65535"),
            ("config.linkerd.io/proxy-cpu-request", "lots"),
            ("config.linkerd.io/proxy-memory-limit", "10MB"),
            ("config.linkerd.io/proxy-log-level", "loud"),
            ("config.linkerd.io/proxy-uid", "-1"),
            ("config.linkerd.io/proxy-uid", "0"),
            ("config.linkerd.io/proxy-image", "a b"),
            ("linkerd.io/inject", "yes"),
        ] {
            let original = pod(json!({ key: value }));
            let mut p = original.clone();
            let e = inject_pod(&mut p, None, Mode::Manual, &crate::config::test_config())
                .expect_err(value)
                .to_string();
            assert!(e.contains(key) && e.contains(value), "{key}={value}: {e}");
            assert_eq!(p, original, "{key}={value}");
        }
        let mut p = pod(json!({
            "config.linkerd.io/proxy-memory-request": "1Gi",
            "config.linkerd.io/proxy-memory-limit": "128Mi",
        }));
        let e = inject_pod(&mut p, None, Mode::Manual, &crate::config::test_config()).unwrap_err();
        assert!(e.to_string().contains("more than its limit"), "{e}");
    }

    #[test]
    fn a_bad_configuration_is_an_error_not_a_broken_pod() {
        for config in [
            Config {
                proxy_uid: 0,
                ..crate::config::test_config()
            },
            Config {
                log_level: "loud".into(),
                ..crate::config::test_config()
            },
            Config {
                memory_limit: Some("lots".into()),
                ..crate::config::test_config()
            },
        ] {
            let mut p = pod(json!({}));
            let e = inject_pod(&mut p, None, Mode::Manual, &config).unwrap_err();
            assert!(e.to_string().starts_with("configuration "), "{e}");
            assert_eq!(p, pod(json!({})));
        }
    }

    #[test]
    fn host_network_pods_and_disabled_pods_are_skipped() {
        let mut p = pod(json!({}));
        p["spec"]["hostNetwork"] = true.into();
        let original = p.clone();
        assert_eq!(
            inject_pod(&mut p, None, Mode::Manual, &crate::config::test_config()).unwrap(),
            Outcome::Skipped {
                reason: SkipReason::HostNetwork
            }
        );
        assert_eq!(p, original);
        let mut p = pod(json!({"linkerd.io/inject": "disabled"}));
        assert_eq!(
            inject_pod(&mut p, None, Mode::Manual, &crate::config::test_config()).unwrap(),
            Outcome::Skipped {
                reason: SkipReason::Disabled
            }
        );
    }

    #[test]
    fn webhook_mode_injects_only_what_is_enabled() {
        let enabled = json!({"linkerd.io/inject": "enabled"});
        let disabled = json!({"linkerd.io/inject": "disabled"});
        let cases = [
            (json!({}), None, false),
            (json!({}), Some(&enabled), true),
            (enabled.clone(), None, true),
            (disabled.clone(), Some(&enabled), false),
            (enabled.clone(), Some(&disabled), true),
            (json!({}), Some(&disabled), false),
        ];
        for (pod_annotations, ns, injected) in cases {
            let mut p = pod(pod_annotations.clone());
            let out = inject_pod(
                &mut p,
                ns.and_then(Value::as_object),
                Mode::Webhook,
                &crate::config::test_config(),
            )
            .unwrap();
            assert_eq!(
                out.changed(),
                injected,
                "{pod_annotations} in {ns:?}: {out}"
            );
        }
        // Manual mode: the namespace's disabled also holds.
        let mut p = pod(json!({}));
        let out = inject_pod(
            &mut p,
            disabled.as_object(),
            Mode::Manual,
            &crate::config::test_config(),
        );
        assert_eq!(
            out.unwrap(),
            Outcome::Skipped {
                reason: SkipReason::Disabled
            }
        );
    }

    #[test]
    fn owners_come_from_controller_references() {
        let p = json!({"metadata": {
            "labels": {"pod-template-hash": "5d8f9c"},
            "ownerReferences": [{"kind": "ReplicaSet", "name": "web-5d8f9c", "controller": true}],
        }});
        assert_eq!(Owner::of_pod(&p), Owner::of_workload("deployment", "web"));
        let p = json!({"metadata": {"ownerReferences": [
            {"kind": "StatefulSet", "name": "db", "controller": true}]}});
        assert_eq!(Owner::of_pod(&p).unwrap().to_string(), "statefulset/db");
        assert_eq!(Owner::of_workload("CronJob", "x"), None);
        assert_eq!(Owner::of_pod(&json!({})), None);
    }

    #[test]
    fn malformed_pods_are_errors() {
        for bad in [
            json!({}),
            json!({"spec": {}}),
            json!({"spec": {"containers": "x"}}),
            json!({"spec": {"containers": [], "volumes": 3}}),
            json!({"metadata": {"labels": "x"}, "spec": {"containers": []}}),
            json!({"metadata": [], "spec": {"containers": []}}),
            json!({"spec": {"containers": [], "initContainers": [{"name": INIT_CONTAINER}]}}),
            json!({"spec": {"containers": [], "volumes": [{"name": SNAPSHOT_VOLUME, "emptyDir": {}}]}}),
        ] {
            let mut p = bad.clone();
            assert!(
                inject_pod(&mut p, None, Mode::Manual, &crate::config::test_config()).is_err(),
                "{bad}"
            );
            assert_eq!(p, bad);
        }
    }

    #[test]
    fn image_repositories_drop_tags_not_ports() {
        assert_eq!(image_repository("ballast-proxy:latest"), "ballast-proxy");
        assert_eq!(
            image_repository("reg:5000/ballast-proxy"),
            "reg:5000/ballast-proxy"
        );
        assert_eq!(image_repository("reg:5000/p:v1@sha256:ab"), "reg:5000/p");
    }

    #[test]
    fn a_pod_of_another_mesh_is_left_alone_naming_its_sidecar() {
        for (list, name) in [
            ("containers", "istio-proxy"),
            ("initContainers", "istio-init"),
        ] {
            let mut p = pod(json!({}));
            p["spec"][list]
                .as_array_mut()
                .map(|l| l.push(json!({"name": name})))
                .unwrap_or_else(|| p["spec"][list] = json!([{"name": name}]));
            let before = p.clone();
            let out = inject_pod(&mut p, None, Mode::Manual, &crate::config::test_config());
            let reason = SkipReason::OtherMesh {
                container: name.into(),
            };
            assert_eq!(
                out.unwrap(),
                Outcome::Skipped {
                    reason: reason.clone()
                }
            );
            assert_eq!(p, before);
            assert!(reason.to_string().contains(name));
        }
    }

    #[test]
    fn identity_without_trust_anchors_is_an_error_not_a_pod_that_never_starts() {
        let mut p = pod(json!({}));
        let before = p.clone();
        let err = inject_pod(&mut p, None, Mode::Manual, &Config::default()).unwrap_err();
        assert!(err.to_string().contains("trust anchors"), "{err}");
        assert_eq!(p, before);
        // A ConfigMap the user keeps in the pod's namespace is mounted.
        let config = Config {
            trust_anchors_config_map: Some("my-anchors".into()),
            ..Config::default()
        };
        inject_pod(&mut p, None, Mode::Manual, &config).unwrap();
        let volume = p["spec"]["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == TRUST_ANCHORS_VOLUME)
            .unwrap();
        assert_eq!(volume["configMap"]["name"], "my-anchors");
    }

    #[test]
    fn the_control_plane_names_the_label_addresses_and_identities() {
        let cp = crate::config::ControlPlane {
            namespace: "mesh".into(),
            cluster_domain: "corp".into(),
            trust_domain: "example.org".into(),
        };
        let config = Config {
            trust_anchors_pem: Some("pem".into()),
            ..Config::for_control_plane(cp)
        };
        let mut p = pod(json!({}));
        inject_pod(&mut p, None, Mode::Manual, &config).unwrap();
        assert_eq!(
            p["metadata"]["labels"]["linkerd.io/control-plane-ns"],
            "mesh"
        );
        let proxy = container(&p, "containers", PROXY_CONTAINER);
        for arg in [
            "--destination-addr=ballast-dst-headless.mesh.svc.corp:8086",
            "--identity-controller-namespace=mesh",
            "--destination-server-name=ballast-destination.mesh.serviceaccount.identity.mesh.example.org",
        ] {
            assert!(args(proxy).contains(&arg), "{arg} in {:?}", args(proxy));
        }
    }
}
