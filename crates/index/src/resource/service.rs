use super::{
    meta::{Labels, ObjectMetaWire},
    pod::{parse_ip, parse_port},
    InvalidObject, ObjectKey,
};
use serde::Deserialize;
use std::{collections::BTreeMap, net::IpAddr, time::Duration};

/// Linkerd's failure accrual of a Service: `consecutive` turns it on.
pub const FAILURE_ACCRUAL_ANNOTATION: &str = "balancer.linkerd.io/failure-accrual";
pub const FAILURE_ACCRUAL_MAX_FAILURES_ANNOTATION: &str =
    "balancer.linkerd.io/failure-accrual-consecutive-max-failures";
pub const FAILURE_ACCRUAL_MIN_PENALTY_ANNOTATION: &str =
    "balancer.linkerd.io/failure-accrual-consecutive-min-penalty";
pub const FAILURE_ACCRUAL_MAX_PENALTY_ANNOTATION: &str =
    "balancer.linkerd.io/failure-accrual-consecutive-max-penalty";
pub const FAILURE_ACCRUAL_JITTER_ANNOTATION: &str =
    "balancer.linkerd.io/failure-accrual-consecutive-jitter-ratio";

/// Consecutive-failures failure accrual, with Linkerd's defaults: 7
/// failures, penalties from 1 s to 1 m, jitter 0.5.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FailureAccrual {
    pub max_failures: u32,
    pub min_penalty: Duration,
    pub max_penalty: Duration,
    pub jitter_ratio: f32,
}

impl Default for FailureAccrual {
    fn default() -> Self {
        Self {
            max_failures: 7,
            min_penalty: Duration::from_secs(1),
            max_penalty: Duration::from_secs(60),
            jitter_ratio: 0.5,
        }
    }
}

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
    /// The Service's failure accrual (`None`: off), read from its
    /// annotations as Linkerd reads them; `Err` names the annotation that
    /// cannot be read (Linkerd then turns accrual off, and so does the
    /// controller).
    pub fn failure_accrual(&self) -> Result<Option<FailureAccrual>, InvalidObject> {
        let get = |name: &str| self.annotations.get(name).map(str::trim);
        let field = |name: &str| format!("metadata.annotations[{name}]");
        match get(FAILURE_ACCRUAL_ANNOTATION) {
            None => return Ok(None),
            Some("consecutive") => {}
            Some(other) => {
                let mut shown = other.to_string();
                super::truncate(&mut shown, 40);
                return Err(InvalidObject::invalid(
                    field(FAILURE_ACCRUAL_ANNOTATION),
                    format!("{shown:?}: the only mode read is \"consecutive\""),
                ));
            }
        }
        let mut accrual = FailureAccrual::default();
        if let Some(v) = get(FAILURE_ACCRUAL_MAX_FAILURES_ANNOTATION) {
            accrual.max_failures = v.parse().map_err(|_| {
                InvalidObject::invalid(
                    field(FAILURE_ACCRUAL_MAX_FAILURES_ANNOTATION),
                    "expected a whole number of failures",
                )
            })?;
        }
        let penalty = |name: &str| {
            get(name)
                .map(|v| super::parse_annotation_duration(&field(name), v))
                .transpose()
        };
        if let Some(d) = penalty(FAILURE_ACCRUAL_MIN_PENALTY_ANNOTATION)? {
            accrual.min_penalty = d;
        }
        if let Some(d) = penalty(FAILURE_ACCRUAL_MAX_PENALTY_ANNOTATION)? {
            accrual.max_penalty = d;
        }
        if let Some(v) = get(FAILURE_ACCRUAL_JITTER_ANNOTATION) {
            accrual.jitter_ratio = v
                .parse::<f32>()
                .ok()
                .filter(|j| j.is_finite() && (0.0..=100.0).contains(j))
                .ok_or_else(|| {
                    InvalidObject::invalid(
                        field(FAILURE_ACCRUAL_JITTER_ANNOTATION),
                        "expected a ratio from 0 to 100",
                    )
                })?;
        }
        if accrual.min_penalty > accrual.max_penalty {
            return Err(InvalidObject::invalid(
                field(FAILURE_ACCRUAL_MIN_PENALTY_ANNOTATION),
                "the minimum penalty exceeds the maximum",
            ));
        }
        if accrual.max_penalty.is_zero() {
            return Err(InvalidObject::invalid(
                field(FAILURE_ACCRUAL_MAX_PENALTY_ANNOTATION),
                "the maximum penalty cannot be zero",
            ));
        }
        Ok(Some(accrual))
    }

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::Resource;
    use serde_json::json;

    fn service(annotations: serde_json::Value) -> Service {
        let v = json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "shop", "annotations": annotations},
            "spec": {"ports": [{"port": 80}]}});
        match Resource::from_value(v) {
            Ok(Some(Resource::Service(s))) => (*s).clone(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn failure_accrual_reads_linkerds_annotations() {
        assert_eq!(service(json!({})).failure_accrual(), Ok(None));
        assert_eq!(
            service(json!({FAILURE_ACCRUAL_ANNOTATION: "consecutive"})).failure_accrual(),
            Ok(Some(FailureAccrual::default()))
        );
        let tuned = service(json!({
            FAILURE_ACCRUAL_ANNOTATION: " consecutive ",
            FAILURE_ACCRUAL_MAX_FAILURES_ANNOTATION: "3",
            FAILURE_ACCRUAL_MIN_PENALTY_ANNOTATION: "100ms",
            FAILURE_ACCRUAL_MAX_PENALTY_ANNOTATION: "2m",
            FAILURE_ACCRUAL_JITTER_ANNOTATION: "1.5",
        }));
        assert_eq!(
            tuned.failure_accrual(),
            Ok(Some(FailureAccrual {
                max_failures: 3,
                min_penalty: Duration::from_millis(100),
                max_penalty: Duration::from_secs(120),
                jitter_ratio: 1.5,
            }))
        );
        for (bad, field) in [
            (
                json!({FAILURE_ACCRUAL_ANNOTATION: "success-rate"}),
                FAILURE_ACCRUAL_ANNOTATION,
            ),
            (
                json!({FAILURE_ACCRUAL_ANNOTATION: "consecutive", FAILURE_ACCRUAL_MAX_FAILURES_ANNOTATION: "-1"}),
                FAILURE_ACCRUAL_MAX_FAILURES_ANNOTATION,
            ),
            (
                json!({FAILURE_ACCRUAL_ANNOTATION: "consecutive", FAILURE_ACCRUAL_MIN_PENALTY_ANNOTATION: "2m"}),
                FAILURE_ACCRUAL_MIN_PENALTY_ANNOTATION,
            ),
            (
                json!({FAILURE_ACCRUAL_ANNOTATION: "consecutive", FAILURE_ACCRUAL_MAX_PENALTY_ANNOTATION: "0s", FAILURE_ACCRUAL_MIN_PENALTY_ANNOTATION: "0s"}),
                FAILURE_ACCRUAL_MAX_PENALTY_ANNOTATION,
            ),
            (
                json!({FAILURE_ACCRUAL_ANNOTATION: "consecutive", FAILURE_ACCRUAL_JITTER_ANNOTATION: "NaN"}),
                FAILURE_ACCRUAL_JITTER_ANNOTATION,
            ),
        ] {
            let e = service(bad.clone()).failure_accrual().expect_err("refused");
            assert_eq!(e.field, format!("metadata.annotations[{field}]"), "{bad}");
        }
    }
}
