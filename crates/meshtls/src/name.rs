//! Linkerd's identity names. A workload's identity is its service account as
//! a DNS-like name, `SA.NS.serviceaccount.identity.CONTROL_NS.TRUST_DOMAIN`,
//! carried in certificates as a DNS SAN (and as the SPIFFE URI
//! `spiffe://TRUST_DOMAIN/ns/NS/sa/SA`).

use std::{fmt, sync::Arc};

/// Longest DNS name (RFC 1035).
pub const MAX_NAME_LEN: usize = 253;

/// A syntactically valid DNS-like identity name, lower case.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdentityName(Arc<str>);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("identity name is empty")]
    Empty,
    #[error("identity name is longer than {MAX_NAME_LEN} bytes")]
    TooLong,
    #[error("identity name has an empty label")]
    EmptyLabel,
    #[error("identity name has a label longer than 63 bytes")]
    LabelTooLong,
    #[error("identity name has a character other than a-z, 0-9, '-' or '.'")]
    BadCharacter,
    #[error("identity name has a label that starts or ends with '-'")]
    BadHyphen,
}

impl IdentityName {
    /// Parses a DNS-like name; upper case is folded, a trailing dot refused.
    pub fn parse(s: &str) -> Result<Self, NameError> {
        if s.is_empty() {
            return Err(NameError::Empty);
        }
        if s.len() > MAX_NAME_LEN {
            return Err(NameError::TooLong);
        }
        for label in s.split('.') {
            if label.is_empty() {
                return Err(NameError::EmptyLabel);
            }
            if label.len() > 63 {
                return Err(NameError::LabelTooLong);
            }
            if !label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            {
                return Err(NameError::BadCharacter);
            }
            if label.starts_with('-') || label.ends_with('-') {
                return Err(NameError::BadHyphen);
            }
        }
        Ok(Self(s.to_ascii_lowercase().into()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The identity of service account `sa` in namespace `ns`.
    pub fn for_service_account(
        sa: &str,
        ns: &str,
        control_ns: &str,
        trust_domain: &str,
    ) -> Result<Self, NameError> {
        Self::parse(&format!(
            "{sa}.{ns}.serviceaccount.identity.{control_ns}.{trust_domain}"
        ))
    }

    /// The service account and namespace this name stands for, when it has
    /// Linkerd's form under `control_ns` and `trust_domain`.
    pub fn service_account(&self, control_ns: &str, trust_domain: &str) -> Option<(&str, &str)> {
        let suffix_len =
            ".serviceaccount.identity.".len() + control_ns.len() + 1 + trust_domain.len();
        let s = self.as_str();
        let head = s.get(..s.len().checked_sub(suffix_len)?)?;
        let tail = &s[head.len()..];
        let expected = format!(".serviceaccount.identity.{control_ns}.{trust_domain}");
        if !tail.eq_ignore_ascii_case(&expected) {
            return None;
        }
        let (sa, ns) = head.split_once('.')?;
        (!ns.contains('.')).then_some((sa, ns))
    }

    /// Linkerd's SPIFFE URI for this name's service account.
    pub fn spiffe_uri(&self, control_ns: &str, trust_domain: &str) -> Option<String> {
        let (sa, ns) = self.service_account(control_ns, trust_domain)?;
        Some(format!("spiffe://{trust_domain}/ns/{ns}/sa/{sa}"))
    }
}

impl fmt::Display for IdentityName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for IdentityName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", &*self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_dns_like_names() {
        let n =
            IdentityName::parse("Default.Emojivoto.serviceaccount.identity.linkerd.cluster.local")
                .unwrap();
        assert_eq!(
            n.as_str(),
            "default.emojivoto.serviceaccount.identity.linkerd.cluster.local"
        );
        assert_eq!(IdentityName::parse(""), Err(NameError::Empty));
        assert_eq!(IdentityName::parse("a..b"), Err(NameError::EmptyLabel));
        assert_eq!(IdentityName::parse("a.b."), Err(NameError::EmptyLabel));
        assert_eq!(IdentityName::parse("a_b.c"), Err(NameError::BadCharacter));
        assert_eq!(IdentityName::parse("-a.c"), Err(NameError::BadHyphen));
        assert_eq!(
            IdentityName::parse(&"a".repeat(64)),
            Err(NameError::LabelTooLong)
        );
        assert_eq!(
            IdentityName::parse(&["a"; 130].join(".")),
            Err(NameError::TooLong)
        );
    }

    #[test]
    fn service_account_round_trips() {
        let n =
            IdentityName::for_service_account("web", "shop", "linkerd", "cluster.local").unwrap();
        assert_eq!(
            n.as_str(),
            "web.shop.serviceaccount.identity.linkerd.cluster.local"
        );
        assert_eq!(
            n.service_account("linkerd", "cluster.local"),
            Some(("web", "shop"))
        );
        assert_eq!(
            n.spiffe_uri("linkerd", "cluster.local").as_deref(),
            Some("spiffe://cluster.local/ns/shop/sa/web")
        );
        assert_eq!(n.service_account("ballast", "cluster.local"), None);
        assert_eq!(n.service_account("linkerd", "example.org"), None);
        let deep =
            IdentityName::parse("a.b.c.serviceaccount.identity.linkerd.cluster.local").unwrap();
        assert_eq!(deep.service_account("linkerd", "cluster.local"), None);
        let short = IdentityName::parse("serviceaccount.identity.linkerd.cluster.local").unwrap();
        assert_eq!(short.service_account("linkerd", "cluster.local"), None);
    }
}
