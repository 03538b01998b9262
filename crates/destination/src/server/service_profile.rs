//! A ServiceProfile's routes, retry budget and overrides, as `GetProfile`
//! carries them (Linkerd 2.9's shape).

use crate::resource::{RequestCondition, ResponseCondition, RetryBudget as Budget, ServiceProfile};
use linkerd2_proxy_api::{
    destination::{
        request_match, response_match, HttpStatusRange, PathMatch, RequestMatch, ResponseClass,
        ResponseMatch, RetryBudget, Route, WeightedDst,
    },
    http_types::HttpMethod,
};

fn duration(d: std::time::Duration) -> Option<prost_types::Duration> {
    prost_types::Duration::try_from(d).ok()
}

fn request_match(c: &RequestCondition) -> RequestMatch {
    use request_match::{Match, Seq};
    let seq = |v: &[RequestCondition]| Seq {
        matches: v.iter().map(request_match).collect(),
    };
    RequestMatch {
        r#match: Some(match c {
            RequestCondition::All(v) => Match::All(seq(v)),
            RequestCondition::Any(v) => Match::Any(seq(v)),
            RequestCondition::Not(c) => Match::Not(Box::new(request_match(c))),
            RequestCondition::PathRegex(r) => Match::Path(PathMatch { regex: r.clone() }),
            RequestCondition::Method(m) => Match::Method(HttpMethod::from(
                // The index admits only ASCII letters, which always parse.
                http::Method::from_bytes(m.as_bytes()).unwrap_or(http::Method::GET),
            )),
        }),
    }
}

fn response_match(c: &ResponseCondition) -> ResponseMatch {
    use response_match::{Match, Seq};
    let seq = |v: &[ResponseCondition]| Seq {
        matches: v.iter().map(response_match).collect(),
    };
    ResponseMatch {
        r#match: Some(match c {
            ResponseCondition::All(v) => Match::All(seq(v)),
            ResponseCondition::Any(v) => Match::Any(seq(v)),
            ResponseCondition::Not(c) => Match::Not(Box::new(response_match(c))),
            ResponseCondition::Status { min, max } => Match::Status(HttpStatusRange {
                min: u32::from(*min),
                max: u32::from(*max),
            }),
        }),
    }
}

pub fn routes(p: &ServiceProfile) -> Vec<Route> {
    p.routes
        .iter()
        .map(|r| Route {
            condition: Some(request_match(&r.condition)),
            response_classes: r
                .response_classes
                .iter()
                .map(|c| ResponseClass {
                    condition: Some(response_match(&c.condition)),
                    is_failure: c.is_failure,
                })
                .collect(),
            metrics_labels: [("route".to_string(), r.name.clone())].into(),
            is_retryable: r.is_retryable,
            timeout: r.timeout.and_then(duration),
        })
        .collect()
}

pub fn retry_budget(b: &Budget) -> RetryBudget {
    RetryBudget {
        retry_ratio: b.retry_ratio,
        min_retries_per_second: b.min_retries_per_second,
        ttl: duration(b.ttl),
    }
}

pub fn dst_overrides(p: &ServiceProfile) -> Vec<WeightedDst> {
    p.dst_overrides
        .iter()
        .map(|d| WeightedDst {
            authority: d.authority.clone(),
            weight: d.weight,
            backend_ref: None,
        })
        .collect()
}
