//! Linkerd's Tap API (`io.linkerd.proxy.tap.Tap/Observe`, crate feature
//! `tap`): live requests of this proxy, for the dashboard and `ballast tap`.
//!
//! - [`matcher`]: the `ObserveRequest` match tree (source and destination
//!   address or port range, destination labels, HTTP scheme, method,
//!   authority and path), at most 16 deep and 256 nodes.
//! - [`registry`]: the open taps on the request path — one atomic load per
//!   request while none is open; a matching request emits `RequestInit`,
//!   `ResponseInit` and `ResponseEnd` to each tap's bounded queue.
//! - [`bucket`]: each tap's event rate (token bucket).
//! - [`event`]: the events' parts, each bounded in size.
//! - [`server`]: the listener's connections (mutual TLS for
//!   `--tap-client-identity` when the proxy has an identity).
//!
//! Requests are tapped where they are sent to an endpoint (as Linkerd taps
//! at its endpoint stacks): the destination is the endpoint (outbound) or
//! this pod's address (inbound), with its discovery labels; answers the
//! proxy makes itself (failfast, refused by policy) are not tapped.
//!
//! Destination labels in events and `destination_label` matches:
//! `namespace`, `service`, `pod`, `deployment`, `statefulset`, `daemonset`,
//! `replicaset`, `k8s_job`, `serviceaccount`, `pod_template_hash` (those
//! known), and `tls` = `true` with `server_id`, or why not. Source labels:
//! `tls` = `true` with `client_id` (inbound mesh TLS), or why not
//! (`loopback` outbound, `no_tls_from_remote`, `disabled`).
//!
//! Bounds, each a flag of `ballast proxy`: `--tap-max-taps` (8, then
//! `RESOURCE_EXHAUSTED`), `--tap-max-requests-per-tap` (a tap's `limit` is
//! lowered to it; 10,000), `--tap-max-events-per-second` (per tap, 1,000),
//! `--tap-queue-capacity` (events per tap, 1,024), `--tap-max-event-bytes`
//! (2 KiB), `--tap-max-connections` (16). Memory held by taps is at most
//! about taps x queue x (event bytes + ~1 KiB of labels).

#[cfg(feature = "tap")]
pub mod bucket;
#[cfg(feature = "tap")]
pub mod event;
#[cfg(feature = "tap")]
pub mod matcher;
#[cfg(feature = "tap")]
pub mod registry;
#[cfg(feature = "tap")]
pub mod server;

#[cfg(feature = "tap")]
pub use registry::{request, ConnTap, RequestTap, ResponseTap, TapMetrics, Tapping, Taps};
#[cfg(feature = "tap")]
pub use server::TapServing;

/// The tap listener and the metrics its taps count in.
#[derive(Debug)]
pub struct TapListener {
    pub listener: tokio::net::TcpListener,
    pub metrics: TapMetrics,
}

#[cfg(not(feature = "tap"))]
pub use off::{request, ConnTap, RequestTap, ResponseTap, TapMetrics, Tapping, Taps};

/// Without the `tap` feature: the same names, nothing tapped, no cost.
#[cfg(not(feature = "tap"))]
mod off {
    use crate::{
        config::TapConfig,
        discovery::Endpoint,
        metrics::{Direction, DstLabels, TlsLabels},
    };
    use bytes::Bytes;
    use http::Request;
    use http_body::Frame;
    use std::net::SocketAddr;

    #[derive(Clone, Debug, Default)]
    pub struct TapMetrics;

    impl TapMetrics {
        pub fn register(&self, _: &mut prometheus_client::registry::Registry) {}
    }

    #[derive(Clone, Debug, Default)]
    pub struct Taps;

    impl Taps {
        pub fn new(_: &TapConfig, _: TapMetrics) -> Self {
            Self
        }

        pub fn disabled() -> Self {
            Self
        }

        pub fn enabled(&self) -> bool {
            false
        }

        pub fn connection(
            &self,
            _: Option<SocketAddr>,
            _: Direction,
            _: TlsLabels,
        ) -> Option<ConnTap> {
            None
        }
    }

    #[derive(Clone, Debug)]
    pub struct ConnTap(());

    impl ConnTap {
        pub fn tapping(&self) -> Option<Tapping> {
            None
        }
    }

    #[derive(Clone, Debug)]
    pub struct Tapping(());

    #[derive(Debug)]
    pub struct RequestTap(());

    impl RequestTap {
        // The signature the feature's type has.
        #[allow(clippy::boxed_local)]
        pub fn response(self: Box<Self>, _: &http::response::Parts) -> Box<ResponseTap> {
            Box::new(ResponseTap(()))
        }
    }

    #[derive(Debug)]
    pub struct ResponseTap(());

    impl ResponseTap {
        pub fn frame(&mut self, _: &Option<Result<Frame<Bytes>, hyper::Error>>) {}
    }

    #[inline]
    pub fn request<B>(
        _: &Request<B>,
        _: &Endpoint,
        _: &DstLabels,
        _: bool,
    ) -> Option<Box<RequestTap>> {
        None
    }
}
