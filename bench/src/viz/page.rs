//! A simulated proxy's `/metrics` page, in the shape a real one has
//! (families, label sets and bucket bounds copied from a running
//! `ballast proxy`'s page, prometheus-client text format): one inbound
//! series set for the pod itself and outbound sets to three destination
//! workloads, with TCP, route, authorization and process families around
//! them: about 108 KB and 320 samples. (A demo proxy's real page with
//! outbound traffic only, to three endpoints of one Service, is 57 KB; this
//! one adds the inbound side and three Services with their routes, so it
//! errs on the heavy side.)
//!
//! The page is one shared template; a pod only keeps its label values.
//! Counters grow with the number of times the page was served, so every
//! scrape sees traffic.

use std::fmt::Write;

/// The label values a template refers to by name (`$name$`).
pub const LABELS: &[&str] = &[
    "ns",
    "pod",
    "deploy",
    "hash",
    "ip",
    "caller_sa",
    "caller_ns",
    "d0_ns",
    "d0_svc",
    "d0_deploy",
    "d0_pod",
    "d0_hash",
    "d1_ns",
    "d1_svc",
    "d1_deploy",
    "d1_pod",
    "d1_hash",
    "d2_ns",
    "d2_svc",
    "d2_deploy",
    "d2_pod",
    "d2_hash",
];

/// Counters start as if this many scrapes had been served already.
const BASE: u64 = 100;

#[derive(Clone, Debug, PartialEq)]
enum Value {
    /// `rate` per scrape.
    Counter(u64),
    /// A histogram bucket: `rate` per scrape times the share under `le`.
    Bucket(u64, f64),
    /// A histogram sum: `rate` per scrape times the mean.
    Sum(u64, f64),
    Gauge(u64),
}

#[derive(Clone, Debug, PartialEq)]
enum Piece {
    Text(Box<str>),
    Label(usize),
    Value(Value),
}

/// A compiled page: text with label and value holes.
#[derive(Debug)]
pub struct Template {
    pieces: Vec<Piece>,
}

#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("unknown label ${0}$")]
    UnknownLabel(String),
    #[error("bad value %{0}%")]
    BadValue(String),
    #[error("unclosed {0} marker")]
    Unclosed(char),
}

fn value(spec: &str) -> Result<Value, TemplateError> {
    let bad = || TemplateError::BadValue(spec.to_string());
    let mut parts = spec.split(':');
    let kind = parts.next().ok_or_else(bad)?;
    let rate: u64 = parts.next().and_then(|r| r.parse().ok()).ok_or_else(bad)?;
    let param = parts.next().map(|p| p.parse::<f64>().map_err(|_| bad()));
    Ok(match (kind, param) {
        ("c", None) => Value::Counter(rate),
        ("g", None) => Value::Gauge(rate),
        ("h", Some(frac)) => Value::Bucket(rate, frac?),
        ("s", Some(mean)) => Value::Sum(rate, mean?),
        _ => return Err(bad()),
    })
}

impl Template {
    /// Compiles `text`: `$name$` is a label of [`LABELS`]; `%c:R%` a
    /// counter growing R per scrape, `%h:R:F%` a bucket (share F of it),
    /// `%s:R:M%` a sum (mean M), `%g:V%` a gauge.
    pub fn compile(text: &str) -> Result<Self, TemplateError> {
        let mut pieces = Vec::new();
        let mut rest = text;
        while let Some(at) = rest.find(['$', '%']) {
            let marker = rest.as_bytes()[at] as char;
            if at > 0 {
                pieces.push(Piece::Text(rest[..at].into()));
            }
            let after = &rest[at + 1..];
            let end = after.find(marker).ok_or(TemplateError::Unclosed(marker))?;
            let inner = &after[..end];
            pieces.push(if marker == '$' {
                let i = LABELS
                    .iter()
                    .position(|l| *l == inner)
                    .ok_or_else(|| TemplateError::UnknownLabel(inner.to_string()))?;
                Piece::Label(i)
            } else {
                Piece::Value(value(inner)?)
            });
            rest = &after[end + 1..];
        }
        if !rest.is_empty() {
            pieces.push(Piece::Text(rest.into()));
        }
        Ok(Self { pieces })
    }

    /// The page as served for the `served`-th time (0 first), with `labels`
    /// (in [`LABELS`] order).
    pub fn render(&self, labels: &[String], served: u64, out: &mut Vec<u8>) {
        let mut text = String::with_capacity(80 * 1024);
        let n = (served + BASE) as f64;
        for p in &self.pieces {
            match p {
                Piece::Text(t) => text.push_str(t),
                Piece::Label(i) => text.push_str(labels.get(*i).map_or("", String::as_str)),
                Piece::Value(Value::Counter(r)) => {
                    let _ = write!(text, "{}", r * (served + BASE));
                }
                Piece::Value(Value::Gauge(v)) => {
                    let _ = write!(text, "{v}");
                }
                Piece::Value(Value::Bucket(r, f)) => {
                    let _ = write!(text, "{}", (*r as f64 * n * f).floor() as u64);
                }
                Piece::Value(Value::Sum(r, m)) => {
                    let _ = write!(text, "{:?}", *r as f64 * n * m);
                }
            }
        }
        out.extend_from_slice(text.as_bytes());
    }
}

/// Linkerd's `response_latency_ms` bucket bounds.
const LATENCY_MS: [f64; 25] = [
    1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 100.0, 200.0, 300.0, 400.0, 500.0,
    1000.0, 2000.0, 3000.0, 4000.0, 5000.0, 10000.0, 20000.0, 30000.0, 40000.0, 50000.0,
];
const CONN_MS: [f64; 9] = [1.0, 10.0, 100.0, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8];
const ROUTE_S: [f64; 4] = [0.05, 0.5, 1.0, 10.0];
const BACKEND_S: [f64; 7] = [0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 10.0];

/// Share of an exponential distribution of median `median` under `le`.
fn share(le: f64, median: f64) -> f64 {
    1.0 - (-le / median * std::f64::consts::LN_2).exp()
}

fn le(v: f64) -> String {
    format!("{v:?}")
}

fn workload(d: &str) -> String {
    format!(
        "dst_namespace=\"${d}_ns$\",dst_service=\"${d}_svc$\",dst_pod=\"${d}_pod$\",\
         dst_deployment=\"${d}_deploy$\",dst_statefulset=\"\",dst_daemonset=\"\",\
         dst_replicaset=\"\",dst_k8s_job=\"\",dst_serviceaccount=\"${d}_deploy$\",\
         dst_pod_template_hash=\"${d}_hash$\""
    )
}

/// The `DstLabels` of one series set: the pod itself (inbound), or an
/// outbound destination `d0`..`d2`.
fn dst_sets() -> Vec<(String, u64, f64)> {
    let mut sets = vec![(
        "direction=\"inbound\",authority=\"$ip$:8080\",dst_namespace=\"$ns$\",dst_service=\"\",\
         dst_pod=\"$pod$\",dst_deployment=\"$deploy$\",dst_statefulset=\"\",dst_daemonset=\"\",\
         dst_replicaset=\"\",dst_k8s_job=\"\",dst_serviceaccount=\"$deploy$\",\
         dst_pod_template_hash=\"$hash$\""
            .to_string(),
        // Requests per scrape interval, median latency in ms.
        120,
        4.0,
    )];
    for (i, (rate, median)) in [(60, 3.0), (40, 12.0), (20, 40.0)].into_iter().enumerate() {
        let d = format!("d{i}");
        sets.push((
            format!(
                "direction=\"outbound\",authority=\"${d}_svc$.${d}_ns$.svc.cluster.local:80\",{}",
                workload(&d)
            ),
            rate,
            median,
        ));
    }
    sets
}

fn tls_of(set: usize) -> &'static str {
    if set == 0 {
        "tls=\"true\",client_id=\"$caller_sa$.$caller_ns$.serviceaccount.identity.linkerd.cluster.local\""
    } else {
        match set {
            1 => "tls=\"true\",server_id=\"$d0_deploy$.$d0_ns$.serviceaccount.identity.linkerd.cluster.local\"",
            2 => "tls=\"true\",server_id=\"$d1_deploy$.$d1_ns$.serviceaccount.identity.linkerd.cluster.local\"",
            _ => "tls=\"true\",server_id=\"$d2_deploy$.$d2_ns$.serviceaccount.identity.linkerd.cluster.local\"",
        }
    }
}

/// One histogram series: `_sum` (`mean` per request), `_count` and the
/// cumulative `_bucket`s over `bounds` (a latency with this `median`), all
/// advancing with `rate` requests per scrape.
fn histogram(
    o: &mut String,
    name: &str,
    labels: &str,
    rate: u64,
    (median, mean): (f64, f64),
    bounds: &[f64],
) {
    let _ = writeln!(o, "{name}_sum{{{labels}}} %s:{rate}:{mean:?}%");
    let _ = writeln!(o, "{name}_count{{{labels}}} %c:{rate}%");
    for b in bounds {
        let _ = writeln!(
            o,
            "{name}_bucket{{le=\"{}\",{labels}}} %h:{rate}:{:.6}%",
            le(*b),
            share(*b, median)
        );
    }
    let _ = writeln!(o, "{name}_bucket{{le=\"+Inf\",{labels}}} %c:{rate}%");
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}.\n# TYPE {name} {kind}");
}

/// The text of the template (see [`Template::compile`] for its markers).
pub fn proxy_page_text() -> String {
    let sets = dst_sets();
    let mut o = String::new();
    family(&mut o, "request", "counter", "Requests proxied");
    for (labels, rate, _) in &sets {
        let _ = writeln!(o, "request_total{{{labels}}} %c:{rate}%");
    }
    family(
        &mut o,
        "response",
        "counter",
        "Responses, by classification and status code",
    );
    for (labels, rate, _) in &sets {
        let fail = (rate / 40).max(1);
        let _ = writeln!(
            o,
            "response_total{{{labels},classification=\"success\",status_code=\"200\",grpc_status_code=\"\"}} %c:{}%",
            rate - fail
        );
        let _ = writeln!(
            o,
            "response_total{{{labels},classification=\"failure\",status_code=\"500\",grpc_status_code=\"\"}} %c:{fail}%"
        );
    }
    family(
        &mut o,
        "response_latency_ms",
        "histogram",
        "Time to response headers, in milliseconds",
    );
    for (labels, rate, median) in &sets {
        let latency = (*median, median * 1.44);
        histogram(
            &mut o,
            "response_latency_ms",
            labels,
            *rate,
            latency,
            &LATENCY_MS,
        );
    }
    // TCP: the accepted side of each direction, and each destination.
    let src_out = "peer=\"src\",direction=\"outbound\",authority=\"\",dst_namespace=\"\",\
                   dst_service=\"\",dst_pod=\"\",dst_deployment=\"\",dst_statefulset=\"\",\
                   dst_daemonset=\"\",dst_replicaset=\"\",dst_k8s_job=\"\",\
                   dst_serviceaccount=\"\",dst_pod_template_hash=\"\",tls=\"no_identity\",\
                   no_tls_reason=\"loopback\"";
    let mut tcp: Vec<String> = vec![src_out.to_string()];
    for (i, (labels, _, _)) in sets.iter().enumerate() {
        let peer = if i == 0 { "src" } else { "dst" };
        tcp.push(format!("peer=\"{peer}\",{labels},{}", tls_of(i)));
    }
    for (name, help, kind, rate) in [
        ("tcp_open", "TCP connections opened", "counter", 2),
        ("tcp_open_connections", "TCP connections open", "gauge", 0),
        (
            "tcp_read_bytes",
            "Bytes read from TCP peers",
            "counter",
            41_000,
        ),
        (
            "tcp_write_bytes",
            "Bytes written to TCP peers",
            "counter",
            97_000,
        ),
    ] {
        family(&mut o, name, kind, help);
        let suffix = if kind == "counter" { "_total" } else { "" };
        for labels in &tcp {
            let value = if kind == "gauge" {
                "%g:4%".to_string()
            } else {
                format!("%c:{rate}%")
            };
            let _ = writeln!(o, "{name}{suffix}{{{labels}}} {value}");
        }
    }
    family(&mut o, "tcp_close", "counter", "TCP connections closed");
    for labels in &tcp {
        let _ = writeln!(
            o,
            "tcp_close_total{{{labels},classification=\"success\"}} %c:1%"
        );
    }
    family(
        &mut o,
        "tcp_connection_duration_ms",
        "histogram",
        "Lifetimes of closed TCP connections, in milliseconds",
    );
    for labels in &tcp {
        let l = format!("{labels},classification=\"success\"");
        histogram(
            &mut o,
            "tcp_connection_duration_ms",
            &l,
            1,
            (6000.0, 9000.0),
            &CONN_MS,
        );
    }
    family(
        &mut o,
        "balancer_endpoints",
        "gauge",
        "Endpoints per target and protocol, ready or pending (in connect backoff)",
    );
    for d in ["d0", "d1", "d2"] {
        for (state, n) in [("ready", 10), ("pending", 0)] {
            let _ = writeln!(
                o,
                "balancer_endpoints{{authority=\"${d}_svc$.${d}_ns$.svc.cluster.local:80\",protocol=\"http\",endpoint_state=\"{state}\"}} %g:{n}%"
            );
        }
    }
    o.push_str(CONTROL_AND_LISTENERS);
    // Inbound authorization of the pod's own server.
    family(
        &mut o,
        "inbound_http_authz_allow",
        "counter",
        "Inbound HTTP requests authorized",
    );
    let _ = writeln!(
        o,
        "inbound_http_authz_allow_total{{target_addr=\"$ip$:8080\",srv_group=\"policy.linkerd.io\",\
         srv_kind=\"server\",srv_name=\"$deploy$-http\",srv_port=\"8080\",route_group=\"\",\
         route_kind=\"default\",route_name=\"default\",authz_group=\"\",authz_kind=\"default\",\
         authz_name=\"all-unauthenticated\",{}}} %c:120%",
        tls_of(0)
    );
    family(
        &mut o,
        "inbound_tcp_authz_allow",
        "counter",
        "Inbound TCP connections authorized",
    );
    let _ = writeln!(
        o,
        "inbound_tcp_authz_allow_total{{target_addr=\"$ip$:8080\",srv_group=\"policy.linkerd.io\",\
         srv_kind=\"server\",srv_name=\"$deploy$-http\",srv_port=\"8080\",{}}} %c:2%",
        tls_of(0)
    );
    routes(&mut o);
    o.push_str(PROCESS);
    o.push_str("# EOF\n");
    o
}

/// The outbound route families: the default route of each destination
/// Service and its one backend.
fn routes(o: &mut String) {
    let parent = |d: &str| {
        format!(
            "parent_group=\"core\",parent_kind=\"Service\",parent_namespace=\"${d}_ns$\",\
             parent_name=\"${d}_svc$\",parent_port=\"80\",parent_section_name=\"\",\
             route_group=\"\",route_kind=\"default\",route_namespace=\"\",route_name=\"http\""
        )
    };
    let backend = |d: &str| {
        format!(
            "{},backend_group=\"core\",backend_kind=\"Service\",backend_namespace=\"${d}_ns$\",\
             backend_name=\"${d}_svc$\",backend_port=\"80\",backend_section_name=\"\"",
            parent(d)
        )
    };
    let dsts = [("d0", 60, 0.003), ("d1", 40, 0.012), ("d2", 20, 0.04)];
    let _ = writeln!(
        o,
        "# HELP outbound_http_route_request_duration_seconds The time between request initialization and response headers.\n\
         # TYPE outbound_http_route_request_duration_seconds histogram\n\
         # UNIT outbound_http_route_request_duration_seconds seconds"
    );
    for (d, rate, median) in dsts {
        let l = format!(
            "{},hostname=\"${d}_svc$.${d}_ns$.svc.cluster.local\"",
            parent(d)
        );
        histogram(
            o,
            "outbound_http_route_request_duration_seconds",
            &l,
            rate,
            (median, median * 1.44),
            &ROUTE_S,
        );
    }
    family(
        o,
        "outbound_http_route_request_statuses",
        "counter",
        "Completed request-response streams",
    );
    for (d, rate, _) in dsts {
        let l = format!(
            "{},hostname=\"${d}_svc$.${d}_ns$.svc.cluster.local\"",
            parent(d)
        );
        let fail = (rate / 40).max(1);
        let _ = writeln!(
            o,
            "outbound_http_route_request_statuses_total{{{l},http_status=\"200\",error=\"\"}} %c:{}%",
            rate - fail
        );
        let _ = writeln!(
            o,
            "outbound_http_route_request_statuses_total{{{l},http_status=\"500\",error=\"\"}} %c:{fail}%"
        );
    }
    family(
        o,
        "outbound_http_route_backend_requests",
        "counter",
        "The total number of requests dispatched to a route backend",
    );
    for (d, rate, _) in dsts {
        let _ = writeln!(
            o,
            "outbound_http_route_backend_requests_total{{{}}} %c:{rate}%",
            backend(d)
        );
    }
    let _ = writeln!(
        o,
        "# HELP outbound_http_route_backend_response_duration_seconds The time between request dispatch and response headers.\n\
         # TYPE outbound_http_route_backend_response_duration_seconds histogram\n\
         # UNIT outbound_http_route_backend_response_duration_seconds seconds"
    );
    for (d, rate, median) in dsts {
        histogram(
            o,
            "outbound_http_route_backend_response_duration_seconds",
            &backend(d),
            rate,
            (median, median * 1.4),
            &BACKEND_S,
        );
    }
    family(
        o,
        "outbound_http_route_backend_response_statuses",
        "counter",
        "Completed responses",
    );
    for (d, rate, _) in dsts {
        let _ = writeln!(
            o,
            "outbound_http_route_backend_response_statuses_total{{{},http_status=\"200\",error=\"\"}} %c:{rate}%",
            backend(d)
        );
    }
}

/// The control-plane, listener and memory families of a real page, as it
/// prints them (no traffic labels).
const CONTROL_AND_LISTENERS: &str = "\
# HELP balancer_failfast Targets in failfast: no endpoint became ready within the failfast timeout.
# TYPE balancer_failfast gauge
balancer_failfast 0
# HELP discovery_resolutions Open resolutions (targets in use or recently used).
# TYPE discovery_resolutions gauge
discovery_resolutions 3
# HELP discovery_endpoints_dropped Endpoints dropped because a target exceeded --max-endpoints-per-target.
# TYPE discovery_endpoints_dropped counter
discovery_endpoints_dropped_total 0
# HELP discovery_stale_seconds Age of the oldest endpoint data in use that the destination controller has not confirmed (0 while it is connected); kept at most --stale-endpoints-grace.
# TYPE discovery_stale_seconds gauge
discovery_stale_seconds 0
# HELP control_connected 1 while the connection to the destination controller is up.
# TYPE control_connected gauge
control_connected 1
# HELP control_connect_attempts TCP connects attempted to the destination controller.
# TYPE control_connect_attempts counter
control_connect_attempts_total 1
# HELP control_streams Open streams to the destination controller.
# TYPE control_streams gauge
control_streams{rpc=\"outbound_policy\"} 3
control_streams{rpc=\"get\"} 3
control_streams{rpc=\"inbound_policy\"} 1
# HELP control_messages Messages received from the destination controller.
# TYPE control_messages counter
control_messages_total{rpc=\"get\"} %c:1%
control_messages_total{rpc=\"outbound_policy\"} 3
control_messages_total{rpc=\"inbound_policy\"} 1
# HELP listener_connections Connections open per listener.
# TYPE listener_connections gauge
listener_connections{listener=\"outbound\"} 4
listener_connections{listener=\"inbound\"} 4
# HELP listener_refused Connections closed at accept: the listener was at --max-connections, or memory at --memory-limit.
# TYPE listener_refused counter
listener_refused_total{listener=\"outbound\",reason=\"memory_limit\"} 0
listener_refused_total{listener=\"inbound\",reason=\"max_connections\"} 0
listener_refused_total{listener=\"inbound\",reason=\"memory_limit\"} 0
listener_refused_total{listener=\"outbound\",reason=\"max_connections\"} 0
# HELP listener_accept_errors Accept errors (such as running out of file descriptors); each pauses accepting briefly.
# TYPE listener_accept_errors counter
listener_accept_errors_total{listener=\"inbound\"} 0
listener_accept_errors_total{listener=\"outbound\"} 0
# HELP memory_limit_bytes The --memory-limit (0: none).
# TYPE memory_limit_bytes gauge
memory_limit_bytes 0
# HELP memory_shedding 1 while allocated memory is at or over --memory-limit.
# TYPE memory_shedding gauge
memory_shedding 0
# HELP http_idle_closed Client HTTP connections closed after --http-idle-timeout without a request.
# TYPE http_idle_closed counter
http_idle_closed_total 0
# HELP http1_parked_connections Idle HTTP/1 client connections that gave back their HTTP state after --http1-park-after and hold only their socket.
# TYPE http1_parked_connections gauge
http1_parked_connections 0
# HELP http2_calm_closed Client HTTP/2 connections closed with GOAWAY ENHANCE_YOUR_CALM (e.g. past --http2-max-local-error-resets or --http2-max-pending-accept-resets).
# TYPE http2_calm_closed counter
http2_calm_closed_total 0
# HELP metrics_series_dropped Traffic metric series removed: unused for --metrics-retention, or past --metrics-max-series.
# TYPE metrics_series_dropped counter
metrics_series_dropped_total{reason=\"retention\"} 0
metrics_series_dropped_total{reason=\"limit\"} 0
# HELP inbound_policy_ports Inbound ports whose policy is watched (at most --max-targets; unused ones dropped after --discovery-idle-timeout).
# TYPE inbound_policy_ports gauge
inbound_policy_ports 1
# HELP outbound_policy_watches Outbound policy watches open (one per target in use or recently used).
# TYPE outbound_policy_watches gauge
outbound_policy_watches 3
# HELP outbound_retry_body_bytes Request body bytes kept in memory for retries (each request at most its route's max_request_bytes, capped at 1 MiB).
# TYPE outbound_retry_body_bytes gauge
outbound_retry_body_bytes 0
# HELP proxy_build_info Build of this proxy: 1, labelled with its version.
# TYPE proxy_build_info gauge
proxy_build_info{version=\"0.1.0\"} 1
";

const PROCESS: &str = "\
# HELP process_memory_allocated_bytes Bytes allocated by the application, as counted by jemalloc.
# TYPE process_memory_allocated_bytes gauge
# UNIT process_memory_allocated_bytes bytes
process_memory_allocated_bytes 1793936
# HELP process_memory_resident_bytes Bytes in physically resident pages mapped by jemalloc.
# TYPE process_memory_resident_bytes gauge
# UNIT process_memory_resident_bytes bytes
process_memory_resident_bytes 5940352
# HELP process_resident_memory_bytes Resident set size of the process (VmRSS).
# TYPE process_resident_memory_bytes gauge
# UNIT process_resident_memory_bytes bytes
process_resident_memory_bytes 16110336
# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total %c:1%
# HELP process_open_fds Number of open file descriptors.
# TYPE process_open_fds gauge
process_open_fds 27
# HELP process_max_fds Maximum number of open file descriptors.
# TYPE process_max_fds gauge
process_max_fds 20000
# HELP admin_connections_open Admin connections being served.
# TYPE admin_connections_open gauge
admin_connections_open 1
";

#[cfg(test)]
mod tests {
    use super::*;

    fn labels() -> Vec<String> {
        LABELS.iter().map(|l| format!("v-{l}")).collect()
    }

    fn sample(page: &str, prefix: &str) -> f64 {
        page.lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {prefix} in the page"))
    }

    #[test]
    fn the_page_is_proxy_sized_and_its_counters_advance_per_scrape() {
        let t = Template::compile(&proxy_page_text()).expect("the template compiles");
        let (mut first, mut second) = (Vec::new(), Vec::new());
        t.render(&labels(), 0, &mut first);
        t.render(&labels(), 1, &mut second);
        let (first, second) = (
            String::from_utf8(first).unwrap(),
            String::from_utf8(second).unwrap(),
        );
        assert!(
            (40_000..120_000).contains(&first.len()),
            "{} bytes",
            first.len()
        );
        assert!(!first.contains('$') && !first.contains('%'), "a hole left");
        assert!(first.contains("dst_deployment=\"v-d1_deploy\""));
        let inbound = "response_total{direction=\"inbound\"";
        assert_eq!(sample(&first, inbound) + 117.0, sample(&second, inbound));
        // Buckets are cumulative and end at the count.
        let buckets: Vec<f64> = second
            .lines()
            .filter(|l| l.starts_with("response_latency_ms_bucket{le="))
            .take(26)
            .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
            .collect();
        assert!(buckets.windows(2).all(|w| w[0] <= w[1]), "{buckets:?}");
        assert_eq!(
            buckets[25],
            sample(&second, "response_latency_ms_count{direction=\"inbound\"")
        );
        // Every sample line is NAME{...} VALUE or NAME VALUE.
        for line in second.lines().filter(|l| !l.starts_with('#')) {
            let value = line.rsplit(' ').next().unwrap();
            assert!(value.parse::<f64>().is_ok(), "{line}");
        }
    }

    #[test]
    fn bad_templates_are_refused() {
        assert!(matches!(
            Template::compile("a $nope$"),
            Err(TemplateError::UnknownLabel(_))
        ));
        assert!(matches!(
            Template::compile("a %x:1%"),
            Err(TemplateError::BadValue(_))
        ));
        assert!(matches!(
            Template::compile("a $ns"),
            Err(TemplateError::Unclosed('$'))
        ));
    }
}
