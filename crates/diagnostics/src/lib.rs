//! `ballast diagnostics`: ask a destination controller what it answers, and
//! print it for people (a table) or programs (JSON). A client only: it
//! shares no code with the controller, just the API and
//! `ballast_controlplane::destination_api`.

#![forbid(unsafe_code)]

use ballast_controlplane::destination_api::{self as api, MAX_ADDRS_PER_UPDATE};
use linkerd2_proxy_api::{
    destination::{
        destination_client::DestinationClient, protocol_hint, tls_identity, update,
        DestinationProfile, GetDestination, WeightedAddr,
    },
    net::TcpAddress,
};
use serde_json::{json, Value};
use std::{net::IpAddr, time::Duration};

#[derive(Debug, thiserror::Error)]
pub enum DiagnosticsError {
    #[error("cannot reach the destination controller at {addr}: {reason}; is `ballast destination` running there? (see --destination)")]
    Connect { addr: String, reason: String },
    #[error("the controller answered {code:?}: {message}")]
    Status { code: tonic::Code, message: String },
    #[error("{addr} did not answer as a gRPC server ({detail}); is --destination the controller's gRPC address (`ballast destination --addr`, default 127.0.0.1:8086) rather than, say, its admin port?")]
    NotGrpc { addr: String, detail: String },
    #[error("no answer from the controller within {0:?}")]
    Timeout(Duration),
    #[error("the controller closed the stream without an answer")]
    Closed,
}

impl DiagnosticsError {
    /// A failed call to the server at `addr`: a gRPC status, or, when the
    /// connection itself failed after it was opened (tonic reports that as
    /// `Unknown: transport error`) or the answer was HTTP but not gRPC, that
    /// `addr` is not a gRPC server.
    fn from_status(addr: &str, status: tonic::Status) -> Self {
        let transport =
            chain(&status).any(|e| e.downcast_ref::<tonic::transport::Error>().is_some());
        if transport {
            return DiagnosticsError::NotGrpc {
                addr: addr.to_string(),
                detail: innermost(&status),
            };
        }
        if status.message().starts_with("grpc-status header missing") {
            return DiagnosticsError::NotGrpc {
                addr: addr.to_string(),
                detail: status.message().chars().take(300).collect(),
            };
        }
        DiagnosticsError::Status {
            code: status.code(),
            message: status.message().chars().take(300).collect(),
        }
    }
}

/// `error`'s sources, outermost first (not `error` itself).
fn chain<'a>(
    error: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::successors(error.source(), |e| e.source())
}

/// The deepest cause's text, on one line: the outer errors of tonic and
/// hyper only wrap it ("transport error", "tcp connect error").
fn innermost(error: &(dyn std::error::Error + 'static)) -> String {
    let text = chain(error)
        .last()
        .map(|e| e.to_string())
        .unwrap_or_else(|| error.to_string());
    let mut line: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    line.truncate(line.char_indices().nth(300).map_or(line.len(), |(i, _)| i));
    line
}

/// What `diagnostics` was given where an authority belongs: a URL (a
/// scheme, or a path after the authority). Linkerd's `diagnostics` takes
/// authorities too; the suggestion is the authority inside.
#[derive(Debug, thiserror::Error)]
#[error("expected an authority NAME.NS[:PORT], NAME.NS.svc.CLUSTER_DOMAIN:PORT or IP:PORT, not a URL: try `{suggestion}`")]
pub struct NotAnAuthority {
    pub suggestion: String,
}

/// `given` if it is an authority (the controller judges the rest); a URL is
/// refused with the authority it holds as the suggestion.
pub fn authority(given: &str) -> Result<String, NotAnAuthority> {
    let rest = match given.split_once("://") {
        Some((_, rest)) => rest,
        None if given.contains(['/', '?', '#']) => given,
        None => return Ok(given.to_string()),
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let inner = &rest[..end];
    // Userinfo (`user@host`) has no place in an authority asked about.
    let inner = inner.rsplit_once('@').map_or(inner, |(_, host)| host);
    Err(NotAnAuthority {
        suggestion: inner
            .chars()
            .filter(|c| !c.is_control())
            .take(300)
            .collect(),
    })
}

/// What `Get` answered first: the endpoint set, or that there is none.
#[derive(Debug)]
pub enum EndpointsAnswer {
    Endpoints(Vec<(std::collections::HashMap<String, String>, WeightedAddr)>),
    NoEndpoints { exists: bool },
}

async fn connect(
    addr: &str,
    timeout: Duration,
) -> Result<DestinationClient<tonic::transport::Channel>, DiagnosticsError> {
    // Answers are bounded by the server; this caps what we accept regardless.
    Ok(DestinationClient::new(channel(addr, timeout).await?)
        .max_decoding_message_size(MAX_ANSWER_BYTES))
}

/// The most a diagnostics answer may be.
const MAX_ANSWER_BYTES: usize = 16 * 1024 * 1024;

async fn channel(
    addr: &str,
    timeout: Duration,
) -> Result<tonic::transport::Channel, DiagnosticsError> {
    let uri = if addr.contains("://") {
        addr.to_string()
    } else {
        format!("http://{addr}")
    };
    let endpoint =
        tonic::transport::Endpoint::from_shared(uri).map_err(|e| DiagnosticsError::Connect {
            addr: addr.to_string(),
            reason: e.to_string(),
        })?;
    // A controller that is still starting refuses connections: try again
    // until the timeout, so that a script can start one and query it.
    let deadline = tokio::time::Instant::now() + timeout;
    let mut pause = Duration::from_millis(20);
    let channel = loop {
        match endpoint.clone().connect_timeout(timeout).connect().await {
            Ok(channel) => break channel,
            Err(e) if tokio::time::Instant::now() + pause < deadline => {
                tracing::debug!(error = %e, "controller not reachable yet; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(500));
            }
            Err(e) => {
                return Err(DiagnosticsError::Connect {
                    addr: addr.to_string(),
                    reason: innermost(&e),
                })
            }
        }
    };
    Ok(channel)
}

/// The outbound policy the controller answers for `authority`
/// (`OutboundPolicies.Get`, as a client proxy in `namespace` asks it).
pub async fn outbound_policy(
    destination: &str,
    authority: &str,
    namespace: &str,
    timeout: Duration,
) -> Result<linkerd2_proxy_api::outbound::OutboundPolicy, DiagnosticsError> {
    use linkerd2_proxy_api::outbound::{
        outbound_policies_client::OutboundPoliciesClient, traffic_spec, TrafficSpec,
    };
    let mut client = OutboundPoliciesClient::new(channel(destination, timeout).await?)
        .max_decoding_message_size(MAX_ANSWER_BYTES);
    let spec = TrafficSpec {
        source_workload: json!({"ns": namespace, "pod": "ballast-diagnostics"}).to_string(),
        target: Some(traffic_spec::Target::Authority(authority.to_string())),
    };
    let answer = within(destination, timeout, client.get(spec)).await?;
    Ok(answer.into_inner())
}

/// The inbound policy the controller answers for `port` of pod
/// `namespace/pod` (`InboundServerPolicies.GetPort`, as that pod's proxy asks it).
pub async fn inbound_policy(
    destination: &str,
    namespace: &str,
    pod: &str,
    port: u16,
    timeout: Duration,
) -> Result<linkerd2_proxy_api::inbound::Server, DiagnosticsError> {
    use linkerd2_proxy_api::inbound::{
        inbound_server_policies_client::InboundServerPoliciesClient, PortSpec,
    };
    let mut client = InboundServerPoliciesClient::new(channel(destination, timeout).await?)
        .max_decoding_message_size(MAX_ANSWER_BYTES);
    let spec = PortSpec {
        workload: json!({"ns": namespace, "pod": pod}).to_string(),
        port: u32::from(port),
    };
    let answer = within(destination, timeout, client.get_port(spec)).await?;
    Ok(answer.into_inner())
}

fn request(authority: &str) -> GetDestination {
    GetDestination {
        scheme: "k8s".into(),
        path: authority.to_string(),
        context_token: String::new(),
    }
}

/// `fut`, or a timeout error once `limit` has passed; `addr` is the server
/// asked, named when it does not speak gRPC.
async fn within<T>(
    addr: &str,
    limit: Duration,
    fut: impl std::future::Future<Output = Result<T, tonic::Status>>,
) -> Result<T, DiagnosticsError> {
    tokio::time::timeout(limit, fut)
        .await
        .map_err(|_| DiagnosticsError::Timeout(limit))?
        .map_err(|s| DiagnosticsError::from_status(addr, s))
}

/// How long to wait for the rest of an initial answer the server split over
/// several messages (they are sent back to back).
const REST_OF_ANSWER: Duration = Duration::from_millis(250);

/// The first answer of `Get(authority)`: the initial set, which the server may
/// split over several messages of [`MAX_ADDRS_PER_UPDATE`] addresses.
pub async fn endpoints(
    destination: &str,
    authority: &str,
    timeout: Duration,
) -> Result<EndpointsAnswer, DiagnosticsError> {
    let mut client = connect(destination, timeout).await?;
    let mut stream = within(destination, timeout, client.get(request(authority)))
        .await?
        .into_inner();
    let mut out = Vec::new();
    let mut wait = timeout;
    loop {
        let msg = match tokio::time::timeout(wait, stream.message()).await {
            Ok(msg) => msg.map_err(|s| DiagnosticsError::from_status(destination, s))?,
            Err(_) if !out.is_empty() => return Ok(EndpointsAnswer::Endpoints(out)),
            Err(_) => return Err(DiagnosticsError::Timeout(timeout)),
        };
        let Some(msg) = msg else {
            if out.is_empty() {
                return Err(DiagnosticsError::Closed);
            }
            return Ok(EndpointsAnswer::Endpoints(out));
        };
        match msg.update {
            Some(update::Update::Add(set)) => {
                let full = set.addrs.len() == MAX_ADDRS_PER_UPDATE;
                out.extend(
                    set.addrs
                        .into_iter()
                        .map(|a| (set.metric_labels.clone(), a)),
                );
                if !full {
                    return Ok(EndpointsAnswer::Endpoints(out));
                }
                wait = REST_OF_ANSWER;
            }
            Some(update::Update::NoEndpoints(n)) if out.is_empty() => {
                return Ok(EndpointsAnswer::NoEndpoints { exists: n.exists })
            }
            _ => return Ok(EndpointsAnswer::Endpoints(out)),
        }
    }
}

/// What kind of profile the controller answered: only the answer for an IP
/// carries its endpoint, and the default profile for a service without a
/// ServiceProfile is the same message whether the service exists or not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProfileKind {
    /// A service with a ServiceProfile (routes, overrides or its own retry budget).
    ServiceProfile,
    /// A known service without a ServiceProfile: the defaults.
    Defaults,
    /// No such service (yet): the defaults, which the controller answers
    /// for a name that may still appear.
    UnknownService,
    /// An IP address: a pod's or an unknown address's endpoint profile.
    Endpoint,
}

impl ProfileKind {
    fn name(self) -> &'static str {
        match self {
            ProfileKind::ServiceProfile => "service-profile",
            ProfileKind::Defaults => "defaults",
            ProfileKind::UnknownService => "unknown-service",
            ProfileKind::Endpoint => "endpoint",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            ProfileKind::ServiceProfile => "from the service's ServiceProfile",
            ProfileKind::Defaults => "defaults: no ServiceProfile or routes for this service",
            ProfileKind::UnknownService => {
                "defaults: no such service (the controller answers the default profile until it appears)"
            }
            ProfileKind::Endpoint => "an endpoint's profile (the authority is an address)",
        }
    }
}

/// The first answer of `GetProfile(authority)`, and what kind it is.
#[derive(Debug)]
pub struct ProfileAnswer {
    pub profile: DestinationProfile,
    pub kind: ProfileKind,
}

/// The first answer of `GetProfile(authority)`. For a service answered with
/// the defaults, `Get` is asked too: it says whether the service exists.
pub async fn profile(
    destination: &str,
    authority: &str,
    timeout: Duration,
) -> Result<ProfileAnswer, DiagnosticsError> {
    let mut client = connect(destination, timeout).await?;
    let mut stream = within(destination, timeout, client.get_profile(request(authority)))
        .await?
        .into_inner();
    let profile = within(destination, timeout, stream.message())
        .await?
        .ok_or(DiagnosticsError::Closed)?;
    let kind = if profile.endpoint.is_some() {
        ProfileKind::Endpoint
    } else if !is_default(&profile) {
        ProfileKind::ServiceProfile
    } else {
        match endpoints(destination, authority, timeout).await {
            Ok(EndpointsAnswer::NoEndpoints { exists: false }) => ProfileKind::UnknownService,
            _ => ProfileKind::Defaults,
        }
    };
    Ok(ProfileAnswer { profile, kind })
}

/// No routes, no overrides, the default retry budget: what the controller
/// answers for a service without a ServiceProfile.
fn is_default(p: &DestinationProfile) -> bool {
    p.routes.is_empty()
        && p.dst_overrides.is_empty()
        && p.retry_budget.as_ref().is_none_or(|b| {
            b.retry_ratio == api::DEFAULT_RETRY_RATIO
                && b.min_retries_per_second == api::DEFAULT_MIN_RETRIES_PER_SECOND
                && b.ttl.as_ref().is_some_and(|ttl| {
                    i64::try_from(api::DEFAULT_RETRY_TTL.as_secs()) == Ok(ttl.seconds)
                        && ttl.nanos == 0
                })
        })
}

/// An `f32` as JSON with its shortest decimal text (0.2, not the `f64`
/// widening's 0.20000000298023224).
fn json_f32(x: f32) -> Value {
    format!("{x}")
        .parse::<f64>()
        .ok()
        .and_then(serde_json::Number::from_f64)
        .map_or(Value::Null, Value::Number)
}

fn socket(addr: Option<&TcpAddress>) -> (String, u32) {
    let Some(a) = addr else {
        return ("-".into(), 0);
    };
    let ip =
        a.ip.and_then(|ip| IpAddr::try_from(ip).ok())
            .map(|ip| ip.to_string())
            .unwrap_or_else(|| "-".into());
    (ip, a.port)
}

fn identity(a: &WeightedAddr) -> Option<String> {
    match a.tls_identity.as_ref()?.strategy.as_ref()? {
        tls_identity::Strategy::DnsLikeIdentity(d) => Some(d.name.clone()),
        tls_identity::Strategy::UriLikeIdentity(u) => Some(u.uri.clone()),
    }
}

fn hint(a: &WeightedAddr) -> Option<String> {
    let h = a.protocol_hint.as_ref()?;
    let proto = match &h.protocol {
        Some(protocol_hint::Protocol::H2(_)) => "h2",
        Some(protocol_hint::Protocol::Opaque(_)) => "opaque",
        None => "-",
    };
    Some(match &h.opaque_transport {
        Some(t) => format!("{proto} (transport port {})", t.inbound_port),
        None => proto.to_string(),
    })
}

fn addr_json(
    set_labels: Option<&std::collections::HashMap<String, String>>,
    a: &WeightedAddr,
) -> Value {
    let (ip, port) = socket(a.addr.as_ref());
    let mut labels: std::collections::BTreeMap<&String, &String> = a.metric_labels.iter().collect();
    if let Some(set) = set_labels {
        labels.extend(set.iter());
    }
    json!({
        "ip": ip,
        "port": port,
        "weight": a.weight,
        "labels": labels,
        "identity": identity(a),
        "protocol_hint": hint(a),
    })
}

pub fn endpoints_json(answer: &EndpointsAnswer) -> Value {
    match answer {
        EndpointsAnswer::NoEndpoints { exists } => json!({"endpoints": [], "exists": exists}),
        EndpointsAnswer::Endpoints(list) => json!({
            "exists": true,
            "endpoints": list.iter().map(|(set, a)| addr_json(Some(set), a)).collect::<Vec<_>>(),
        }),
    }
}

/// `NAMESPACE IP PORT POD SERVICE`, as `linkerd diagnostics endpoints` prints.
pub fn endpoints_table(authority: &str, answer: &EndpointsAnswer) -> String {
    let list = match answer {
        EndpointsAnswer::NoEndpoints { exists: true } => {
            return format!("No endpoints found for {authority} (the service exists).\n")
        }
        EndpointsAnswer::NoEndpoints { exists: false } => {
            return format!("No endpoints found for {authority} (no such service).\n")
        }
        EndpointsAnswer::Endpoints(list) => list,
    };
    let mut rows = vec![[
        "NAMESPACE".to_string(),
        "IP".into(),
        "PORT".into(),
        "POD".into(),
        "SERVICE".into(),
        "IDENTITY".into(),
        "HINT".into(),
    ]];
    for (set, a) in list {
        let (ip, port) = socket(a.addr.as_ref());
        let label = |k: &str| {
            a.metric_labels
                .get(k)
                .or_else(|| set.get(k))
                .cloned()
                .unwrap_or_else(|| "-".into())
        };
        rows.push([
            label("namespace"),
            ip,
            port.to_string(),
            label("pod"),
            label("service"),
            identity(a).unwrap_or_else(|| "-".into()),
            hint(a).unwrap_or_else(|| "-".into()),
        ]);
    }
    table(&rows)
}

pub fn profile_json(answer: &ProfileAnswer) -> Value {
    let p = &answer.profile;
    json!({
        "profile": answer.kind.name(),
        "fully_qualified_name": p.fully_qualified_name,
        "opaque_protocol": p.opaque_protocol,
        "routes": p.routes.len(),
        "retry_budget": p.retry_budget.as_ref().map(|b| json!({
            "retry_ratio": json_f32(b.retry_ratio),
            "min_retries_per_second": b.min_retries_per_second,
            "ttl_seconds": b.ttl.as_ref().map(|t| t.seconds),
        })),
        "dst_overrides": p.dst_overrides.iter().map(|d| json!({"authority": d.authority, "weight": d.weight})).collect::<Vec<_>>(),
        "endpoint": p.endpoint.as_ref().map(|a| addr_json(None, a)),
    })
}

pub fn profile_table(answer: &ProfileAnswer) -> String {
    let p = &answer.profile;
    let or_dash = |s: &str| {
        if s.is_empty() {
            "-".to_string()
        } else {
            s.to_string()
        }
    };
    let mut rows = vec![
        ["FIELD".to_string(), "VALUE".to_string()],
        ["profile".into(), answer.kind.describe().into()],
        [
            "fully qualified name".into(),
            or_dash(&p.fully_qualified_name),
        ],
        ["opaque protocol".into(), p.opaque_protocol.to_string()],
        ["routes".into(), p.routes.len().to_string()],
    ];
    if let Some(b) = &p.retry_budget {
        rows.push([
            "retry budget".into(),
            format!(
                "ratio {}, min {}/s, ttl {}s",
                b.retry_ratio,
                b.min_retries_per_second,
                b.ttl.as_ref().map(|t| t.seconds).unwrap_or(0)
            ),
        ]);
    }
    if let Some(a) = &p.endpoint {
        let (ip, port) = socket(a.addr.as_ref());
        rows.push(["endpoint".into(), format!("{ip}:{port}")]);
        let mut labels: Vec<_> = a.metric_labels.iter().collect();
        labels.sort();
        for (k, v) in labels {
            rows.push([format!("endpoint label {k}"), v.clone()]);
        }
        rows.push([
            "endpoint identity".into(),
            identity(a).unwrap_or_else(|| "-".into()),
        ]);
        rows.push([
            "endpoint hint".into(),
            hint(a).unwrap_or_else(|| "-".into()),
        ]);
    }
    table(&rows)
}

fn table<const N: usize>(rows: &[[String; N]]) -> String {
    let mut widths = [0usize; N];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(line.join("   ").trim_end());
        out.push('\n');
    }
    out
}
