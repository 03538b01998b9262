//! Discovery's metrics, owned here and registered by [`crate::metrics::Metrics`].

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StreamLabels {
    pub rpc: &'static str,
}

/// Discovery's metrics: open resolutions, endpoints dropped at the bound, staleness, and the controller connection and its streams.
#[derive(Debug, Default)]
pub struct DiscoveryMetrics {
    /// Open resolutions (one per target in use or recently used).
    pub resolutions: Gauge,
    /// Endpoints dropped because a target exceeded its bound.
    pub endpoints_dropped_total: Counter,
    /// Age of the oldest endpoint data in use that the controller has not
    /// confirmed (0 while it is connected).
    pub discovery_stale_seconds: Gauge,
    /// 1 while the control-plane connection is up, else 0.
    pub control_connected: Gauge,
    /// TCP connects attempted to the controller.
    pub control_connect_attempts_total: Counter,
    /// Open streams to the controller, by RPC.
    pub control_streams: Family<StreamLabels, Gauge>,
    /// Streams to the controller that ended with an error, by RPC.
    pub control_stream_errors_total: Family<StreamLabels, Counter>,
    /// Messages received from the controller, by RPC.
    pub control_messages_total: Family<StreamLabels, Counter>,
    /// Messages from the controller refused for exceeding
    /// `--control-max-message-bytes`, by RPC.
    pub control_messages_too_large_total: Family<StreamLabels, Counter>,
    /// The snapshot file (`--snapshot-path`).
    pub snapshot: super::snapshot::SnapshotMetrics,
}

impl DiscoveryMetrics {
    /// Registers the families under the proxy's registry (Linkerd's names).
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "discovery_resolutions",
            "Open resolutions (targets in use or recently used)",
            self.resolutions.clone(),
        );
        r.register(
            "discovery_endpoints_dropped",
            "Endpoints dropped because a target exceeded --max-endpoints-per-target",
            self.endpoints_dropped_total.clone(),
        );
        r.register(
            "discovery_stale_seconds",
            "Age of the oldest endpoint data in use that the destination controller has not confirmed (0 while it is connected); kept at most --stale-endpoints-grace",
            self.discovery_stale_seconds.clone(),
        );
        r.register(
            "control_connected",
            "1 while the connection to the destination controller is up",
            self.control_connected.clone(),
        );
        r.register(
            "control_connect_attempts",
            "TCP connects attempted to the destination controller",
            self.control_connect_attempts_total.clone(),
        );
        r.register(
            "control_streams",
            "Open streams to the destination controller",
            self.control_streams.clone(),
        );
        r.register(
            "control_stream_errors",
            "Streams to the destination controller that failed",
            self.control_stream_errors_total.clone(),
        );
        r.register(
            "control_messages",
            "Messages received from the destination controller",
            self.control_messages_total.clone(),
        );
        r.register(
            "control_messages_too_large",
            "Messages from the destination controller refused for exceeding --control-max-message-bytes",
            self.control_messages_too_large_total.clone(),
        );
        self.snapshot.register(r);
    }
}
