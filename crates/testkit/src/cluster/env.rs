//! A container's environment as the kubelet makes it: the `kubernetes` Service's
//! variables, `envFrom`, `env` with `valueFrom` (fieldRef, resourceFieldRef,
//! configMapKeyRef, secretKeyRef), and `$(VAR)` expansion.

use base64::Engine;
use serde_json::Value;

use crate::ApiServer;

/// What `fieldRef`s read that is not in the pod object yet.
pub(crate) struct PodFacts<'a> {
    pub pod: &'a Value,
    pub pod_ip: String,
    pub host_ip: String,
    pub node_name: &'a str,
}

impl PodFacts<'_> {
    /// The value of a `fieldRef.fieldPath`, as the downward API gives it.
    pub fn field(&self, path: &str) -> Option<String> {
        let str_at = |p: &str| {
            self.pod
                .pointer(p)
                .and_then(Value::as_str)
                .map(String::from)
        };
        let keyed = |prefix: &str, map: &str| -> Option<Option<String>> {
            let key = path.strip_prefix(prefix)?.strip_suffix("']")?;
            Some(
                self.pod
                    .pointer(&format!("/metadata/{map}"))
                    .and_then(|m| m.get(key))
                    .and_then(Value::as_str)
                    .map(String::from)
                    .or(Some(String::new())),
            )
        };
        if let Some(v) = keyed("metadata.labels['", "labels") {
            return v;
        }
        if let Some(v) = keyed("metadata.annotations['", "annotations") {
            return v;
        }
        match path {
            "metadata.name" => str_at("/metadata/name"),
            "metadata.namespace" => str_at("/metadata/namespace"),
            "metadata.uid" => str_at("/metadata/uid"),
            "spec.nodeName" => Some(self.node_name.to_string()),
            "spec.serviceAccountName" => {
                str_at("/spec/serviceAccountName").or(Some("default".into()))
            }
            "status.podIP" | "status.podIPs" => Some(self.pod_ip.clone()),
            "status.hostIP" | "status.hostIPs" => Some(self.host_ip.clone()),
            _ => None,
        }
    }
}

/// `$(VAR)` replaced by VAR's value when defined, `$$` by `$`; anything else kept.
pub(crate) fn expand(text: &str, env: &[(String, String)]) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(') {
            match inner.find(')') {
                Some(end) => {
                    let name = &inner[..end];
                    match env.iter().rev().find(|(k, _)| k == name) {
                        Some((_, v)) => out.push_str(v),
                        None => out.push_str(&rest[i..i + 2 + end + 1]),
                    }
                    rest = &inner[end + 1..];
                }
                None => {
                    out.push_str(&rest[i..]);
                    rest = "";
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

fn object_key(api: &ApiServer, plural: &str, ns: &str, name: &str, key: &str) -> Option<String> {
    let obj = api.get(plural, ns, name)?;
    if plural == "secrets" {
        if let Some(v) = obj.pointer("/stringData").and_then(|d| d.get(key)) {
            return v.as_str().map(String::from);
        }
        let encoded = obj.pointer("/data")?.get(key)?.as_str()?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .ok()?;
        return Some(String::from_utf8_lossy(&bytes).into_owned());
    }
    obj.pointer("/data")?.get(key)?.as_str().map(String::from)
}

/// Every key of a ConfigMap or Secret, decoded.
pub(crate) fn object_data(
    api: &ApiServer,
    plural: &str,
    ns: &str,
    name: &str,
) -> Option<Vec<(String, Vec<u8>)>> {
    let obj = api.get(plural, ns, name)?;
    let mut out = Vec::new();
    let b64 = base64::engine::general_purpose::STANDARD;
    let decode = |v: &Value| v.as_str().and_then(|s| b64.decode(s).ok());
    if plural == "secrets" {
        for (k, v) in obj
            .pointer("/data")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            out.push((k.clone(), decode(v)?));
        }
        for (k, v) in obj
            .pointer("/stringData")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            out.push((k.clone(), v.as_str()?.as_bytes().to_vec()));
        }
    } else {
        for (k, v) in obj
            .pointer("/data")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            out.push((k.clone(), v.as_str()?.as_bytes().to_vec()));
        }
        for (k, v) in obj
            .pointer("/binaryData")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            out.push((k.clone(), decode(v)?));
        }
    }
    Some(out)
}

fn resource_field(container: &Value, resource: &str) -> String {
    let limit = |kind: &str| {
        container
            .pointer(&format!("/resources/limits/{kind}"))
            .and_then(|v| {
                v.as_str()
                    .map(String::from)
                    .or_else(|| v.as_i64().map(|n| n.to_string()))
            })
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    match resource {
        // A limit in millicores rounds up to whole cores, as the downward API does
        // with the default divisor of 1.
        "limits.cpu" | "requests.cpu" => match limit("cpu") {
            Some(v) => match v.strip_suffix('m') {
                Some(milli) => milli
                    .parse::<u64>()
                    .map_or(cores as u64, |m| m.div_ceil(1000))
                    .to_string(),
                None => v,
            },
            None => cores.to_string(),
        },
        _ => limit("memory").unwrap_or_else(|| "0".to_string()),
    }
}

/// The container's environment in order (later entries win).
pub(crate) fn container_env(
    api: &ApiServer,
    facts: &PodFacts<'_>,
    container: &Value,
) -> Result<Vec<(String, String)>, String> {
    let ns = facts
        .field("metadata.namespace")
        .unwrap_or_else(|| "default".into());
    let mut env: Vec<(String, String)> = vec![
        (
            "PATH".into(),
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
        ),
        (
            "HOSTNAME".into(),
            facts.field("metadata.name").unwrap_or_default(),
        ),
        ("KUBERNETES_SERVICE_HOST".into(), "10.96.0.1".into()),
        ("KUBERNETES_SERVICE_PORT".into(), "443".into()),
        ("KUBERNETES_SERVICE_PORT_HTTPS".into(), "443".into()),
        ("KUBERNETES_PORT".into(), "tcp://10.96.0.1:443".into()),
    ];
    for from in container
        .get("envFrom")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let prefix = from.get("prefix").and_then(Value::as_str).unwrap_or("");
        let (plural, r) = match (from.get("configMapRef"), from.get("secretRef")) {
            (Some(r), _) => ("configmaps", r),
            (_, Some(r)) => ("secrets", r),
            _ => continue,
        };
        let name = r.get("name").and_then(Value::as_str).unwrap_or("");
        let optional = r.get("optional").and_then(Value::as_bool).unwrap_or(false);
        match object_data(api, plural, &ns, name) {
            Some(data) => env.extend(data.into_iter().map(|(k, v)| {
                (
                    format!("{prefix}{k}"),
                    String::from_utf8_lossy(&v).into_owned(),
                )
            })),
            None if optional => {}
            None => return Err(format!("{plural} {ns}/{name} not found (envFrom)")),
        }
    }
    for var in container
        .get("env")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let Some(name) = var.get("name").and_then(Value::as_str) else {
            continue;
        };
        let value = if let Some(v) = var.get("value").and_then(Value::as_str) {
            expand(v, &env)
        } else if let Some(from) = var.get("valueFrom") {
            if let Some(path) = from.pointer("/fieldRef/fieldPath").and_then(Value::as_str) {
                facts
                    .field(path)
                    .ok_or_else(|| format!("env {name}: fieldRef {path} is not supported"))?
            } else if let Some(res) = from
                .pointer("/resourceFieldRef/resource")
                .and_then(Value::as_str)
            {
                resource_field(container, res)
            } else {
                let (plural, r) = match (from.get("configMapKeyRef"), from.get("secretKeyRef")) {
                    (Some(r), _) => ("configmaps", r),
                    (_, Some(r)) => ("secrets", r),
                    _ => return Err(format!("env {name}: valueFrom of an unknown kind")),
                };
                let obj = r.get("name").and_then(Value::as_str).unwrap_or("");
                let key = r.get("key").and_then(Value::as_str).unwrap_or("");
                match object_key(api, plural, &ns, obj, key) {
                    Some(v) => v,
                    None if r.get("optional").and_then(Value::as_bool).unwrap_or(false) => continue,
                    None => {
                        return Err(format!(
                            "env {name}: key {key:?} of {plural} {ns}/{obj} not found"
                        ))
                    }
                }
            }
        } else {
            String::new()
        };
        env.push((name.to_string(), value));
    }
    Ok(env)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_to_defined_variables_expand_and_others_stay() {
        let env = vec![("NS".to_string(), "emojivoto".to_string())];
        assert_eq!(expand("$(NS).svc", &env), "emojivoto.svc");
        assert_eq!(expand("$(NOPE)/$$(NS)/$x", &env), "$(NOPE)/$(NS)/$x");
        assert_eq!(expand("tail $(", &env), "tail $(");
    }

    #[test]
    fn field_paths_read_the_pod_and_what_the_kubelet_knows() {
        let pod = serde_json::json!({
            "metadata": {"name": "web-0", "namespace": "ns", "labels": {"app": "web"}},
            "spec": {"serviceAccountName": "web"}
        });
        let facts = PodFacts {
            pod: &pod,
            pod_ip: "10.244.0.2".into(),
            host_ip: "10.244.0.1".into(),
            node_name: "node-a",
        };
        assert_eq!(
            facts.field("metadata.labels['app']").as_deref(),
            Some("web")
        );
        assert_eq!(facts.field("metadata.labels['none']").as_deref(), Some(""));
        assert_eq!(
            facts.field("spec.serviceAccountName").as_deref(),
            Some("web")
        );
        assert_eq!(facts.field("status.podIP").as_deref(), Some("10.244.0.2"));
        assert_eq!(facts.field("spec.nodeName").as_deref(), Some("node-a"));
        assert_eq!(facts.field("status.phase"), None);
    }
}
