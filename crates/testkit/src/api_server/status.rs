//! `Status` bodies and JSON responses, shaped as the API server sends them.

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Full};
use serde_json::{json, Value};

pub(crate) type Body = UnsyncBoxBody<Bytes, std::io::Error>;

/// The `reason` the API server gives with a status code.
pub(crate) fn reason(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        406 => "NotAcceptable",
        409 => "Conflict",
        410 => "Expired",
        413 => "RequestEntityTooLarge",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "Unknown",
    }
}

/// A failure `Status` object.
pub(crate) fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    })
}

pub(crate) fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

pub(crate) fn json_response(code: u16, body: &Value) -> Response<Body> {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    let mut res = Response::new(full(bytes));
    *res.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    res
}

/// A failure answer with a `Status` body.
pub(crate) fn failure(code: u16, message: &str) -> Response<Body> {
    json_response(code, &status(code, reason(code), message))
}

/// The answer every request gets while a test fault is on, with `Retry-After` and
/// `details.retryAfterSeconds` when given.
pub(crate) fn fault(code: u16, retry_after: Option<u64>) -> Response<Body> {
    let mut body = status(
        code,
        reason(code),
        &format!("injected fault: every request is answered {code}"),
    );
    if let Some(secs) = retry_after {
        body["details"] = json!({ "retryAfterSeconds": secs });
    }
    let mut res = json_response(code, &body);
    if let Some(secs) = retry_after {
        if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
            res.headers_mut().insert(header::RETRY_AFTER, v);
        }
    }
    res
}

/// "Too large resource version", as the API server answers a read ahead of its cache.
pub(crate) fn too_large(requested: u64, current: u64) -> Response<Body> {
    let mut body = status(
        504,
        "Timeout",
        &format!("Too large resource version: {requested}, current: {current}"),
    );
    body["details"] = json!({
        "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
        "retryAfterSeconds": 1
    });
    json_response(504, &body)
}
