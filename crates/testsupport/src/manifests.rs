//! Small Kubernetes manifests for tests, as YAML text.

pub fn service(ns: &str, name: &str, cluster_ip: &str, port: u16, target: u16) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: {ns}}}\n\
         spec:\n  clusterIP: {cluster_ip}\n  selector: {{app: {name}}}\n\
         \x20 ports: [{{name: http, port: {port}, targetPort: {target}}}]\n"
    )
}

#[derive(Clone)]
pub struct PodSpec<'a> {
    pub ns: &'a str,
    pub name: &'a str,
    pub app: &'a str,
    pub ip: &'a str,
    pub port: u16,
    pub phase: &'a str,
    pub terminating: bool,
    pub host_network: bool,
    pub host_ip: &'a str,
    pub created: &'a str,
}

impl<'a> PodSpec<'a> {
    pub fn new(ns: &'a str, name: &'a str, app: &'a str, ip: &'a str, port: u16) -> Self {
        Self {
            ns,
            name,
            app,
            ip,
            port,
            phase: "Running",
            terminating: false,
            host_network: false,
            host_ip: "127.99.0.1",
            created: "2026-01-01T00:00:00Z",
        }
    }

    pub fn yaml(&self) -> String {
        let deletion = if self.terminating {
            "  deletionTimestamp: \"2026-06-01T00:00:00Z\"\n"
        } else {
            ""
        };
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {ns}\n\
             \x20 creationTimestamp: \"{created}\"\n{deletion}  labels: {{app: {app}}}\n\
             spec:\n  hostNetwork: {hn}\n  containers: [{{name: main, ports: [{{name: http, containerPort: {port}}}]}}]\n\
             status: {{phase: {phase}, podIP: {ip}, hostIP: {host_ip}}}\n",
            name = self.name,
            ns = self.ns,
            created = self.created,
            app = self.app,
            hn = self.host_network,
            port = self.port,
            phase = self.phase,
            ip = self.ip,
            host_ip = self.host_ip,
        )
    }
}

pub fn docs(parts: &[String]) -> String {
    parts.join("---\n")
}
