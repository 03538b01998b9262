use super::{
    meta::ObjectMetaWire,
    pod::{parse_ip, parse_port},
    InvalidObject, ObjectKey,
};
use serde::Deserialize;
use std::{net::IpAddr, sync::Arc};

/// Label naming the service an EndpointSlice belongs to.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// An EndpointSlice (discovery.k8s.io/v1), reduced to what resolution needs.
#[derive(Clone, Debug, PartialEq)]
pub struct EndpointSlice {
    pub key: ObjectKey,
    /// The owning service, from the `kubernetes.io/service-name` label.
    pub service: Option<ObjectKey>,
    pub ports: Vec<SlicePort>,
    pub endpoints: Vec<SliceEndpoint>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlicePort {
    pub name: Option<String>,
    pub port: Option<u16>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SliceEndpoint {
    pub addresses: Vec<IpAddr>,
    /// `conditions.ready`; absent means ready, as the API documents.
    pub ready: bool,
    pub zone: Option<String>,
    pub hints_for_zones: Vec<String>,
    /// The pod behind this endpoint, when the slice names one.
    pub target_pod: Option<ObjectKey>,
    pub node_name: Option<String>,
}

#[derive(Deserialize, Clone, Debug)]
#[serde(rename_all = "camelCase")]
pub struct EndpointSliceWire {
    #[serde(default)]
    pub metadata: ObjectMetaWire,
    address_type: Option<String>,
    #[serde(default)]
    ports: Option<Vec<SlicePortWire>>,
    #[serde(default)]
    endpoints: Option<Vec<SliceEndpointWire>>,
}

#[derive(Deserialize, Clone, Debug)]
struct SlicePortWire {
    name: Option<String>,
    port: Option<i64>,
}

#[derive(Deserialize, Clone, Debug)]
#[serde(rename_all = "camelCase")]
struct SliceEndpointWire {
    #[serde(default)]
    addresses: Vec<String>,
    #[serde(default)]
    conditions: ConditionsWire,
    zone: Option<String>,
    node_name: Option<String>,
    target_ref: Option<TargetRefWire>,
    hints: Option<HintsWire>,
}

#[derive(Deserialize, Default, Clone, Debug)]
struct ConditionsWire {
    ready: Option<bool>,
}

#[derive(Deserialize, Clone, Debug)]
struct TargetRefWire {
    kind: Option<String>,
    namespace: Option<String>,
    name: Option<String>,
}

#[derive(Deserialize, Clone, Debug)]
#[serde(rename_all = "camelCase")]
struct HintsWire {
    #[serde(default)]
    for_zones: Vec<ZoneWire>,
}

#[derive(Deserialize, Clone, Debug)]
struct ZoneWire {
    name: Option<String>,
}

impl TryFrom<EndpointSliceWire> for EndpointSlice {
    type Error = InvalidObject;

    fn try_from(w: EndpointSliceWire) -> Result<Self, InvalidObject> {
        let key = w.metadata.key()?;
        match w.address_type.as_deref() {
            Some("IPv4") | Some("IPv6") => {}
            // FQDN slices name hosts, not addresses; the index cannot use them.
            Some("FQDN") => {
                return Ok(EndpointSlice {
                    service: None,
                    key,
                    ports: vec![],
                    endpoints: vec![],
                })
            }
            Some(_) => {
                return Err(InvalidObject::invalid(
                    "addressType",
                    "expected IPv4, IPv6 or FQDN",
                ))
            }
            None => return Err(InvalidObject::missing("addressType")),
        }
        let service = w
            .metadata
            .labels
            .get(SERVICE_NAME_LABEL)
            .filter(|n| !n.is_empty())
            .map(|n| ObjectKey::new(key.namespace.clone(), n.clone()));
        let mut ports = Vec::new();
        for (i, p) in w.ports.unwrap_or_default().into_iter().enumerate() {
            let port = match p.port {
                Some(n) => Some(parse_port(&format!("ports[{i}].port"), n)?),
                None => None,
            };
            ports.push(SlicePort {
                name: p.name.filter(|n| !n.is_empty()),
                port,
            });
        }
        let mut endpoints = Vec::new();
        for (i, e) in w.endpoints.unwrap_or_default().into_iter().enumerate() {
            if e.addresses.is_empty() {
                return Err(InvalidObject::missing(format!("endpoints[{i}].addresses")));
            }
            let mut addresses = Vec::with_capacity(e.addresses.len());
            for (j, a) in e.addresses.iter().enumerate() {
                addresses.push(parse_ip(&format!("endpoints[{i}].addresses[{j}]"), a)?);
            }
            let target_pod = e
                .target_ref
                .and_then(|r| match (r.kind.as_deref(), r.name) {
                    (Some("Pod") | None, Some(name)) if !name.is_empty() => Some(ObjectKey::new(
                        r.namespace
                            .filter(|n| !n.is_empty())
                            .map(Arc::<str>::from)
                            .unwrap_or_else(|| key.namespace.clone()),
                        name,
                    )),
                    _ => None,
                });
            endpoints.push(SliceEndpoint {
                addresses,
                ready: e.conditions.ready.unwrap_or(true),
                zone: e.zone.filter(|z| !z.is_empty()),
                hints_for_zones: e
                    .hints
                    .map(|h| h.for_zones.into_iter().filter_map(|z| z.name).collect())
                    .unwrap_or_default(),
                target_pod,
                node_name: e.node_name,
            });
        }
        Ok(EndpointSlice {
            key,
            service,
            ports,
            endpoints,
        })
    }
}
