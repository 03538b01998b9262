//! What every hostile-peer case shares: the proxy's memory and descriptors
//! read from /proc and /metrics, a well-behaved client measured during the
//! attack, backends that stream large bodies or never read, and a mesh
//! wiring them to a controller and a proxy.

use crate::support::{
    eventually,
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
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kb: u64 = line[field.len()..]
        .trim_start_matches(':')
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kb * 1024)
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

/// A TCP "backend" that accepts connections and never reads from them;
/// they stay open until it is dropped.
pub struct BlackHole {
    addr: SocketAddr,
    accepted: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl BlackHole {
    pub async fn start(bind: SocketAddr) -> BlackHole {
        let listener = TcpListener::bind(bind).await.expect("bind the black hole");
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicU64::new(0));
        let count = accepted.clone();
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::Relaxed);
                held.push(s);
            }
        });
        BlackHole {
            addr,
            accepted,
            task,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }
}

impl Drop for BlackHole {
    fn drop(&mut self) {
        self.task.abort();
    }
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
        eventually("a 200 for web through the proxy", || {
            let web = web.clone();
            async move {
                let a = get(outbound, &web, "/").await.ok()?;
                (a.status == StatusCode::OK).then_some(())
            }
        })
        .await;
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
