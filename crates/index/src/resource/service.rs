use super::{
    meta::{Labels, ObjectMetaWire},
    pod::{parse_ip, parse_port},
    InvalidObject, ObjectKey,
};
use serde::Deserialize;
use std::{collections::BTreeMap, net::IpAddr};

/// A service, reduced to what endpoint resolution needs.
#[derive(Clone, Debug, PartialEq)]
pub struct Service {
    pub key: ObjectKey,
    /// Only the annotations the index reads ([`super::USED_ANNOTATIONS`]).
    pub annotations: Labels,
    pub type_: ServiceType,
    /// `clusterIP` and `clusterIPs`, without `None` (headless).
    pub cluster_ips: Vec<IpAddr>,
    /// `None` for a service without a selector (endpoints managed by hand).
    pub selector: Option<Labels>,
    pub ports: Vec<ServicePort>,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ServiceType {
    ClusterIp,
    NodePort,
    LoadBalancer,
    ExternalName,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePort {
    pub name: Option<String>,
    pub port: u16,
    pub target_port: TargetPort,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TargetPort {
    Number(u16),
    Name(String),
}

impl Service {
    pub fn port(&self, port: u16) -> Option<&ServicePort> {
        self.ports.iter().find(|p| p.port == port)
    }

    /// Does this service select the pod with these labels?
    pub fn selects(&self, labels: &Labels) -> bool {
        match &self.selector {
            Some(sel) if !sel.is_empty() => sel.is_subset_of(labels),
            _ => false,
        }
    }
}

#[derive(Deserialize, Clone, Debug)]
pub struct ServiceWire {
    #[serde(default)]
    pub metadata: ObjectMetaWire,
    #[serde(default)]
    spec: ServiceSpecWire,
}

#[derive(Deserialize, Default, Clone, Debug)]
#[serde(rename_all = "camelCase")]
struct ServiceSpecWire {
    #[serde(rename = "type")]
    type_: Option<String>,
    #[serde(rename = "clusterIP")]
    cluster_ip: Option<String>,
    #[serde(rename = "clusterIPs", default)]
    cluster_ips: Vec<String>,
    selector: Option<BTreeMap<String, String>>,
    #[serde(default)]
    ports: Vec<ServicePortWire>,
}

#[derive(Deserialize, Clone, Debug)]
#[serde(rename_all = "camelCase")]
struct ServicePortWire {
    name: Option<String>,
    port: Option<i64>,
    target_port: Option<IntOrString>,
}

#[derive(Deserialize, Clone, Debug)]
#[serde(untagged)]
enum IntOrString {
    Int(i64),
    String(String),
}

impl TryFrom<ServiceWire> for Service {
    type Error = InvalidObject;

    fn try_from(mut w: ServiceWire) -> Result<Self, InvalidObject> {
        let key = w.metadata.key()?;
        let type_ = match w.spec.type_.as_deref() {
            None | Some("ClusterIP") => ServiceType::ClusterIp,
            Some("NodePort") => ServiceType::NodePort,
            Some("LoadBalancer") => ServiceType::LoadBalancer,
            Some("ExternalName") => ServiceType::ExternalName,
            Some(_) => {
                return Err(InvalidObject::invalid(
                    "spec.type",
                    "expected ClusterIP, NodePort, LoadBalancer or ExternalName",
                ))
            }
        };
        let mut cluster_ips = Vec::new();
        let singular = w
            .spec
            .cluster_ip
            .iter()
            .map(|ip| ("spec.clusterIP".to_string(), ip));
        let plural = w
            .spec
            .cluster_ips
            .iter()
            .enumerate()
            .map(|(i, ip)| (format!("spec.clusterIPs[{i}]"), ip));
        for (field, ip) in singular.chain(plural) {
            if ip.is_empty() || ip == "None" {
                continue;
            }
            let ip = parse_ip(&field, ip)?;
            if !cluster_ips.contains(&ip) {
                cluster_ips.push(ip);
            }
        }
        let mut ports = Vec::with_capacity(w.spec.ports.len());
        for (i, p) in w.spec.ports.iter().enumerate() {
            let port = match p.port {
                Some(n) => parse_port(&format!("spec.ports[{i}].port"), n)?,
                None => return Err(InvalidObject::missing(format!("spec.ports[{i}].port"))),
            };
            let target_port = match &p.target_port {
                None => TargetPort::Number(port),
                Some(IntOrString::Int(n)) => {
                    TargetPort::Number(parse_port(&format!("spec.ports[{i}].targetPort"), *n)?)
                }
                Some(IntOrString::String(s)) => match s.parse::<i64>() {
                    Ok(n) => {
                        TargetPort::Number(parse_port(&format!("spec.ports[{i}].targetPort"), n)?)
                    }
                    Err(_) if !s.is_empty() => TargetPort::Name(s.clone()),
                    Err(_) => TargetPort::Number(port),
                },
            };
            ports.push(ServicePort {
                name: p.name.clone().filter(|n| !n.is_empty()),
                port,
                target_port,
            });
        }
        Ok(Service {
            annotations: w.metadata.take_used_annotations(),
            key,
            type_,
            cluster_ips,
            selector: w.spec.selector.map(Labels::from),
            ports,
        })
    }
}
