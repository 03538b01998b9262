//! What an injected pod gets: images, the control plane's addresses, the
//! proxy's ports, uid and resources. The defaults are those of
//! deploy/examples/sidecar.yaml, with identity on (as Linkerd's).

pub use ballast_controlplane::ControlPlane;

/// The proxy's image (`ballast-proxy` with no subcommand runs the proxy).
pub const DEFAULT_PROXY_IMAGE: &str = "ballast-proxy:latest";
/// The init container's image (the same `ballast-proxy` binary, with iptables).
pub const DEFAULT_INIT_IMAGE: &str = "ballast-init:latest";
/// Pull policy of both images.
pub const DEFAULT_IMAGE_PULL_POLICY: &str = "IfNotPresent";
/// The key of the PEM bundle in a trust anchors ConfigMap.
pub const DEFAULT_TRUST_ANCHORS_KEY: &str = ballast_controlplane::object::TRUST_ROOTS_KEY;
/// The uid the proxy runs as, exempted from redirection by the init container (Linkerd's).
pub const DEFAULT_PROXY_UID: u32 = 2102;
/// The proxy's outbound listener port on 127.0.0.1 (Linkerd's).
pub const DEFAULT_OUTBOUND_PORT: u16 = 4140;
/// The proxy's inbound listener port on 0.0.0.0 (Linkerd's).
pub const DEFAULT_INBOUND_PORT: u16 = 4143;
/// The proxy's admin port (/live, /ready, /metrics) on 0.0.0.0 (Linkerd's).
pub const DEFAULT_ADMIN_PORT: u16 = 4191;
/// The proxy's Tap API port on 0.0.0.0 (Linkerd's proxy control port), for
/// `ballast viz`; mutual TLS, served only to viz's identity.
pub const DEFAULT_TAP_PORT: u16 = 4190;
/// The proxy's CPU request.
pub const DEFAULT_CPU_REQUEST: &str = "100m";
/// The proxy's memory request.
pub const DEFAULT_MEMORY_REQUEST: &str = "16Mi";
/// The proxy's memory limit: room for its bounded queues and pools.
pub const DEFAULT_MEMORY_LIMIT: &str = "128Mi";
/// The proxy's log filter (`BALLAST_LOG`).
pub const DEFAULT_LOG_LEVEL: &str = "info";
/// Inbound ports the init container never redirects, whatever the
/// annotations add: the proxy's control and admin ports, and 4567,4568 (as Linkerd).
pub const DEFAULT_INBOUND_PORTS_TO_IGNORE: &str = "4190,4191,4567,4568";
/// Outbound ports the init container never redirects, whatever the annotations add.
pub const DEFAULT_OUTBOUND_PORTS_TO_IGNORE: &str = "4567,4568";
/// Written to each injected pod's `linkerd.io/proxy-version` annotation.
pub const PROXY_VERSION: &str = env!("CARGO_PKG_VERSION");

/// How pods are injected. `Config::default()` gives every documented default.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// The proxy container's image. Default [`DEFAULT_PROXY_IMAGE`].
    pub proxy_image: String,
    /// The init container's image. Default [`DEFAULT_INIT_IMAGE`].
    pub init_image: String,
    /// `imagePullPolicy` of both containers. Default [`DEFAULT_IMAGE_PULL_POLICY`].
    pub image_pull_policy: String,
    /// The control plane the proxies belong to: its namespace (the
    /// `linkerd.io/control-plane-ns` label, and part of identity names), its
    /// cluster domain and trust domain. The controllers' addresses and
    /// identities given to proxies follow from it. Default: the installed one.
    pub control_plane: ControlPlane,
    /// The proxy's `--destination-addr`. Default: the control plane's.
    pub destination_addr: String,
    /// Run proxies without mesh identity (`--identity-disabled`: no
    /// certificates, plaintext). Default `false`.
    pub identity_disabled: bool,
    /// The proxy's `--identity-addr` (identity on). Default: the control plane's.
    pub identity_addr: String,
    /// A ConfigMap in the pod's own namespace holding the trust anchors, to
    /// mount instead of giving them inline (identity on). Default none: a
    /// pod mounts only ConfigMaps of its own namespace, and `ballast
    /// install` creates one only in the control plane's.
    pub trust_anchors_config_map: Option<String>,
    /// Key of the PEM bundle in that ConfigMap. Default [`DEFAULT_TRUST_ANCHORS_KEY`].
    pub trust_anchors_key: String,
    /// The trust anchors (PEM), given to the proxy in its environment (as
    /// Linkerd's injector does). Identity on needs these or the ConfigMap.
    pub trust_anchors_pem: Option<String>,
    /// The proxy's uid (`config.linkerd.io/proxy-uid` overrides). Default [`DEFAULT_PROXY_UID`].
    pub proxy_uid: u32,
    /// Outbound listener port. Default [`DEFAULT_OUTBOUND_PORT`].
    pub outbound_port: u16,
    /// Inbound listener port. Default [`DEFAULT_INBOUND_PORT`].
    pub inbound_port: u16,
    /// Admin port, probed by kubelet. Default [`DEFAULT_ADMIN_PORT`].
    pub admin_port: u16,
    /// Tap API port (`--tap-addr`), declared as the container port
    /// `linkerd-tap`. Default [`DEFAULT_TAP_PORT`].
    pub tap_port: u16,
    /// Proxy CPU request (`config.linkerd.io/proxy-cpu-request` overrides).
    /// Default [`DEFAULT_CPU_REQUEST`].
    pub cpu_request: Option<String>,
    /// Proxy CPU limit (`config.linkerd.io/proxy-cpu-limit` overrides); also
    /// sizes the proxy's `--workers`. Default none.
    pub cpu_limit: Option<String>,
    /// Proxy memory request (`config.linkerd.io/proxy-memory-request`
    /// overrides). Default [`DEFAULT_MEMORY_REQUEST`].
    pub memory_request: Option<String>,
    /// Proxy memory limit (`config.linkerd.io/proxy-memory-limit`
    /// overrides). Default [`DEFAULT_MEMORY_LIMIT`].
    pub memory_limit: Option<String>,
    /// The proxy's log filter (`config.linkerd.io/proxy-log-level`
    /// overrides). Default [`DEFAULT_LOG_LEVEL`].
    pub log_level: String,
    /// Value of the `linkerd.io/proxy-version` annotation
    /// (`config.linkerd.io/proxy-version` overrides, and then also sets the
    /// proxy image's tag). Default [`PROXY_VERSION`], this crate's version.
    pub proxy_version: String,
}

impl Config {
    /// The defaults for proxies of `control_plane`: its controllers' addresses.
    pub fn for_control_plane(control_plane: ControlPlane) -> Config {
        Config {
            destination_addr: control_plane.destination_addr(),
            identity_addr: control_plane.identity_addr(),
            control_plane,
            ..Config::default()
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            proxy_image: DEFAULT_PROXY_IMAGE.into(),
            init_image: DEFAULT_INIT_IMAGE.into(),
            image_pull_policy: DEFAULT_IMAGE_PULL_POLICY.into(),
            destination_addr: ControlPlane::default().destination_addr(),
            identity_disabled: false,
            identity_addr: ControlPlane::default().identity_addr(),
            trust_anchors_config_map: None,
            trust_anchors_key: DEFAULT_TRUST_ANCHORS_KEY.into(),
            trust_anchors_pem: None,
            control_plane: ControlPlane::default(),
            proxy_uid: DEFAULT_PROXY_UID,
            outbound_port: DEFAULT_OUTBOUND_PORT,
            inbound_port: DEFAULT_INBOUND_PORT,
            admin_port: DEFAULT_ADMIN_PORT,
            tap_port: DEFAULT_TAP_PORT,
            cpu_request: Some(DEFAULT_CPU_REQUEST.into()),
            cpu_limit: None,
            memory_request: Some(DEFAULT_MEMORY_REQUEST.into()),
            memory_limit: Some(DEFAULT_MEMORY_LIMIT.into()),
            log_level: DEFAULT_LOG_LEVEL.into(),
            proxy_version: PROXY_VERSION.into(),
        }
    }
}

/// The defaults, with trust anchors given inline (what every caller with
/// identity on must give).
#[cfg(test)]
pub(crate) fn test_config() -> Config {
    Config {
        trust_anchors_pem: Some("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n".into()),
        ..Config::default()
    }
}
