//! `ballast inject`: reads manifests, writes them back with the proxy
//! sidecar added (or removed, `--uninject`); also the proxy configuration
//! flags `ballast injector` shares.

use ballast_flags::{dns_label, dns_name, host_port, non_empty};
use ballast_inject::{config as defaults, values, Action, Config, Format, Mode};
use clap::Args as ClapArgs;
use std::{
    io::{Read, Write},
    path::{Path, PathBuf},
};

#[derive(ClapArgs)]
#[command(
    after_help = "Reads multi-document YAML or JSON (JSON in, JSON out), Lists included, \
and adds the proxy container `linkerd-proxy` (first among containers) and the init container \
`linkerd-init` to the pod templates of Deployments, StatefulSets, DaemonSets, ReplicaSets, \
ReplicationControllers, Jobs, CronJobs and Pods, unless their `linkerd.io/inject` annotation is \
`disabled` or they use the host's network. Linkerd's annotations configure each pod: \
config.linkerd.io/skip-inbound-ports, skip-outbound-ports, opaque-ports, proxy-cpu-request, \
proxy-cpu-limit, proxy-memory-request, proxy-memory-limit, proxy-log-level, proxy-image, \
proxy-version, proxy-uid. Injecting twice changes nothing; --uninject removes exactly what \
injection added. Documents with nothing to change are written back byte for byte, comments \
included; a changed document keeps its key order and the comments around it, not those inside.\n\
The result goes to stdout (files separated by `---`), one line per workload to stderr. Any \
error (unreadable input, malformed document, bad annotation value) prints nothing to stdout \
and exits 1."
)]
pub struct Args {
    /// Manifest files, directories (their .yaml, .yml and .json files, in
    /// name order, not recursing) or `-` for stdin.
    #[arg(required = true, value_name = "FILE|DIR|-")]
    pub inputs: Vec<PathBuf>,

    /// Remove the sidecar instead of adding it.
    #[arg(long)]
    pub uninject: bool,

    /// Write yaml or json (default: each input in its own syntax). A
    /// conversion rewrites every document, dropping comments.
    #[arg(short, long, value_enum)]
    pub output: Option<OutputFormat>,

    /// A kubeconfig, to read the trust anchors from the control plane's
    /// ConfigMap when no flag gives them (default: KUBECONFIG,
    /// ~/.kube/config, else in-cluster).
    #[arg(long, env = "BALLAST_INJECT_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    #[command(flatten)]
    pub proxy: ProxyConfigFlags,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputFormat {
    Yaml,
    Json,
}

impl From<OutputFormat> for Format {
    fn from(format: OutputFormat) -> Self {
        match format {
            OutputFormat::Yaml => Format::Yaml,
            OutputFormat::Json => Format::Json,
        }
    }
}

/// How injected pods are configured; shared by `ballast inject` and
/// `ballast injector`. Pod annotations (`config.linkerd.io/...`) override
/// the flags that name one.
#[derive(ClapArgs, Clone, Debug)]
pub struct ProxyConfigFlags {
    /// The proxy container's image; `config.linkerd.io/proxy-image` overrides.
    #[arg(long, env = "BALLAST_INJECT_PROXY_IMAGE", default_value = defaults::DEFAULT_PROXY_IMAGE)]
    pub proxy_image: String,

    /// The init container's image (iptables setup).
    #[arg(long, env = "BALLAST_INJECT_INIT_IMAGE", default_value = defaults::DEFAULT_INIT_IMAGE)]
    pub init_image: String,

    /// imagePullPolicy of both containers: Always, IfNotPresent or Never.
    #[arg(long, env = "BALLAST_INJECT_IMAGE_PULL_POLICY", default_value = defaults::DEFAULT_IMAGE_PULL_POLICY,
          value_parser = ["Always", "IfNotPresent", "Never"])]
    pub image_pull_policy: String,

    /// The control plane's namespace: the `linkerd.io/control-plane-ns`
    /// label, part of every identity name, and the namespace of the
    /// controllers proxies dial (as `ballast install --namespace`).
    #[arg(long, env = "BALLAST_INJECT_CONTROL_PLANE_NAMESPACE",
          default_value = ballast_controlplane::DEFAULT_NAMESPACE, value_parser = dns_label)]
    pub control_plane_namespace: String,

    /// The cluster's DNS domain (as `ballast install --cluster-domain`).
    #[arg(long, env = "BALLAST_INJECT_CLUSTER_DOMAIN",
          default_value = ballast_controlplane::DEFAULT_CLUSTER_DOMAIN, value_parser = dns_name)]
    pub cluster_domain: String,

    /// The identity trust domain (as `ballast install --trust-domain`).
    #[arg(long, env = "BALLAST_INJECT_IDENTITY_TRUST_DOMAIN",
          default_value = ballast_controlplane::DEFAULT_TRUST_DOMAIN, value_parser = dns_name)]
    pub identity_trust_domain: String,

    /// The destination controller, as proxies dial it (HOST:PORT; default:
    /// ballast-dst-headless.NAMESPACE.svc.CLUSTER_DOMAIN:8086).
    #[arg(long, env = "BALLAST_INJECT_DESTINATION_ADDR", value_parser = host_port)]
    pub destination_addr: Option<String>,

    /// The identity controller, as proxies dial it (HOST:PORT; default:
    /// ballast-identity-headless.NAMESPACE.svc.CLUSTER_DOMAIN:8080).
    #[arg(long, env = "BALLAST_INJECT_IDENTITY_ADDR", value_parser = host_port)]
    pub identity_addr: Option<String>,

    /// Inject proxies without mesh identity (no certificates, plaintext):
    /// no trust anchors or token are mounted.
    #[arg(long, env = "BALLAST_INJECT_IDENTITY_DISABLED")]
    pub identity_disabled: bool,

    /// The trust anchors (PEM bundle) given to each proxy inline, in its
    /// environment (as Linkerd does). Without it (and without
    /// --trust-anchors-config-map), `ballast inject` reads the control
    /// plane's ConfigMap linkerd-identity-trust-roots from the cluster;
    /// `ballast injector` is given the file by `ballast install`.
    #[arg(
        long,
        env = "BALLAST_INJECT_IDENTITY_TRUST_ANCHORS_FILE",
        value_name = "PEM"
    )]
    pub identity_trust_anchors_file: Option<std::path::PathBuf>,

    /// Mount the trust anchors from this ConfigMap, which must exist in every
    /// injected pod's own namespace (a pod mounts no other namespace's),
    /// instead of giving them inline.
    #[arg(long, env = "BALLAST_INJECT_TRUST_ANCHORS_CONFIG_MAP", value_parser = non_empty,
          conflicts_with = "identity_trust_anchors_file")]
    pub trust_anchors_config_map: Option<String>,

    /// The key of the PEM bundle in that ConfigMap.
    #[arg(long, env = "BALLAST_INJECT_TRUST_ANCHORS_KEY",
          default_value = defaults::DEFAULT_TRUST_ANCHORS_KEY, value_parser = non_empty)]
    pub trust_anchors_key: String,

    /// The proxy's uid (not 0), exempted from redirection; `config.linkerd.io/proxy-uid` overrides.
    #[arg(long, env = "BALLAST_INJECT_PROXY_UID", default_value_t = defaults::DEFAULT_PROXY_UID,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub proxy_uid: u32,

    /// The proxy's log filter (LEVEL or TARGET=LEVEL, comma-separated);
    /// `config.linkerd.io/proxy-log-level` overrides.
    #[arg(long, env = "BALLAST_INJECT_PROXY_LOG_LEVEL", default_value = defaults::DEFAULT_LOG_LEVEL,
          value_parser = log_level)]
    pub proxy_log_level: String,

    /// The proxy's CPU request (a Kubernetes quantity; empty for none);
    /// `config.linkerd.io/proxy-cpu-request` overrides.
    #[arg(long, env = "BALLAST_INJECT_PROXY_CPU_REQUEST", default_value = defaults::DEFAULT_CPU_REQUEST,
          value_parser = quantity)]
    pub proxy_cpu_request: String,

    /// The proxy's CPU limit (empty for none; also sizes the proxy's
    /// --workers); `config.linkerd.io/proxy-cpu-limit` overrides.
    #[arg(long, env = "BALLAST_INJECT_PROXY_CPU_LIMIT", default_value = "", value_parser = quantity)]
    pub proxy_cpu_limit: String,

    /// The proxy's memory request (empty for none);
    /// `config.linkerd.io/proxy-memory-request` overrides.
    #[arg(long, env = "BALLAST_INJECT_PROXY_MEMORY_REQUEST", default_value = defaults::DEFAULT_MEMORY_REQUEST,
          value_parser = quantity)]
    pub proxy_memory_request: String,

    /// The proxy's memory limit (empty for none);
    /// `config.linkerd.io/proxy-memory-limit` overrides.
    #[arg(long, env = "BALLAST_INJECT_PROXY_MEMORY_LIMIT", default_value = defaults::DEFAULT_MEMORY_LIMIT,
          value_parser = quantity)]
    pub proxy_memory_limit: String,

    /// The `linkerd.io/proxy-version` annotation's value (default: this
    /// binary's version); `config.linkerd.io/proxy-version` overrides and
    /// then also sets the proxy image's tag.
    #[arg(long, env = "BALLAST_INJECT_PROXY_VERSION", default_value = defaults::PROXY_VERSION,
          value_parser = non_empty)]
    pub proxy_version: String,
}

impl ProxyConfigFlags {
    /// The control plane these flags name.
    pub fn control_plane(&self) -> ballast_controlplane::ControlPlane {
        ballast_controlplane::ControlPlane {
            namespace: self.control_plane_namespace.clone(),
            cluster_domain: self.cluster_domain.clone(),
            trust_domain: self.identity_trust_domain.clone(),
        }
    }

    /// Whether proxies need trust anchors that no flag gives.
    pub fn needs_anchors(&self) -> bool {
        !self.identity_disabled
            && self.identity_trust_anchors_file.is_none()
            && self.trust_anchors_config_map.is_none()
    }

    /// The injection configuration these flags describe (reads
    /// --identity-trust-anchors-file; `anchors` are used when no flag gives any).
    pub fn config(&self, anchors: Option<String>) -> anyhow::Result<Config> {
        self.config_for(anchors, Action::Inject)
    }

    /// [`Self::config`] for `action`: removing a sidecar needs no anchors.
    pub fn config_for(&self, anchors: Option<String>, action: Action) -> anyhow::Result<Config> {
        let optional = |s: &str| (!s.is_empty()).then(|| s.to_string());
        let trust_anchors_pem = match &self.identity_trust_anchors_file {
            _ if self.identity_disabled => None,
            Some(path) => Some(read_anchors(path)?),
            None => anchors,
        };
        if action == Action::Inject && self.needs_anchors() && trust_anchors_pem.is_none() {
            anyhow::bail!(
                "proxies need the mesh's trust anchors: pass --identity-trust-anchors-file \
                 (the ca-bundle.crt of `ballast install`'s ConfigMap {}), or \
                 --identity-disabled for proxies without mTLS",
                ballast_controlplane::object::TRUST_ROOTS_CONFIG_MAP
            );
        }
        let control_plane = self.control_plane();
        Ok(Config {
            proxy_image: self.proxy_image.clone(),
            init_image: self.init_image.clone(),
            image_pull_policy: self.image_pull_policy.clone(),
            destination_addr: self
                .destination_addr
                .clone()
                .unwrap_or_else(|| control_plane.destination_addr()),
            identity_disabled: self.identity_disabled,
            identity_addr: self
                .identity_addr
                .clone()
                .unwrap_or_else(|| control_plane.identity_addr()),
            trust_anchors_config_map: self.trust_anchors_config_map.clone(),
            trust_anchors_key: self.trust_anchors_key.clone(),
            trust_anchors_pem,
            control_plane,
            proxy_uid: self.proxy_uid,
            log_level: self.proxy_log_level.clone(),
            cpu_request: optional(&self.proxy_cpu_request),
            cpu_limit: optional(&self.proxy_cpu_limit),
            memory_request: optional(&self.proxy_memory_request),
            memory_limit: optional(&self.proxy_memory_limit),
            proxy_version: self.proxy_version.clone(),
            ..Config::default()
        })
    }
}

/// The PEM bundle at `path`, checked to hold certificates.
fn read_anchors(path: &std::path::Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        anyhow::anyhow!(
            "--identity-trust-anchors-file {}: cannot read: {e}",
            path.display()
        )
    })?;
    ballast_meshtls::pem::certificates(text.as_bytes())
        .map_err(|e| anyhow::anyhow!("--identity-trust-anchors-file {}: {e}", path.display()))?;
    Ok(text)
}

fn quantity(s: &str) -> Result<String, values::InvalidValue> {
    if !s.is_empty() {
        values::parse_quantity(s)?;
    }
    Ok(s.to_string())
}

fn log_level(s: &str) -> Result<String, values::InvalidValue> {
    values::check_log_level(s)?;
    Ok(s.to_string())
}

/// The trust anchors of the installed control plane: the `ca-bundle.crt`
/// of its ConfigMap `linkerd-identity-trust-roots`.
async fn anchors_from_cluster(
    flags: &ProxyConfigFlags,
    kubeconfig: Option<&Path>,
) -> anyhow::Result<String> {
    use ballast_controlplane::object::{TRUST_ROOTS_CONFIG_MAP, TRUST_ROOTS_KEY};
    let ns = &flags.control_plane_namespace;
    let what = format!("ConfigMap {ns}/{TRUST_ROOTS_CONFIG_MAP}");
    let hint =
        "pass --identity-trust-anchors-file (or --identity-disabled for proxies without mTLS)";
    let config = ballast_kubeconfig::load(kubeconfig)
        .await
        .map_err(|e| anyhow::anyhow!("cannot read the trust anchors from {what}: {e}; {hint}"))?;
    let client = kube::Client::try_from(config)
        .map_err(|e| anyhow::anyhow!("cannot read the trust anchors from {what}: {e}; {hint}"))?;
    let api: kube::Api<k8s_openapi::api::core::v1::ConfigMap> = kube::Api::namespaced(client, ns);
    let config_map = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        api.get(TRUST_ROOTS_CONFIG_MAP),
    )
    .await
    .map_err(|_| {
        anyhow::anyhow!("cannot read the trust anchors from {what}: no answer within 30s; {hint}")
    })?
    .map_err(|e| {
        let e = ballast_kubeconfig::first_line(&e.to_string());
        anyhow::anyhow!("cannot read the trust anchors from {what}: {e}; {hint}")
    })?;
    let pem = config_map
        .data
        .and_then(|mut d| d.remove(TRUST_ROOTS_KEY))
        .ok_or_else(|| anyhow::anyhow!("{what} has no {TRUST_ROOTS_KEY}; {hint}"))?;
    ballast_meshtls::pem::certificates(pem.as_bytes())
        .map_err(|e| anyhow::anyhow!("{what}: {TRUST_ROOTS_KEY}: {e}; {hint}"))?;
    Ok(pem)
}

/// Largest input read (a file or stdin): manifests are far smaller, and
/// a mistaken `ballast inject /dev/zero` should end.
/// (16 MiB, as a manifests file the controllers read; an injected tree is
/// several times its text.)
const MAX_INPUT_BYTES: u64 = 16 * 1024 * 1024;

pub async fn run(args: Args) -> anyhow::Result<()> {
    // As `linkerd inject` does: what no flag says is read from the
    // installed control plane. Uninjecting needs no anchors.
    let anchors = if args.proxy.needs_anchors() && !args.uninject {
        Some(anchors_from_cluster(&args.proxy, args.kubeconfig.as_deref()).await?)
    } else {
        None
    };
    let action = if args.uninject {
        Action::Uninject
    } else {
        Action::Inject
    };
    // Reading and rewriting is synchronous and quick; no task needs the runtime.
    let config = args.proxy.config_for(anchors, action)?;
    let mut sources = Vec::new();
    for input in &args.inputs {
        sources.extend(expand(input)?);
    }
    // Everything is rewritten before anything is printed: a failing input
    // leaves stdout empty rather than half a manifest set.
    let mut out = String::new();
    let mut previous: Option<Format> = None;
    let mut lines = Vec::new();
    for source in &sources {
        let text = read(source)?;
        let name = source.name();
        let mut rewritten =
            ballast_inject::inject_documents(&text, &name, Mode::Manual, &config, action)?;
        if let Some(format) = args.output.map(Format::from) {
            if format != rewritten.format {
                rewritten.text = ballast_inject::convert(&rewritten.text, &name, format)?;
                rewritten.format = format;
            }
        }
        if rewritten.text.trim().is_empty() {
            continue;
        }
        if let Some(previous) = previous {
            if !out.ends_with('\n') {
                out.push('\n');
            }
            let both_json = previous == Format::Json && rewritten.format == Format::Json;
            if !both_json && !ends_with_marker(&out) && !starts_with_marker(&rewritten.text) {
                out.push_str("---\n");
            }
        }
        out.push_str(&rewritten.text);
        previous = Some(rewritten.format);
        for object in &rewritten.report.objects {
            lines.push(format!("{object}"));
        }
    }
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(out.as_bytes())
        .and_then(|()| stdout.flush())
        .map_err(|e| anyhow::anyhow!("cannot write to stdout: {e}"))?;
    let mut stderr = std::io::stderr().lock();
    for line in lines {
        // The report is for a human; stdout carries the result.
        let _ = writeln!(stderr, "{line}");
    }
    Ok(())
}

fn ends_with_marker(text: &str) -> bool {
    text.lines()
        .next_back()
        .is_some_and(|l| l.trim_end() == "---")
}

fn starts_with_marker(text: &str) -> bool {
    text.lines()
        .find(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .is_some_and(|l| l == "---" || l.starts_with("--- "))
}

/// One input: a file or stdin.
enum Source {
    Stdin,
    File(PathBuf),
}

impl Source {
    fn name(&self) -> String {
        match self {
            Source::Stdin => "<stdin>".into(),
            Source::File(path) => path.display().to_string(),
        }
    }
}

fn expand(input: &Path) -> anyhow::Result<Vec<Source>> {
    if input == Path::new("-") {
        return Ok(vec![Source::Stdin]);
    }
    let metadata =
        std::fs::metadata(input).map_err(|e| anyhow::anyhow!("{}: {e}", input.display()))?;
    if !metadata.is_dir() {
        return Ok(vec![Source::File(input.to_path_buf())]);
    }
    // The rule every reader of a manifests directory shares (subdirectories
    // included, as `linkerd inject` walks them).
    let listing = ballast_manifests::walk(input, &ballast_manifests::Limits::default())
        .map_err(|e| anyhow::anyhow!("{}: {e}", input.display()))?;
    if let Some((dir, e)) = listing.unreadable.first() {
        anyhow::bail!("{}: {e}", dir.display());
    }
    if listing.too_many {
        anyhow::bail!(
            "{}: more than {} manifest files; inject a smaller directory",
            input.display(),
            ballast_manifests::DEFAULT_MAX_FILES
        );
    }
    let files = listing.files.into_keys().map(|p| p.to_path_buf());
    Ok(files.map(Source::File).collect())
}

fn read(source: &Source) -> anyhow::Result<String> {
    let name = source.name();
    let mut bytes = Vec::new();
    let read = match source {
        Source::Stdin => std::io::stdin()
            .lock()
            .take(MAX_INPUT_BYTES + 1)
            .read_to_end(&mut bytes),
        Source::File(path) => std::fs::File::open(path)
            .and_then(|f| f.take(MAX_INPUT_BYTES + 1).read_to_end(&mut bytes)),
    };
    read.map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
    if bytes.len() as u64 > MAX_INPUT_BYTES {
        anyhow::bail!("{name}: larger than {} MiB", MAX_INPUT_BYTES >> 20);
    }
    String::from_utf8(bytes)
        .map_err(|e| anyhow::anyhow!("{name}: not UTF-8 text ({})", e.utf8_error()))
}
