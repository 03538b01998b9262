//! HTTP/1 request framing across the protocol boundary: the bytes a client
//! sends go through the proxy's framing reader (`http::framing::Guarded`)
//! into hyper, as on a proxy's HTTP/1 server connection, and each request
//! hyper reads is made ready to go on (`forwarded_h1_request`) and carried
//! as HTTP/2 (`orig_proto::upgrade`), as the outbound proxy sends it to a
//! meshed peer.
//!
//! Input: the first byte picks where the client's bytes are split in two
//! reads; the rest are those bytes. Properties:
//! - the framing reader reads the same however the bytes are split;
//! - hyper never reads a request the framing reader did not count (no
//!   request hides in what the reader took for a body), and where the bytes
//!   end between messages with every request answered, both count the same
//!   requests;
//! - every request that goes on is one well-framed message: no header of
//!   the HTTP/1 hop (HTTP/2 forbids them), no Content-Length beside a
//!   Transfer-Encoding it was read by, and a body read whole is as long as
//!   the Content-Length it keeps (none without one or a Transfer-Encoding).
#![no_main]

use ballast_proxy::http::{
    forwarded_h1_request,
    framing::{Guarded, RequestFraming},
    orig_proto,
};
use http::header;
use http_body_util::BodyExt;
use hyper::{body::Incoming, Request, Response};
use hyper_util::rt::TokioIo;
use libfuzzer_sys::fuzz_target;
use std::{
    pin::Pin,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    task::{Context, Poll},
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

const MAX_HEAD: usize = 16 * 1024;

/// What hyper read of one request, after the proxy's head handling.
#[derive(Debug)]
struct Seen {
    headers: http::HeaderMap,
    had_te: bool,
    had_cl: bool,
    /// Whether it goes on as HTTP/2 (else as HTTP/1, unchanged in version).
    upgraded: bool,
    body: Option<u64>,
}

fuzz_target!(|data: &[u8]| {
    let Some((&cut, input)) = data.split_first() else {
        return;
    };
    let cut = usize::from(cut).min(input.len());

    let mut whole = RequestFraming::new(MAX_HEAD);
    let whole_result = whole.scan(input);
    let mut split = RequestFraming::new(MAX_HEAD);
    let split_result = split
        .scan(&input[..cut])
        .and_then(|()| split.scan(&input[cut..]).map_err(|n| cut + n));
    assert_eq!(whole_result, split_result, "split at {cut}");
    assert_eq!(whole.heads(), split.heads(), "split at {cut}");
    assert_eq!(whole.left_to_hyper(), split.left_to_hyper());

    let (requests, responses, read_to_end) = serve(input, cut);
    if !whole.left_to_hyper() {
        assert!(
            requests.len() as u64 <= whole.heads(),
            "hyper read {} requests, the framing reader {}: {requests:?}",
            requests.len(),
            whole.heads()
        );
        // hyper may end a connection early (a 4xx, a body it could not
        // read, HTTP/1.0 without keep-alive, a close after a message it read
        // by both lengths): then it reads fewer. Compared when it read to
        // the end and answered every request.
        let all_ok = read_to_end
            && requests.iter().all(|r| r.body.is_some())
            && responses.iter().all(|s| *s == 200)
            && responses.len() == requests.len();
        if whole_result.is_ok() && whole.between_messages() && all_ok {
            assert_eq!(
                requests.len() as u64,
                whole.heads(),
                "{requests:?}, responses {responses:?}"
            );
        }
    }
    for r in &requests {
        for name in [
            "connection",
            "keep-alive",
            "proxy-connection",
            "transfer-encoding",
            "upgrade",
            "te",
        ] {
            assert!(!r.headers.contains_key(name), "{name} goes on: {r:?}");
        }
        if r.upgraded {
            // HTTP/2 names the host in :authority only.
            assert!(!r.headers.contains_key(header::HOST), "{r:?}");
        }
        let lengths: Vec<_> = r.headers.get_all(header::CONTENT_LENGTH).iter().collect();
        assert!(lengths.len() <= 1, "{r:?}");
        if r.had_te {
            assert!(lengths.is_empty(), "a length beside chunked goes on: {r:?}");
        }
        if let Some(body) = r.body {
            match lengths.first() {
                Some(l) => assert_eq!(
                    l.to_str().ok().and_then(|l| l.parse::<u64>().ok()),
                    Some(body),
                    "{r:?}"
                ),
                None if !r.had_te && !r.had_cl => assert_eq!(body, 0, "{r:?}"),
                None => {}
            }
        }
    }
});

/// Serves `input` with hyper over the framing reader; returns the requests
/// hyper read, the statuses of the responses the client got, and whether
/// hyper read to the end of the input.
fn serve(input: &[u8], cut: usize) -> (Vec<Seen>, Vec<u16>, bool) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let responses = rt.block_on(async {
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        let record = seen.clone();
        let eof = Arc::new(AtomicBool::new(false));
        let service = hyper::service::service_fn(move |mut req: Request<Incoming>| {
            let record = record.clone();
            async move {
                let had_te = req.headers().contains_key(header::TRANSFER_ENCODING);
                let had_cl = req.headers().contains_key(header::CONTENT_LENGTH);
                forwarded_h1_request(&mut req);
                let upgraded = orig_proto::upgrade(&mut req).is_some();
                let (parts, mut body) = req.into_parts();
                let mut n = 0u64;
                let mut whole = true;
                while let Some(frame) = body.frame().await {
                    match frame {
                        Ok(f) => n += f.data_ref().map_or(0, |d| d.len() as u64),
                        Err(_) => {
                            whole = false;
                            break;
                        }
                    }
                }
                record.lock().unwrap().push(Seen {
                    headers: parts.headers,
                    had_te,
                    had_cl,
                    upgraded,
                    body: whole.then_some(n),
                });
                Ok::<_, std::convert::Infallible>(Response::new(String::new()))
            }
        });
        // The client shuts its side once it has written: hyper must read on.
        let conn = hyper::server::conn::http1::Builder::new()
            .half_close(true)
            .serve_connection(
                TokioIo::new(EofSeen {
                    inner: Guarded::new(server, MAX_HEAD),
                    eof: eof.clone(),
                }),
                service,
            );
        let input = input.to_vec();
        let writer = async move {
            let _ = client.write_all(&input[..cut]).await;
            let _ = client.write_all(&input[cut..]).await;
            let _ = client.shutdown().await;
            let mut out = Vec::new();
            let _ = client.read_to_end(&mut out).await;
            out
        };
        let (_, out) = tokio::join!(conn, writer);
        (statuses(&out), eof.load(Ordering::Relaxed))
    });
    let requests = std::mem::take(&mut *seen.lock().unwrap());
    (requests, responses.0, responses.1)
}

/// The status of each response on the client's side of the wire.
fn statuses(out: &[u8]) -> Vec<u16> {
    out.windows(9)
        .enumerate()
        .filter(|(i, w)| {
            w.starts_with(b"HTTP/1.") && w[8] == b' ' && (*i == 0 || out[i - 1] == b'\n')
        })
        .filter_map(|(i, _)| {
            std::str::from_utf8(out.get(i + 9..i + 12)?)
                .ok()?
                .parse()
                .ok()
        })
        .collect()
}

/// Records when a read reached the end of the input.
struct EofSeen<T> {
    inner: T,
    eof: Arc<AtomicBool>,
}

impl<T: AsyncRead + Unpin> AsyncRead for EofSeen<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() == before && buf.remaining() > 0 {
            self.eof.store(true, Ordering::Relaxed);
        }
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for EofSeen<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        b: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, b)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
