//! The Kubernetes source's metrics, registered under the controller's
//! `destination_` prefix: what it asked the API server, what came back,
//! how often watches restarted or kinds were relisted, and how fresh each
//! kind is.

use ballast_store::metrics::KindLabel;
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric},
    metrics::{
        counter::Counter,
        family::Family,
        gauge::{ConstGauge, Gauge},
        MetricType,
    },
    registry::Registry,
};
use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
};
use tokio::time::Instant;

/// A Kubernetes API request: its verb (`list`, `watch`, `get`, `other`) and
/// the resource it names (the URL's plural, e.g. `pods`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KubeRequestLabel {
    pub verb: String,
    pub kind: String,
}

/// A Kubernetes API response: the resource and the HTTP status code, or
/// `error` when no response came (connection refused, reset, timeout).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KubeResponseLabel {
    pub kind: String,
    pub code: String,
}

/// When each watched resource last showed the source was in step with the
/// API server (a watch event, a bookmark, a listed page); exported as
/// `destination_kube_last_event_age_seconds{kind}`, computed at scrape time.
/// A kind whose source started but never heard back counts from the start.
#[derive(Clone, Debug, Default)]
pub struct KubeFreshness(Arc<Mutex<BTreeMap<String, Instant>>>);

impl KubeFreshness {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Instant>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts the clock of a kind, unless it already runs.
    pub fn start(&self, kind: &str) {
        self.lock()
            .entry(kind.to_string())
            .or_insert_with(Instant::now);
    }

    /// Marks a kind as heard from now.
    pub fn touch(&self, kind: &str) {
        let now = Instant::now();
        let mut map = self.lock();
        match map.get_mut(kind) {
            Some(at) => *at = now,
            None => {
                map.insert(kind.to_string(), now);
            }
        }
    }

    /// Time since the kind was last heard from.
    pub fn age(&self, kind: &str) -> Option<std::time::Duration> {
        self.lock().get(kind).map(|at| at.elapsed())
    }
}

impl Collector for KubeFreshness {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let ages: Vec<(String, f64)> = self
            .lock()
            .iter()
            .map(|(kind, at)| (kind.clone(), at.elapsed().as_secs_f64()))
            .collect();
        if ages.is_empty() {
            return Ok(());
        }
        let mut metric = encoder.encode_descriptor(
            "kube_last_event_age_seconds",
            "Seconds since the last watch event, bookmark or listed page from the Kubernetes API, by resource",
            None,
            MetricType::Gauge,
        )?;
        for (kind, age) in ages {
            let label = KindLabel { kind };
            ConstGauge::new(age).encode(metric.encode_family(&label)?)?;
        }
        Ok(())
    }
}

/// Every metric of the Kubernetes source, cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct KubeMetrics {
    pub kube_requests_total: Family<KubeRequestLabel, Counter>,
    pub kube_responses_total: Family<KubeResponseLabel, Counter>,
    pub kube_watch_restarts_total: Family<KindLabel, Counter>,
    pub kube_relists_total: Family<KindLabel, Counter>,
    pub kube_invalid_objects: Family<KindLabel, Gauge>,
    pub kube_settling_objects: Family<KindLabel, Gauge>,
    pub kube_last_event: KubeFreshness,
}

impl KubeMetrics {
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("destination");
        r.register(
            "kube_requests",
            "Kubernetes API requests sent, by verb (list, watch, get, other) and resource",
            self.kube_requests_total.clone(),
        );
        r.register(
            "kube_responses",
            "Kubernetes API responses, by resource and HTTP status code (code=\"error\": no response)",
            self.kube_responses_total.clone(),
        );
        r.register(
            "kube_watch_restarts",
            "WATCH requests after the first, by resource (each resumes or restarts a watch)",
            self.kube_watch_restarts_total.clone(),
        );
        r.register(
            "kube_relists",
            "Full LISTs after the first, by resource (after 410 Gone or a lost watch state)",
            self.kube_relists_total.clone(),
        );
        r.register(
            "kube_invalid_objects",
            "Kubernetes objects skipped because the index cannot use them, by resource",
            self.kube_invalid_objects.clone(),
        );
        r.register(
            "kube_settling_objects",
            "Objects received but held before they are applied (Servers wait --kube-server-settle), by resource",
            self.kube_settling_objects.clone(),
        );
        r.register_collector(Box::new(self.kube_last_event.clone()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ballast_store::metrics::Metrics;

    /// Each family one name and one type (an empty family is not written,
    /// so each gets a sample).
    #[test]
    fn every_family_has_a_name_of_its_own() {
        let m = KubeMetrics::default();
        let kind = Metrics::kind("pods");
        m.kube_requests_total
            .get_or_create(&KubeRequestLabel {
                verb: "list".into(),
                kind: "pods".into(),
            })
            .inc();
        m.kube_responses_total
            .get_or_create(&KubeResponseLabel {
                kind: "pods".into(),
                code: "200".into(),
            })
            .inc();
        m.kube_watch_restarts_total.get_or_create(&kind).inc();
        m.kube_relists_total.get_or_create(&kind).inc();
        m.kube_invalid_objects.get_or_create(&kind).set(1);
        m.kube_settling_objects.get_or_create(&kind).set(1);
        m.kube_last_event.start("pods");
        let mut registry = Registry::default();
        m.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        let mut names: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        assert_eq!(names.len(), 7, "{text}");
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), 7, "a family name used twice:\n{text}");
        assert!(
            text.contains("destination_kube_last_event_age_seconds{kind=\"pods\"}"),
            "{text}"
        );
    }
}
