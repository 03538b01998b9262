//! One review's answer: parse it, read the pod's namespace, inject with
//! `ballast_inject` (the code `ballast inject` runs), and answer with the
//! JSON Patch from the pod as sent to the pod as injected. Whatever fails
//! once a uid is known is answered per the failure policy.

use crate::{
    namespaces::NamespaceCache,
    patch,
    review::{self, Parsed, Verdict},
};
use ballast_inject::{inject_pod, Config, Mode, Outcome};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};
use serde_json::Value;

/// What to answer when the injector cannot decide (the namespace cannot be
/// read, an annotation is invalid, the request is not a pod): `Ignore`
/// admits the pod unchanged with a warning, `Fail` refuses it. The same
/// word as the webhook configuration's failurePolicy, which covers the
/// injector not answering at all.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FailurePolicy {
    #[default]
    Ignore,
    Fail,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReviewLabels {
    /// `injected`, `skipped` (admitted unchanged), `error` (answered per the
    /// failure policy) or `malformed` (HTTP 400).
    pub result: &'static str,
}

#[derive(Clone, Debug, Default)]
pub struct ReviewMetrics {
    pub reviews: Family<ReviewLabels, Counter>,
}

impl ReviewMetrics {
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "injector_admission_reviews",
            "AdmissionReviews answered, by result: injected, skipped, error (per the failure policy), malformed (HTTP 400)",
            self.reviews.clone(),
        );
    }
    pub fn count(&self, result: &'static str) {
        self.reviews.get_or_create(&ReviewLabels { result }).inc();
    }
}

/// An HTTP answer: 200 with a review, or 400 with a message.
#[derive(Debug)]
pub enum Answer {
    Review(Value),
    BadRequest(String),
}

pub struct Decider {
    pub config: Config,
    pub namespaces: NamespaceCache,
    pub failure_policy: FailurePolicy,
    pub metrics: ReviewMetrics,
}

impl Decider {
    fn failed(&self, uid: &str, message: String) -> Answer {
        self.metrics.count("error");
        tracing::warn!(uid, "{message}");
        let verdict = match self.failure_policy {
            FailurePolicy::Ignore => Verdict::Allow {
                patch: vec![],
                warning: Some(format!("ballast injector: not injected: {message}")),
            },
            FailurePolicy::Fail => Verdict::Deny {
                message: format!("ballast injector: {message}"),
            },
        };
        Answer::Review(review::response(uid, &verdict))
    }

    pub async fn answer(&self, body: &[u8]) -> Answer {
        let review = match review::parse(body) {
            Ok(Parsed::Pod(r)) => r,
            Ok(Parsed::Unusable(u)) => return self.failed(&u.uid, u.reason),
            Err(e) => {
                self.metrics.count("malformed");
                tracing::info!("malformed review: {e}");
                return Answer::BadRequest(e.to_string());
            }
        };
        let unchanged = || {
            review::response(
                &review.uid,
                &Verdict::Allow {
                    patch: vec![],
                    warning: None,
                },
            )
        };
        if review.operation != "CREATE" {
            self.metrics.count("skipped");
            return Answer::Review(unchanged());
        }
        let annotations = match &review.namespace {
            Some(ns) => match self.namespaces.annotations(ns).await {
                Ok(a) => a,
                Err(e) => return self.failed(&review.uid, e.to_string()),
            },
            None => None,
        };
        let mut pod = review.pod.clone();
        match inject_pod(&mut pod, annotations.as_ref(), Mode::Webhook, &self.config) {
            Ok(Outcome::Injected) => {
                let ops = patch::diff(&review.pod, &pod);
                self.metrics.count("injected");
                tracing::info!(
                    uid = %review.uid,
                    namespace = review.namespace.as_deref().unwrap_or(""),
                    name = pod_name(&review.pod).unwrap_or(""),
                    "injected"
                );
                Answer::Review(review::response(
                    &review.uid,
                    &Verdict::Allow {
                        patch: ops,
                        warning: None,
                    },
                ))
            }
            Ok(outcome) => {
                self.metrics.count("skipped");
                tracing::debug!(uid = %review.uid, ?outcome, "not injected");
                Answer::Review(unchanged())
            }
            Err(e) => self.failed(&review.uid, e.to_string()),
        }
    }
}

fn pod_name(pod: &Value) -> Option<&str> {
    pod["metadata"]["name"]
        .as_str()
        .or_else(|| pod["metadata"]["generateName"].as_str())
}
