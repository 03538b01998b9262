//! The parts of a tap event, each bounded: authority and path cut to a
//! quarter of `--tap-max-event-bytes` each, extracted headers to half of it
//! (at most [`MAX_HEADERS`], values cut), label values to
//! [`MAX_LABEL_BYTES`]. Pure.

use crate::metrics::{DstLabels, TlsLabels};
use linkerd2_proxy_api::{
    http_types::{headers::Header, Headers, HttpMethod, Scheme},
    tap::tap_event::EndpointMeta,
};
use std::{collections::HashMap, sync::Arc};

/// Most headers extracted into one event.
pub const MAX_HEADERS: usize = 64;
/// Longest label value sent (Kubernetes names are at most 253 bytes).
pub const MAX_LABEL_BYTES: usize = 256;
/// Smallest `--tap-max-event-bytes`.
pub const MIN_EVENT_BYTES: usize = 256;

/// The size bounds of one event's variable parts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventLimits {
    pub authority: usize,
    pub path: usize,
    /// Names and values of all extracted headers together.
    pub headers: usize,
    /// One header's name or value.
    pub header_part: usize,
}

impl EventLimits {
    pub fn new(max_event_bytes: usize) -> Self {
        let b = max_event_bytes.max(MIN_EVENT_BYTES);
        Self {
            authority: b / 4,
            path: b / 4,
            headers: b / 2,
            header_part: b / 8,
        }
    }
}

/// `s` cut to at most `max` bytes, on a character boundary.
pub fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

fn cut_bytes(b: &[u8], max: usize) -> Vec<u8> {
    b[..b.len().min(max)].to_vec()
}

/// The request's method; an extension method's name is cut.
pub fn method(m: &http::Method, limits: &EventLimits) -> HttpMethod {
    let standard = [
        http::Method::GET,
        http::Method::POST,
        http::Method::PUT,
        http::Method::DELETE,
        http::Method::PATCH,
        http::Method::HEAD,
        http::Method::OPTIONS,
        http::Method::CONNECT,
        http::Method::TRACE,
    ];
    if standard.contains(m) {
        return m.clone().into();
    }
    HttpMethod {
        r#type: Some(
            linkerd2_proxy_api::http_types::http_method::Type::Unregistered(cut(
                m.as_str(),
                limits.header_part,
            )),
        ),
    }
}

pub fn scheme(s: &http::uri::Scheme) -> Scheme {
    Scheme::from(cut(s.as_str(), 16).as_str())
}

/// `pseudos` then `headers`, while they fit the header budget: values and
/// names cut to their bound, headers past the budget or [`MAX_HEADERS`]
/// left out.
pub fn headers<'a>(
    pseudos: impl IntoIterator<Item = (&'a str, &'a [u8])>,
    headers: &'a http::HeaderMap,
    limits: &EventLimits,
) -> Headers {
    let mut out = Vec::new();
    let mut left = limits.headers;
    let all = pseudos
        .into_iter()
        .chain(headers.iter().map(|(n, v)| (n.as_str(), v.as_bytes())));
    for (name, value) in all {
        if out.len() == MAX_HEADERS {
            break;
        }
        let name = cut(name, limits.header_part);
        let value = cut_bytes(value, limits.header_part);
        let size = name.len() + value.len();
        if size > left {
            break;
        }
        left -= size;
        out.push(Header { name, value });
    }
    Headers { headers: out }
}

/// A destination's labels, as Linkerd's tap events name them
/// (`namespace`, `service`, `pod`, `deployment`, ..., `serviceaccount`);
/// empty ones left out.
pub fn dst_labels(l: &DstLabels) -> Vec<(&'static str, Arc<str>)> {
    crate::metrics::controller_labels(&l.dst_namespace, &l.dst_service, &l.dst_pod, &l.workload)
        .map(|(k, v)| (k, v.clone()))
        .collect()
}

/// Endpoint metadata: `labels` and the connection's TLS, as Linkerd's tap
/// writes it: `tls` = `true` with `client_id` (source) or `server_id`
/// (destination), or the reason there is none (`loopback`,
/// `no_tls_from_remote`, `disabled`, ...).
pub fn meta(labels: &[(&'static str, Arc<str>)], tls: &TlsLabels) -> EndpointMeta {
    let mut m: HashMap<String, String> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), cut(v, MAX_LABEL_BYTES)))
        .collect();
    let mut set = |k: &str, v: &str| {
        m.insert(k.to_owned(), cut(v, MAX_LABEL_BYTES));
    };
    match tls {
        TlsLabels::Disabled => set("tls", "disabled"),
        TlsLabels::NoIdentity(reason) => set("tls", reason),
        TlsLabels::ServerId(id) => {
            set("tls", "true");
            set("server_id", id);
        }
        TlsLabels::ClientId(id) => {
            set("tls", "true");
            set("client_id", id);
        }
        TlsLabels::Passthru(sni) => {
            set("tls", "passthru");
            set("sni", sni);
        }
    }
    EndpointMeta { labels: m }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{Direction, DstWorkload};
    use http::{HeaderMap, HeaderValue};

    #[test]
    fn strings_are_cut_on_character_boundaries() {
        assert_eq!(cut("abc", 10), "abc");
        assert_eq!(cut("abcdef", 3), "abc");
        assert_eq!(cut("aé", 2), "a", "é is two bytes");
        assert_eq!(cut("", 0), "");
    }

    #[test]
    fn headers_stay_within_their_budget_and_count() {
        let limits = EventLimits::new(1024);
        assert_eq!(limits.headers, 512);
        assert_eq!(limits.header_part, 128);
        let mut h = HeaderMap::new();
        h.insert("x-long", HeaderValue::from_str(&"v".repeat(1000)).unwrap());
        h.insert("x-short", HeaderValue::from_static("1"));
        let out = headers([(":method", &b"GET"[..])], &h, &limits);
        let total: usize = out
            .headers
            .iter()
            .map(|x| x.name.len() + x.value.len())
            .sum();
        assert!(total <= 512, "{total}");
        assert_eq!(out.headers[0].name, ":method");
        let long = out.headers.iter().find(|x| x.name == "x-long").unwrap();
        assert_eq!(long.value.len(), 128, "a value is cut to its bound");

        let mut many = HeaderMap::new();
        for i in 0..200 {
            many.append(
                http::header::HeaderName::from_bytes(format!("x-{i}").as_bytes()).unwrap(),
                HeaderValue::from_static("1"),
            );
        }
        let out = headers([], &many, &EventLimits::new(1 << 20));
        assert_eq!(out.headers.len(), MAX_HEADERS);
    }

    #[test]
    fn labels_name_the_destination_and_its_tls_as_linkerd() {
        let mut l = DstLabels::unknown(Direction::outbound);
        l.dst_namespace = Arc::from("shop");
        l.dst_service = Arc::from("web");
        l.workload = DstWorkload::none();
        let labels = dst_labels(&l);
        assert_eq!(
            labels,
            vec![
                ("namespace", Arc::from("shop")),
                ("service", Arc::from("web"))
            ]
        );
        let m = meta(
            &labels,
            &TlsLabels::ServerId(Arc::from("web.shop.serviceaccount")),
        );
        assert_eq!(m.labels["tls"], "true");
        assert_eq!(m.labels["server_id"], "web.shop.serviceaccount");
        assert_eq!(m.labels["namespace"], "shop");
        let m = meta(&[], &TlsLabels::NoIdentity("loopback"));
        assert_eq!(m.labels["tls"], "loopback");
        assert_eq!(m.labels.len(), 1);
    }

    #[test]
    fn extension_methods_are_cut() {
        let limits = EventLimits::new(MIN_EVENT_BYTES);
        let long = http::Method::from_bytes("X".repeat(500).as_bytes()).unwrap();
        let m = method(&long, &limits);
        match m.r#type {
            Some(linkerd2_proxy_api::http_types::http_method::Type::Unregistered(s)) => {
                assert_eq!(s.len(), limits.header_part)
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            method(&http::Method::GET, &limits),
            http::Method::GET.into()
        );
    }
}
