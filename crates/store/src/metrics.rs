//! The controller's core metrics: what the index holds, who is watching,
//! what the streams sent. The sources own theirs.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MethodLabel {
    pub method: String,
}

/// The metrics of the store and of the servers reading it, cheap to
/// clone. Each source registers its own (`KubeMetrics`, `ManifestsMetrics`)
/// under the same `destination_` prefix.
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
        assert_eq!(names.len(), 12, "{text}");
        names.sort_unstable();
        let mut unique = names.clone();
        unique.dedup();
        assert_eq!(names, unique, "a family name used twice:\n{text}");
    }
}
