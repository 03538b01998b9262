//! Linkerd's `l5d-orig-proto`: a meshed client proxy may carry HTTP/1
//! requests to a peer proxy as HTTP/2, naming the original version in this
//! header; the receiving proxy hands them to its workload as HTTP/1 again and
//! marks the response so the client's proxy restores it.

use http::{header, HeaderValue, Request, Response, Uri, Version};

pub const L5D_ORIG_PROTO: &str = "l5d-orig-proto";

/// Outbound: makes an HTTP/1 request (origin-form, with its Host header) an
/// HTTP/2 one naming its version. Returns the original version, or `None`
/// (the request unchanged) when it cannot travel upgraded.
pub fn upgrade<B>(req: &mut Request<B>) -> Option<Version> {
    let orig = req.version();
    let mark = match orig {
        Version::HTTP_11 => "HTTP/1.1",
        Version::HTTP_10 => "HTTP/1.0",
        _ => return None,
    };
    let host = req.headers().get(header::HOST)?.to_str().ok()?;
    let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
    let uri = Uri::builder()
        .scheme("http")
        .authority(host)
        .path_and_query(path)
        .build()
        .ok()?;
    *req.uri_mut() = uri;
    *req.version_mut() = Version::HTTP_2;
    // HTTP/2 names the host in :authority; the peer puts Host back.
    req.headers_mut().remove(header::HOST);
    req.headers_mut().remove(header::TRANSFER_ENCODING);
    req.headers_mut()
        .insert(L5D_ORIG_PROTO, HeaderValue::from_static(mark));
    Some(orig)
}

/// Takes back an upgrade of a request that was not sent (it may go to an
/// endpoint that takes HTTP/1 only).
pub fn undo<B>(req: &mut Request<B>, orig: Version) {
    req.headers_mut().remove(L5D_ORIG_PROTO);
    *req.version_mut() = orig;
    if let Some(host) = req
        .uri()
        .authority()
        .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
    {
        req.headers_mut().insert(header::HOST, host);
    }
    if let Some(pq) = req.uri().path_and_query().cloned() {
        if let Ok(uri) = Uri::builder().path_and_query(pq).build() {
            *req.uri_mut() = uri;
        }
    }
}

/// The response to an upgraded request, back in the client's version.
pub fn restore<B>(rsp: &mut Response<B>, orig: Version) {
    rsp.headers_mut().remove(L5D_ORIG_PROTO);
    *rsp.version_mut() = orig;
}

/// An HTTP/2 request a meshed client upgraded goes back to its HTTP/1
/// version. Returns the value to mark the response with, or `None` for a
/// request that was not upgraded (left as it is).
pub fn downgrade<B>(req: &mut Request<B>) -> Option<HeaderValue> {
    if req.version() != Version::HTTP_2 {
        return None;
    }
    let orig = req.headers_mut().remove(L5D_ORIG_PROTO)?;
    let (version, mark) = if orig.as_bytes().starts_with(b"HTTP/1.1") {
        (Version::HTTP_11, "HTTP/1.1")
    } else if orig.as_bytes().starts_with(b"HTTP/1.0") {
        (Version::HTTP_10, "HTTP/1.0")
    } else {
        tracing::debug!(value = ?orig, "unknown l5d-orig-proto; serving as HTTP/2");
        return None;
    };
    *req.version_mut() = version;
    // HTTP/2 carries the host as :authority; HTTP/1 needs the header.
    if !req.headers().contains_key(header::HOST) {
        let host = req
            .uri()
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok());
        if let Some(host) = host {
            req.headers_mut().insert(header::HOST, host);
        }
    }
    Some(HeaderValue::from_static(mark))
}

/// Marks the response to a downgraded request.
pub fn mark<B>(rsp: &mut Response<B>, orig: HeaderValue) {
    rsp.headers_mut().remove(header::TRANSFER_ENCODING);
    rsp.headers_mut().insert(L5D_ORIG_PROTO, orig);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h2(orig: Option<&str>) -> Request<()> {
        let mut b = Request::builder()
            .version(Version::HTTP_2)
            .uri("http://web.shop.svc.cluster.local:8080/items?x=1");
        if let Some(o) = orig {
            b = b.header(L5D_ORIG_PROTO, o);
        }
        b.body(()).unwrap()
    }

    #[test]
    fn an_upgraded_request_goes_back_to_http1_with_its_host() {
        let mut req = h2(Some("HTTP/1.1"));
        assert_eq!(downgrade(&mut req).unwrap(), "HTTP/1.1");
        assert_eq!(req.version(), Version::HTTP_11);
        assert!(!req.headers().contains_key(L5D_ORIG_PROTO));
        assert_eq!(
            req.headers()[header::HOST],
            "web.shop.svc.cluster.local:8080"
        );
        let mut req = h2(Some("HTTP/1.0; absolute-form"));
        assert_eq!(downgrade(&mut req).unwrap(), "HTTP/1.0");
        assert_eq!(req.version(), Version::HTTP_10);
    }

    #[test]
    fn other_requests_are_left_alone() {
        let mut req = h2(None);
        assert!(downgrade(&mut req).is_none());
        assert_eq!(req.version(), Version::HTTP_2);
        let mut req = h2(Some("SPDY/3"));
        assert!(downgrade(&mut req).is_none());
        assert_eq!(req.version(), Version::HTTP_2);
        let mut h1 = Request::builder()
            .header(L5D_ORIG_PROTO, "HTTP/1.1")
            .body(())
            .unwrap();
        assert!(downgrade(&mut h1).is_none());
        assert!(h1.headers().contains_key(L5D_ORIG_PROTO));
    }

    #[test]
    fn upgrade_then_downgrade_gives_back_the_request() {
        let mut req = Request::get("/items?x=1")
            .version(Version::HTTP_11)
            .header(header::HOST, "web.shop.svc.cluster.local:8080")
            .header("x-a", "1")
            .body(())
            .unwrap();
        assert_eq!(upgrade(&mut req), Some(Version::HTTP_11));
        assert_eq!(req.version(), Version::HTTP_2);
        assert_eq!(
            req.uri(),
            "http://web.shop.svc.cluster.local:8080/items?x=1"
        );
        assert_eq!(req.headers()[L5D_ORIG_PROTO], "HTTP/1.1");
        assert!(!req.headers().contains_key(header::HOST));
        let mut down = req;
        assert_eq!(downgrade(&mut down).unwrap(), "HTTP/1.1");
        assert_eq!(down.version(), Version::HTTP_11);
        assert_eq!(
            down.headers()[header::HOST],
            "web.shop.svc.cluster.local:8080"
        );
        assert_eq!(down.headers()["x-a"], "1");
    }

    #[test]
    fn an_unsent_upgrade_is_undone() {
        let mut req = Request::get("/a")
            .version(Version::HTTP_10)
            .header(header::HOST, "web:80")
            .body(())
            .unwrap();
        let v = upgrade(&mut req).unwrap();
        undo(&mut req, v);
        assert_eq!(req.version(), Version::HTTP_10);
        assert_eq!(req.uri(), "/a");
        assert_eq!(req.headers()[header::HOST], "web:80");
        assert!(!req.headers().contains_key(L5D_ORIG_PROTO));
        // No Host: no upgrade.
        let mut bare = Request::get("/a").body(()).unwrap();
        assert_eq!(upgrade(&mut bare), None);
        assert_eq!(bare.version(), Version::HTTP_11);
    }

    #[test]
    fn the_response_is_marked() {
        let mut rsp = Response::builder()
            .header("transfer-encoding", "chunked")
            .body(())
            .unwrap();
        mark(&mut rsp, HeaderValue::from_static("HTTP/1.1"));
        assert_eq!(rsp.headers()[L5D_ORIG_PROTO], "HTTP/1.1");
        assert!(!rsp.headers().contains_key(header::TRANSFER_ENCODING));
    }
}
