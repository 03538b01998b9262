//! Cheap fake proxies: HTTP/1.1 servers answering `GET /metrics` in the
//! benchmark's own process, one listener each. A normal one serves its pod's
//! page ([`page::Template`]), its counters a step further at each request;
//! a `Hang` one reads the request and never answers; a `Huge` one answers
//! a page of `HUGE_BYTES` bytes (valid sample lines, streamed, never held
//! whole).

use super::page::Template;
use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

/// What the huge fake answers: 100 MB.
pub const HUGE_BYTES: u64 = 100 * 1000 * 1000;
/// A request head longer than this is refused (the connection closed).
const MAX_HEAD_BYTES: usize = 8 * 1024;

pub enum Behaviour {
    /// Serves `labels` through the shared template.
    Page {
        template: Arc<Template>,
        labels: Vec<String>,
    },
    Hang,
    Huge,
}

/// Counts shared by every fake: requests answered, bytes written, and
/// connections accepted.
#[derive(Debug, Default)]
pub struct Served {
    pub requests: AtomicU64,
    pub bytes: AtomicU64,
    pub connections: AtomicU64,
}

/// Binds `addr` and serves it until the runtime stops.
pub async fn spawn(
    addr: SocketAddr,
    behaviour: Behaviour,
    served: Arc<Served>,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let behaviour = Arc::new(behaviour);
    // Each fake's own scrape count: its counters advance per request.
    let count = Arc::new(AtomicU64::new(0));
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                // EMFILE and the like: let the peer's timeout see it.
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            };
            served.connections.fetch_add(1, Ordering::Relaxed);
            let (b, s, c) = (behaviour.clone(), served.clone(), count.clone());
            tokio::spawn(async move {
                let _ = connection(stream, &b, &s, &c).await;
            });
        }
    });
    Ok(local)
}

/// Reads one request head; `None` at a clean end of the connection.
async fn request(stream: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<Option<Head>> {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            buf.drain(..end + 4);
            return Ok(Some(Head {
                close: head.contains("connection: close"),
            }));
        }
        if buf.len() > MAX_HEAD_BYTES {
            return Ok(None);
        }
        let mut chunk = [0u8; 2048];
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

struct Head {
    close: bool,
}

async fn connection(
    mut stream: TcpStream,
    behaviour: &Behaviour,
    served: &Served,
    count: &AtomicU64,
) -> std::io::Result<()> {
    let mut buf = Vec::new();
    while let Some(head) = request(&mut stream, &mut buf).await? {
        match behaviour {
            Behaviour::Hang => {
                // Hold the connection open, unanswered, until the peer leaves.
                let mut sink = [0u8; 1024];
                while stream.read(&mut sink).await? > 0 {}
                return Ok(());
            }
            Behaviour::Page { template, labels } => {
                let mut body = Vec::with_capacity(96 * 1024);
                template.render(labels, count.fetch_add(1, Ordering::Relaxed), &mut body);
                let mut out =
                    format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4; charset=utf-8\r\n\
                     content-length: {}\r\n{}\r\n",
                    body.len(),
                    if head.close { "connection: close\r\n" } else { "" }
                )
                    .into_bytes();
                out.extend_from_slice(&body);
                stream.write_all(&out).await?;
                served.bytes.fetch_add(out.len() as u64, Ordering::Relaxed);
            }
            Behaviour::Huge => {
                let head_text = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4; charset=utf-8\r\n\
                     content-length: {HUGE_BYTES}\r\n\r\n"
                );
                stream.write_all(head_text.as_bytes()).await?;
                let chunk = huge_chunk();
                let mut left = HUGE_BYTES;
                while left > 0 {
                    let n = left.min(chunk.len() as u64) as usize;
                    // The reader stops at its page limit: a write error ends it.
                    stream.write_all(&chunk[..n]).await?;
                    served.bytes.fetch_add(n as u64, Ordering::Relaxed);
                    left -= n as u64;
                }
            }
        }
        served.requests.fetch_add(1, Ordering::Relaxed);
        if head.close {
            break;
        }
    }
    Ok(())
}

/// 64 KiB of distinct-looking sample lines (the tail of the last one cut).
fn huge_chunk() -> Vec<u8> {
    let mut out = Vec::with_capacity(64 * 1024 + 200);
    let mut i = 0u64;
    while out.len() < 64 * 1024 {
        out.extend_from_slice(
            format!(
                "request_total{{direction=\"outbound\",authority=\"svc-{i}.ns.svc.cluster.local:80\",dst_namespace=\"ns\",dst_service=\"svc-{i}\"}} {i}\n"
            )
            .as_bytes(),
        );
        i += 1;
    }
    out.truncate(64 * 1024);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::page::{proxy_page_text, LABELS};
    use std::time::Duration;

    async fn get(addr: SocketAddr, requests: usize) -> Vec<Vec<u8>> {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let mut pages = Vec::new();
        for _ in 0..requests {
            s.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n")
                .await
                .unwrap();
            let mut head = Vec::new();
            while !head.ends_with(b"\r\n\r\n") {
                let mut b = [0u8; 1];
                assert_eq!(s.read(&mut b).await.unwrap(), 1, "the head ends");
                head.push(b[0]);
            }
            let head = String::from_utf8(head).unwrap();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .unwrap()
                .trim()
                .parse()
                .unwrap();
            let mut body = vec![0u8; len];
            s.read_exact(&mut body).await.unwrap();
            pages.push(body);
        }
        pages
    }

    fn page_fake() -> Behaviour {
        Behaviour::Page {
            template: Arc::new(Template::compile(&proxy_page_text()).unwrap()),
            labels: LABELS.iter().map(|l| l.to_string()).collect(),
        }
    }

    #[tokio::test]
    async fn a_page_fake_serves_keep_alive_requests_with_advancing_counters() {
        let served = Arc::new(Served::default());
        let addr = spawn("127.0.0.1:0".parse().unwrap(), page_fake(), served.clone())
            .await
            .unwrap();
        let pages = get(addr, 2).await;
        assert_ne!(pages[0], pages[1], "the counters moved");
        assert!(pages[0].len() > 40_000);
        assert_eq!(served.requests.load(Ordering::Relaxed), 2);
        assert_eq!(served.connections.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn the_hanging_fake_never_answers_and_the_huge_one_streams_its_size() {
        let served = Arc::new(Served::default());
        let hang = spawn(
            "127.0.0.1:0".parse().unwrap(),
            Behaviour::Hang,
            served.clone(),
        )
        .await
        .unwrap();
        let mut s = TcpStream::connect(hang).await.unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut b = [0u8; 1];
        let waited = tokio::time::timeout(Duration::from_millis(300), s.read(&mut b)).await;
        assert!(waited.is_err(), "no answer");

        let huge = spawn(
            "127.0.0.1:0".parse().unwrap(),
            Behaviour::Huge,
            served.clone(),
        )
        .await
        .unwrap();
        let mut s = TcpStream::connect(huge).await.unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        // Read 1 MB and leave: the fake must not need the rest read.
        let mut got = vec![0u8; 1_000_000];
        s.read_exact(&mut got).await.unwrap();
        let text = String::from_utf8_lossy(&got);
        assert!(text.contains(&format!("content-length: {HUGE_BYTES}")));
        assert!(text.contains("request_total{direction=\"outbound\""));
        drop(s);
        let mut total = Vec::new();
        let mut s = TcpStream::connect(huge).await.unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        s.read_to_end(&mut total).await.unwrap();
        let head_end = total.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        assert_eq!((total.len() - head_end) as u64, HUGE_BYTES);
    }
}
