//! Discovery: what the destination controller says about a target, kept
//! current over long-lived `Get` and `GetProfile` streams.
//!
//! Linkerd's semantics hold: a lost stream removes no endpoints (the last
//! known set stays in use), the stream is opened again after a backoff, and
//! the first update on a new stream replaces the whole set (a Reset).
//! `InvalidArgument` and `Unimplemented` are final answers; every other
//! failure is retried.

mod control;
mod last_known;
pub mod metrics;
mod policy;
mod profile;
mod resolve;
mod server_policy;
pub mod snapshot;
mod stream;

pub use control::ControlPlane;
pub use last_known::LastKnown;
pub use policy::{forward_endpoint, ConvertPolicy, PolicyState, PolicyWatch};
pub use profile::{Profile, ProfileWatch};
pub use resolve::{Resolution, ResolveState};
pub use server_policy::{workload_json, PortAnswer, PortPolicyWatch};

use crate::cache::spawn_sweeper;
use std::{net::SocketAddr, sync::Arc};

/// One endpoint of a target, as the controller described it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub addr: SocketAddr,
    /// Relative weight (Linkerd's default is 10,000); never 0.
    pub weight: u32,
    pub namespace: Arc<str>,
    pub service: Arc<str>,
    pub pod: Arc<str>,
    /// The pod's owner, service account and template hash, as metric labels.
    pub workload: crate::metrics::DstWorkload,
    /// The endpoint's mesh identity: connections to it are mutual TLS.
    pub identity: Option<ballast_meshtls::IdentityName>,
    /// The controller's hints: the endpoint's proxy takes HTTP/2 (HTTP/1
    /// may travel upgraded), and its inbound port for opaque transport.
    pub h2_hint: bool,
    pub opaque_port: Option<u16>,
}

impl Endpoint {
    /// An endpoint known only by its address.
    pub fn bare(addr: SocketAddr) -> Self {
        let empty = crate::metrics::empty_label();
        Self {
            addr,
            weight: 1,
            namespace: empty.clone(),
            service: empty.clone(),
            pod: empty,
            workload: crate::metrics::DstWorkload::none(),
            identity: None,
            h2_hint: false,
            opaque_port: None,
        }
    }

    /// Metric labels for traffic to this endpoint of the target `authority`.
    pub fn dst_labels(
        &self,
        direction: crate::metrics::Direction,
        authority: Arc<str>,
    ) -> crate::metrics::DstLabels {
        crate::metrics::DstLabels {
            direction,
            authority,
            dst_namespace: self.namespace.clone(),
            dst_service: self.service.clone(),
            dst_pod: self.pod.clone(),
            workload: self.workload.clone(),
        }
    }
}

/// What is known of a target's endpoints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SetState {
    /// Nothing heard yet.
    Pending,
    /// The controller's set (possibly empty), or the last one it sent.
    Known,
    /// The controller says there is no such target (yet).
    DoesNotExist,
    /// The controller refused the name for good.
    Invalid(Arc<str>),
}

/// A snapshot of a target's endpoints, sorted by address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointSet {
    pub state: SetState,
    pub endpoints: Vec<Endpoint>,
}

impl EndpointSet {
    pub fn pending() -> Self {
        Self {
            state: SetState::Pending,
            endpoints: Vec::new(),
        }
    }
}

/// Opens resolutions and profile watches against one controller.
#[derive(Clone, Debug)]
pub struct Discovery {
    control: ControlPlane,
    max_endpoints: usize,
    last_known: Arc<LastKnown>,
}

impl Discovery {
    /// `max_targets` and `stale_grace` bound what is remembered of targets
    /// no longer in use.
    pub fn new(
        control: ControlPlane,
        max_endpoints: usize,
        max_targets: usize,
        stale_grace: std::time::Duration,
    ) -> Self {
        let last_known = Arc::new(LastKnown::new(max_targets, stale_grace));
        let (connected, metrics) = (control.clone(), control.metrics.clone());
        spawn_sweeper(
            Arc::downgrade(&last_known),
            std::time::Duration::from_secs(1),
            move |memory: &LastKnown| {
                let oldest = memory.sweep(connected.is_connected());
                metrics
                    .discovery
                    .discovery_stale_seconds
                    .set(i64::try_from(oldest.as_secs()).unwrap_or(i64::MAX));
            },
        );
        Self {
            control,
            max_endpoints,
            last_known,
        }
    }

    /// Starts resolving `authority` (`name.ns.svc.cluster.local:port`); the
    /// stream lives as long as the returned handle. It starts from the
    /// target's last-known endpoints, if any.
    pub fn resolve(&self, authority: &Arc<str>) -> Resolution {
        Resolution::spawn(
            self.control.clone(),
            authority,
            self.max_endpoints,
            self.last_known.clone(),
        )
    }

    /// Starts watching the profile of a destination address.
    pub fn profile(&self, addr: SocketAddr) -> ProfileWatch {
        ProfileWatch::spawn(self.control.clone(), addr)
    }

    /// Starts watching the outbound policy of the target `spec` names.
    pub fn outbound_policy<T: Send + Sync + 'static, E: std::fmt::Display + 'static>(
        &self,
        spec: linkerd2_proxy_api::outbound::TrafficSpec,
        convert: ConvertPolicy<T, E>,
    ) -> PolicyWatch<T> {
        PolicyWatch::spawn(self.control.clone(), spec, convert)
    }

    pub fn profile_timeout(&self) -> std::time::Duration {
        self.control.config.profile_timeout
    }

    /// Starts watching the inbound policy of `port` of `workload` (see
    /// [`workload_json`]), each answer turned into a `T` by `translate`.
    pub fn watch_port<T: Send + Sync + 'static>(
        &self,
        workload: Arc<str>,
        port: u16,
        translate: Arc<dyn Fn(linkerd2_proxy_api::inbound::Server) -> T + Send + Sync>,
    ) -> PortPolicyWatch<T> {
        PortPolicyWatch::spawn(self.control.clone(), workload, port, translate)
    }
}

/// Aborts a task when the last handle goes.
#[derive(Debug)]
pub(crate) struct AbortOnDrop(pub tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
