//! AdmissionReview v1 in and out (pure): what a review asks, and the
//! review that answers it.

use crate::patch::{self, Op};
use base64::Engine;
use serde_json::{json, Value};

pub const API_VERSION: &str = "admission.k8s.io/v1";
pub const KIND: &str = "AdmissionReview";

/// What the API server asks about a pod.
#[derive(Clone, Debug)]
pub struct PodReview {
    pub uid: String,
    /// `request.namespace`, else the pod's own `metadata.namespace`.
    pub namespace: Option<String>,
    /// `CREATE`, `UPDATE`...
    pub operation: String,
    pub pod: Value,
}

/// A review that cannot be answered at all: no uid to answer to.
#[derive(Debug, thiserror::Error)]
pub enum Malformed {
    #[error("the body is not JSON: {0}")]
    NotJson(String),
    #[error(
        "not an admission.k8s.io/v1 AdmissionReview (apiVersion {api_version:?}, kind {kind:?})"
    )]
    NotAdmissionReview { api_version: String, kind: String },
    #[error("the AdmissionReview has no request.uid")]
    NoUid,
}

/// A review with a uid whose request is not a pod to decide on.
#[derive(Debug, thiserror::Error)]
#[error("{reason}")]
pub struct Unusable {
    pub uid: String,
    pub reason: String,
}

#[derive(Debug)]
pub enum Parsed {
    Pod(PodReview),
    Unusable(Unusable),
}

fn text(v: &Value) -> String {
    v.as_str()
        .map(str::to_string)
        .unwrap_or_else(|| v.to_string())
}

/// Reads an AdmissionReview's request.
pub fn parse(body: &[u8]) -> Result<Parsed, Malformed> {
    let review: Value =
        serde_json::from_slice(body).map_err(|e| Malformed::NotJson(e.to_string()))?;
    if review["apiVersion"] != API_VERSION || review["kind"] != KIND {
        return Err(Malformed::NotAdmissionReview {
            api_version: text(&review["apiVersion"]),
            kind: text(&review["kind"]),
        });
    }
    let request = &review["request"];
    let uid = match request["uid"].as_str() {
        Some(uid) if !uid.is_empty() => uid.to_string(),
        _ => return Err(Malformed::NoUid),
    };
    let unusable = |reason: String| {
        Ok(Parsed::Unusable(Unusable {
            uid: uid.clone(),
            reason,
        }))
    };
    let kind = &request["kind"];
    if kind["group"] != "" || kind["version"] != "v1" || kind["kind"] != "Pod" {
        return unusable(format!(
            "request.kind is {}, not a v1 Pod: the webhook configuration sends only pods here",
            kind
        ));
    }
    let pod = &request["object"];
    if !pod.is_object() {
        return unusable("request.object is not an object".into());
    }
    if !(pod["kind"].is_null() || pod["kind"] == "Pod") {
        return unusable(format!(
            "request.object is a {}, not a Pod",
            text(&pod["kind"])
        ));
    }
    let namespace = request["namespace"]
        .as_str()
        .or_else(|| pod["metadata"]["namespace"].as_str())
        .filter(|ns| !ns.is_empty())
        .map(str::to_string);
    Ok(Parsed::Pod(PodReview {
        uid,
        namespace,
        operation: request["operation"].as_str().unwrap_or("").to_string(),
        pod: pod.clone(),
    }))
}

/// The answer to a review.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// Admit, changed by these operations (none: unchanged).
    Allow {
        patch: Vec<Op>,
        warning: Option<String>,
    },
    /// Refuse, with this message (code 500: the injector failed).
    Deny { message: String },
}

/// The AdmissionReview that answers `uid` with `verdict`.
pub fn response(uid: &str, verdict: &Verdict) -> Value {
    let mut response = json!({"uid": uid});
    match verdict {
        Verdict::Allow { patch, warning } => {
            response["allowed"] = json!(true);
            if !patch.is_empty() {
                let text = patch::to_json(patch).to_string();
                response["patchType"] = json!("JSONPatch");
                response["patch"] = json!(base64::engine::general_purpose::STANDARD.encode(text));
            }
            if let Some(w) = warning {
                response["warnings"] = json!([w]);
            }
        }
        Verdict::Deny { message } => {
            response["allowed"] = json!(false);
            response["status"] = json!({"code": 500, "message": message});
        }
    }
    json!({"apiVersion": API_VERSION, "kind": KIND, "response": response})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn review(request: Value) -> Vec<u8> {
        json!({"apiVersion": API_VERSION, "kind": KIND, "request": request})
            .to_string()
            .into_bytes()
    }

    fn pod_request() -> Value {
        json!({
            "uid": "u-1",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "namespace": "shop",
            "operation": "CREATE",
            "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "web-"}, "spec": {"containers": []}},
        })
    }

    #[test]
    fn a_pod_review_is_read() {
        let Parsed::Pod(r) = parse(&review(pod_request())).unwrap() else {
            panic!("not a pod review")
        };
        assert_eq!(r.uid, "u-1");
        assert_eq!(r.namespace.as_deref(), Some("shop"));
        assert_eq!(r.operation, "CREATE");
        assert_eq!(r.pod["metadata"]["generateName"], "web-");
    }

    #[test]
    fn malformed_reviews_are_named() {
        assert!(matches!(parse(b"{not json"), Err(Malformed::NotJson(_))));
        assert!(matches!(
            parse(b"[]"),
            Err(Malformed::NotAdmissionReview { .. })
        ));
        let v1beta1 = json!({"apiVersion": "admission.k8s.io/v1beta1", "kind": KIND, "request": pod_request()});
        assert!(matches!(
            parse(v1beta1.to_string().as_bytes()),
            Err(Malformed::NotAdmissionReview { .. })
        ));
        let mut no_uid = pod_request();
        no_uid["uid"] = json!(7);
        assert!(matches!(parse(&review(no_uid)), Err(Malformed::NoUid)));
        assert!(matches!(
            parse(
                &json!({"apiVersion": API_VERSION, "kind": KIND})
                    .to_string()
                    .into_bytes()
            ),
            Err(Malformed::NoUid)
        ));

        let mut service = pod_request();
        service["kind"]["kind"] = json!("Service");
        let Parsed::Unusable(u) = parse(&review(service)).unwrap() else {
            panic!("a Service is not a pod")
        };
        assert_eq!(u.uid, "u-1");
        let mut no_object = pod_request();
        no_object["object"] = json!("x");
        assert!(matches!(
            parse(&review(no_object)).unwrap(),
            Parsed::Unusable(_)
        ));
    }

    #[test]
    fn responses_echo_the_uid_and_carry_a_base64_json_patch() {
        let ops = vec![Op::Add {
            path: "/metadata/labels".into(),
            value: json!({"a": "b"}),
        }];
        let r = response(
            "u-9",
            &Verdict::Allow {
                patch: ops.clone(),
                warning: None,
            },
        );
        assert_eq!(r["apiVersion"], API_VERSION);
        assert_eq!(r["kind"], KIND);
        assert_eq!(r["response"]["uid"], "u-9");
        assert_eq!(r["response"]["allowed"], true);
        assert_eq!(r["response"]["patchType"], "JSONPatch");
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(r["response"]["patch"].as_str().unwrap())
            .unwrap();
        let json: Value = serde_json::from_slice(&decoded).unwrap();
        assert_eq!(json, patch::to_json(&ops));

        let unchanged = response(
            "u",
            &Verdict::Allow {
                patch: vec![],
                warning: Some("w".into()),
            },
        );
        assert!(unchanged["response"].get("patch").is_none());
        assert_eq!(unchanged["response"]["warnings"][0], "w");
        let denied = response(
            "u",
            &Verdict::Deny {
                message: "no".into(),
            },
        );
        assert_eq!(denied["response"]["allowed"], false);
        assert_eq!(denied["response"]["status"]["message"], "no");
    }
}
