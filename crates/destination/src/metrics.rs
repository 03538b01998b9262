//! The controller's metrics: what it holds, who is watching, what went wrong.

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

/// Every metric the destination controller exports, cheap to clone.
#[derive(Clone, Default)]
pub struct Metrics {
    pub index_objects: Family<KindLabel, Gauge>,
    pub index_endpoints: Gauge,
    pub ip_conflicts: Gauge,
    pub ip_conflicts_total: Counter,
    pub subscriptions: Family<MethodLabel, Gauge>,
    pub streams: Family<MethodLabel, Gauge>,
    pub streams_total: Family<MethodLabel, Counter>,
    pub stream_overflows_total: Family<MethodLabel, Counter>,
    pub streams_refused_total: Family<MethodLabel, Counter>,
    pub updates_sent_total: Family<MethodLabel, Counter>,
    pub reload_errors_total: Counter,
    pub manifest_files_invalid: Gauge,
    pub reloads_total: Counter,
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
        r.register(
            "ip_conflicts",
            "IP:port conflicts seen (each counted once, when it appears)",
            self.ip_conflicts_total.clone(),
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
            "streams",
            "gRPC streams accepted, by method",
            self.streams_total.clone(),
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
    }

    pub fn method(method: &str) -> MethodLabel {
        MethodLabel {
            method: method.to_string(),
        }
    }
}
