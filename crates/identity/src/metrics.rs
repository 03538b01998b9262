//! The identity controller's metrics.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use std::sync::atomic::AtomicU64;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// `ok`, or why the request was refused.
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CertLabels {
    /// `issuer`, or `anchor`.
    pub cert: &'static str,
    pub subject: String,
}

#[derive(Clone, Debug, Default)]
pub struct Metrics {
    pub certify_total: Family<ResultLabels, Counter>,
    pub expiration: Family<CertLabels, Gauge<i64, std::sync::atomic::AtomicI64>>,
    pub issuer_loaded: Gauge<i64, std::sync::atomic::AtomicI64>,
    pub issuer_reloads: Family<ResultLabels, Counter>,
    pub certify_in_flight: Gauge<i64, std::sync::atomic::AtomicI64>,
    pub tracked_clients: Gauge<u64, AtomicU64>,
}

impl Metrics {
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "identity_certify",
            "Certify requests by result (ok, or the reason refused)",
            self.certify_total.clone(),
        );
        r.register(
            "identity_cert_expiration_timestamp_seconds",
            "When the issuer certificate and each trust anchor expire (Unix seconds)",
            self.expiration.clone(),
        );
        r.register(
            "identity_issuer_valid",
            "1 while the issuer files load and verify, else 0",
            self.issuer_loaded.clone(),
        );
        r.register(
            "identity_issuer_reloads",
            "Issuer file changes read, by result",
            self.issuer_reloads.clone(),
        );
        r.register(
            "identity_certify_in_flight",
            "Certify requests being checked and signed (bounded by --max-concurrent-certify)",
            self.certify_in_flight.clone(),
        );
        r.register(
            "identity_tracked_clients",
            "Client addresses tracked by the per-client rate limit (bounded by --max-tracked-clients)",
            self.tracked_clients.clone(),
        );
    }
}
