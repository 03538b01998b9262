//! What the data-plane checks read from a pod: liveness, addresses, ports,
//! and the proxy and init containers' configuration (their flags, then their
//! environment, then the binaries' defaults).

use crate::snapshot::{array, text};
use serde_json::Value;
use std::net::SocketAddr;

/// Container names of the mesh's proxy (Ballast's, and Linkerd's).
pub const PROXY_CONTAINERS: [&str; 2] = ["ballast-proxy", "linkerd-proxy"];
/// Container names of the mesh's init container.
pub const INIT_CONTAINERS: [&str; 2] = ["ballast-init", "linkerd-init"];
/// The annotation Linkerd's injector writes the proxy's version in.
pub const PROXY_VERSION_ANNOTATION: &str = "linkerd.io/proxy-version";

/// The proxy's listener ports when its flags do not say (Linkerd's).
pub const DEFAULT_OUTBOUND_PORT: u16 = 4140;
pub const DEFAULT_INBOUND_PORT: u16 = 4143;
pub const DEFAULT_ADMIN_PORT: u16 = 4191;
/// The proxy's uid when the init container's flags do not say.
pub const DEFAULT_PROXY_UID: i64 = 2102;

/// Not finished: phase neither `Succeeded` nor `Failed` (a terminating pod
/// is live: its IP is still in use).
pub fn is_live(pod: &Value) -> bool {
    !matches!(text(pod, "/status/phase"), "Succeeded" | "Failed")
}

pub fn is_terminating(pod: &Value) -> bool {
    pod.pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null())
}

pub fn host_network(pod: &Value) -> bool {
    pod.pointer("/spec/hostNetwork")
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

/// `status.podIPs` and `status.podIP`, deduplicated.
pub fn ips(pod: &Value) -> Vec<&str> {
    let mut ips: Vec<&str> = array(pod, "/status/podIPs")
        .iter()
        .map(|ip| text(ip, "/ip"))
        .chain([text(pod, "/status/podIP")])
        .filter(|ip| !ip.is_empty())
        .collect();
    ips.sort_unstable();
    ips.dedup();
    ips
}

/// Containers, then init containers (a native sidecar is one).
pub fn all_containers(pod_spec_owner: &Value) -> impl Iterator<Item = &Value> {
    array(pod_spec_owner, "/spec/containers")
        .iter()
        .chain(array(pod_spec_owner, "/spec/initContainers"))
}

pub fn proxy_container(pod: &Value) -> Option<&Value> {
    all_containers(pod).find(|c| PROXY_CONTAINERS.contains(&text(c, "/name")))
}

pub fn init_container(pod: &Value) -> Option<&Value> {
    array(pod, "/spec/initContainers")
        .iter()
        .find(|c| INIT_CONTAINERS.contains(&text(c, "/name")))
}

/// Has a proxy container, or the injector's version annotation.
pub fn is_meshed(pod: &Value) -> bool {
    proxy_container(pod).is_some()
        || !text(
            pod,
            &format!(
                "/metadata/annotations/{}",
                PROXY_VERSION_ANNOTATION.replace('/', "~1")
            ),
        )
        .is_empty()
}

/// Every value given to `--flag` in the container's command and args
/// (`--flag=V` or `--flag V`), in order.
pub fn flag_values<'a>(container: &'a Value, flag: &str) -> Vec<&'a str> {
    let words: Vec<&str> = array(container, "/command")
        .iter()
        .chain(array(container, "/args"))
        .filter_map(Value::as_str)
        .collect();
    let prefix = format!("{flag}=");
    let mut values = Vec::new();
    let mut i = 0;
    while i < words.len() {
        if let Some(v) = words[i].strip_prefix(&prefix) {
            values.push(v);
        } else if words[i] == flag {
            if let Some(v) = words.get(i + 1) {
                values.push(*v);
                i += 1;
            }
        }
        i += 1;
    }
    values
}

/// A literal environment variable's value (not `valueFrom`).
pub fn env_value<'a>(container: &'a Value, name: &str) -> Option<&'a str> {
    array(container, "/env")
        .iter()
        .find(|e| text(e, "/name") == name)
        .and_then(|e| e.get("value"))
        .and_then(Value::as_str)
}

/// The last value of a flag, else an environment variable (as clap reads them).
pub(crate) fn setting<'a>(container: &'a Value, flag: &str, envs: &[&str]) -> Option<&'a str> {
    flag_values(container, flag)
        .last()
        .copied()
        .or_else(|| envs.iter().find_map(|e| env_value(container, e)))
}

fn port_of(addr: &str) -> Option<u16> {
    addr.trim()
        .parse::<SocketAddr>()
        .ok()
        .map(|a| a.port())
        .or_else(|| addr.rsplit_once(':').and_then(|(_, p)| p.parse().ok()))
}

/// The proxy's listener ports, as its flags and environment set them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProxyPorts {
    pub outbound: u16,
    pub inbound: u16,
    pub admin: u16,
}

impl ProxyPorts {
    pub fn of(proxy: &Value) -> ProxyPorts {
        let port = |flag: &str, envs: &[&str], default: u16| {
            setting(proxy, flag, envs)
                .and_then(port_of)
                .unwrap_or(default)
        };
        ProxyPorts {
            outbound: port(
                "--outbound-addr",
                &[
                    "BALLAST_PROXY_OUTBOUND_ADDR",
                    "LINKERD2_PROXY_OUTBOUND_LISTEN_ADDR",
                ],
                DEFAULT_OUTBOUND_PORT,
            ),
            inbound: port(
                "--inbound-addr",
                &[
                    "BALLAST_PROXY_INBOUND_ADDR",
                    "LINKERD2_PROXY_INBOUND_LISTEN_ADDR",
                ],
                DEFAULT_INBOUND_PORT,
            ),
            admin: port(
                "--admin-addr",
                &[
                    "BALLAST_PROXY_ADMIN_ADDR",
                    "LINKERD2_PROXY_ADMIN_LISTEN_ADDR",
                ],
                DEFAULT_ADMIN_PORT,
            ),
        }
    }

    /// `inbound listener (4143)`, when `port` is one of them.
    pub fn describe(&self, port: u16) -> Option<String> {
        let which = if port == self.inbound {
            "inbound"
        } else if port == self.outbound {
            "outbound"
        } else if port == self.admin {
            "admin"
        } else {
            return None;
        };
        Some(format!("the proxy's {which} listener ({port})"))
    }
}

/// One `--outbound-tcp LISTEN=AUTHORITY` route of the proxy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TcpRoute {
    pub listen: String,
    pub listen_port: Option<u16>,
    pub authority: String,
    pub authority_host: String,
    pub authority_port: Option<u16>,
}

pub fn outbound_tcp_routes(proxy: &Value) -> Vec<TcpRoute> {
    let mut specs: Vec<&str> = flag_values(proxy, "--outbound-tcp");
    if specs.is_empty() {
        if let Some(env) = env_value(proxy, "BALLAST_PROXY_OUTBOUND_TCP") {
            specs = env.split(',').collect();
        }
    }
    specs
        .into_iter()
        .filter_map(|spec| {
            let (listen, authority) = spec.split_once('=')?;
            let (host, port) = match authority.trim().rsplit_once(':') {
                Some((h, p)) => (h, p.parse().ok()),
                None => (authority.trim(), None),
            };
            Some(TcpRoute {
                listen: listen.trim().to_string(),
                listen_port: port_of(listen),
                authority: authority.trim().to_string(),
                authority_host: host.trim_matches(['[', ']']).to_string(),
                authority_port: port,
            })
        })
        .collect()
}

/// The init container's redirection settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InitPorts {
    pub incoming: u16,
    pub outgoing: u16,
    pub proxy_uid: i64,
}

impl InitPorts {
    pub fn of(init: &Value) -> InitPorts {
        let get = |flag: &str, env: &str| setting(init, flag, &[env]);
        InitPorts {
            incoming: get("--incoming-proxy-port", "BALLAST_INIT_INCOMING_PROXY_PORT")
                .and_then(|p| p.trim().parse().ok())
                .unwrap_or(DEFAULT_INBOUND_PORT),
            outgoing: get("--outgoing-proxy-port", "BALLAST_INIT_OUTGOING_PROXY_PORT")
                .and_then(|p| p.trim().parse().ok())
                .unwrap_or(DEFAULT_OUTBOUND_PORT),
            proxy_uid: get("--proxy-uid", "BALLAST_INIT_PROXY_UID")
                .and_then(|p| p.trim().parse().ok())
                .unwrap_or(DEFAULT_PROXY_UID),
        }
    }
}

/// The uid a container runs as, when its spec or the pod's says.
pub fn run_as_user(pod: &Value, container: &Value) -> Option<i64> {
    container
        .pointer("/securityContext/runAsUser")
        .or_else(|| pod.pointer("/spec/securityContext/runAsUser"))
        .and_then(Value::as_i64)
}

/// A container's ports: `(name, containerPort, hostPort, protocol)`.
pub struct DeclaredPort<'a> {
    pub name: &'a str,
    pub container_port: Option<u16>,
    pub host_port: Option<u16>,
    pub protocol: &'a str,
}

pub fn declared_ports(pod: &Value) -> impl Iterator<Item = DeclaredPort<'_>> {
    all_containers(pod).flat_map(|c| {
        array(c, "/ports").iter().map(|p| {
            let port = |f: &str| {
                p.get(f)
                    .and_then(Value::as_u64)
                    .and_then(|n| u16::try_from(n).ok())
                    .filter(|n| *n > 0)
            };
            DeclaredPort {
                name: text(p, "/name"),
                container_port: port("containerPort"),
                host_port: port("hostPort"),
                protocol: match text(p, "/protocol") {
                    "" => "TCP",
                    other => other,
                },
            }
        })
    })
}

/// The proxy's version: the injector's annotation, else its image's tag
/// (`None` for `latest`, a digest, or no tag).
pub fn proxy_version(pod: &Value) -> Option<String> {
    let annotation = text(
        pod,
        &format!(
            "/metadata/annotations/{}",
            PROXY_VERSION_ANNOTATION.replace('/', "~1")
        ),
    );
    if !annotation.is_empty() {
        return Some(annotation.to_string());
    }
    let image = text(proxy_container(pod)?, "/image");
    let image = image.split('@').next().unwrap_or(image);
    let (_, tag) = image.rsplit_once(':')?;
    (!tag.contains('/') && tag != "latest" && !tag.is_empty()).then(|| tag.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn flags_are_read_in_both_spellings_and_env_is_the_fallback() {
        let c = json!({
            "name": "ballast-proxy",
            "args": ["--inbound-addr", "0.0.0.0:5143", "--outbound-addr=127.0.0.1:5140",
                     "--outbound-tcp=127.0.0.1:5432=db.shop.svc.cluster.local:5432",
                     "--outbound-tcp", "127.0.0.1:6000=localhost:4140"],
            "env": [{"name": "BALLAST_PROXY_ADMIN_ADDR", "value": "0.0.0.0:5191"}]
        });
        assert_eq!(
            ProxyPorts::of(&c),
            ProxyPorts {
                outbound: 5140,
                inbound: 5143,
                admin: 5191
            }
        );
        let routes = outbound_tcp_routes(&c);
        assert_eq!(routes.len(), 2);
        assert_eq!(routes[1].authority_host, "localhost");
        assert_eq!(routes[1].authority_port, Some(4140));
        assert_eq!(routes[0].listen_port, Some(5432));
        let bare = json!({"name": "linkerd-proxy"});
        assert_eq!(ProxyPorts::of(&bare).inbound, DEFAULT_INBOUND_PORT);
        let init = json!({"args": ["init", "--outgoing-proxy-port=4143", "--proxy-uid", "1000"]});
        assert_eq!(
            InitPorts::of(&init),
            InitPorts {
                incoming: 4143,
                outgoing: 4143,
                proxy_uid: 1000
            }
        );
    }

    #[test]
    fn versions_come_from_the_annotation_or_a_real_tag() {
        let pod = |ann: Option<&str>, image: &str| {
            let mut p = json!({"metadata": {"annotations": {}},
                "spec": {"containers": [{"name": "ballast-proxy", "image": image}]}});
            if let Some(a) = ann {
                p["metadata"]["annotations"][PROXY_VERSION_ANNOTATION] = json!(a);
            }
            p
        };
        assert_eq!(
            proxy_version(&pod(Some("0.1.0"), "x:latest")).as_deref(),
            Some("0.1.0")
        );
        assert_eq!(
            proxy_version(&pod(None, "reg:5000/ballast-proxy:0.2.0")).as_deref(),
            Some("0.2.0")
        );
        assert_eq!(proxy_version(&pod(None, "ballast-proxy:latest")), None);
        assert_eq!(proxy_version(&pod(None, "reg:5000/ballast-proxy")), None);
        assert!(is_meshed(&pod(None, "x")));
        assert!(!is_meshed(
            &json!({"spec": {"containers": [{"name": "web"}]}})
        ));
    }
}
