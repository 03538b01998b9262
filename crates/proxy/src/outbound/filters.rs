//! Route filters: header modifiers, redirects (Gateway API's
//! `RequestRedirect`, with Linkerd's rules for the `Location`), and
//! injected failures.

use super::policy::{HeaderModifier, PathModifier, Ratio, Redirect};
use http::{uri::Scheme, HeaderMap, StatusCode, Uri};
use rand::Rng;

/// Applies a header modifier: set replaces, add appends, remove removes.
pub fn modify_headers(m: &HeaderModifier, headers: &mut HeaderMap) {
    for (name, value) in &m.set {
        headers.insert(name.clone(), value.clone());
    }
    for (name, value) in &m.add {
        headers.append(name.clone(), value.clone());
    }
    for name in &m.remove {
        headers.remove(name);
    }
}

/// Whether this request is one of the ratio's.
pub fn sample(ratio: Ratio, rng: &mut impl Rng) -> bool {
    ratio.denominator != 0
        && rng.random_ratio(ratio.numerator.min(ratio.denominator), ratio.denominator)
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidRedirect {
    #[error("a prefix may be replaced only when the rule matched a path prefix")]
    NotAPrefixMatch,
    #[error("the redirect has no host to send the client to")]
    NoAuthority,
    #[error("the redirect made an invalid location")]
    Location,
}

/// Where a redirect sends a request for `uri` (the request's URI, with the
/// authority from `Host` when it had none), given the length of the path
/// prefix its rule matched. `None` when the location is the request's own.
pub fn redirect(
    r: &Redirect,
    uri: &Uri,
    prefix_len: Option<usize>,
) -> Result<Option<(StatusCode, Uri)>, InvalidRedirect> {
    let scheme = r
        .scheme
        .clone()
        .or_else(|| uri.scheme().cloned())
        .unwrap_or(Scheme::HTTP);
    let host = r
        .host
        .as_deref()
        .or_else(|| uri.host())
        .ok_or(InvalidRedirect::NoAuthority)?;
    // The port: the redirect's, else the request's unless a new host was
    // named; either way left out when it is the scheme's default.
    let port = r.port.or(if r.host.is_some() {
        None
    } else {
        uri.port_u16()
    });
    let default_port =
        |p: u16| (scheme == Scheme::HTTP && p == 80) || (scheme == Scheme::HTTPS && p == 443);
    let authority = match port.filter(|p| !default_port(*p)) {
        Some(p) => format!("{host}:{p}"),
        None => host.to_string(),
    };
    let path_and_query = match &r.path {
        None => uri
            .path_and_query()
            .map(|pq| pq.as_str().to_string())
            .unwrap_or_else(|| "/".into()),
        Some(PathModifier::Full(p)) => p.clone(),
        Some(PathModifier::Prefix(new)) => {
            let len = prefix_len.ok_or(InvalidRedirect::NotAPrefixMatch)?;
            let path = uri.path();
            let rest = path.get(len.min(path.len())..).unwrap_or("");
            let mut p = new.trim_end_matches('/').to_string();
            if !rest.is_empty() && !rest.starts_with('/') {
                p.push('/');
            }
            p.push_str(rest);
            if p.is_empty() {
                p.push('/');
            }
            if let Some(q) = uri.query() {
                p.push('?');
                p.push_str(q);
            }
            p
        }
    };
    let location = Uri::builder()
        .scheme(scheme)
        .authority(authority)
        .path_and_query(path_and_query)
        .build()
        .map_err(|_| InvalidRedirect::Location)?;
    if location == *uri {
        return Ok(None);
    }
    Ok(Some((r.status, location)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderName, HeaderValue};

    fn r(
        scheme: Option<Scheme>,
        host: Option<&str>,
        port: Option<u16>,
        path: Option<PathModifier>,
    ) -> Redirect {
        Redirect {
            scheme,
            host: host.map(String::from),
            port,
            path,
            status: StatusCode::MOVED_PERMANENTLY,
        }
    }

    fn location(red: &Redirect, uri: &str, prefix: Option<usize>) -> String {
        let uri: Uri = uri.parse().expect("uri");
        match redirect(red, &uri, prefix).expect("valid") {
            Some((status, loc)) => {
                assert_eq!(status, StatusCode::MOVED_PERMANENTLY);
                loc.to_string()
            }
            None => "same".into(),
        }
    }

    #[test]
    fn locations_follow_the_gateway_api() {
        let uri = "http://web.shop:8080/api/v1/items?x=1";
        assert_eq!(
            location(&r(Some(Scheme::HTTPS), None, None, None), uri, None),
            "https://web.shop:8080/api/v1/items?x=1"
        );
        // A new host drops the request's port; a default port is left out.
        assert_eq!(
            location(&r(None, Some("new.shop"), None, None), uri, None),
            "http://new.shop/api/v1/items?x=1"
        );
        assert_eq!(
            location(&r(None, None, Some(80), None), uri, None),
            "http://web.shop/api/v1/items?x=1"
        );
        assert_eq!(
            location(
                &r(Some(Scheme::HTTPS), Some("new.shop"), Some(8443), None),
                uri,
                None
            ),
            "https://new.shop:8443/api/v1/items?x=1"
        );
        // The full path replaced (the query goes with it), or the prefix.
        assert_eq!(
            location(
                &r(None, None, None, Some(PathModifier::Full("/other".into()))),
                uri,
                None
            ),
            "http://web.shop:8080/other"
        );
        let prefix = |p: &str| Some(PathModifier::Prefix(p.into()));
        assert_eq!(
            location(
                &r(None, None, None, prefix("/v2")),
                uri,
                Some("/api/v1".len())
            ),
            "http://web.shop:8080/v2/items?x=1"
        );
        assert_eq!(
            location(&r(None, None, None, prefix("/")), "http://a/api", Some(4)),
            "http://a/"
        );
        let uri: Uri = uri.parse().expect("uri");
        assert_eq!(
            redirect(&r(None, None, None, prefix("/v2")), &uri, None),
            Err(InvalidRedirect::NotAPrefixMatch)
        );
        // A redirect to where the request already is, is none.
        assert_eq!(
            location(&r(None, None, None, None), "http://a/b", None),
            "same"
        );
    }

    #[test]
    fn header_modifiers_set_add_and_remove() {
        let name = HeaderName::from_static;
        let value = HeaderValue::from_static;
        let m = HeaderModifier {
            set: vec![(name("x-set"), value("new"))],
            add: vec![(name("x-add"), value("2"))],
            remove: vec![name("x-gone")],
        };
        let mut h = HeaderMap::new();
        h.append("x-set", value("old1"));
        h.append("x-set", value("old2"));
        h.append("x-add", value("1"));
        h.append("x-gone", value("bye"));
        modify_headers(&m, &mut h);
        let all = |n: &str| {
            h.get_all(n)
                .iter()
                .map(|v| v.to_str().unwrap_or(""))
                .collect::<Vec<_>>()
        };
        assert_eq!(all("x-set"), ["new"]);
        assert_eq!(all("x-add"), ["1", "2"]);
        assert!(all("x-gone").is_empty());
    }

    #[test]
    fn ratios_sample_as_asked() {
        let mut rng = rand::rng();
        let all = Ratio {
            numerator: 1,
            denominator: 1,
        };
        let none = Ratio {
            numerator: 0,
            denominator: 0,
        };
        assert!((0..100).all(|_| sample(all, &mut rng)));
        assert!((0..100).all(|_| !sample(none, &mut rng)));
    }
}
