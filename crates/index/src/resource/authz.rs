//! Linkerd's inbound policy resources (`policy.linkerd.io`): `Server`,
//! `AuthorizationPolicy`, `MeshTLSAuthentication`, `NetworkAuthentication`,
//! and the Namespace annotation naming a default inbound policy.

use super::{meta::null_as_default, InvalidObject, Labels, ObjectKey, ObjectMetaWire};
use serde::Deserialize;
use std::{collections::BTreeMap, fmt, net::IpAddr, str::FromStr, sync::Arc};

/// Annotation (on a pod or its namespace) naming the default inbound policy.
pub const DEFAULT_INBOUND_POLICY_ANNOTATION: &str = "config.linkerd.io/default-inbound-policy";
/// Bounds on one object's lists, so one object cannot make answers large.
pub const MAX_SELECTOR_TERMS: usize = 32;
pub const MAX_AUTHN_REFS: usize = 32;
pub const MAX_IDENTITIES: usize = 256;
pub const MAX_NETWORKS: usize = 256;

/// Linkerd's default inbound policies.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum DefaultPolicy {
    AllUnauthenticated,
    AllAuthenticated,
    ClusterUnauthenticated,
    ClusterAuthenticated,
    Deny,
    Audit,
}

impl DefaultPolicy {
    pub const ALL: [DefaultPolicy; 6] = [
        DefaultPolicy::AllUnauthenticated,
        DefaultPolicy::AllAuthenticated,
        DefaultPolicy::ClusterUnauthenticated,
        DefaultPolicy::ClusterAuthenticated,
        DefaultPolicy::Deny,
        DefaultPolicy::Audit,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DefaultPolicy::AllUnauthenticated => "all-unauthenticated",
            DefaultPolicy::AllAuthenticated => "all-authenticated",
            DefaultPolicy::ClusterUnauthenticated => "cluster-unauthenticated",
            DefaultPolicy::ClusterAuthenticated => "cluster-authenticated",
            DefaultPolicy::Deny => "deny",
            DefaultPolicy::Audit => "audit",
        }
    }
}

impl fmt::Display for DefaultPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for DefaultPolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        DefaultPolicy::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| {
                format!(
                    "{s:?} is not a default policy (one of: {})",
                    DefaultPolicy::ALL.map(|p| p.as_str()).join(", ")
                )
            })
    }
}

/// An IP network in CIDR form.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IpNet {
    pub addr: IpAddr,
    pub prefix_len: u8,
}

impl IpNet {
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix_len))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix_len))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }

    pub fn all_v4() -> IpNet {
        IpNet {
            addr: IpAddr::from([0u8; 4]),
            prefix_len: 0,
        }
    }

    pub fn all_v6() -> IpNet {
        IpNet {
            addr: IpAddr::from([0u8; 16]),
            prefix_len: 0,
        }
    }
}

impl FromStr for IpNet {
    type Err = String;

    /// `10.0.0.0/8`, `fd00::/8`, or a bare address (a host network).
    fn from_str(s: &str) -> Result<Self, String> {
        let (addr, len) = match s.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (s, None),
        };
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| format!("{s:?} is not a CIDR network"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix_len = match len {
            None => max,
            Some(l) => l
                .parse::<u8>()
                .ok()
                .filter(|l| *l <= max)
                .ok_or_else(|| format!("{s:?}: prefix length is not in 0..={max}"))?,
        };
        Ok(IpNet { addr, prefix_len })
    }
}

impl fmt::Display for IpNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix_len)
    }
}

/// Kubernetes' label selector.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct LabelSelector {
    pub match_labels: Labels,
    pub expressions: Vec<SelectorExpression>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SelectorExpression {
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

impl LabelSelector {
    pub fn matches(&self, labels: &Labels) -> bool {
        self.match_labels.is_subset_of(labels)
            && self.expressions.iter().all(|e| match e {
                SelectorExpression::In(k, vs) => {
                    labels.get(k).is_some_and(|v| vs.iter().any(|x| x == v))
                }
                SelectorExpression::NotIn(k, vs) => {
                    labels.get(k).is_none_or(|v| vs.iter().all(|x| x != v))
                }
                SelectorExpression::Exists(k) => labels.contains_key(k),
                SelectorExpression::DoesNotExist(k) => !labels.contains_key(k),
            })
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ServerProtocol {
    Unknown,
    Http1,
    Http2,
    Grpc,
    Opaque,
    Tls,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServerPort {
    Number(u16),
    Name(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Server {
    pub key: ObjectKey,
    pub creation_timestamp: Option<String>,
    pub selector: LabelSelector,
    pub port: ServerPort,
    pub protocol: ServerProtocol,
    /// `accessPolicy` (v1beta3): the default for clients no policy names.
    pub access_policy: Option<DefaultPolicy>,
}

/// What an AuthorizationPolicy applies to.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AuthzTarget {
    Server(Arc<str>),
    /// An HTTPRoute (either group) or GRPCRoute attached to a Server.
    Route(Arc<str>),
    /// Every Server in the policy's namespace.
    Namespace,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AuthnRef {
    MeshTls(ObjectKey),
    Network(ObjectKey),
    ServiceAccount(ObjectKey),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthorizationPolicy {
    pub key: ObjectKey,
    pub target: AuthzTarget,
    pub required: Vec<AuthnRef>,
}

/// A client identity a MeshTLSAuthentication accepts.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IdentityMatch {
    /// `*`: any authenticated client.
    Any,
    Exact(String),
    /// `*.ns.serviceaccount.identity...`: the suffix after `*.`.
    Suffix(String),
    /// Every service account of a namespace, resolved with the trust domain.
    ServiceAccount(ObjectKey),
    Namespace(Arc<str>),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MeshTlsAuthentication {
    pub key: ObjectKey,
    pub identities: Vec<IdentityMatch>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Network {
    pub net: IpNet,
    pub except: Vec<IpNet>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetworkAuthentication {
    pub key: ObjectKey,
    pub networks: Vec<Network>,
}

/// A namespace: only its default inbound policy annotation is kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Namespace {
    /// `("", name)`: see [`namespace_key`].
    pub key: ObjectKey,
    pub default_policy: Option<DefaultPolicy>,
}

// === wire ===

#[derive(Deserialize, Clone, Debug, Default)]
#[serde(rename_all = "camelCase")]
struct SelectorWire {
    #[serde(default, deserialize_with = "null_as_default")]
    match_labels: BTreeMap<String, String>,
    #[serde(default, deserialize_with = "null_as_default")]
    match_expressions: Vec<ExpressionWire>,
}

#[derive(Deserialize, Clone, Debug, Default)]
struct ExpressionWire {
    #[serde(default)]
    key: String,
    #[serde(default)]
    operator: String,
    #[serde(default, deserialize_with = "null_as_default")]
    values: Vec<String>,
}

fn selector(field: &str, w: SelectorWire) -> Result<LabelSelector, InvalidObject> {
    if w.match_labels.len() + w.match_expressions.len() > MAX_SELECTOR_TERMS {
        return Err(InvalidObject::invalid(
            field,
            format!("more than {MAX_SELECTOR_TERMS} terms"),
        ));
    }
    let expressions = w
        .match_expressions
        .into_iter()
        .enumerate()
        .map(|(i, e)| {
            let f = format!("{field}.matchExpressions[{i}]");
            if e.key.is_empty() {
                return Err(InvalidObject::missing(format!("{f}.key")));
            }
            Ok(match e.operator.as_str() {
                "In" => SelectorExpression::In(e.key, e.values),
                "NotIn" => SelectorExpression::NotIn(e.key, e.values),
                "Exists" => SelectorExpression::Exists(e.key),
                "DoesNotExist" => SelectorExpression::DoesNotExist(e.key),
                other => {
                    return Err(InvalidObject::invalid(
                        format!("{f}.operator"),
                        format!("unknown operator {other:?}"),
                    ))
                }
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(LabelSelector {
        match_labels: w.match_labels.into(),
        expressions,
    })
}

#[derive(Deserialize, Clone, Debug)]
#[serde(rename_all = "camelCase")]
pub struct ServerWire {
    #[serde(default)]
    pub metadata: ObjectMetaWire,
    #[serde(default)]
    spec: ServerSpecWire,
}

#[derive(Deserialize, Clone, Debug, Default)]
#[serde(rename_all = "camelCase")]
struct ServerSpecWire {
    pod_selector: Option<SelectorWire>,
    port: Option<serde_json::Value>,
    proxy_protocol: Option<String>,
    access_policy: Option<String>,
}

impl TryFrom<ServerWire> for Server {
    type Error = InvalidObject;

    fn try_from(w: ServerWire) -> Result<Server, InvalidObject> {
        let key = w.metadata.key()?;
        let spec = w.spec;
        let selector = selector(
            "spec.podSelector",
            spec.pod_selector
                .ok_or_else(|| InvalidObject::missing("spec.podSelector"))?,
        )?;
        let port = match spec.port {
            None => return Err(InvalidObject::missing("spec.port")),
            Some(serde_json::Value::Number(n)) => ServerPort::Number(
                n.as_u64()
                    .and_then(|n| u16::try_from(n).ok())
                    .filter(|n| *n != 0)
                    .ok_or_else(|| {
                        InvalidObject::invalid("spec.port", format!("{n} is not a port"))
                    })?,
            ),
            Some(serde_json::Value::String(s)) if !s.is_empty() && s.len() <= 15 => {
                match s.parse::<u16>() {
                    Ok(n) if n != 0 => ServerPort::Number(n),
                    _ => ServerPort::Name(s),
                }
            }
            Some(_) => {
                return Err(InvalidObject::invalid(
                    "spec.port",
                    "expected a port number or name",
                ))
            }
        };
        let protocol = match spec.proxy_protocol.as_deref().unwrap_or("unknown") {
            "unknown" => ServerProtocol::Unknown,
            "HTTP/1" => ServerProtocol::Http1,
            "HTTP/2" => ServerProtocol::Http2,
            "gRPC" => ServerProtocol::Grpc,
            "opaque" => ServerProtocol::Opaque,
            "TLS" => ServerProtocol::Tls,
            other => {
                return Err(InvalidObject::invalid(
                    "spec.proxyProtocol",
                    format!("unknown protocol {other:?}"),
                ))
            }
        };
        let access_policy = spec
            .access_policy
            .map(|p| {
                p.parse()
                    .map_err(|e| InvalidObject::invalid("spec.accessPolicy", e))
            })
            .transpose()?;
        Ok(Server {
            key,
            creation_timestamp: w.metadata.creation_timestamp,
            selector,
            port,
            protocol,
            access_policy,
        })
    }
}

#[derive(Deserialize, Clone, Debug, Default)]
#[serde(rename_all = "camelCase")]
struct RefWire {
    group: Option<String>,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    name: String,
    namespace: Option<String>,
}

impl RefWire {
    fn namespace_or(&self, ns: &Arc<str>) -> Arc<str> {
        match &self.namespace {
            Some(n) if !n.is_empty() => n.as_str().into(),
            _ => ns.clone(),
        }
    }
}

#[derive(Deserialize, Clone, Debug)]
#[serde(rename_all = "camelCase")]
pub struct AuthorizationPolicyWire {
    #[serde(default)]
    pub metadata: ObjectMetaWire,
    #[serde(default)]
    spec: AuthorizationPolicySpecWire,
}

#[derive(Deserialize, Clone, Debug, Default)]
#[serde(rename_all = "camelCase")]
struct AuthorizationPolicySpecWire {
    target_ref: Option<RefWire>,
    #[serde(default, deserialize_with = "null_as_default")]
    required_authentication_refs: Vec<RefWire>,
}

impl TryFrom<AuthorizationPolicyWire> for AuthorizationPolicy {
    type Error = InvalidObject;

    fn try_from(w: AuthorizationPolicyWire) -> Result<AuthorizationPolicy, InvalidObject> {
        let key = w.metadata.key()?;
        let t = w
            .spec
            .target_ref
            .ok_or_else(|| InvalidObject::missing("spec.targetRef"))?;
        let group = t.group.as_deref().unwrap_or("");
        let target = match (group, t.kind.as_str()) {
            ("policy.linkerd.io", "Server") => AuthzTarget::Server(t.name.as_str().into()),
            ("policy.linkerd.io" | "gateway.networking.k8s.io", "HTTPRoute")
            | ("gateway.networking.k8s.io", "GRPCRoute") => {
                AuthzTarget::Route(t.name.as_str().into())
            }
            ("" | "core", "Namespace") => {
                if !t.name.is_empty() && *t.name != *key.namespace {
                    return Err(InvalidObject::invalid(
                        "spec.targetRef.name",
                        "a policy may target only its own namespace",
                    ));
                }
                AuthzTarget::Namespace
            }
            (g, k) => {
                return Err(InvalidObject::invalid(
                    "spec.targetRef",
                    format!("cannot target {g}/{k}"),
                ))
            }
        };
        if t.name.is_empty() && target != AuthzTarget::Namespace {
            return Err(InvalidObject::missing("spec.targetRef.name"));
        }
        if w.spec.required_authentication_refs.len() > MAX_AUTHN_REFS {
            return Err(InvalidObject::invalid(
                "spec.requiredAuthenticationRefs",
                format!("more than {MAX_AUTHN_REFS} references"),
            ));
        }
        let required = w
            .spec
            .required_authentication_refs
            .into_iter()
            .enumerate()
            .map(|(i, r)| {
                let f = format!("spec.requiredAuthenticationRefs[{i}]");
                if r.name.is_empty() {
                    return Err(InvalidObject::missing(format!("{f}.name")));
                }
                let ref_key = ObjectKey::new(r.namespace_or(&key.namespace), r.name.as_str());
                Ok(match (r.group.as_deref().unwrap_or(""), r.kind.as_str()) {
                    ("policy.linkerd.io", "MeshTLSAuthentication") => AuthnRef::MeshTls(ref_key),
                    ("policy.linkerd.io", "NetworkAuthentication") => AuthnRef::Network(ref_key),
                    ("" | "core", "ServiceAccount") => AuthnRef::ServiceAccount(ref_key),
                    (g, k) => {
                        return Err(InvalidObject::invalid(
                            f,
                            format!("{g}/{k} is not an authentication kind"),
                        ))
                    }
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(AuthorizationPolicy {
            key,
            target,
            required,
        })
    }
}

#[derive(Deserialize, Clone, Debug)]
#[serde(rename_all = "camelCase")]
pub struct MeshTlsAuthenticationWire {
    #[serde(default)]
    pub metadata: ObjectMetaWire,
    #[serde(default)]
    spec: MeshTlsSpecWire,
}

#[derive(Deserialize, Clone, Debug, Default)]
#[serde(rename_all = "camelCase")]
struct MeshTlsSpecWire {
    #[serde(default, deserialize_with = "null_as_default")]
    identities: Vec<String>,
    #[serde(default, deserialize_with = "null_as_default")]
    identity_refs: Vec<RefWire>,
}

impl TryFrom<MeshTlsAuthenticationWire> for MeshTlsAuthentication {
    type Error = InvalidObject;

    fn try_from(w: MeshTlsAuthenticationWire) -> Result<Self, InvalidObject> {
        let key = w.metadata.key()?;
        let spec = w.spec;
        if spec.identities.len() + spec.identity_refs.len() > MAX_IDENTITIES {
            return Err(InvalidObject::invalid(
                "spec.identities",
                format!("more than {MAX_IDENTITIES} identities"),
            ));
        }
        if spec.identities.is_empty() && spec.identity_refs.is_empty() {
            return Err(InvalidObject::missing("spec.identities"));
        }
        let mut identities = Vec::new();
        for (i, id) in spec.identities.into_iter().enumerate() {
            let f = format!("spec.identities[{i}]");
            if id.is_empty() || id.len() > 253 {
                return Err(InvalidObject::invalid(f, "not an identity name"));
            }
            identities.push(if id == "*" {
                IdentityMatch::Any
            } else if let Some(suffix) = id.strip_prefix("*.") {
                IdentityMatch::Suffix(suffix.to_string())
            } else if id.contains('*') {
                return Err(InvalidObject::invalid(
                    f,
                    "a wildcard may only lead, as *.suffix",
                ));
            } else {
                IdentityMatch::Exact(id)
            });
        }
        for (i, r) in spec.identity_refs.into_iter().enumerate() {
            let f = format!("spec.identityRefs[{i}]");
            identities.push(match (r.group.as_deref().unwrap_or(""), r.kind.as_str()) {
                ("" | "core", "ServiceAccount") if r.name == "*" || r.name.is_empty() => {
                    IdentityMatch::Namespace(r.namespace_or(&key.namespace))
                }
                ("" | "core", "ServiceAccount") => IdentityMatch::ServiceAccount(ObjectKey::new(
                    r.namespace_or(&key.namespace),
                    r.name.as_str(),
                )),
                ("" | "core", "Namespace") if r.name.is_empty() || r.name == "*" => {
                    IdentityMatch::Any
                }
                ("" | "core", "Namespace") => IdentityMatch::Namespace(r.name.as_str().into()),
                (g, k) => {
                    return Err(InvalidObject::invalid(
                        f,
                        format!("{g}/{k} is not ServiceAccount or Namespace"),
                    ))
                }
            });
        }
        Ok(MeshTlsAuthentication { key, identities })
    }
}

#[derive(Deserialize, Clone, Debug)]
#[serde(rename_all = "camelCase")]
pub struct NetworkAuthenticationWire {
    #[serde(default)]
    pub metadata: ObjectMetaWire,
    #[serde(default)]
    spec: NetworkSpecWire,
}

#[derive(Deserialize, Clone, Debug, Default)]
#[serde(rename_all = "camelCase")]
struct NetworkSpecWire {
    #[serde(default, deserialize_with = "null_as_default")]
    networks: Vec<NetworkWire>,
}

#[derive(Deserialize, Clone, Debug, Default)]
#[serde(rename_all = "camelCase")]
struct NetworkWire {
    #[serde(default)]
    cidr: String,
    #[serde(default, deserialize_with = "null_as_default")]
    except: Vec<String>,
}

impl TryFrom<NetworkAuthenticationWire> for NetworkAuthentication {
    type Error = InvalidObject;

    fn try_from(w: NetworkAuthenticationWire) -> Result<Self, InvalidObject> {
        let key = w.metadata.key()?;
        let spec = w.spec;
        if spec.networks.is_empty() {
            return Err(InvalidObject::missing("spec.networks"));
        }
        let total: usize = spec.networks.iter().map(|n| 1 + n.except.len()).sum();
        if total > MAX_NETWORKS {
            return Err(InvalidObject::invalid(
                "spec.networks",
                format!("more than {MAX_NETWORKS} networks"),
            ));
        }
        let networks = spec
            .networks
            .into_iter()
            .enumerate()
            .map(|(i, n)| {
                let f = format!("spec.networks[{i}]");
                let net = n
                    .cidr
                    .parse()
                    .map_err(|e| InvalidObject::invalid(format!("{f}.cidr"), e))?;
                let except = n
                    .except
                    .iter()
                    .enumerate()
                    .map(|(j, e)| {
                        e.parse()
                            .map_err(|r| InvalidObject::invalid(format!("{f}.except[{j}]"), r))
                    })
                    .collect::<Result<_, _>>()?;
                Ok(Network { net, except })
            })
            .collect::<Result<_, _>>()?;
        Ok(NetworkAuthentication { key, networks })
    }
}

#[derive(Deserialize, Clone, Debug)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceWire {
    #[serde(default)]
    pub metadata: ObjectMetaWire,
}

impl TryFrom<NamespaceWire> for Namespace {
    type Error = InvalidObject;

    fn try_from(mut w: NamespaceWire) -> Result<Self, InvalidObject> {
        let key = match w.metadata.name.as_deref() {
            Some(n) if !n.is_empty() => namespace_key(n),
            _ => return Err(InvalidObject::missing("metadata.name")),
        };
        let annotations = w.metadata.take_used_annotations();
        let default_policy = annotations
            .get(DEFAULT_INBOUND_POLICY_ANNOTATION)
            .map(|p| {
                p.parse().map_err(|e| {
                    InvalidObject::invalid(
                        format!("metadata.annotations[{DEFAULT_INBOUND_POLICY_ANNOTATION}]"),
                        e,
                    )
                })
            })
            .transpose()?;
        Ok(Namespace {
            key,
            default_policy,
        })
    }
}

/// The key a namespace is filed under (namespaces have no namespace).
pub fn namespace_key(name: &str) -> ObjectKey {
    ObjectKey::new("", name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn networks_contain_what_their_prefix_covers() {
        let net: IpNet = "10.1.0.0/16".parse().unwrap();
        assert!(net.contains("10.1.2.3".parse().unwrap()));
        assert!(!net.contains("10.2.0.1".parse().unwrap()));
        assert!(!net.contains("::1".parse().unwrap()));
        assert!(IpNet::all_v4().contains("1.2.3.4".parse().unwrap()));
        assert!(IpNet::all_v6().contains("fd00::1".parse().unwrap()));
        let host: IpNet = "192.168.1.1".parse().unwrap();
        assert_eq!(host.prefix_len, 32);
        assert!("10.0.0.0/33".parse::<IpNet>().is_err());
        assert!("ten/8".parse::<IpNet>().is_err());
    }

    #[test]
    fn selectors_match_labels_and_expressions() {
        let s = selector(
            "s",
            serde_json::from_value(json!({
                "matchLabels": {"app": "web"},
                "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]},
                                     {"key": "canary", "operator": "DoesNotExist"}]
            }))
            .unwrap(),
        )
        .unwrap();
        let labels = |v: serde_json::Value| -> Labels {
            serde_json::from_value::<BTreeMap<String, String>>(v)
                .unwrap()
                .into()
        };
        assert!(s.matches(&labels(json!({"app": "web", "tier": "a"}))));
        assert!(!s.matches(&labels(json!({"app": "web", "tier": "c"}))));
        assert!(!s.matches(&labels(json!({"app": "web", "tier": "a", "canary": "1"}))));
        assert!(!s.matches(&labels(json!({"tier": "a"}))));
    }

    #[test]
    fn policy_objects_decode_and_name_their_faults() {
        let ap: AuthorizationPolicyWire = serde_json::from_value(json!({
            "metadata": {"name": "allow-a", "namespace": "ns"},
            "spec": {"targetRef": {"group": "policy.linkerd.io", "kind": "Server", "name": "web"},
                     "requiredAuthenticationRefs": [
                        {"group": "policy.linkerd.io", "kind": "MeshTLSAuthentication", "name": "a"},
                        {"kind": "ServiceAccount", "name": "client", "namespace": "other"}]}
        }))
        .unwrap();
        let ap = AuthorizationPolicy::try_from(ap).unwrap();
        assert_eq!(ap.target, AuthzTarget::Server("web".into()));
        assert_eq!(
            ap.required,
            [
                AuthnRef::MeshTls(ObjectKey::new("ns", "a")),
                AuthnRef::ServiceAccount(ObjectKey::new("other", "client"))
            ]
        );
        let bad: AuthorizationPolicyWire = serde_json::from_value(json!({
            "metadata": {"name": "x", "namespace": "ns"},
            "spec": {"targetRef": {"group": "apps", "kind": "Deployment", "name": "web"}}
        }))
        .unwrap();
        assert_eq!(
            AuthorizationPolicy::try_from(bad).unwrap_err().field,
            "spec.targetRef"
        );

        let m: MeshTlsAuthenticationWire = serde_json::from_value(json!({
            "metadata": {"name": "a", "namespace": "ns"},
            "spec": {"identities": ["*", "*.ns.serviceaccount.identity.linkerd.cluster.local", "a.b"]}
        }))
        .unwrap();
        let m = MeshTlsAuthentication::try_from(m).unwrap();
        assert_eq!(m.identities[0], IdentityMatch::Any);
        assert!(matches!(&m.identities[1], IdentityMatch::Suffix(s) if s.starts_with("ns.")));

        let n: NetworkAuthenticationWire = serde_json::from_value(json!({
            "metadata": {"name": "n", "namespace": "ns"},
            "spec": {"networks": [{"cidr": "10.0.0.0/8", "except": ["10.9.0.0/16", "bogus"]}]}
        }))
        .unwrap();
        assert_eq!(
            NetworkAuthentication::try_from(n).unwrap_err().field,
            "spec.networks[0].except[1]"
        );

        let s: ServerWire = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "ns"},
            "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "port": "http", "proxyProtocol": "HTTP/1"}
        }))
        .unwrap();
        let s = Server::try_from(s).unwrap();
        assert_eq!(s.port, ServerPort::Name("http".into()));
        assert_eq!(s.protocol, ServerProtocol::Http1);
        let s: ServerWire = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "ns"},
            "spec": {"podSelector": {}, "port": 8080, "proxyProtocol": "SMTP"}
        }))
        .unwrap();
        assert_eq!(Server::try_from(s).unwrap_err().field, "spec.proxyProtocol");
    }
}
