//! The manifests source's metrics, registered under the controller's
//! `destination_` prefix: reads, failed reads, broken files, rescans.

use prometheus_client::{
    metrics::{counter::Counter, gauge::Gauge},
    registry::Registry,
};

/// Every metric of the manifests source, cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct ManifestsMetrics {
    pub reload_errors_total: Counter,
    pub manifest_files_invalid: Gauge,
    pub reloads_total: Counter,
    pub manifest_rescans_total: Counter,
}

impl ManifestsMetrics {
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("destination");
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
    }
}
