//! One bounded HTTP/1.1 GET: a proxy's `/metrics`, or Prometheus' `/federate`.
//!
//! One connection per request, closed after it (`Connection: close`). A pod
//! is scraped once per interval (10 s by default) and a proxy's admin server
//! closes idle keep-alive connections after its header read timeout (10 s),
//! so a pool would mostly hold connections about to be closed, and 2,000 of
//! them: a descriptor and buffers per pod in both processes. A connect per
//! scrape costs one round trip.
//!
//! The body is read frame by frame and the read stops once it passes the
//! bound: a larger page is an error and its connection is dropped, so one
//! request never holds more than `max_bytes` plus one read buffer (hyper's,
//! about 400 KiB). [`get_into`] hands each frame on as it comes (a proxy's
//! page goes to the parser that way, through a small read buffer, and is
//! never held whole). The caller bounds the time (the whole request,
//! connect included, is one future to put under `tokio::time::timeout`).

use std::net::SocketAddr;
use std::pin::pin;

use bytes::{Bytes, BytesMut};
use http::header::{ACCEPT, CONNECTION, CONTENT_LENGTH, HOST, USER_AGENT};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// What a scrape asks for: Prometheus' text format first (what Linkerd's
/// proxy serves), OpenMetrics too; both parse.
pub const ACCEPT_METRICS: &str =
    "text/plain;version=0.0.4;q=0.9,application/openmetrics-text;version=1.0.0;q=0.8,*/*;q=0.1";

/// Why a GET gave no page.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("cannot connect: {0}")]
    Connect(std::io::Error),
    #[error("HTTP error: {0}")]
    Http(hyper::Error),
    #[error("answered HTTP {0}")]
    Status(StatusCode),
    /// A path or host that makes no request line.
    #[error("cannot make the request: {0}")]
    Request(http::Error),
    /// The read stopped after `read` bytes (at most one read buffer past the bound).
    #[error("page over {max} bytes")]
    TooLarge { max: usize, read: usize },
}

impl FetchError {
    /// The `result` label of `viz_scrapes_total`.
    pub fn result_label(&self) -> &'static str {
        match self {
            FetchError::Connect(_) => "connect_error",
            FetchError::Http(_) | FetchError::Status(_) | FetchError::Request(_) => "http_error",
            FetchError::TooLarge { .. } => "too_large",
        }
    }
}

/// Where a GET's body goes as it arrives.
pub trait BodySink: Send {
    /// The body's length as the server declared it (never over the bound),
    /// when it did; before any data.
    fn declared(&mut self, _len: Option<u64>) {}
    /// The next piece of the body.
    fn data(&mut self, piece: &[u8]);
}

/// A body kept whole.
struct Whole(BytesMut);

impl BodySink for Whole {
    fn declared(&mut self, len: Option<u64>) {
        self.0
            .reserve(len.map_or(16 * 1024, |n| usize::try_from(n).unwrap_or(0)));
    }

    fn data(&mut self, piece: &[u8]) {
        self.0.extend_from_slice(piece);
    }
}

/// `GET path_and_query` from `addr` (with `Host: host`), reading at most
/// `max_bytes` of body. Anything but `200` is an error. No timeout of its own.
pub async fn get(
    addr: SocketAddr,
    host: &str,
    path_and_query: &str,
    max_bytes: usize,
) -> Result<Bytes, FetchError> {
    let mut whole = Whole(BytesMut::new());
    get_into(addr, host, path_and_query, max_bytes, None, &mut whole).await?;
    Ok(whole.0.freeze())
}

/// [`get`], the body handed to `sink` piece by piece as it arrives instead
/// of kept: the request holds its read buffer and nothing of the page.
/// `read_buffer`: its size (hyper's own grows up to about 400 KiB when
/// `None`). Returns the body's length.
pub async fn get_into(
    addr: SocketAddr,
    host: &str,
    path_and_query: &str,
    max_bytes: usize,
    read_buffer: Option<usize>,
    sink: &mut dyn BodySink,
) -> Result<usize, FetchError> {
    let stream = TcpStream::connect(addr)
        .await
        .map_err(FetchError::Connect)?;
    // Small requests, one each: no Nagle delay on the request line.
    let _ = stream.set_nodelay(true);
    let mut builder = hyper::client::conn::http1::Builder::new();
    if let Some(size) = read_buffer {
        builder.read_buf_exact_size(Some(size));
    }
    let (mut sender, connection) = builder
        .handshake::<_, Empty<Bytes>>(TokioIo::new(stream))
        .await
        .map_err(FetchError::Http)?;
    let request = Request::get(path_and_query)
        .header(HOST, host)
        .header(ACCEPT, ACCEPT_METRICS)
        .header(CONNECTION, "close")
        .header(USER_AGENT, "ballast-viz")
        .body(Empty::new())
        .map_err(FetchError::Request)?;

    let exchange = async {
        let response = sender
            .send_request(request)
            .await
            .map_err(FetchError::Http)?;
        if response.status() != StatusCode::OK {
            return Err(FetchError::Status(response.status()));
        }
        let declared = response
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > max_bytes as u64) {
            return Err(FetchError::TooLarge {
                max: max_bytes,
                read: 0,
            });
        }
        sink.declared(declared);
        let mut read = 0usize;
        let mut incoming = response.into_body();
        while let Some(frame) = incoming.frame().await {
            let frame = frame.map_err(FetchError::Http)?;
            if let Ok(data) = frame.into_data() {
                if read + data.len() > max_bytes {
                    return Err(FetchError::TooLarge {
                        max: max_bytes,
                        read: read + data.len(),
                    });
                }
                read += data.len();
                // Handed on and dropped at once: the read buffer is free
                // again for the next piece.
                sink.data(&data);
            }
        }
        Ok(read)
    };

    // The connection is driven here, not on a task of its own: when this
    // future ends or is dropped (the caller's timeout), the socket closes.
    let mut connection = pin!(connection);
    let mut exchange = pin!(exchange);
    let mut connection_done = false;
    loop {
        tokio::select! {
            result = &mut exchange => return result,
            // A connection that ends (the server closed after its answer)
            // leaves the body's last frames for the exchange to read; one that
            // fails fails the exchange too.
            _ = &mut connection, if !connection_done => connection_done = true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// Serves `answer` (raw bytes: status line, headers, body) to every connection.
    async fn serve(answer: Vec<u8>) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let answer = answer.clone();
                tokio::spawn(async move {
                    let mut head = vec![0; 4096];
                    let _ = s.read(&mut head).await;
                    let _ = s.write_all(&answer).await;
                });
            }
        });
        addr
    }

    #[tokio::test]
    async fn a_page_is_read_whole() {
        let body = "# TYPE x counter\nx_total 1\n";
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        let addr = serve(answer.into_bytes()).await;
        let page = get(addr, "pod", "/metrics", 1024).await.unwrap();
        assert_eq!(&page[..], body.as_bytes());
    }

    #[tokio::test]
    async fn a_declared_length_over_the_bound_is_refused_unread() {
        let answer =
            "HTTP/1.1 200 OK\r\ncontent-length: 5000\r\n\r\n".to_string() + &"x".repeat(5000);
        let addr = serve(answer.into_bytes()).await;
        match get(addr, "pod", "/metrics", 1000).await {
            Err(FetchError::TooLarge { max: 1000, read: 0 }) => {}
            other => panic!("want too large, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_chunked_page_over_the_bound_stops_the_read() {
        let mut answer = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
        for _ in 0..64 {
            answer.extend_from_slice(b"400\r\n");
            answer.extend_from_slice(&[b'x'; 0x400]);
            answer.extend_from_slice(b"\r\n");
        }
        answer.extend_from_slice(b"0\r\n\r\n");
        let addr = serve(answer).await;
        match get(addr, "pod", "/metrics", 10 * 1024).await {
            Err(e @ FetchError::TooLarge { .. }) => {
                assert_eq!(e.result_label(), "too_large");
                assert_eq!(e.to_string(), "page over 10240 bytes");
            }
            other => panic!("want too large, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_status_other_than_200_is_an_error_naming_it() {
        let addr =
            serve(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n".to_vec()).await;
        let e = get(addr, "pod", "/metrics", 1024).await.unwrap_err();
        assert_eq!(e.result_label(), "http_error");
        assert_eq!(e.to_string(), "answered HTTP 503 Service Unavailable");
    }

    #[tokio::test]
    async fn a_closed_port_is_a_connect_error() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let e = get(addr, "pod", "/metrics", 1024).await.unwrap_err();
        assert_eq!(e.result_label(), "connect_error");
    }

    #[tokio::test]
    async fn a_body_until_close_is_read() {
        let addr = serve(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nabc".to_vec()).await;
        let page = get(addr, "pod", "/metrics", 1024).await.unwrap();
        assert_eq!(&page[..], b"abc");
    }
}
