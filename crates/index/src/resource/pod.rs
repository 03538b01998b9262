use super::{
    meta::{Labels, ObjectMetaWire, Owner},
    InvalidObject, ObjectKey,
};
use serde::{
    de::{self, IgnoredAny, MapAccess, SeqAccess, Visitor},
    Deserialize, Deserializer,
};
use std::{fmt, net::IpAddr};

/// A pod, reduced to what endpoint resolution needs.
#[derive(Clone, Debug, PartialEq)]
pub struct Pod {
    pub key: ObjectKey,
    pub labels: Labels,
    /// Only the annotations the index reads ([`super::USED_ANNOTATIONS`]).
    pub annotations: Labels,
    pub owner: Option<Owner>,
    /// RFC 3339, as the API server writes it; compares in time order.
    pub creation_timestamp: Option<String>,
    pub terminating: bool,
    pub service_account: String,
    pub node_name: Option<String>,
    pub host_network: bool,
    pub ports: Vec<ContainerPort>,
    pub phase: Phase,
    pub ready: bool,
    /// All pod IPs (dual-stack pods have two); the first is the primary.
    pub ips: Vec<IpAddr>,
    pub host_ip: Option<IpAddr>,
    /// The inbound port of the pod's Linkerd proxy, from its
    /// `LINKERD2_PROXY_INBOUND_LISTEN_ADDR`, when it has one.
    pub proxy_inbound_port: Option<u16>,
    /// The admin and tap ports of the pod's proxy when it has one (a
    /// container named `linkerd-proxy`): the ports named `linkerd-admin` or
    /// `proxy-admin` and `linkerd-tap` or `proxy-tap`, else Linkerd's 4191
    /// and 4190. `None` for a pod without a proxy.
    pub proxy_ports: Option<ProxyPorts>,
}

/// Where a meshed pod's proxy serves its admin (`/metrics`) and Tap APIs.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct ProxyPorts {
    pub admin: u16,
    pub tap: u16,
}

impl ProxyPorts {
    pub const DEFAULT_ADMIN: u16 = 4191;
    pub const DEFAULT_TAP: u16 = 4190;
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerPort {
    pub name: Option<String>,
    pub container_port: u16,
    pub host_port: Option<u16>,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    Pending,
    Running,
    Succeeded,
    Failed,
    Unknown,
}

impl Pod {
    /// A pod that may still own its IP: not terminating and not finished.
    pub fn is_live(&self) -> bool {
        !self.terminating && !matches!(self.phase, Phase::Succeeded | Phase::Failed)
    }

    pub fn container_port_named(&self, name: &str) -> Option<u16> {
        self.ports
            .iter()
            .find(|p| p.name.as_deref() == Some(name))
            .map(|p| p.container_port)
    }

    pub fn is_meshed(&self) -> bool {
        self.labels.contains_key(super::CONTROL_PLANE_NS_LABEL)
    }
}

#[derive(Deserialize, Clone, Debug)]
#[serde(rename_all = "camelCase")]
pub struct PodWire {
    #[serde(default)]
    pub metadata: ObjectMetaWire,
    #[serde(default)]
    spec: PodSpecWire,
    #[serde(default)]
    status: PodStatusWire,
}

#[derive(Deserialize, Default, Clone, Debug)]
#[serde(rename_all = "camelCase")]
struct PodSpecWire {
    #[serde(default)]
    host_network: bool,
    service_account_name: Option<String>,
    service_account: Option<String>,
    node_name: Option<String>,
    #[serde(default)]
    containers: Vec<ContainerWire>,
}

#[derive(Deserialize, Clone, Debug)]
struct ContainerWire {
    #[serde(default)]
    name: String,
    #[serde(default)]
    ports: Vec<ContainerPortWire>,
    /// The value of `LINKERD2_PROXY_INBOUND_LISTEN_ADDR`, the one variable
    /// read; the others are skipped by the decoder, never allocated.
    #[serde(default, rename = "env", deserialize_with = "proxy_inbound_env")]
    proxy_inbound_listen_addr: Option<String>,
}

/// The container Linkerd's injector adds, and its inbound listener setting.
/// Linkerd's and injection's name for the proxy container (one source:
/// `ballast-controlplane`, so viz finds what inject makes).
use ballast_controlplane::pod::{ADMIN_PORT_NAME, PROXY_CONTAINER, TAP_PORT_NAME};
const PROXY_INBOUND_ENV: &str = "LINKERD2_PROXY_INBOUND_LISTEN_ADDR";

#[derive(Deserialize, Clone, Debug)]
#[serde(rename_all = "camelCase")]
struct ContainerPortWire {
    name: Option<String>,
    container_port: Option<i64>,
    host_port: Option<i64>,
}

#[derive(Deserialize, Default, Clone, Debug)]
#[serde(rename_all = "camelCase")]
struct PodStatusWire {
    phase: Option<String>,
    #[serde(rename = "podIP")]
    pod_ip: Option<String>,
    #[serde(rename = "podIPs", default)]
    pod_ips: Vec<PodIpWire>,
    #[serde(rename = "hostIP")]
    host_ip: Option<String>,
    conditions: Option<Vec<ConditionWire>>,
}

#[derive(Deserialize, Clone, Debug)]
struct PodIpWire {
    ip: Option<String>,
}

#[derive(Deserialize, Clone, Debug)]
struct ConditionWire {
    #[serde(rename = "type", default)]
    type_: String,
    #[serde(default)]
    status: String,
}

pub(super) fn parse_ip(field: &str, s: &str) -> Result<IpAddr, InvalidObject> {
    s.parse()
        .map_err(|_| InvalidObject::invalid(field, "not an IP address"))
}

pub(super) fn parse_port(field: &str, n: i64) -> Result<u16, InvalidObject> {
    u16::try_from(n)
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| InvalidObject::invalid(field, "port must be between 1 and 65535"))
}

impl TryFrom<PodWire> for Pod {
    type Error = InvalidObject;

    fn try_from(mut w: PodWire) -> Result<Self, InvalidObject> {
        let key = w.metadata.key()?;
        let phase = match w.status.phase.as_deref() {
            None | Some("Pending") => Phase::Pending,
            Some("Running") => Phase::Running,
            Some("Succeeded") => Phase::Succeeded,
            Some("Failed") => Phase::Failed,
            Some("Unknown") => Phase::Unknown,
            Some(_) => {
                return Err(InvalidObject::invalid(
                    "status.phase",
                    "expected Pending, Running, Succeeded, Failed or Unknown",
                ))
            }
        };
        // Hand-written manifests often have no conditions at all; a Running pod
        // without any is taken as ready. The API server always writes them.
        let ready = match &w.status.conditions {
            Some(conds) => conds
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True"),
            None => phase == Phase::Running,
        };
        let mut ips = Vec::new();
        if let Some(ip) = w.status.pod_ip.as_deref().filter(|s| !s.is_empty()) {
            ips.push(parse_ip("status.podIP", ip)?);
        }
        for (i, p) in w.status.pod_ips.iter().enumerate() {
            if let Some(ip) = p.ip.as_deref() {
                let ip = parse_ip(&format!("status.podIPs[{i}].ip"), ip)?;
                if !ips.contains(&ip) {
                    ips.push(ip);
                }
            }
        }
        let host_ip = match w.status.host_ip.as_deref().filter(|s| !s.is_empty()) {
            Some(ip) => Some(parse_ip("status.hostIP", ip)?),
            None => None,
        };
        let mut ports = Vec::new();
        for (ci, c) in w.spec.containers.iter().enumerate() {
            for (pi, p) in c.ports.iter().enumerate() {
                let field = format!("spec.containers[{ci}].ports[{pi}]");
                let container_port = match p.container_port {
                    Some(n) => parse_port(&format!("{field}.containerPort"), n)?,
                    None => return Err(InvalidObject::missing(format!("{field}.containerPort"))),
                };
                let host_port = match p.host_port {
                    Some(0) | None => None,
                    Some(n) => Some(parse_port(&format!("{field}.hostPort"), n)?),
                };
                ports.push(ContainerPort {
                    name: p.name.clone().filter(|n| !n.is_empty()),
                    container_port,
                    host_port,
                });
            }
        }
        let proxy_inbound_port = w
            .spec
            .containers
            .iter()
            .filter(|c| c.name == PROXY_CONTAINER)
            .find_map(|c| c.proxy_inbound_listen_addr.as_deref())
            .and_then(|v| v.rsplit_once(':'))
            .and_then(|(_, port)| port.parse::<u16>().ok());
        let proxy_ports = w
            .spec
            .containers
            .iter()
            .position(|c| c.name == PROXY_CONTAINER)
            .map(|ci| {
                let named = |names: [&str; 2], default: u16| {
                    w.spec.containers[ci]
                        .ports
                        .iter()
                        .find(|p| p.name.as_deref().is_some_and(|n| names.contains(&n)))
                        .and_then(|p| p.container_port)
                        .and_then(|n| u16::try_from(n).ok())
                        .filter(|n| *n != 0)
                        .unwrap_or(default)
                };
                ProxyPorts {
                    admin: named([ADMIN_PORT_NAME, "proxy-admin"], ProxyPorts::DEFAULT_ADMIN),
                    tap: named([TAP_PORT_NAME, "proxy-tap"], ProxyPorts::DEFAULT_TAP),
                }
            });
        let annotations = w.metadata.take_used_annotations();
        Ok(Pod {
            owner: w.metadata.controller(),
            creation_timestamp: w.metadata.creation_timestamp.take(),
            terminating: w.metadata.deletion_timestamp.is_some(),
            labels: w.metadata.take_labels(),
            annotations,
            key,
            service_account: w
                .spec
                .service_account_name
                .or(w.spec.service_account)
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "default".to_string()),
            node_name: w.spec.node_name,
            host_network: w.spec.host_network,
            ports,
            phase,
            ready,
            ips,
            host_ip,
            proxy_inbound_port,
            proxy_ports,
        })
    }
}

/// Reads a container's `env` list keeping only the value of
/// [`PROXY_INBOUND_ENV`]. Other variables' values are skipped unread when
/// their name comes first, as the API server writes it.
fn proxy_inbound_env<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    struct EnvList;

    impl<'de> Visitor<'de> for EnvList {
        type Value = Option<String>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a list of environment variables")
        }

        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_seq(self)
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut found = None;
            while let Some(EnvVar(value)) = seq.next_element()? {
                if found.is_none() {
                    found = value;
                }
            }
            Ok(found)
        }
    }

    d.deserialize_option(EnvList)
}

/// One `env` entry: the value when the name is [`PROXY_INBOUND_ENV`].
struct EnvVar(Option<String>);

impl<'de> Deserialize<'de> for EnvVar {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Entry;

        impl<'de> Visitor<'de> for Entry {
            type Value = EnvVar;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an environment variable")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<EnvVar, A::Error> {
                let mut is_proxy_inbound: Option<bool> = None;
                let mut value: Option<String> = None;
                while let Some(key) = map.next_key::<EnvKey>()? {
                    match key {
                        EnvKey::Name => {
                            let NameIsProxyInbound(matched) = map.next_value()?;
                            is_proxy_inbound = Some(matched);
                        }
                        EnvKey::Value if is_proxy_inbound != Some(false) => {
                            value = map.next_value()?;
                        }
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(EnvVar(value.filter(|_| is_proxy_inbound == Some(true))))
            }
        }

        d.deserialize_map(Entry)
    }
}

enum EnvKey {
    Name,
    Value,
    Other,
}

impl<'de> Deserialize<'de> for EnvKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Key;

        impl Visitor<'_> for Key {
            type Value = EnvKey;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a field name")
            }

            fn visit_str<E: de::Error>(self, s: &str) -> Result<EnvKey, E> {
                Ok(match s {
                    "name" => EnvKey::Name,
                    "value" => EnvKey::Value,
                    _ => EnvKey::Other,
                })
            }
        }

        d.deserialize_identifier(Key)
    }
}

/// An env var's name, compared in place with [`PROXY_INBOUND_ENV`].
struct NameIsProxyInbound(bool);

impl<'de> Deserialize<'de> for NameIsProxyInbound {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Name;

        impl<'de> Visitor<'de> for Name {
            type Value = NameIsProxyInbound;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }

            fn visit_str<E: de::Error>(self, s: &str) -> Result<NameIsProxyInbound, E> {
                Ok(NameIsProxyInbound(s == PROXY_INBOUND_ENV))
            }

            fn visit_none<E: de::Error>(self) -> Result<NameIsProxyInbound, E> {
                Ok(NameIsProxyInbound(false))
            }

            fn visit_unit<E: de::Error>(self) -> Result<NameIsProxyInbound, E> {
                Ok(NameIsProxyInbound(false))
            }

            fn visit_some<D: Deserializer<'de>>(
                self,
                d: D,
            ) -> Result<NameIsProxyInbound, D::Error> {
                d.deserialize_str(self)
            }
        }

        d.deserialize_option(Name)
    }
}
