//! What an injected pod gets: images, the control plane's addresses, the
//! proxy's ports, uid and resources. The defaults are those of
//! deploy/examples/sidecar.yaml, with identity on (as Linkerd's).

/// The proxy's image (`ballast-proxy` with no subcommand runs the proxy).
pub const DEFAULT_PROXY_IMAGE: &str = "ballast-proxy:latest";
/// The init container's image (the same `ballast-proxy` binary, with iptables).
pub const DEFAULT_INIT_IMAGE: &str = "ballast-init:latest";
/// Pull policy of both images.
pub const DEFAULT_IMAGE_PULL_POLICY: &str = "IfNotPresent";
/// The destination controller, as proxies dial it (the headless Service).
pub const DEFAULT_DESTINATION_ADDR: &str = "ballast-dst-headless.ballast.svc.cluster.local:8086";
/// The identity controller, as proxies dial it (the headless Service).
pub const DEFAULT_IDENTITY_ADDR: &str = "ballast-identity-headless.ballast.svc.cluster.local:8080";
/// The ConfigMap holding the trust anchors when they are not given inline
/// (in the pod's namespace: a pod mounts only ConfigMaps of its own
/// namespace). The name of the control plane's own copy, as Linkerd's.
pub const DEFAULT_TRUST_ANCHORS_CONFIG_MAP: &str = "linkerd-identity-trust-roots";
/// The key of the PEM bundle in that ConfigMap.
pub const DEFAULT_TRUST_ANCHORS_KEY: &str = "ca-bundle.crt";
/// The control plane's namespace: the value of the `linkerd.io/control-plane-ns` label.
pub const DEFAULT_CONTROL_PLANE_NAMESPACE: &str = "ballast";
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
    /// The proxy's `--destination-addr`. Default [`DEFAULT_DESTINATION_ADDR`].
    pub destination_addr: String,
    /// Run proxies without mesh identity (`--identity-disabled`: no
    /// certificates, plaintext). Default `false`.
    pub identity_disabled: bool,
    /// The proxy's `--identity-addr` (identity on). Default [`DEFAULT_IDENTITY_ADDR`].
    pub identity_addr: String,
    /// ConfigMap (in the pod's namespace) holding the trust anchors, mounted
    /// read-only (identity on). Default [`DEFAULT_TRUST_ANCHORS_CONFIG_MAP`].
    pub trust_anchors_config_map: String,
    /// Key of the PEM bundle in that ConfigMap. Default [`DEFAULT_TRUST_ANCHORS_KEY`].
    pub trust_anchors_key: String,
    /// The trust anchors (PEM), given to the proxy in its environment
    /// instead of the ConfigMap mount. Default none (the ConfigMap).
    pub trust_anchors_pem: Option<String>,
    /// Value of the `linkerd.io/control-plane-ns` label. Default [`DEFAULT_CONTROL_PLANE_NAMESPACE`].
    pub control_plane_namespace: String,
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

impl Default for Config {
    fn default() -> Self {
        Self {
            proxy_image: DEFAULT_PROXY_IMAGE.into(),
            init_image: DEFAULT_INIT_IMAGE.into(),
            image_pull_policy: DEFAULT_IMAGE_PULL_POLICY.into(),
            destination_addr: DEFAULT_DESTINATION_ADDR.into(),
            identity_disabled: false,
            identity_addr: DEFAULT_IDENTITY_ADDR.into(),
            trust_anchors_config_map: DEFAULT_TRUST_ANCHORS_CONFIG_MAP.into(),
            trust_anchors_key: DEFAULT_TRUST_ANCHORS_KEY.into(),
            trust_anchors_pem: None,
            control_plane_namespace: DEFAULT_CONTROL_PLANE_NAMESPACE.into(),
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
