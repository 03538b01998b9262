//! The simulated cluster: meshed pods in Deployments (owner ReplicaSet
//! `NAME-HASH`, label `pod-template-hash`), a Service per Deployment, ten
//! namespaces; each pod's proxy admin port is its fake's. Written as one
//! manifests file per Deployment, shaped as `kubectl get -o yaml` prints
//! them.

use std::net::{IpAddr, Ipv4Addr};

const HASH: &str = "7c9f8b6d5";
/// Linkerd's proxy admin port: each fake listens on it at its pod's IP.
pub const ADMIN_PORT: u16 = 4191;

/// The generated cluster's shape.
#[derive(Clone, Copy, Debug)]
pub struct Cluster {
    pub pods: usize,
    pub deployments: usize,
}

/// One meshed pod of the cluster.
#[derive(Clone, Debug)]
pub struct PodSpec {
    pub namespace: String,
    pub name: String,
    pub deployment: String,
    pub ip: IpAddr,
    pub admin_port: u16,
}

fn deployment_name(d: usize) -> String {
    format!("app-{d}")
}

fn namespace_of(d: usize) -> String {
    format!("ns-{}", d % 10)
}

/// Pod `i`'s loopback IP: 127.1.0.1, 127.1.0.2, ... (all of 127/8 is
/// loopback on Linux, so each fake has its own address and port 4191).
pub fn ip_of(i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(
        127,
        (1 + i / 62_500) as u8,
        (i / 250 % 250) as u8,
        (i % 250 + 1) as u8,
    ))
}

impl Cluster {
    fn per_deployment(&self) -> usize {
        self.pods.div_ceil(self.deployments.max(1)).max(1)
    }

    fn deployment_of(&self, i: usize) -> usize {
        i / self.per_deployment()
    }

    pub fn pod(&self, i: usize) -> PodSpec {
        let d = self.deployment_of(i);
        let deployment = deployment_name(d);
        PodSpec {
            namespace: namespace_of(d),
            name: format!("{deployment}-{HASH}-p{i:05}"),
            deployment,
            ip: ip_of(i),
            admin_port: ADMIN_PORT,
        }
    }

    /// Deployments that have at least one pod.
    fn used_deployments(&self) -> usize {
        self.pods.div_ceil(self.per_deployment())
    }

    /// Pod `i`'s page labels, in [`super::page::LABELS`] order: itself, the
    /// workload that calls it, and the three it calls (a pod of each).
    pub fn page_labels(&self, i: usize) -> Vec<String> {
        let me = self.pod(i);
        let used = self.used_deployments();
        let d = self.deployment_of(i);
        let caller = (d + used - 1) % used;
        let mut labels = vec![
            me.namespace.clone(),
            me.name.clone(),
            me.deployment.clone(),
            HASH.to_string(),
            me.ip.to_string(),
            deployment_name(caller),
            namespace_of(caller),
        ];
        for step in [1, 7, 31] {
            let t = (d + step) % used;
            let pod = (t * self.per_deployment() + i % self.per_deployment()).min(self.pods - 1);
            let target = self.pod(pod);
            labels.extend([
                target.namespace,
                target.deployment.clone(),
                target.deployment,
                target.name,
                HASH.to_string(),
            ]);
        }
        labels
    }

    /// (file name, contents) per Deployment.
    pub fn files(&self) -> Vec<(String, String)> {
        let per = self.per_deployment();
        (0..self.used_deployments())
            .map(|d| {
                let name = deployment_name(d);
                let mut text = service_yaml(&name, &namespace_of(d));
                for i in d * per..((d + 1) * per).min(self.pods) {
                    text.push_str("---\n");
                    text.push_str(&pod_yaml(&self.pod(i), i));
                }
                (format!("{name}.yaml"), text)
            })
            .collect()
    }
}

fn service_yaml(name: &str, ns: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: {ns}\n  \
         labels: {{app: {name}}}\nspec:\n  selector: {{app: {name}}}\n  ports:\n  - name: http\n    \
         port: 80\n    protocol: TCP\n    targetPort: 8080\n"
    )
}

/// A meshed pod as the API server returns it (trimmed): owner, labels,
/// the app and `linkerd-proxy` containers with the proxy's named ports.
pub fn pod_yaml(p: &PodSpec, n: usize) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {ns}\n  \
         creationTimestamp: \"2026-11-01T10:00:00Z\"\n  labels:\n    app: {deploy}\n    \
         pod-template-hash: {HASH}\n    linkerd.io/control-plane-ns: linkerd\n    \
         linkerd.io/proxy-deployment: {deploy}\n  annotations:\n    linkerd.io/proxy-version: stable\n  \
         ownerReferences:\n  - apiVersion: apps/v1\n    kind: ReplicaSet\n    name: {deploy}-{HASH}\n    \
         controller: true\n    uid: 0f6c2a34-1111-2222-3333-{n:012}\nspec:\n  serviceAccountName: {deploy}\n  \
         nodeName: node-{node}\n  containers:\n  - name: app\n    image: example/app:1.0\n    ports:\n    \
         - name: http\n      containerPort: 8080\n      protocol: TCP\n  - name: linkerd-proxy\n    \
         image: cr.l5d.io/linkerd/proxy:stable\n    ports:\n    - name: linkerd-proxy\n      \
         containerPort: 4143\n    - name: linkerd-admin\n      containerPort: {admin}\n    \
         - name: linkerd-tap\n      containerPort: 4190\n    env:\n    \
         - name: LINKERD2_PROXY_INBOUND_LISTEN_ADDR\n      value: 0.0.0.0:4143\n\
         status:\n  phase: Running\n  podIP: {ip}\n  podIPs:\n  - ip: {ip}\n  hostIP: 172.16.0.{host}\n  \
         conditions:\n  - type: Ready\n    status: \"True\"\n  - type: ContainersReady\n    status: \"True\"\n",
        name = p.name,
        ns = p.namespace,
        deploy = p.deployment,
        admin = p.admin_port,
        ip = p.ip,
        node = n % 50,
        host = n % 50 + 1,
    )
}

/// The two misbehaving pods (Deployment `faulty` in `ns-0`): one hangs,
/// one answers 100 MB.
pub fn faulty(hang: IpAddr, huge: IpAddr) -> (PodSpec, PodSpec) {
    let pod = |name: &str, ip| PodSpec {
        namespace: "ns-0".into(),
        name: format!("faulty-{HASH}-{name}"),
        deployment: "faulty".into(),
        ip,
        admin_port: ADMIN_PORT,
    };
    (pod("hang", hang), pod("huge", huge))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn pods_have_their_own_ips_deployments_and_three_destinations() {
        let c = Cluster {
            pods: 2_000,
            deployments: 200,
        };
        let files = c.files();
        assert_eq!(files.len(), 200);
        let ips: std::collections::HashSet<_> = (0..c.pods).map(|i| c.pod(i).ip).collect();
        assert_eq!(ips.len(), 2_000);
        assert!(ips.iter().all(|ip| ip.is_loopback()));
        let labels = c.page_labels(1_999);
        assert_eq!(labels.len(), super::super::page::LABELS.len());
        assert_eq!(labels[2], "app-199");
        // Its destinations are other deployments.
        assert_ne!(labels[9], "app-199");
        // The manifests parse as Kubernetes objects with the proxy's port.
        let docs: Vec<Value> = files[0]
            .1
            .split("---\n")
            .map(|d| serde_saphyr::from_str(d).expect("YAML"))
            .collect();
        assert_eq!(docs.len(), 11);
        assert_eq!(docs[1]["kind"], "Pod");
        assert_eq!(
            docs[1]["metadata"]["ownerReferences"][0]["name"],
            "app-0-7c9f8b6d5"
        );
        assert_eq!(
            docs[1]["spec"]["containers"][1]["ports"][1]["containerPort"],
            4191
        );
        assert_eq!(docs[1]["status"]["podIP"], "127.1.0.1");
    }
}
