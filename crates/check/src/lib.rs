//! `ballast check`: is Ballast healthy on this cluster (or in this manifests
//! directory), and is any workload set up the way that took meshes down?
//!
//! A pure core, [`checks`], reads a [`Snapshot`] of objects and returns one
//! [`CheckResult`] per named check; two gatherers fill the snapshot:
//! [`cluster::gather`] (the Kubernetes API, bounded in page size, objects
//! and time) and [`manifests::gather`] (a directory of YAML/JSON files).
//! [`Report`] prints the results for people or as JSON (schema in
//! [`report`]).
//!
//! The checks, by category:
//!
//! - control-plane: the namespace exists; the control plane Deployments'
//!   pods are ready; the ClusterRoles bound to the controllers' service
//!   accounts grant what each needs (evaluated here, so manifests are
//!   checked too); the policy CRDs the destination controller watches are
//!   installed (missing: a warning, the controller serves none of them);
//!   the controllers, the injector and the injected proxies agree on the
//!   control plane's namespace, trust domain, identities and TLS.
//! - identity: trust anchors and issuer parse, are valid now and not within
//!   the expiry warning period, and the issuer is signed by an anchor.
//! - data-plane: no two live pods share an IP (seed 000); no two pods bind
//!   one port on a node's network; every Service selector matches a pod;
//!   meshed pods' proxies are ready and of this version; no proxy sends
//!   traffic into its own listeners (seed 004).
//! - kubernetes: the API server's clock is close to this machine's.
#![forbid(unsafe_code)]

pub mod agreement;
pub mod cluster;
pub mod control_plane;
pub mod data_plane;
pub mod identity;
pub mod manifests;
pub mod pods;
pub mod report;
pub mod snapshot;

pub use report::{CheckResult, Finding, ObjectRef, Report, Severity, Source, Status};
pub use snapshot::Snapshot;

use std::time::{Duration, SystemTime};

/// The control plane namespace when none is given.
pub const DEFAULT_NAMESPACE: &str = "ballast";
/// Certificates expiring sooner than this warn (Linkerd's 60 days).
pub const DEFAULT_EXPIRY_WARNING: Duration = Duration::from_secs(60 * 86_400);
/// A clock further than this from the API server's warns (Linkerd's
/// check allows one minute; the identity controller backdates
/// certificates by its clock-skew allowance, 20 s in deploy/).
pub const DEFAULT_MAX_CLOCK_SKEW: Duration = Duration::from_secs(60);

/// What the checks compare against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// The control plane's namespace. Default [`DEFAULT_NAMESPACE`].
    pub namespace: String,
    /// Default [`DEFAULT_EXPIRY_WARNING`], 60 days.
    pub expiry_warning: Duration,
    /// Default [`DEFAULT_MAX_CLOCK_SKEW`], 1 minute.
    pub max_clock_skew: Duration,
    /// The version meshed pods' proxies should run (this `ballast`'s).
    pub proxy_version: String,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            namespace: DEFAULT_NAMESPACE.to_string(),
            expiry_warning: DEFAULT_EXPIRY_WARNING,
            max_clock_skew: DEFAULT_MAX_CLOCK_SKEW,
            proxy_version: env!("CARGO_PKG_VERSION").to_string(),
        }
    }
}

/// The name of the clock check.
pub const CLOCK_SKEW: &str = "clock is in sync with the API server";

/// Every check, in report order.
pub fn checks(snap: &Snapshot, now: SystemTime, config: &Config) -> Vec<CheckResult> {
    vec![
        control_plane::namespace_exists(snap, config),
        control_plane::pods_ready(snap, config),
        control_plane::rbac(snap, config),
        control_plane::crds(snap),
        agreement::agree(snap, config),
        identity::trust_anchors(snap, now, config),
        identity::issuer(snap, now, config),
        data_plane::shared_ips(snap),
        data_plane::host_ports(snap),
        data_plane::selectors(snap),
        data_plane::proxy_ready(snap),
        data_plane::proxy_versions(snap, config),
        data_plane::loops(snap),
        data_plane::failure_accrual(snap),
        clock_skew(snap, now, config),
    ]
}

/// [`checks`] as a [`Report`].
pub fn report(snap: &Snapshot, now: SystemTime, config: &Config) -> Report {
    Report::new(snap.source, checks(snap, now, config))
}

/// The API server's `Date` against this machine's clock. Certificates are
/// valid from their issue time: a skewed clock makes fresh ones look
/// not-yet-valid. Skipped on manifests (no server).
pub fn clock_skew(snap: &Snapshot, now: SystemTime, config: &Config) -> CheckResult {
    const CATEGORY: &str = "kubernetes";
    if snap.source == Source::Manifests {
        return CheckResult::skipped(
            CATEGORY,
            CLOCK_SKEW,
            "skipped: a manifests directory has no API server clock",
        );
    }
    let Some(server) = snap.server_time else {
        return CheckResult::skipped(
            CATEGORY,
            CLOCK_SKEW,
            "skipped: the API server sent no Date header",
        );
    };
    let (skew, direction) = match server.duration_since(now) {
        Ok(ahead) => (ahead, "ahead of"),
        Err(behind) => (behind.duration(), "behind"),
    };
    let findings = if skew > config.max_clock_skew {
        vec![Finding::warn(
            format!(
                "the API server's clock is {}s {direction} this machine's (more than {}s): certificates may look not yet valid or expired",
                skew.as_secs(),
                config.max_clock_skew.as_secs()
            ),
            Vec::new(),
        )]
    } else {
        Vec::new()
    };
    CheckResult::ran(CATEGORY, CLOCK_SKEW, findings)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_skew_warns_beyond_the_threshold_and_skips_on_manifests() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_900_000_000);
        let mut snap = Snapshot::new(Source::Cluster, Vec::new());
        let cfg = Config::default();
        assert_eq!(clock_skew(&snap, now, &cfg).status, Status::Skipped);
        snap.server_time = Some(now + Duration::from_secs(30));
        assert_eq!(clock_skew(&snap, now, &cfg).status, Status::Ok);
        snap.server_time = Some(now - Duration::from_secs(300));
        let c = clock_skew(&snap, now, &cfg);
        assert_eq!(c.status, Status::Warn);
        assert!(
            c.findings[0].message.contains("300s behind"),
            "{}",
            c.findings[0].message
        );
        snap.source = Source::Manifests;
        assert_eq!(clock_skew(&snap, now, &cfg).status, Status::Skipped);
    }

    #[test]
    fn a_healthy_cluster_passes_every_check() {
        let (anchor_pem, anchor) = identity::tests::ca("root", 1_800_000_000, 2_200_000_000, None);
        let (issuer_pem, _) =
            identity::tests::ca("issuer", 1_800_000_000, 2_100_000_000, Some(&anchor));
        let mut objects = control_plane::tests::control_plane();
        objects.extend(data_plane::tests::healthy());
        objects.push(identity::tests::trust_roots(&anchor_pem));
        objects.push(identity::tests::issuer_secret(&issuer_pem));
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_900_000_000);
        let mut snap = Snapshot::new(Source::Cluster, objects);
        snap.server_time = Some(now);
        let cfg = Config {
            proxy_version: "0.1.0".into(),
            ..Config::default()
        };
        let r = report(&snap, now, &cfg);
        for c in &r.checks {
            assert_eq!(c.status, Status::Ok, "{}: {:?}", c.name, c.findings);
        }
        assert_eq!(r.summary.ok, 15);
    }
}
