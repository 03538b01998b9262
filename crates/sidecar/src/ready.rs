//! `ballast-proxy await`: wait until the proxy in this pod answers `/ready`.
//! Run as the proxy container's postStart hook (as Linkerd's `linkerd-await`
//! is), it holds back the pod's next containers until the proxy can carry
//! their traffic: kubelet starts containers in order and waits for each
//! postStart hook.

use ballast_flags::TIMEOUT;
use clap::Args as ClapArgs;
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How often `/ready` is asked.
pub const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// The most of an answer read: the status line is all that matters.
const MAX_ANSWER_BYTES: u64 = 1024;

#[derive(ClapArgs, Debug)]
#[command(
    after_help = "Exits 0 as soon as the proxy's admin server answers GET /ready with 200, \
or 1 when --timeout passes first (kubelet then restarts the proxy container)."
)]
pub struct Args {
    /// The proxy's admin server (its --admin-addr, reached on loopback).
    #[arg(
        long,
        env = "BALLAST_PROXY_AWAIT_ADMIN_ADDR",
        default_value = "127.0.0.1:4191"
    )]
    admin_addr: SocketAddr,

    /// How long to wait for the proxy to be ready.
    #[arg(long, env = "BALLAST_PROXY_AWAIT_TIMEOUT", default_value = "2m", value_parser = TIMEOUT)]
    timeout: Duration,
}

/// The proxy did not become ready in time.
#[derive(Debug, thiserror::Error)]
#[error("the proxy at {addr} was not ready within {timeout:?} (last answer: {last})")]
pub struct NotReady {
    addr: SocketAddr,
    timeout: Duration,
    last: String,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| anyhow::anyhow!("cannot start the async runtime: {e}"))?;
    let addr = args.admin_addr;
    runtime.block_on(wait_ready(
        || ask_ready(addr),
        addr,
        args.timeout,
        POLL_INTERVAL,
    ))?;
    Ok(())
}

/// Asks `probe` every `interval` until it says ready, for at most `timeout`.
/// A probe that hangs is cut at the deadline too.
pub async fn wait_ready<F, P>(
    mut probe: P,
    addr: SocketAddr,
    timeout: Duration,
    interval: Duration,
) -> Result<(), NotReady>
where
    P: FnMut() -> F,
    F: Future<Output = Probe>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last = String::from("none yet");
    loop {
        match tokio::time::timeout_at(deadline, probe()).await {
            Ok(Probe::Ready) => return Ok(()),
            Ok(Probe::NotReady(why)) => last = why,
            Err(_) => break,
        }
        if tokio::time::Instant::now() + interval >= deadline {
            break;
        }
        tokio::time::sleep(interval).await;
    }
    Err(NotReady {
        addr,
        timeout,
        last,
    })
}

/// One answer to `GET /ready`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    Ready,
    /// Why not: the status line, or the connection error.
    NotReady(String),
}

async fn ask_ready(addr: SocketAddr) -> Probe {
    let mut stream = match TcpStream::connect(addr).await {
        Ok(s) => s,
        Err(e) => return Probe::NotReady(format!("cannot connect: {e}")),
    };
    let request = "GET /ready HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    if let Err(e) = stream.write_all(request.as_bytes()).await {
        return Probe::NotReady(format!("cannot send: {e}"));
    }
    let mut answer = Vec::new();
    if let Err(e) = stream.take(MAX_ANSWER_BYTES).read_to_end(&mut answer).await {
        return Probe::NotReady(format!("cannot read: {e}"));
    }
    let text = String::from_utf8_lossy(&answer);
    let status = text.lines().next().unwrap_or_default();
    if status.starts_with("HTTP/1.1 200") {
        Probe::Ready
    } else if status.is_empty() {
        Probe::NotReady("no answer".into())
    } else {
        Probe::NotReady(status.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    const ADDR: SocketAddr =
        SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 4191);

    #[tokio::test(start_paused = true)]
    async fn returns_once_the_proxy_says_ready() {
        let asked = Arc::new(AtomicU32::new(0));
        let counter = asked.clone();
        let started = tokio::time::Instant::now();
        let result = wait_ready(
            move || {
                let n = counter.fetch_add(1, Ordering::SeqCst);
                async move {
                    if n < 5 {
                        Probe::NotReady("HTTP/1.1 503 Service Unavailable".into())
                    } else {
                        Probe::Ready
                    }
                }
            },
            ADDR,
            Duration::from_secs(120),
            POLL_INTERVAL,
        )
        .await;
        assert!(result.is_ok());
        assert_eq!(asked.load(Ordering::SeqCst), 6);
        assert_eq!(started.elapsed(), 5 * POLL_INTERVAL);
    }

    #[tokio::test(start_paused = true)]
    async fn gives_up_at_the_timeout_naming_the_last_answer() {
        let started = tokio::time::Instant::now();
        let err = wait_ready(
            || async { Probe::NotReady("cannot connect: refused".into()) },
            ADDR,
            Duration::from_secs(2),
            POLL_INTERVAL,
        )
        .await
        .expect_err("never ready");
        assert!(started.elapsed() <= Duration::from_secs(2));
        assert!(started.elapsed() >= Duration::from_secs(2) - POLL_INTERVAL);
        let text = err.to_string();
        assert!(text.contains("127.0.0.1:4191"), "{text}");
        assert!(text.contains("cannot connect: refused"), "{text}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_probe_that_hangs_is_cut_at_the_deadline() {
        let started = tokio::time::Instant::now();
        let result = wait_ready(
            std::future::pending::<Probe>,
            ADDR,
            Duration::from_secs(3),
            POLL_INTERVAL,
        )
        .await;
        assert!(result.is_err());
        assert_eq!(started.elapsed(), Duration::from_secs(3));
    }
}
