//! The demo's cluster as Kubernetes manifests: Service `web` in namespace
//! `demo`, port 80 with a named targetPort; one meshed Pod per backend whose
//! IP and container port of that name are its proxy's inbound address, and
//! whose `linkerd-proxy` container names the proxy's admin and tap ports;
//! the meshed `load` pod; the service-account token Secrets `ballast
//! identity` checks.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::identity::{ServiceAccount, CONTROL_NS};

pub const NAMESPACE: &str = "demo";
pub const SERVICE: &str = "web";
pub const SERVICE_PORT: u16 = 80;
/// The Service's clusterIP: only a name in this demo, nothing listens there.
const CLUSTER_IP: &str = "10.96.0.80";
/// The named targetPort every pod resolves to its own port.
const PORT_NAME: &str = "http";

const SERVICE_FILE: &str = "web-service.yaml";
const PODS_FILE: &str = "web-pods.yaml";
const LOAD_FILE: &str = "load-pod.yaml";
const TOKENS_FILE: &str = "service-account-tokens.yaml";

/// The `pod-template-hash` of the demo's ReplicaSets, so pods roll up to
/// their Deployments (`web`, `load`) as Linkerd names workloads.
pub const WEB_HASH: &str = "5d8f7c6b9";
pub const LOAD_HASH: &str = "7c9d4f8b6";
/// The load client's pod: the demo proxy stands for its sidecar.
pub const LOAD_DEPLOYMENT: &str = "load";
pub const LOAD_POD: &str = "load-7c9d4f8b6-x2k4q";

/// The authority clients use for the demo service.
pub fn authority() -> String {
    format!("{SERVICE}.{NAMESPACE}.svc.cluster.local")
}

/// The web pods' service account.
pub const WEB_SERVICE_ACCOUNT: &str = SERVICE;

/// A meshed pod of the demo service: its name, the address clients reach
/// it at (its proxy's inbound listener: the pod's IP and port), and its
/// proxy's admin and tap ports on the same IP.
#[derive(Clone, Debug)]
pub struct PodBackend {
    pub name: String,
    pub addr: SocketAddr,
    pub admin_port: u16,
    pub tap_port: u16,
}

/// The meshed pod the demo proxy stands for: where its admin (`/metrics`)
/// and Tap APIs listen.
#[derive(Clone, Copy, Debug)]
pub struct LoadPod {
    pub admin: SocketAddr,
    pub tap: SocketAddr,
}

/// The manifests directory the controller reads.
pub struct Manifests {
    dir: PathBuf,
}

impl Manifests {
    /// Writes the Service and the token Secrets of `accounts` into `dir`
    /// (the pods come once their proxies listen).
    pub fn write(dir: &Path, accounts: &[&ServiceAccount]) -> anyhow::Result<Manifests> {
        let manifests = Manifests {
            dir: dir.to_path_buf(),
        };
        manifests.replace(SERVICE_FILE, &service_yaml())?;
        let secrets = accounts
            .iter()
            .map(|a| a.secret_yaml())
            .collect::<Vec<_>>()
            .join("---\n");
        manifests.replace(TOKENS_FILE, &secrets)?;
        Ok(manifests)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Rewrites the pods file to hold exactly `pods`.
    pub fn set_pods(&self, pods: &[PodBackend]) -> anyhow::Result<()> {
        let text = pods.iter().map(pod_yaml).collect::<Vec<_>>().join("---\n");
        self.replace(PODS_FILE, &text)
    }

    /// Writes the meshed `load` pod (Deployment `load`), whose proxy is
    /// the demo proxy, so `ballast viz` scrapes and taps it.
    pub fn set_load(&self, load: &LoadPod) -> anyhow::Result<()> {
        self.replace(LOAD_FILE, &load_pod_yaml(load))
    }

    /// Replaces `name` in one step: written beside it under a hidden name
    /// (which the controller skips), then renamed over it, so the controller
    /// never reads half a file.
    fn replace(&self, name: &str, text: &str) -> anyhow::Result<()> {
        let target = self.dir.join(name);
        let staging = self.dir.join(format!(".{name}.tmp"));
        let mut file = std::fs::File::create(&staging)
            .with_context(|| format!("cannot create {}", staging.display()))?;
        file.write_all(text.as_bytes())
            .and_then(|()| file.sync_all())
            .with_context(|| format!("cannot write {}", staging.display()))?;
        std::fs::rename(&staging, &target).with_context(|| {
            format!(
                "cannot move {} over {}",
                staging.display(),
                target.display()
            )
        })
    }
}

fn service_yaml() -> String {
    format!(
        "apiVersion: v1\n\
         kind: Service\n\
         metadata:\n  name: {SERVICE}\n  namespace: {NAMESPACE}\n\
         spec:\n  clusterIP: {CLUSTER_IP}\n  selector:\n    app: {SERVICE}\n\
         \x20 ports:\n  - name: http\n    port: {SERVICE_PORT}\n    targetPort: {PORT_NAME}\n"
    )
}

fn pod_yaml(pod: &PodBackend) -> String {
    format!(
        "apiVersion: v1\n\
         kind: Pod\n\
         metadata:\n  name: {name}\n  namespace: {NAMESPACE}\n  labels:\n    app: {SERVICE}\n    pod-template-hash: {WEB_HASH}\n    linkerd.io/control-plane-ns: {CONTROL_NS}\n\
         \x20 ownerReferences:\n  - apiVersion: apps/v1\n    kind: ReplicaSet\n    name: {SERVICE}-{WEB_HASH}\n    uid: demo-{SERVICE}-rs\n    controller: true\n\
         spec:\n  serviceAccountName: {WEB_SERVICE_ACCOUNT}\n  containers:\n  - name: linkerd-proxy\n    ports:\n    - name: linkerd-admin\n      containerPort: {admin}\n    - name: linkerd-tap\n      containerPort: {tap}\n\
         \x20 - name: web\n    ports:\n    - name: {PORT_NAME}\n      containerPort: {port}\n\
         status:\n  phase: Running\n  podIP: {ip}\n  conditions:\n  - type: Ready\n    status: \"True\"\n",
        name = pod.name,
        port = pod.addr.port(),
        admin = pod.admin_port,
        tap = pod.tap_port,
        ip = pod.addr.ip(),
    )
}

/// A pod with a `linkerd-proxy` container whose named ports are the load
/// client's proxy's: viz finds a meshed pod there to scrape and tap.
fn load_pod_yaml(load: &LoadPod) -> String {
    format!(
        "apiVersion: v1\n\
         kind: Pod\n\
         metadata:\n  name: {LOAD_POD}\n  namespace: {NAMESPACE}\n  labels:\n    app: {LOAD_DEPLOYMENT}\n    pod-template-hash: {LOAD_HASH}\n    linkerd.io/control-plane-ns: {CONTROL_NS}\n\
         \x20 ownerReferences:\n  - apiVersion: apps/v1\n    kind: ReplicaSet\n    name: {LOAD_DEPLOYMENT}-{LOAD_HASH}\n    uid: demo-{LOAD_DEPLOYMENT}-rs\n    controller: true\n\
         spec:\n  serviceAccountName: {LOAD_DEPLOYMENT}\n  containers:\n  - name: linkerd-proxy\n    ports:\n    - name: linkerd-admin\n      containerPort: {admin}\n    - name: linkerd-tap\n      containerPort: {tap}\n\
         \x20 - name: load\n\
         status:\n  phase: Running\n  podIP: {ip}\n  conditions:\n  - type: Ready\n    status: \"True\"\n",
        admin = load.admin.port(),
        tap = load.tap.port(),
        ip = load.admin.ip(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pods() -> Vec<PodBackend> {
        ["web-a", "web-b"]
            .iter()
            .enumerate()
            .map(|(i, name)| PodBackend {
                name: name.to_string(),
                addr: SocketAddr::from(([127, 0, 0, 2 + i as u8], 40_000 + i as u16)),
                admin_port: 41_000 + i as u16,
                tap_port: 42_000 + i as u16,
            })
            .collect()
    }

    fn accounts(dir: &Path) -> Vec<ServiceAccount> {
        ["load", "web"]
            .iter()
            .map(|sa| ServiceAccount::create(dir, NAMESPACE, sa).expect("account"))
            .collect()
    }

    #[test]
    fn writes_the_service_tokens_and_pods() {
        let dir = tempfile::tempdir().expect("tempdir");
        let tokens = tempfile::tempdir().expect("tempdir");
        let accounts = accounts(tokens.path());
        let manifests =
            Manifests::write(dir.path(), &accounts.iter().collect::<Vec<_>>()).expect("write");
        let service = std::fs::read_to_string(dir.path().join(SERVICE_FILE)).expect("service file");
        assert!(service.contains("targetPort: http"), "{service}");
        let secrets = std::fs::read_to_string(dir.path().join(TOKENS_FILE)).expect("tokens file");
        assert_eq!(secrets.matches("kind: Secret\n").count(), 2, "{secrets}");
        for account in &accounts {
            assert!(
                secrets.contains(&format!("token: {}\n", account.token)),
                "{secrets}"
            );
        }
        assert!(!dir.path().join(PODS_FILE).exists(), "pods come later");
        manifests.set_pods(&pods()).expect("pods");
        let text = std::fs::read_to_string(dir.path().join(PODS_FILE)).expect("pods file");
        assert_eq!(text.matches("kind: Pod").count(), 2);
        assert!(text.contains("podIP: 127.0.0.3"), "{text}");
        assert!(text.contains("containerPort: 40001"), "{text}");
        // Meshed: the controller gives their endpoints the `web` identity
        // and viz scrapes and taps their proxies.
        assert_eq!(
            text.matches("linkerd.io/control-plane-ns: linkerd\n")
                .count(),
            2,
            "{text}"
        );
        assert_eq!(
            text.matches("serviceAccountName: web\n").count(),
            2,
            "{text}"
        );
        assert!(
            text.contains("- name: linkerd-proxy\n    ports:\n    - name: linkerd-admin\n      containerPort: 41001\n    - name: linkerd-tap\n      containerPort: 42001\n"),
            "{text}"
        );
        // Web pods roll up to Deployment web through their ReplicaSet.
        assert_eq!(text.matches("name: web-5d8f7c6b9\n").count(), 2, "{text}");
        assert_eq!(
            text.matches("pod-template-hash: 5d8f7c6b9\n").count(),
            2,
            "{text}"
        );

        manifests.set_pods(&pods()[..1]).expect("rewrite");
        let text = std::fs::read_to_string(dir.path().join(PODS_FILE)).expect("pods file");
        assert_eq!(text.matches("kind: Pod").count(), 1);
        assert!(!text.contains("web-b"));
        // Only the two manifests remain: no staging file left behind.
        let mut names: Vec<_> = std::fs::read_dir(dir.path())
            .expect("read dir")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, [TOKENS_FILE, PODS_FILE, SERVICE_FILE]);
    }

    #[test]
    fn the_load_pod_is_meshed_with_the_proxys_ports() {
        let dir = tempfile::tempdir().expect("tempdir");
        let manifests = Manifests::write(dir.path(), &[]).expect("write");
        manifests.set_pods(&pods()).expect("pods");
        manifests
            .set_load(&LoadPod {
                admin: "127.0.0.1:41001".parse().expect("addr"),
                tap: "127.0.0.1:41002".parse().expect("addr"),
            })
            .expect("load pod");
        let text = std::fs::read_to_string(dir.path().join(LOAD_FILE)).expect("load file");
        for needle in [
            "name: load-7c9d4f8b6-x2k4q\n",
            "pod-template-hash: 7c9d4f8b6\n",
            "kind: ReplicaSet\n    name: load-7c9d4f8b6\n",
            "- name: linkerd-proxy\n    ports:\n    - name: linkerd-admin\n      containerPort: 41001\n    - name: linkerd-tap\n      containerPort: 41002\n",
            "podIP: 127.0.0.1\n",
            "phase: Running\n",
            "serviceAccountName: load\n",
            "linkerd.io/control-plane-ns: linkerd\n",
        ] {
            assert!(text.contains(needle), "{needle:?} in\n{text}");
        }
        // The web pods are rewritten without touching it.
        manifests.set_pods(&pods()[..1]).expect("rewrite");
        assert!(dir.path().join(LOAD_FILE).exists());
    }
}
