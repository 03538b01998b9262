//! The HTTP server side's metrics, owned here and registered by
//! [`crate::metrics::Metrics`].

use prometheus_client::{
    metrics::{counter::Counter, gauge::Gauge},
    registry::Registry,
};

/// The HTTP server side's metrics: idle connections closed or parked, HTTP/2 connections calmed, HTTP/1 framing refused.
#[derive(Debug, Default)]
pub struct HttpServerMetrics {
    /// Client HTTP connections closed for being idle.
    pub http_idle_closed_total: Counter,
    /// Idle HTTP/1 client connections holding only their socket.
    pub http1_parked_connections: Gauge,
    /// Client HTTP/2 connections closed with GOAWAY ENHANCE_YOUR_CALM (too
    /// many streams reset by the proxy or by the client, and h2's other
    /// abuse limits).
    pub http2_calm_closed_total: Counter,
    /// Client HTTP/1 connections closed at a malformed chunked body
    /// (`http::framing`), their request answered 400.
    pub http1_framing_refused_total: Counter,
}

impl HttpServerMetrics {
    /// Registers the families under the proxy's registry (Linkerd's names).
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "http_idle_closed",
            "Client HTTP connections closed after --http-idle-timeout without a request",
            self.http_idle_closed_total.clone(),
        );
        r.register(
            "http1_parked_connections",
            "Idle HTTP/1 client connections that gave back their HTTP state after \
             --http1-park-after and hold only their socket",
            self.http1_parked_connections.clone(),
        );
        r.register(
            "http2_calm_closed",
            "Client HTTP/2 connections closed with GOAWAY ENHANCE_YOUR_CALM (e.g. past \
             --http2-max-local-error-resets or --http2-max-pending-accept-resets)",
            self.http2_calm_closed_total.clone(),
        );
        r.register(
            "http1_framing_refused",
            "Client HTTP/1 connections closed at a malformed chunk line or trailer, their \
             request answered 400 malformed_chunk (RFC 9112 section 7.1)",
            self.http1_framing_refused_total.clone(),
        );
    }
}
