//! Load: `oha` at fixed rates, `wrk` for the maximum rate, and a small
//! HTTP/1.1 keep-alive client of our own for warm-up and idle connections.

use std::{path::Path, process::Stdio, time::Duration};
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::TcpStream,
    process::Command,
};

/// Longest response head or chunk-size line we accept from a server.
const MAX_LINE: usize = 8 * 1024;
/// Largest body we read (the backend's is 1 KB).
const MAX_BODY: u64 = 1 << 20;

/// One HTTP/1.1 keep-alive connection.
pub struct Conn {
    io: BufReader<TcpStream>,
}

impl Conn {
    pub async fn open(addr: &str) -> anyhow::Result<Self> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Self {
            io: BufReader::new(stream),
        })
    }

    async fn line(&mut self) -> anyhow::Result<String> {
        let mut line = String::new();
        let n = (&mut self.io)
            .take(MAX_LINE as u64)
            .read_line(&mut line)
            .await?;
        anyhow::ensure!(n > 0, "connection closed");
        anyhow::ensure!(line.ends_with('\n'), "line too long or cut");
        Ok(line.trim_end().to_string())
    }

    /// GET / with `Host: host`; reads the whole response, returns its status.
    pub async fn get(&mut self, host: &str) -> anyhow::Result<u16> {
        let req = format!("GET / HTTP/1.1\r\nHost: {host}\r\n\r\n");
        self.io.get_mut().write_all(req.as_bytes()).await?;
        let status_line = self.line().await?;
        let status: u16 = status_line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| anyhow::anyhow!("bad status line {status_line:?}"))?;
        let (mut length, mut chunked) = (0u64, false);
        loop {
            let line = self.line().await?;
            if line.is_empty() {
                break;
            }
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            let value = value.trim();
            if name.eq_ignore_ascii_case("content-length") {
                length = value.parse()?;
            } else if name.eq_ignore_ascii_case("transfer-encoding") {
                chunked = value.eq_ignore_ascii_case("chunked");
            }
        }
        if chunked {
            loop {
                let size_line = self.line().await?;
                let hex = size_line.split(';').next().unwrap_or("").trim();
                let size = u64::from_str_radix(hex, 16)?;
                anyhow::ensure!(size <= MAX_BODY, "chunk too large");
                self.skip(size).await?;
                let _crlf = self.line().await?;
                if size == 0 {
                    break;
                }
            }
        } else {
            anyhow::ensure!(length <= MAX_BODY, "body too large");
            self.skip(length).await?;
        }
        Ok(status)
    }

    async fn skip(&mut self, n: u64) -> anyhow::Result<()> {
        let copied = tokio::io::copy(&mut (&mut self.io).take(n), &mut tokio::io::sink()).await?;
        anyhow::ensure!(copied == n, "body cut short");
        Ok(())
    }
}

/// `n` keep-alive connections to `addr`, each having completed one request.
pub async fn open_idle(addr: &str, host: &str, n: usize) -> anyhow::Result<Vec<Conn>> {
    let mut conns = Vec::with_capacity(n);
    for _ in 0..n {
        let mut c = Conn::open(addr).await?;
        let status = tokio::time::timeout(Duration::from_secs(5), c.get(host)).await??;
        anyhow::ensure!(status == 200, "idle connection setup: status {status}");
        conns.push(c);
    }
    Ok(conns)
}

/// One `oha` run at a fixed rate.
#[derive(Clone, Debug, Default)]
pub struct Fixed {
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub achieved_rps: f64,
    pub ok: u64,
    /// Non-200 responses and errors other than requests cut at the deadline.
    pub failed: u64,
}

pub struct OhaArgs<'a> {
    pub oha: &'a Path,
    pub core: u32,
    pub addr: &'a str,
    pub host: &'a str,
    pub rate: u32,
    pub connections: u32,
    pub duration: Duration,
}

/// `oha` with `--latency-correction` at a fixed rate over HTTP/1.1 keep-alive.
pub async fn oha(a: &OhaArgs<'_>) -> anyhow::Result<Fixed> {
    let out = Command::new("taskset")
        .args(["-c", &a.core.to_string()])
        .arg(a.oha)
        .args([
            "-z",
            &format!("{}s", a.duration.as_secs()),
            "-q",
            &a.rate.to_string(),
            "-c",
            &a.connections.to_string(),
            "--latency-correction",
            "--no-tui",
            "--output-format",
            "json",
            // Pinned to one core: one runtime thread.
            "--worker-threads",
            "1",
            "--host",
            a.host,
            &format!("http://{}/", a.addr),
        ])
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| anyhow::anyhow!("oha: {e} (cargo install --locked oha)"))?;
    anyhow::ensure!(
        out.status.success(),
        "oha failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let mut r = Fixed {
        achieved_rps: v["summary"]["requestsPerSec"].as_f64().unwrap_or(0.0),
        ..Fixed::default()
    };
    if let Some(codes) = v["statusCodeDistribution"].as_object() {
        for (code, n) in codes {
            let n = n.as_u64().unwrap_or(0);
            if code == "200" {
                r.ok += n;
            } else {
                r.failed += n;
            }
        }
    }
    let mut errors = Vec::new();
    if let Some(distribution) = v["errorDistribution"].as_object() {
        for (what, n) in distribution {
            if !what.contains("deadline") {
                r.failed += n.as_u64().unwrap_or(0);
                eprintln!("  oha error: {what}: {n}");
                errors.push(format!("{what}: {n}"));
            }
        }
    }
    // Nothing answered: no latency either (and the process measured did
    // not serve).
    anyhow::ensure!(
        r.ok > 0,
        "oha: no request through {} answered 200 ({} failed{}{})",
        a.addr,
        r.failed,
        if errors.is_empty() { "" } else { ": " },
        errors.join("; ")
    );
    let pct = |key: &str| {
        v["latencyPercentiles"][key]
            .as_f64()
            .map(|s| s * 1e6)
            .ok_or_else(|| anyhow::anyhow!("oha output without latencyPercentiles.{key}"))
    };
    r.p50_us = pct("p50")?;
    r.p99_us = pct("p99")?;
    r.p999_us = pct("p99.9")?;
    Ok(r)
}

/// One `wrk` run: as many requests as it can.
#[derive(Clone, Debug, Default)]
pub struct Max {
    pub rps: f64,
    pub requests: u64,
    /// Non-2xx responses and socket errors (timeouts included).
    pub failed: u64,
    /// Of `failed`, wrk's timeouts (no answer within its 2 s): slowness,
    /// not a wrong answer.
    pub timeouts: u64,
}

impl Max {
    /// Requests that failed other than by wrk's timeout.
    pub fn errors(&self) -> u64 {
        self.failed.saturating_sub(self.timeouts)
    }
}

/// `wrk -t1 -cCONNECTIONS` for `duration`.
pub async fn wrk(
    core: u32,
    addr: &str,
    host: &str,
    connections: u32,
    duration: Duration,
) -> anyhow::Result<Max> {
    let out = Command::new("taskset")
        .args(["-c", &core.to_string(), "wrk", "-t1"])
        .arg(format!("-c{connections}"))
        .arg(format!("-d{}s", duration.as_secs()))
        .args(["-H", &format!("Host: {host}")])
        .arg(format!("http://{addr}/"))
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| anyhow::anyhow!("wrk: {e} (apt-get install wrk)"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    anyhow::ensure!(out.status.success(), "wrk failed: {text}");
    let mut m = Max::default();
    let mut non_2xx = 0;
    for line in text.lines().map(str::trim) {
        if let Some(v) = line.strip_prefix("Requests/sec:") {
            m.rps = v.trim().parse()?;
        } else if let Some(v) = line.strip_prefix("Non-2xx or 3xx responses:") {
            non_2xx = v.trim().parse::<u64>()?;
            m.failed += non_2xx;
        } else if let Some(v) = line.strip_prefix("Socket errors:") {
            // "connect 0, read 0, write 0, timeout 0"
            for part in v.split(',') {
                let mut words = part.split_whitespace();
                let (Some(what), Some(n)) = (words.next(), words.next()) else {
                    continue;
                };
                let n: u64 = n.parse().unwrap_or(0);
                m.failed += n;
                if what == "timeout" {
                    m.timeouts += n;
                }
            }
        } else if line.contains(" requests in ") {
            m.requests = line
                .split_whitespace()
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
        }
    }
    anyhow::ensure!(m.rps > 0.0, "wrk output without Requests/sec: {text}");
    // wrk counts answered requests, non-2xx ones included.
    anyhow::ensure!(
        m.requests > non_2xx,
        "wrk: no request through {addr} answered 2xx ({} answered, {non_2xx} non-2xx, \
         {} failed): {text}",
        m.requests,
        m.failed
    );
    Ok(m)
}
