//! Inbound authorization metrics, with Linkerd's names and labels:
//! `inbound_{http,tcp}_authz_{allow,deny}_total`,
//! `inbound_tcp_authz_terminate_total` and
//! `inbound_http_route_not_found_total`, labelled by `target_addr`, the
//! server (`srv_group`, `srv_kind`, `srv_name`, `srv_port`), the route
//! (`route_*`, HTTP) and the authorization that allowed (`authz_*`), and the
//! client's TLS (`tls`, `client_id`). Each family is bounded like every
//! traffic family ([`RetainedFamily`]): client identities are the peer's
//! choice.

use super::{RetainedFamily, SeriesDrops, SeriesLimits, TlsLabels};
use prometheus_client::{
    encoding::{EncodeLabelSet, LabelSetEncoder},
    metrics::{counter::Counter, gauge::Gauge},
    registry::Registry,
};
use std::sync::Arc;
use tokio::time::Instant;

/// What names a server, route or authorization in policies and metrics:
/// a default (`kind="default"`, no group) or a resource.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct PolicyMeta {
    pub group: Arc<str>,
    pub kind: Arc<str>,
    pub name: Arc<str>,
}

impl PolicyMeta {
    /// A default policy's name (`all-unauthenticated`, `audit`, ...).
    pub fn default_named(name: &str) -> Arc<Self> {
        Arc::new(Self {
            group: Arc::from(""),
            kind: Arc::from("default"),
            name: Arc::from(name),
        })
    }

    /// An authorization that allows and is counted as an audit (Linkerd's
    /// `audit` default).
    pub fn is_audit(&self) -> bool {
        &*self.kind == "default" && self.group.is_empty() && &*self.name == "audit"
    }

    fn encode(&self, prefix: &str, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        let (g, k, n) = (
            format!("{prefix}_group"),
            format!("{prefix}_kind"),
            format!("{prefix}_name"),
        );
        [
            (g.as_str(), &*self.group),
            (k.as_str(), &*self.kind),
            (n.as_str(), &*self.name),
        ]
        .encode(encoder)
    }
}

/// The labels of every authorization series; `route` and `authz` are set
/// where Linkerd sets them (HTTP series name the route; allow series name
/// the authorization).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct AuthzLabels {
    /// The connection's original destination, `IP:PORT`.
    pub target_addr: Arc<str>,
    pub server: Arc<PolicyMeta>,
    pub port: u16,
    pub route: Option<Arc<PolicyMeta>>,
    pub authz: Option<Arc<PolicyMeta>>,
    pub tls: TlsLabels,
}

impl EncodeLabelSet for AuthzLabels {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        let port = self.port.to_string();
        [("target_addr", &*self.target_addr)].encode(encoder)?;
        self.server.encode("srv", encoder)?;
        [("srv_port", port.as_str())].encode(encoder)?;
        if let Some(route) = &self.route {
            route.encode("route", encoder)?;
        }
        if let Some(authz) = &self.authz {
            authz.encode("authz", encoder)?;
        }
        self.tls.encode(encoder)
    }
}

/// The inbound authorization families and the count of watched ports.
#[derive(Debug)]
pub struct AuthzMetrics {
    pub http_allow: RetainedFamily<AuthzLabels, Counter>,
    pub http_deny: RetainedFamily<AuthzLabels, Counter>,
    pub http_route_not_found: RetainedFamily<AuthzLabels, Counter>,
    pub tcp_allow: RetainedFamily<AuthzLabels, Counter>,
    pub tcp_deny: RetainedFamily<AuthzLabels, Counter>,
    pub tcp_terminate: RetainedFamily<AuthzLabels, Counter>,
    /// Inbound ports whose policy is watched (one controller stream each).
    pub policy_ports: Gauge,
}

impl AuthzMetrics {
    pub(super) fn new(limits: SeriesLimits, drops: &SeriesDrops) -> Self {
        let family = || RetainedFamily::new(limits, drops.clone(), Counter::default);
        Self {
            http_allow: family(),
            http_deny: family(),
            http_route_not_found: family(),
            tcp_allow: family(),
            tcp_deny: family(),
            tcp_terminate: family(),
            policy_ports: Gauge::default(),
        }
    }

    pub(super) fn register(&self, r: &mut Registry) {
        r.register(
            "inbound_http_authz_allow",
            "Inbound HTTP requests that were authorized",
            self.http_allow.clone(),
        );
        r.register(
            "inbound_http_authz_deny",
            "Inbound HTTP requests that were denied by the port's policy",
            self.http_deny.clone(),
        );
        r.register(
            "inbound_http_route_not_found",
            "Inbound HTTP requests that matched no route of the port's policy",
            self.http_route_not_found.clone(),
        );
        r.register(
            "inbound_tcp_authz_allow",
            "Inbound TCP connections that were authorized",
            self.tcp_allow.clone(),
        );
        r.register(
            "inbound_tcp_authz_deny",
            "Inbound TCP connections that were denied",
            self.tcp_deny.clone(),
        );
        r.register(
            "inbound_tcp_authz_terminate",
            "Inbound TCP connections closed because a policy change no longer authorized them",
            self.tcp_terminate.clone(),
        );
        r.register(
            "inbound_policy_ports",
            "Inbound ports whose policy is watched (at most --max-targets; unused ones dropped after --discovery-idle-timeout)",
            self.policy_ports.clone(),
        );
    }

    pub(super) fn sweep(&self, now: Instant) {
        for f in [
            &self.http_allow,
            &self.http_deny,
            &self.http_route_not_found,
            &self.tcp_allow,
            &self.tcp_deny,
            &self.tcp_terminate,
        ] {
            f.sweep(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_carry_linkerds_labels_in_linkerds_order() {
        let mut registry = Registry::default();
        let drops = SeriesDrops::default();
        let limits = SeriesLimits {
            retention: std::time::Duration::from_secs(60),
            max_series: 100,
        };
        let m = AuthzMetrics::new(limits, &drops);
        m.register(&mut registry);
        let resource = Arc::new(PolicyMeta {
            group: Arc::from("policy.linkerd.io"),
            kind: Arc::from("server"),
            name: Arc::from("web-http"),
        });
        let labels = AuthzLabels {
            target_addr: Arc::from("10.0.0.1:8080"),
            server: resource,
            port: 8080,
            route: Some(PolicyMeta::default_named("default")),
            authz: Some(PolicyMeta::default_named("audit")),
            tls: TlsLabels::ClientId(Arc::from(
                "web.shop.serviceaccount.identity.linkerd.cluster.local",
            )),
        };
        m.http_allow.get(&labels).inc();
        m.tcp_deny
            .get(&AuthzLabels {
                route: None,
                authz: None,
                tls: TlsLabels::NoIdentity("no_tls_from_remote"),
                ..labels
            })
            .inc();
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(text.contains(
            "inbound_http_authz_allow_total{target_addr=\"10.0.0.1:8080\",\
             srv_group=\"policy.linkerd.io\",srv_kind=\"server\",srv_name=\"web-http\",srv_port=\"8080\",\
             route_group=\"\",route_kind=\"default\",route_name=\"default\",\
             authz_group=\"\",authz_kind=\"default\",authz_name=\"audit\",\
             tls=\"true\",client_id=\"web.shop.serviceaccount.identity.linkerd.cluster.local\"} 1"
        ), "{text}");
        assert!(text.contains(
            "inbound_tcp_authz_deny_total{target_addr=\"10.0.0.1:8080\",\
             srv_group=\"policy.linkerd.io\",srv_kind=\"server\",srv_name=\"web-http\",srv_port=\"8080\",\
             tls=\"no_identity\",no_tls_reason=\"no_tls_from_remote\"} 1"
        ), "{text}");
        assert!(PolicyMeta::default_named("audit").is_audit());
        assert!(!PolicyMeta::default_named("all-unauthenticated").is_audit());
    }
}
