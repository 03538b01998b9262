//! A pod's volumes as files under the kubelet's directory, and the mounts that put
//! them at each container's `mountPath`.

use std::collections::HashMap;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use rand::Rng;
use serde_json::Value;

use super::env::{object_data, PodFacts};
use crate::ApiServer;

/// Where the service-account volume is mounted in every container.
pub const SERVICE_ACCOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The name the automatic service-account volume has (as `kube-api-access-*`).
const SERVICE_ACCOUNT_VOLUME: &str = "kube-api-access";
/// Audiences of the automatic token: what the API server's TokenReview accepts.
const API_AUDIENCES: [&str; 2] = [
    "https://kubernetes.default.svc.cluster.local",
    "https://kubernetes.default.svc",
];

/// One bind mount into a container.
#[derive(Debug, Clone)]
pub(crate) struct Mount {
    pub source: PathBuf,
    pub target: String,
    pub read_only: bool,
}

/// The pod's volumes by name: a directory (or a host path) each.
pub(crate) struct PodVolumes {
    paths: HashMap<String, PathBuf>,
    /// Mount points this pod made on the host (released on drop).
    mount_points: Vec<MountPoint>,
}

impl PodVolumes {
    /// Writes every volume of the pod under `dir`, and the automatic service-account
    /// volume unless `automountServiceAccountToken` is false; tokens are registered
    /// with the API server for TokenReview.
    pub fn materialize(
        api: &ApiServer,
        facts: &PodFacts<'_>,
        ca_pem: &str,
        dir: &Path,
    ) -> Result<PodVolumes, String> {
        let pod = facts.pod;
        let ns = facts
            .field("metadata.namespace")
            .unwrap_or_else(|| "default".into());
        let sa = facts
            .field("spec.serviceAccountName")
            .unwrap_or_else(|| "default".into());
        let mut paths = HashMap::new();
        let fail = |what: &str, e: io::Error| format!("volume {what}: {e}");
        for vol in pod
            .pointer("/spec/volumes")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let Some(name) = vol.get("name").and_then(Value::as_str) else {
                continue;
            };
            if let Some(host) = vol.pointer("/hostPath/path").and_then(Value::as_str) {
                paths.insert(name.to_string(), PathBuf::from(host));
                continue;
            }
            let path = dir.join(name);
            make_dir(&path, 0o755).map_err(|e| fail(name, e))?;
            let mut files: Vec<(String, Vec<u8>)> = Vec::new();
            if vol.get("emptyDir").is_some() {
                // Any container's user may write there.
                make_dir(&path, 0o777).map_err(|e| fail(name, e))?;
            } else if let Some(cm) = vol.get("configMap") {
                let cm_name = cm.get("name").and_then(Value::as_str).unwrap_or("");
                files.extend(object_files(api, "configmaps", &ns, cm_name, cm)?);
            } else if let Some(secret) = vol.get("secret") {
                let s_name = secret
                    .get("secretName")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                files.extend(object_files(api, "secrets", &ns, s_name, secret)?);
            } else if let Some(items) = vol.pointer("/downwardAPI/items").and_then(Value::as_array)
            {
                files.extend(downward_files(facts, items));
            } else if let Some(sources) =
                vol.pointer("/projected/sources").and_then(Value::as_array)
            {
                for source in sources {
                    if let Some(t) = source.get("serviceAccountToken") {
                        let audience = t.get("audience").and_then(Value::as_str);
                        let file = t.get("path").and_then(Value::as_str).unwrap_or("token");
                        let audiences: Vec<&str> = match audience {
                            Some(a) => vec![a],
                            None => API_AUDIENCES.to_vec(),
                        };
                        files.push((
                            file.to_string(),
                            new_token(api, &ns, &sa, &audiences).into_bytes(),
                        ));
                    } else if let Some(cm) = source.get("configMap") {
                        let cm_name = cm.get("name").and_then(Value::as_str).unwrap_or("");
                        files.extend(object_files(api, "configmaps", &ns, cm_name, cm)?);
                    } else if let Some(secret) = source.get("secret") {
                        let s_name = secret.get("name").and_then(Value::as_str).unwrap_or("");
                        files.extend(object_files(api, "secrets", &ns, s_name, secret)?);
                    } else if let Some(items) = source
                        .pointer("/downwardAPI/items")
                        .and_then(Value::as_array)
                    {
                        files.extend(downward_files(facts, items));
                    }
                }
            }
            write_files(&path, &files).map_err(|e| fail(name, e))?;
            paths.insert(name.to_string(), path);
        }
        if pod
            .pointer("/spec/automountServiceAccountToken")
            .and_then(Value::as_bool)
            != Some(false)
        {
            let path = dir.join(SERVICE_ACCOUNT_VOLUME);
            make_dir(&path, 0o755).map_err(|e| fail(SERVICE_ACCOUNT_VOLUME, e))?;
            let files = vec![
                (
                    "token".to_string(),
                    new_token(api, &ns, &sa, &API_AUDIENCES).into_bytes(),
                ),
                ("ca.crt".to_string(), ca_pem.as_bytes().to_vec()),
                ("namespace".to_string(), ns.clone().into_bytes()),
            ];
            write_files(&path, &files).map_err(|e| fail(SERVICE_ACCOUNT_VOLUME, e))?;
            paths.insert(SERVICE_ACCOUNT_VOLUME.to_string(), path);
        }
        Ok(PodVolumes {
            paths,
            mount_points: Vec::new(),
        })
    }

    /// The container's mounts (its `volumeMounts`, `subPath` included, then the
    /// service-account volume unless it mounts that path itself), with every mount
    /// point made on the host if missing.
    pub fn mounts(&mut self, container: &Value) -> Result<Vec<Mount>, String> {
        let mut mounts = Vec::new();
        for m in container
            .get("volumeMounts")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let name = m.get("name").and_then(Value::as_str).unwrap_or("");
            let Some(target) = m.get("mountPath").and_then(Value::as_str) else {
                continue;
            };
            let Some(base) = self.paths.get(name) else {
                return Err(format!("volumeMount {name:?}: the pod has no such volume"));
            };
            let source = match m.get("subPath").and_then(Value::as_str) {
                Some(sub) if !sub.is_empty() => {
                    if Path::new(sub)
                        .components()
                        .any(|c| !matches!(c, Component::Normal(_)))
                    {
                        return Err(format!(
                            "volumeMount {name:?}: subPath {sub:?} must be relative"
                        ));
                    }
                    base.join(sub)
                }
                _ => base.clone(),
            };
            mounts.push(Mount {
                source,
                target: target.to_string(),
                read_only: m.get("readOnly").and_then(Value::as_bool).unwrap_or(false),
            });
        }
        if let Some(sa) = self.paths.get(SERVICE_ACCOUNT_VOLUME) {
            if !mounts.iter().any(|m| m.target == SERVICE_ACCOUNT_PATH) {
                mounts.push(Mount {
                    source: sa.clone(),
                    target: SERVICE_ACCOUNT_PATH.to_string(),
                    read_only: true,
                });
            }
        }
        for m in &mounts {
            let is_dir = m.source.is_dir();
            let point = MountPoint::make(Path::new(&m.target), is_dir)
                .map_err(|e| format!("mount point {}: {e}", m.target))?;
            self.mount_points.push(point);
        }
        Ok(mounts)
    }
}

fn make_dir(path: &Path, mode: u32) -> io::Result<()> {
    std::fs::create_dir_all(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

/// Files readable by every container user (0644), as Kubernetes' default mode.
fn write_files(dir: &Path, files: &[(String, Vec<u8>)]) -> io::Result<()> {
    for (name, bytes) in files {
        let rel = Path::new(name);
        if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
            return Err(io::Error::other(format!(
                "file {name:?} must be a relative path"
            )));
        }
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            make_dir(parent, 0o755)?;
        }
        std::fs::write(&path, bytes)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))?;
    }
    Ok(())
}

/// A ConfigMap's or Secret's keys as files (only `items`, renamed, when given).
fn object_files(
    api: &ApiServer,
    plural: &str,
    ns: &str,
    name: &str,
    source: &Value,
) -> Result<Vec<(String, Vec<u8>)>, String> {
    let optional = source
        .get("optional")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let Some(data) = object_data(api, plural, ns, name) else {
        return if optional {
            Ok(Vec::new())
        } else {
            Err(format!("{plural} {ns}/{name} not found"))
        };
    };
    let Some(items) = source.get("items").and_then(Value::as_array) else {
        return Ok(data);
    };
    let mut files = Vec::new();
    for item in items {
        let key = item.get("key").and_then(Value::as_str).unwrap_or("");
        let path = item.get("path").and_then(Value::as_str).unwrap_or(key);
        match data.iter().find(|(k, _)| k == key) {
            Some((_, v)) => files.push((path.to_string(), v.clone())),
            None if optional => {}
            None => return Err(format!("key {key:?} of {plural} {ns}/{name} not found")),
        }
    }
    Ok(files)
}

fn downward_files(facts: &PodFacts<'_>, items: &[Value]) -> Vec<(String, Vec<u8>)> {
    items
        .iter()
        .filter_map(|item| {
            let path = item.get("path").and_then(Value::as_str)?;
            let field = item
                .pointer("/fieldRef/fieldPath")
                .and_then(Value::as_str)?;
            let value = match field {
                "metadata.labels" | "metadata.annotations" => {
                    let map = facts.pod.pointer(&format!("/metadata/{}", &field[9..]));
                    map.and_then(Value::as_object)
                        .map(|m| {
                            m.iter()
                                .map(|(k, v)| format!("{k}={}\n", v))
                                .collect::<String>()
                        })
                        .unwrap_or_default()
                }
                _ => facts.field(field)?,
            };
            Some((path.to_string(), value.into_bytes()))
        })
        .collect()
}

/// A random token the API server's TokenReview authenticates as the service account.
fn new_token(api: &ApiServer, ns: &str, sa: &str, audiences: &[&str]) -> String {
    let bytes: [u8; 24] = rand::rng().random();
    let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    api.add_token(
        &token,
        &format!("system:serviceaccount:{ns}:{sa}"),
        audiences,
    );
    token
}

/// Where kubelets (of every test process) record the mount points they made on the
/// host and who uses them: one `PID<TAB>PATH` line per use. Every container's private
/// mount namespace binds over the same host path, so a path is removed only when its
/// last user is gone, whichever process made it (and once its users' processes have
/// died, by the next kubelet that looks).
const MOUNT_POINTS: &str = "/run/ballast-testkit/mount-points";

/// Runs `f` on the registry's entries under an exclusive lock and writes them back;
/// entries of processes that are gone are dropped first, and what only they used is
/// removed.
fn with_mount_points<T>(f: impl FnOnce(&mut Vec<(u32, PathBuf)>) -> T) -> io::Result<T> {
    use std::io::{Read, Seek, Write};
    let path = Path::new(MOUNT_POINTS);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    file.lock()?;
    let mut text = String::new();
    file.read_to_string(&mut text)?;
    let mut entries: Vec<(u32, PathBuf)> = text
        .lines()
        .filter_map(|l| {
            let (pid, path) = l.split_once('\t')?;
            Some((pid.parse().ok()?, PathBuf::from(path)))
        })
        .collect();
    let alive = |pid: u32| Path::new(&format!("/proc/{pid}")).exists();
    let (live, dead): (Vec<_>, Vec<_>) = entries.drain(..).partition(|(pid, _)| alive(*pid));
    entries = live;
    let mut orphans: Vec<PathBuf> = dead
        .into_iter()
        .map(|(_, p)| p)
        .filter(|p| !entries.iter().any(|(_, q)| q == p))
        .collect();
    // Deepest first, so that a directory is empty when its turn comes.
    orphans.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    orphans.dedup();
    for p in &orphans {
        remove_made(p);
    }
    let out = f(&mut entries);
    let text: String = entries
        .iter()
        .map(|(pid, p)| format!("{pid}\t{}\n", p.display()))
        .collect();
    file.set_len(0)?;
    file.rewind()?;
    file.write_all(text.as_bytes())?;
    Ok(out)
}

/// rmdir or unlink of an empty file: never more than what was made.
fn remove_made(path: &Path) {
    if path.is_dir() {
        let _ = std::fs::remove_dir(path);
    } else if std::fs::metadata(path).is_ok_and(|m| m.len() == 0) {
        let _ = std::fs::remove_file(path);
    }
}

/// A host path made (if missing) to mount over, released on drop.
pub(crate) struct MountPoint {
    /// The paths this handle uses (made by it or by another kubelet), deepest last.
    used: Vec<PathBuf>,
}

impl MountPoint {
    fn make(target: &Path, dir: bool) -> io::Result<MountPoint> {
        let me = std::process::id();
        // Owned from the start: on an error, its drop releases what was taken.
        let mut point = MountPoint { used: Vec::new() };
        with_mount_points(|entries| -> io::Result<()> {
            let mut path = PathBuf::new();
            let components: Vec<_> = target.components().collect();
            for (i, c) in components.iter().enumerate() {
                path.push(c);
                let last = i + 1 == components.len();
                let made_by_a_kubelet = entries.iter().any(|(_, p)| *p == path);
                // `exists` follows symlinks (/var/run -> /run): that is what mount does.
                if !made_by_a_kubelet {
                    if path.exists() {
                        continue;
                    }
                    if last && !dir {
                        std::fs::write(&path, b"")?;
                    } else {
                        std::fs::create_dir(&path)?;
                    }
                }
                entries.push((me, path.clone()));
                point.used.push(path.clone());
            }
            Ok(())
        })??;
        Ok(point)
    }
}

impl Drop for MountPoint {
    fn drop(&mut self) {
        if self.used.is_empty() {
            return;
        }
        let me = std::process::id();
        let used = std::mem::take(&mut self.used);
        let released = with_mount_points(|entries| {
            for path in used.iter().rev() {
                if let Some(i) = entries.iter().position(|(pid, p)| *pid == me && p == path) {
                    entries.remove(i);
                }
                if !entries.iter().any(|(_, p)| p == path) {
                    remove_made(path);
                }
            }
        });
        if let Err(e) = released {
            tracing::warn!(error = %e, "testkit: mount points not released");
        }
    }
}
