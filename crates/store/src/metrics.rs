//! The controller's metrics: what it holds, who is watching, what went wrong.

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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MethodLabel {
    pub method: String,
}

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

/// Every metric the destination controller exports, cheap to clone.
#[derive(Clone, Default)]
pub struct Metrics {
    pub index_objects: Family<KindLabel, Gauge>,
    pub index_endpoints: Gauge,
    pub ip_conflicts: Gauge,
    pub ip_conflicts_seen_total: Counter,
    pub subscriptions: Family<MethodLabel, Gauge>,
    pub streams: Family<MethodLabel, Gauge>,
    pub streams_opened_total: Family<MethodLabel, Counter>,
    pub stream_overflows_total: Family<MethodLabel, Counter>,
    pub streams_refused_total: Family<MethodLabel, Counter>,
    pub updates_sent_total: Family<MethodLabel, Counter>,
    pub stream_resyncs_total: Family<MethodLabel, Counter>,
    pub subscription_history_bytes: Gauge,
    pub reload_errors_total: Counter,
    pub manifest_files_invalid: Gauge,
    pub reloads_total: Counter,
    pub manifest_rescans_total: Counter,
    pub kube_requests_total: Family<KubeRequestLabel, Counter>,
    pub kube_responses_total: Family<KubeResponseLabel, Counter>,
    pub kube_watch_restarts_total: Family<KindLabel, Counter>,
    pub kube_relists_total: Family<KindLabel, Counter>,
    pub kube_invalid_objects: Family<KindLabel, Gauge>,
    pub kube_last_event: KubeFreshness,
}

impl Metrics {
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("destination");
        r.register(
            "index_objects",
            "Objects held by the index, by kind",
            self.index_objects.clone(),
        );
        r.register(
            "index_endpoints",
            "Endpoint addresses listed across all EndpointSlices in the index",
            self.index_endpoints.clone(),
        );
        r.register(
            "ip_conflicts",
            "IP:port keys currently claimed by more than one live pod",
            self.ip_conflicts.clone(),
        );
        // Not `ip_conflicts` (the gauge's family): one name, one type.
        r.register(
            "ip_conflicts_seen",
            "Address conflicts seen: pods claiming one IP or host port, Services claiming one clusterIP (each counted once, when it appears)",
            self.ip_conflicts_seen_total.clone(),
        );
        r.register(
            "subscriptions",
            "Live shared subscriptions, by method",
            self.subscriptions.clone(),
        );
        r.register(
            "streams",
            "Open gRPC streams, by method",
            self.streams.clone(),
        );
        r.register(
            "streams_opened",
            "gRPC streams accepted, by method",
            self.streams_opened_total.clone(),
        );
        r.register(
            "stream_overflows",
            "Streams closed because their client did not read (queue full)",
            self.stream_overflows_total.clone(),
        );
        r.register(
            "streams_refused",
            "Streams refused because the concurrent stream limit was reached",
            self.streams_refused_total.clone(),
        );
        r.register(
            "updates_sent",
            "Messages queued to clients, by method",
            self.updates_sent_total.clone(),
        );
        r.register(
            "stream_resyncs",
            "Streams that fell behind their subscription's history of changes and were sent a reset and the whole answer",
            self.stream_resyncs_total.clone(),
        );
        r.register(
            "subscription_history_bytes",
            "Encoded changes kept for streams that fall behind, across subscriptions (bounded per subscription)",
            self.subscription_history_bytes.clone(),
        );
        r.register(
            "reload_errors",
            "Manifest file reads that failed to parse or validate",
            self.reload_errors_total.clone(),
        );
        r.register(
            "manifest_files_invalid",
            "Manifest files whose last read failed (their last good state is served)",
            self.manifest_files_invalid.clone(),
        );
        r.register(
            "reloads",
            "Manifest files read after a change",
            self.reloads_total.clone(),
        );
        r.register(
            "manifest_rescans",
            "Rescans of the manifests directory (targeted or full) the source ran",
            self.manifest_rescans_total.clone(),
        );
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
        r.register_collector(Box::new(self.kube_last_event.clone()));
    }

    pub fn kind(kind: &str) -> KindLabel {
        KindLabel {
            kind: kind.to_string(),
        }
    }

    pub fn method(method: &str) -> MethodLabel {
        MethodLabel {
            method: method.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// OpenMetrics gives each family one name and one type: a gauge and a
    /// counter registered under one name make a page scrapers refuse. Every
    /// family is given a sample, since an empty one is not written.
    #[test]
    fn every_family_has_a_name_of_its_own() {
        let m = Metrics::default();
        let method = Metrics::method("Get");
        let kind = Metrics::kind("Pod");
        m.index_objects.get_or_create(&kind).set(1);
        m.index_endpoints.set(1);
        m.ip_conflicts.set(1);
        m.ip_conflicts_seen_total.inc();
        for gauges in [&m.subscriptions, &m.streams] {
            gauges.get_or_create(&method).set(1);
        }
        for counters in [
            &m.streams_opened_total,
            &m.stream_overflows_total,
            &m.streams_refused_total,
            &m.updates_sent_total,
            &m.stream_resyncs_total,
        ] {
            counters.get_or_create(&method).inc();
        }
        m.subscription_history_bytes.set(1);
        m.reload_errors_total.inc();
        m.manifest_files_invalid.set(1);
        m.reloads_total.inc();
        m.manifest_rescans_total.inc();
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
        // One family per field of Metrics, each written.
        assert_eq!(names.len(), 22, "{text}");
        names.sort_unstable();
        let mut unique = names.clone();
        unique.dedup();
        assert_eq!(names, unique, "a family name used twice:\n{text}");
    }
}
