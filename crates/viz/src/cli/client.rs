//! The viz JSON API from the command line: one HTTP/1.1 GET per answer,
//! `/api/tap` read line by line. Answers and lines are bounded.

use std::time::Duration;

use ballast_vizcore::api::{TapEvent, TapNotice};
use bytes::{Buf, Bytes, BytesMut};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;

use super::CliError;

/// Largest JSON answer read (a stat of every pod of a big cluster fits).
pub const MAX_ANSWER_BYTES: usize = 64 * 1024 * 1024;
/// Longest tap line read.
pub const MAX_LINE_BYTES: usize = 1024 * 1024;
/// Connecting and the answer's head.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// A whole JSON answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the viz server is.
#[derive(Clone, Debug)]
pub struct VizClient {
    addr: String,
}

impl VizClient {
    /// `HOST:PORT`; an `http://` prefix and a trailing `/` are tolerated.
    pub fn new(addr: &str) -> Self {
        let addr = addr.trim();
        let addr = addr.strip_prefix("http://").unwrap_or(addr);
        Self {
            addr: addr.trim_end_matches('/').to_string(),
        }
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// `GET path?query` and the JSON answer; a non-2xx answer's `error`
    /// is the error.
    pub async fn get_json(
        &self,
        path: &str,
        query: &[(&str, String)],
    ) -> Result<serde_json::Value, CliError> {
        let response = self.get(path, query).await?;
        let body = tokio::time::timeout(ANSWER_TIMEOUT, read_bounded(response.into_body()))
            .await
            .map_err(|_| self.protocol(format!("the answer took longer than {ANSWER_TIMEOUT:?}")))?
            .map_err(|e| self.protocol(e))?;
        serde_json::from_slice(&body).map_err(|e| self.protocol(format!("not JSON: {e}")))
    }

    /// Opens `GET /api/tap?query`.
    pub async fn tap(&self, query: &[(&str, String)]) -> Result<TapLines, CliError> {
        let response = self.get("/api/tap", query).await?;
        Ok(TapLines {
            body: response.into_body(),
            buf: BytesMut::new(),
            addr: self.addr.clone(),
        })
    }

    async fn get(
        &self,
        path: &str,
        query: &[(&str, String)],
    ) -> Result<hyper::Response<Incoming>, CliError> {
        let mut target = path.to_string();
        let pairs: Vec<&(&str, String)> = query.iter().filter(|(_, v)| !v.is_empty()).collect();
        if !pairs.is_empty() {
            let mut s = form_urlencoded::Serializer::new(String::new());
            for (k, v) in pairs {
                s.append_pair(k, v);
            }
            target.push('?');
            target.push_str(&s.finish());
        }
        let unreachable = |reason: String| CliError::Unreachable {
            addr: self.addr.clone(),
            reason,
        };
        let connect = async {
            let stream = tokio::net::TcpStream::connect(self.addr.as_str())
                .await
                .map_err(|e| unreachable(e.to_string()))?;
            let _ = stream.set_nodelay(true);
            let (mut sender, connection) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                    .await
                    .map_err(|e| unreachable(e.to_string()))?;
            tokio::spawn(async move {
                let _ = connection.await;
            });
            let request = http::Request::builder()
                .uri(target.as_str())
                .header(http::header::HOST, self.addr.as_str())
                .header(http::header::ACCEPT, "application/json")
                .body(Empty::<Bytes>::new())
                .map_err(|e| CliError::Usage(format!("bad request {target:?}: {e}")))?;
            sender
                .send_request(request)
                .await
                .map_err(|e| unreachable(e.to_string()))
        };
        let response = tokio::time::timeout(CONNECT_TIMEOUT, connect)
            .await
            .map_err(|_| unreachable(format!("no answer within {CONNECT_TIMEOUT:?}")))??;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status();
        let body = tokio::time::timeout(CONNECT_TIMEOUT, read_bounded(response.into_body()))
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_default();
        Err(api_error(status, &body))
    }

    fn protocol(&self, reason: impl Into<String>) -> CliError {
        CliError::Protocol {
            addr: self.addr.clone(),
            reason: reason.into(),
        }
    }
}

/// A non-2xx answer as an error: its JSON `error`, else its text's first line.
fn api_error(status: http::StatusCode, body: &[u8]) -> CliError {
    let message = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_string))
        .unwrap_or_else(|| {
            String::from_utf8_lossy(body)
                .lines()
                .next()
                .unwrap_or_default()
                .chars()
                .take(300)
                .collect()
        });
    let message = if message.trim().is_empty() {
        format!("viz answered {status}")
    } else {
        message
    };
    CliError::Api {
        status: status.as_u16(),
        message,
    }
}

async fn read_bounded(mut body: Incoming) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| e.to_string())?;
        if let Ok(data) = frame.into_data() {
            if out.len() + data.len() > MAX_ANSWER_BYTES {
                return Err(format!(
                    "the answer is larger than {MAX_ANSWER_BYTES} bytes"
                ));
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(out)
}

/// One line of a tap stream.
#[derive(Clone, Debug, PartialEq)]
pub enum TapLine {
    Event(Box<TapEvent>),
    Notice(String),
}

impl TapLine {
    /// A line as the server writes it.
    pub fn parse(line: &[u8]) -> Result<TapLine, String> {
        let value: serde_json::Value =
            serde_json::from_slice(line).map_err(|e| format!("not JSON: {e}"))?;
        if value.get("notice").is_some() {
            let n: TapNotice = serde_json::from_value(value).map_err(|e| e.to_string())?;
            return Ok(TapLine::Notice(n.notice));
        }
        serde_json::from_value(value)
            .map(|e| TapLine::Event(Box::new(e)))
            .map_err(|e| format!("not a tap event: {e}"))
    }
}

/// An open tap, read a line at a time.
pub struct TapLines {
    body: Incoming,
    buf: BytesMut,
    addr: String,
}

impl TapLines {
    /// The next line (its text without the newline); `None` at the end.
    pub async fn next_raw(&mut self) -> Result<Option<Bytes>, CliError> {
        loop {
            if let Some(at) = self.buf.iter().position(|b| *b == b'\n') {
                let line = self.buf.split_to(at + 1).freeze();
                let line = line.slice(..at);
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return Ok(Some(line));
            }
            if self.buf.len() > MAX_LINE_BYTES {
                return Err(
                    self.protocol(format!("a tap line is longer than {MAX_LINE_BYTES} bytes"))
                );
            }
            match self.body.frame().await {
                None => {
                    if self.buf.iter().all(u8::is_ascii_whitespace) {
                        return Ok(None);
                    }
                    let rest = self.buf.split().freeze();
                    return Ok(Some(rest));
                }
                Some(Err(e)) => return Err(self.protocol(format!("the tap broke: {e}"))),
                Some(Ok(frame)) => {
                    if let Ok(mut data) = frame.into_data() {
                        while data.has_remaining() {
                            let chunk = data.chunk();
                            self.buf.extend_from_slice(chunk);
                            let n = chunk.len();
                            data.advance(n);
                        }
                    }
                }
            }
        }
    }

    /// The next line, parsed.
    pub async fn next(&mut self) -> Result<Option<TapLine>, CliError> {
        match self.next_raw().await? {
            None => Ok(None),
            Some(line) => TapLine::parse(&line)
                .map(Some)
                .map_err(|e| self.protocol(e)),
        }
    }

    fn protocol(&self, reason: String) -> CliError {
        CliError::Protocol {
            addr: self.addr.clone(),
            reason,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_tidied() {
        assert_eq!(
            VizClient::new("http://127.0.0.1:8084/").addr(),
            "127.0.0.1:8084"
        );
        assert_eq!(
            VizClient::new(" viz.ballast:8084 ").addr(),
            "viz.ballast:8084"
        );
    }

    #[test]
    fn error_answers_say_their_error() {
        let e = api_error(
            http::StatusCode::BAD_REQUEST,
            br#"{"error":"unknown kind \"x\""}"#,
        );
        assert_eq!(e.to_string(), "unknown kind \"x\"");
        let e = api_error(http::StatusCode::NOT_FOUND, b"not found\nmore");
        assert_eq!(e.to_string(), "not found");
        let e = api_error(http::StatusCode::BAD_GATEWAY, b"");
        assert_eq!(e.to_string(), "viz answered 502 Bad Gateway");
    }

    #[test]
    fn tap_lines_are_events_or_notices() {
        assert_eq!(
            TapLine::parse(br#"{"notice":"pod a/b: cannot tap"}"#),
            Ok(TapLine::Notice("pod a/b: cannot tap".into()))
        );
        let e = TapEvent {
            path: "/x".into(),
            status: Some(200),
            ..TapEvent::default()
        };
        let line = serde_json::to_vec(&e).expect("json");
        assert_eq!(TapLine::parse(&line), Ok(TapLine::Event(Box::new(e))));
        assert!(TapLine::parse(b"[1,2]").is_err());
        assert!(TapLine::parse(b"{nope").is_err());
    }
}
