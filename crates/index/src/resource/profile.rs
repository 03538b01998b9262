//! Linkerd's `ServiceProfile` (`linkerd.io/v1alpha2`): per-route retries and
//! timeouts, response classes, a retry budget and traffic-split overrides,
//! served through `GetProfile` as Linkerd 2.9 did.

use super::{
    duration::parse_annotation_duration, meta::null_as_default, route::check_regex, InvalidObject,
    ObjectKey, ObjectMetaWire,
};
use serde::Deserialize;
use std::time::Duration;

/// Bounds on one profile, so that one object cannot make an answer large.
pub const MAX_PROFILE_ROUTES: usize = 100;
pub const MAX_DST_OVERRIDES: usize = 16;
/// Conditions nested in one route's condition or response class.
pub const MAX_CONDITION_NODES: usize = 32;

#[derive(Clone, Debug, PartialEq)]
pub struct ServiceProfile {
    /// Named `SERVICE.NAMESPACE.svc.CLUSTER_DOMAIN`, in the service's namespace.
    pub key: ObjectKey,
    pub routes: Vec<ProfileRoute>,
    pub retry_budget: Option<RetryBudget>,
    pub dst_overrides: Vec<DstOverride>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ProfileRoute {
    pub name: String,
    pub condition: RequestCondition,
    pub response_classes: Vec<ResponseClass>,
    pub is_retryable: bool,
    pub timeout: Option<Duration>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestCondition {
    All(Vec<RequestCondition>),
    Any(Vec<RequestCondition>),
    Not(Box<RequestCondition>),
    PathRegex(String),
    Method(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResponseClass {
    pub condition: ResponseCondition,
    pub is_failure: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResponseCondition {
    All(Vec<ResponseCondition>),
    Any(Vec<ResponseCondition>),
    Not(Box<ResponseCondition>),
    Status { min: u16, max: u16 },
}

#[derive(Clone, Debug, PartialEq)]
pub struct RetryBudget {
    pub retry_ratio: f32,
    pub min_retries_per_second: u32,
    pub ttl: Duration,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DstOverride {
    pub authority: String,
    /// In thousandths (a Kubernetes quantity's milli-value, as Linkerd uses).
    pub weight: u32,
}

#[derive(Deserialize, Clone, Debug)]
#[serde(rename_all = "camelCase")]
pub struct ServiceProfileWire {
    #[serde(default)]
    pub metadata: ObjectMetaWire,
    #[serde(default)]
    spec: SpecWire,
}

#[derive(Deserialize, Clone, Debug, Default)]
#[serde(rename_all = "camelCase")]
struct SpecWire {
    #[serde(default, deserialize_with = "null_as_default")]
    routes: Vec<RouteWire>,
    retry_budget: Option<RetryBudgetWire>,
    #[serde(default, deserialize_with = "null_as_default")]
    dst_overrides: Vec<DstOverrideWire>,
}

#[derive(Deserialize, Clone, Debug, Default)]
#[serde(rename_all = "camelCase")]
struct RouteWire {
    #[serde(default)]
    name: String,
    condition: Option<RequestConditionWire>,
    #[serde(default, deserialize_with = "null_as_default")]
    response_classes: Vec<ResponseClassWire>,
    #[serde(default)]
    is_retryable: bool,
    timeout: Option<String>,
}

#[derive(Deserialize, Clone, Debug, Default)]
#[serde(rename_all = "camelCase")]
struct RequestConditionWire {
    method: Option<String>,
    path_regex: Option<String>,
    all: Option<Vec<RequestConditionWire>>,
    any: Option<Vec<RequestConditionWire>>,
    not: Option<Box<RequestConditionWire>>,
}

#[derive(Deserialize, Clone, Debug, Default)]
#[serde(rename_all = "camelCase")]
struct ResponseClassWire {
    condition: Option<ResponseConditionWire>,
    #[serde(default)]
    is_failure: bool,
}

#[derive(Deserialize, Clone, Debug, Default)]
#[serde(rename_all = "camelCase")]
struct ResponseConditionWire {
    status: Option<StatusWire>,
    all: Option<Vec<ResponseConditionWire>>,
    any: Option<Vec<ResponseConditionWire>>,
    not: Option<Box<ResponseConditionWire>>,
}

#[derive(Deserialize, Clone, Debug, Default)]
struct StatusWire {
    min: Option<i64>,
    max: Option<i64>,
}

#[derive(Deserialize, Clone, Debug, Default)]
#[serde(rename_all = "camelCase")]
struct RetryBudgetWire {
    retry_ratio: Option<f64>,
    min_retries_per_second: Option<i64>,
    ttl: Option<String>,
}

#[derive(Deserialize, Clone, Debug, Default)]
struct DstOverrideWire {
    #[serde(default)]
    authority: String,
    weight: Option<serde_json::Value>,
}

fn bad(field: impl Into<String>, reason: impl Into<String>) -> InvalidObject {
    InvalidObject::invalid(field, reason)
}

/// Counts nodes as it converts, so a deeply nested condition is refused
/// instead of recursing without bound.
struct Budget(usize);

impl Budget {
    fn take(&mut self, field: &str) -> Result<(), InvalidObject> {
        if self.0 == 0 {
            return Err(bad(
                field,
                format!("more than {MAX_CONDITION_NODES} conditions"),
            ));
        }
        self.0 -= 1;
        Ok(())
    }
}

fn request_condition(
    field: &str,
    w: RequestConditionWire,
    budget: &mut Budget,
) -> Result<RequestCondition, InvalidObject> {
    budget.take(field)?;
    let mut all = Vec::new();
    if let Some(m) = w.method {
        if m.is_empty() || m.len() > 16 || !m.bytes().all(|b| b.is_ascii_alphabetic()) {
            return Err(bad(
                format!("{field}.method"),
                format!("{m:?} is not a method"),
            ));
        }
        all.push(RequestCondition::Method(m.to_ascii_uppercase()));
    }
    if let Some(p) = w.path_regex {
        check_regex(&format!("{field}.pathRegex"), &p)?;
        all.push(RequestCondition::PathRegex(p));
    }
    let list = |name: &str, v: Vec<RequestConditionWire>, budget: &mut Budget| {
        v.into_iter()
            .enumerate()
            .map(|(i, c)| request_condition(&format!("{field}.{name}[{i}]"), c, budget))
            .collect::<Result<Vec<_>, _>>()
    };
    if let Some(v) = w.all {
        all.push(RequestCondition::All(list("all", v, budget)?));
    }
    if let Some(v) = w.any {
        all.push(RequestCondition::Any(list("any", v, budget)?));
    }
    if let Some(n) = w.not {
        all.push(RequestCondition::Not(Box::new(request_condition(
            &format!("{field}.not"),
            *n,
            budget,
        )?)));
    }
    match all.len() {
        0 => Err(bad(
            field,
            "a condition needs method, pathRegex, all, any or not",
        )),
        1 => Ok(all.remove(0)),
        _ => Ok(RequestCondition::All(all)),
    }
}

fn response_condition(
    field: &str,
    w: ResponseConditionWire,
    budget: &mut Budget,
) -> Result<ResponseCondition, InvalidObject> {
    budget.take(field)?;
    let mut all = Vec::new();
    if let Some(s) = w.status {
        let code = |n: Option<i64>, default: u16| -> Result<u16, InvalidObject> {
            match n {
                None => Ok(default),
                Some(n) => u16::try_from(n)
                    .ok()
                    .filter(|c| (100..600).contains(c))
                    .ok_or_else(|| bad(format!("{field}.status"), format!("{n} is not a status"))),
            }
        };
        let (min, max) = (code(s.min, 100)?, code(s.max, 599)?);
        if min > max {
            return Err(bad(format!("{field}.status"), "min is above max"));
        }
        all.push(ResponseCondition::Status { min, max });
    }
    let list = |name: &str, v: Vec<ResponseConditionWire>, budget: &mut Budget| {
        v.into_iter()
            .enumerate()
            .map(|(i, c)| response_condition(&format!("{field}.{name}[{i}]"), c, budget))
            .collect::<Result<Vec<_>, _>>()
    };
    if let Some(v) = w.all {
        all.push(ResponseCondition::All(list("all", v, budget)?));
    }
    if let Some(v) = w.any {
        all.push(ResponseCondition::Any(list("any", v, budget)?));
    }
    if let Some(n) = w.not {
        all.push(ResponseCondition::Not(Box::new(response_condition(
            &format!("{field}.not"),
            *n,
            budget,
        )?)));
    }
    match all.len() {
        0 => Err(bad(field, "a condition needs status, all, any or not")),
        1 => Ok(all.remove(0)),
        _ => Ok(ResponseCondition::All(all)),
    }
}

/// A Kubernetes quantity as thousandths: `1` is 1000, `100m` is 100.
fn milli_quantity(field: &str, v: &serde_json::Value) -> Result<u32, InvalidObject> {
    let fail = || bad(field, format!("{v} is not a weight like 1, 500m or 0.5"));
    let milli = match v {
        serde_json::Value::Number(n) => n.as_f64().map(|f| f * 1000.0),
        serde_json::Value::String(s) => match s.strip_suffix('m') {
            Some(m) => m.parse::<f64>().ok(),
            None => s.parse::<f64>().ok().map(|f| f * 1000.0),
        },
        _ => None,
    }
    .ok_or_else(fail)?;
    if !(0.0..=1_000_000_000.0).contains(&milli) {
        return Err(fail());
    }
    Ok(milli.round() as u32)
}

impl TryFrom<ServiceProfileWire> for ServiceProfile {
    type Error = InvalidObject;

    fn try_from(w: ServiceProfileWire) -> Result<Self, InvalidObject> {
        let key = w.metadata.key()?;
        let spec = w.spec;
        if spec.routes.len() > MAX_PROFILE_ROUTES {
            return Err(bad(
                "spec.routes",
                format!("{} routes, at most {MAX_PROFILE_ROUTES}", spec.routes.len()),
            ));
        }
        let routes = spec
            .routes
            .into_iter()
            .enumerate()
            .map(|(i, r)| {
                let f = format!("spec.routes[{i}]");
                if r.name.is_empty() || r.name.len() > 256 {
                    return Err(bad(format!("{f}.name"), "a route needs a name"));
                }
                let mut budget = Budget(MAX_CONDITION_NODES);
                let condition = request_condition(
                    &format!("{f}.condition"),
                    r.condition
                        .ok_or_else(|| InvalidObject::missing(format!("{f}.condition")))?,
                    &mut budget,
                )?;
                let response_classes = r
                    .response_classes
                    .into_iter()
                    .enumerate()
                    .map(|(j, c)| {
                        let cf = format!("{f}.responseClasses[{j}]");
                        Ok(ResponseClass {
                            condition: response_condition(
                                &format!("{cf}.condition"),
                                c.condition.ok_or_else(|| {
                                    InvalidObject::missing(format!("{cf}.condition"))
                                })?,
                                &mut budget,
                            )?,
                            is_failure: c.is_failure,
                        })
                    })
                    .collect::<Result<_, InvalidObject>>()?;
                Ok(ProfileRoute {
                    name: r.name,
                    condition,
                    response_classes,
                    is_retryable: r.is_retryable,
                    timeout: r
                        .timeout
                        .map(|t| parse_annotation_duration(&format!("{f}.timeout"), &t))
                        .transpose()?
                        .filter(|d| !d.is_zero()),
                })
            })
            .collect::<Result<_, InvalidObject>>()?;
        let retry_budget = spec
            .retry_budget
            .map(|b| {
                let ratio = b.retry_ratio.unwrap_or(0.2);
                if !(0.0..=1000.0).contains(&ratio) {
                    return Err(bad("spec.retryBudget.retryRatio", "must be in 0..=1000"));
                }
                let min = b.min_retries_per_second.unwrap_or(10);
                let min = u32::try_from(min).map_err(|_| {
                    bad(
                        "spec.retryBudget.minRetriesPerSecond",
                        "must not be negative",
                    )
                })?;
                let ttl = match b.ttl {
                    Some(t) => parse_annotation_duration("spec.retryBudget.ttl", &t)?,
                    None => Duration::from_secs(10),
                };
                if ttl < Duration::from_secs(1) || ttl > Duration::from_secs(60) {
                    return Err(bad("spec.retryBudget.ttl", "must be between 1s and 60s"));
                }
                Ok(RetryBudget {
                    retry_ratio: ratio as f32,
                    min_retries_per_second: min,
                    ttl,
                })
            })
            .transpose()?;
        if spec.dst_overrides.len() > MAX_DST_OVERRIDES {
            return Err(bad(
                "spec.dstOverrides",
                format!("at most {MAX_DST_OVERRIDES} overrides"),
            ));
        }
        let dst_overrides = spec
            .dst_overrides
            .into_iter()
            .enumerate()
            .map(|(i, d)| {
                let f = format!("spec.dstOverrides[{i}]");
                if d.authority.is_empty() || d.authority.len() > 253 + 6 {
                    return Err(bad(format!("{f}.authority"), "not an authority"));
                }
                let weight = match &d.weight {
                    Some(w) => milli_quantity(&format!("{f}.weight"), w)?,
                    None => 1000,
                };
                Ok(DstOverride {
                    authority: d.authority,
                    weight,
                })
            })
            .collect::<Result<_, InvalidObject>>()?;
        Ok(ServiceProfile {
            key,
            routes,
            retry_budget,
            dst_overrides,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn decode(spec: serde_json::Value) -> Result<ServiceProfile, InvalidObject> {
        let w: ServiceProfileWire = serde_json::from_value(json!({
            "metadata": {"name": "web.shop.svc.cluster.local", "namespace": "shop"},
            "spec": spec
        }))
        .unwrap();
        ServiceProfile::try_from(w)
    }

    #[test]
    fn a_profile_decodes_routes_budget_and_overrides() {
        let p = decode(json!({
            "routes": [{"name": "GET /api", "condition": {"method": "GET", "pathRegex": "/api/.*"},
                        "responseClasses": [{"condition": {"status": {"min": 500, "max": 599}}, "isFailure": true}],
                        "isRetryable": true, "timeout": "300ms"}],
            "retryBudget": {"retryRatio": 0.5, "minRetriesPerSecond": 3, "ttl": "5s"},
            "dstOverrides": [{"authority": "web.shop.svc.cluster.local:80", "weight": "900m"},
                             {"authority": "web-v2.shop.svc.cluster.local:80", "weight": 0.1}]
        }))
        .unwrap();
        let r = &p.routes[0];
        assert_eq!(
            r.condition,
            RequestCondition::All(vec![
                RequestCondition::Method("GET".into()),
                RequestCondition::PathRegex("/api/.*".into())
            ])
        );
        assert!(r.is_retryable);
        assert_eq!(r.timeout, Some(Duration::from_millis(300)));
        assert_eq!(
            r.response_classes[0].condition,
            ResponseCondition::Status { min: 500, max: 599 }
        );
        assert_eq!(p.retry_budget.as_ref().unwrap().min_retries_per_second, 3);
        assert_eq!(
            p.dst_overrides.iter().map(|d| d.weight).collect::<Vec<_>>(),
            [900, 100]
        );
    }

    #[test]
    fn faults_are_named_and_nesting_is_bounded() {
        let cases = [
            (
                json!({"routes": [{"name": "x", "condition": {"pathRegex": "(["}}]}),
                "spec.routes[0].condition.pathRegex",
            ),
            (
                json!({"routes": [{"name": "x"}]}),
                "spec.routes[0].condition",
            ),
            (
                json!({"routes": [{"name": "x", "condition": {}}]}),
                "spec.routes[0].condition",
            ),
            (
                json!({"retryBudget": {"ttl": "2h"}}),
                "spec.retryBudget.ttl",
            ),
            (
                json!({"dstOverrides": [{"authority": "a:80", "weight": "lots"}]}),
                "spec.dstOverrides[0].weight",
            ),
        ];
        for (spec, field) in cases {
            assert_eq!(decode(spec.clone()).unwrap_err().field, field, "{spec}");
        }
        let mut deep = json!({"method": "GET"});
        for _ in 0..40 {
            deep = json!({"not": deep});
        }
        let err = decode(json!({"routes": [{"name": "deep", "condition": deep}]})).unwrap_err();
        assert!(err.reason.contains("conditions"), "{err}");
    }
}
