//! Reading an existing Prometheus instead of scraping the proxies: once per
//! cycle, `GET URL/federate?match[]={__name__=~"..."}` for the families the
//! mesh reads, split by the `namespace` and `pod` labels that Linkerd's
//! Prometheus scrape configuration adds to every proxy series. Prometheus'
//! own `up` of the `linkerd-proxy` job comes along, so that a proxy it
//! cannot scrape, or does not scrape at all, is shown as such.
//!
//! The page is bounded like a scrape, only larger (`--max-federate-bytes`,
//! 256 MiB by default: ~150 KiB of these families per busy pod, for ~2,000
//! pods) and parsed on the blocking pool with its own series bound
//! (`--max-federate-series`, 2,000,000).

use std::collections::HashMap;
use std::time::Duration;

use ballast_serve::GaugeGuard;
use ballast_vizcore::api::ResourceRef;
use ballast_vizcore::expo::{self, Limits, Page};
use ballast_vizcore::targets::PodTarget;
use http::Uri;
use tokio::time::Instant;

use crate::collector::ScrapeError;
use crate::metrics::VizMetrics;
use crate::scrape::{self, FetchError};

pub const DEFAULT_MAX_FEDERATE_BYTES: usize = 256 * 1024 * 1024;
pub const DEFAULT_MAX_FEDERATE_SERIES: usize = 2_000_000;

/// The metric families the mesh reads (Linkerd's proxy names).
pub const FAMILIES: &[&str] = &[
    "response_total",
    "response_latency_ms_bucket",
    "tcp_open_total",
    "tcp_open_connections",
    "outbound_http_route_request_statuses_total",
    "outbound_http_route_request_duration_seconds_bucket",
    "outbound_grpc_route_request_statuses_total",
    "outbound_grpc_route_request_duration_seconds_bucket",
];

/// Linkerd's scrape job for the proxies, whose `up` says which are reached.
pub const PROXY_JOB: &str = "linkerd-proxy";

/// A Prometheus server's base URL, checked at start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrometheusUrl {
    host: String,
    port: u16,
    /// The path prefix without a trailing `/` (Prometheus behind a
    /// `--web.route-prefix`), possibly empty.
    prefix: String,
}

/// Why a `--prometheus-url` was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum UrlError {
    #[error("not a URL: {0}")]
    Invalid(String),
    #[error("only http:// URLs are read (no TLS client here)")]
    Scheme,
    #[error("no host in the URL")]
    NoHost,
    #[error("a query or fragment has no place in the base URL")]
    Query,
}

impl std::str::FromStr for PrometheusUrl {
    type Err = UrlError;

    fn from_str(s: &str) -> Result<Self, UrlError> {
        let uri: Uri = s.parse().map_err(|e| UrlError::Invalid(format!("{e}")))?;
        if uri.scheme_str() != Some("http") {
            return Err(UrlError::Scheme);
        }
        if uri.query().is_some() || s.contains('#') {
            return Err(UrlError::Query);
        }
        let host = uri
            .host()
            .filter(|h| !h.is_empty())
            .ok_or(UrlError::NoHost)?;
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        Ok(PrometheusUrl {
            host,
            port: uri.port_u16().unwrap_or(80),
            prefix: uri.path().trim_end_matches('/').to_string(),
        })
    }
}

impl std::fmt::Display for PrometheusUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "http://[{}]:{}{}", self.host, self.port, self.prefix)
        } else {
            write!(f, "http://{}:{}{}", self.host, self.port, self.prefix)
        }
    }
}

impl PrometheusUrl {
    /// `PREFIX/federate?match[]=...&match[]=up{...}`, the selectors
    /// percent-encoded.
    pub fn federate_path(&self) -> String {
        let families = format!("{{__name__=~\"{}\"}}", FAMILIES.join("|"));
        let up = format!("up{{job=\"{PROXY_JOB}\"}}");
        let query = form_urlencoded::Serializer::new(String::new())
            .append_pair("match[]", &families)
            .append_pair("match[]", &up)
            .finish();
        format!("{}/federate?{query}", self.prefix)
    }

    fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// Reads one federation page per call.
#[derive(Clone, Debug)]
pub struct Federation {
    pub url: PrometheusUrl,
    /// The whole request: name lookup, connect, last byte.
    pub timeout: Duration,
    pub max_bytes: usize,
    pub limits: Limits,
}

impl Federation {
    /// The page, split by pod (`meshed` says each pod's admin port, whose
    /// inbound series are Prometheus' scrapes, not traffic). Counted in
    /// `viz_scrapes_total` by the caller.
    pub async fn fetch(
        &self,
        metrics: &VizMetrics,
        meshed: &[PodTarget],
    ) -> Result<Vec<(ResourceRef, Page)>, ScrapeError> {
        let _in_flight = GaugeGuard::new(&metrics.scrapes_in_flight);
        let started = Instant::now();
        let got = tokio::time::timeout(self.timeout, self.get()).await;
        metrics
            .scrape_duration
            .observe(started.elapsed().as_secs_f64());
        let body = match got {
            Err(_) => return Err(ScrapeError::Timeout(self.timeout)),
            Ok(Err(error)) => {
                if let FetchError::TooLarge { read, .. } = &error {
                    metrics.scrape_bytes.inc_by(*read as u64);
                }
                return Err(error.into());
            }
            Ok(Ok(body)) => body,
        };
        metrics.scrape_bytes.inc_by(body.len() as u64);
        let limits = self.limits;
        let admin_ports: HashMap<(String, String), u16> = meshed
            .iter()
            .map(|t| {
                let key = (t.pod.namespace.clone(), t.pod.name.clone());
                (key, t.admin_port)
            })
            .collect();
        let parse = move || {
            let admin_port =
                |ns: &str, pod: &str| admin_ports.get(&(ns.to_string(), pod.to_string())).copied();
            expo::parse_federated(&body, &limits, &admin_port)
        };
        match tokio::task::spawn_blocking(parse).await {
            Ok(parsed) => parsed.map_err(ScrapeError::from),
            Err(error) => {
                tracing::error!(%error, "federation parser task failed");
                Err(ScrapeError::ParserFailed)
            }
        }
    }

    async fn get(&self) -> Result<bytes::Bytes, FetchError> {
        let addr = tokio::net::lookup_host((self.url.host.as_str(), self.url.port))
            .await
            .map_err(FetchError::Connect)?
            .next()
            .ok_or_else(|| {
                FetchError::Connect(std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!("{} has no address", self.url.host),
                ))
            })?;
        scrape::get(
            addr,
            &self.url.authority(),
            &self.url.federate_path(),
            self.max_bytes,
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked_and_the_selector_encoded() {
        let url: PrometheusUrl = "http://prometheus.linkerd-viz.svc:9090".parse().unwrap();
        assert_eq!(url.to_string(), "http://prometheus.linkerd-viz.svc:9090");
        let path = url.federate_path();
        assert!(
            path.starts_with("/federate?match%5B%5D=%7B__name__%3D%7E%22response_total%7C"),
            "{path}"
        );
        let decoded: Vec<(String, String)> =
            form_urlencoded::parse(path.split_once('?').unwrap().1.as_bytes())
                .into_owned()
                .collect();
        assert_eq!(decoded.len(), 2);
        assert_eq!(decoded[0].0, "match[]");
        assert_eq!(
            decoded[0].1,
            format!("{{__name__=~\"{}\"}}", FAMILIES.join("|"))
        );
        assert_eq!(
            decoded[1],
            (
                "match[]".to_string(),
                "up{job=\"linkerd-proxy\"}".to_string()
            )
        );

        let prefixed: PrometheusUrl = "http://127.0.0.1/prom/".parse().unwrap();
        assert_eq!(prefixed.port, 80);
        assert!(prefixed.federate_path().starts_with("/prom/federate?"));
        let v6: PrometheusUrl = "http://[::1]:9090".parse().unwrap();
        assert_eq!(v6.authority(), "[::1]:9090");

        for (bad, want) in [
            ("https://prom:9090", UrlError::Scheme),
            ("prom:9090", UrlError::Scheme),
            ("http://prom:9090/?x=1", UrlError::Query),
        ] {
            assert_eq!(bad.parse::<PrometheusUrl>(), Err(want), "{bad}");
        }
        assert!(matches!(
            "http://".parse::<PrometheusUrl>(),
            Err(UrlError::Invalid(_) | UrlError::NoHost)
        ));
    }
}
