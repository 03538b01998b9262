//! What the index answers: pure values, compared to find what changed.

use crate::resource::ObjectKey;
use std::{collections::BTreeMap, net::SocketAddr};

/// The endpoints a `Get` on one target resolves to right now.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct EndpointSet {
    /// False when the target names a service the index does not know.
    pub exists: bool,
    /// Labels shared by every endpoint (`namespace`, `service`).
    pub labels: BTreeMap<String, String>,
    pub endpoints: BTreeMap<SocketAddr, Endpoint>,
}

/// One address a client may connect to, with what is known of it.
#[derive(Clone, Debug, PartialEq)]
pub struct Endpoint {
    pub addr: SocketAddr,
    /// Metric labels: `pod`, `pod_template_hash`, `serviceaccount`, owner, `zone`.
    pub labels: BTreeMap<String, String>,
    /// Present when the pod behind the address runs Linkerd's proxy.
    pub mesh: Option<MeshIdentity>,
    /// The pod marks this port opaque (`config.linkerd.io/opaque-ports`).
    pub opaque: bool,
    pub zone: Option<String>,
    pub hints_for_zones: Vec<String>,
    pub pod: Option<ObjectKey>,
}

/// How a meshed pod is reached and identified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MeshIdentity {
    pub service_account: String,
    pub namespace: String,
    /// The control plane namespace the pod was injected by.
    pub control_plane_ns: String,
    /// The pod's proxy inbound port, when it says so.
    pub inbound_port: Option<u16>,
}

/// What a `GetProfile` on one target resolves to right now.
#[derive(Clone, Debug, PartialEq)]
pub enum ProfileView {
    /// A service, by name or by cluster IP.
    Service {
        service: ObjectKey,
        port: u16,
        opaque: bool,
        /// The service's ServiceProfile, when one is written.
        profile: Option<std::sync::Arc<crate::resource::ServiceProfile>>,
    },
    /// An address that belongs to one pod.
    Pod { endpoint: Endpoint, opaque: bool },
    /// An address that belongs to nothing the index knows.
    Address { addr: SocketAddr, opaque: bool },
    /// A service name the index does not know.
    UnknownService,
}
