//! `fanout-floor`: the least a fan-out can take on this machine (not a
//! test).
//!
//! `scale-bench` measures a change reaching every stream of a hot Service
//! through the controller. This measures the same fan-out with everything
//! but the kernel taken away: a writer process (this binary, `--serve`)
//! holds the same TCP connections as the controller would (PROXIES proxies,
//! PROXIES_PER_CONNECTION to a connection, HOT_SHARE of them watching the
//! hot Service with two streams each, as `scale-bench` lays them out), and
//! on a trigger writes each hot stream's update as plain bytes from two
//! threads, with no HTTP/2, no gRPC, no runtime and no allocation. The bench
//! process reads every connection and records when each stream's bytes
//! arrived, counted from just before the trigger.
//!
//! Two writers are measured side by side in one run:
//!
//! - `per stream`: one `write` per stream's update, as today's controller
//!   does when a connection's streams do not share a write;
//! - `per connection`: one `write` per connection with all its streams'
//!   updates, the best any HTTP/2 writer could do.
//!
//! Each runs ROUNDS times quiet, and again with BUSY CPU hogs. The
//! latencies it prints are a floor for `scale-bench`'s: the real fan-out
//! does all of this and more (it also parses the change, and its client
//! decodes gRPC).

use ballast_bench::{
    percentile,
    system::{clock_ticks, cpu_ticks, dies_with_bench, hogs, raise_nofile, wait_for_quiet},
};
use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    process::Stdio,
    sync::{mpsc as std_mpsc, Arc},
    time::{Duration, Instant},
};
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt},
    sync::mpsc,
};

const USAGE: &str = "\
usage: fanout-floor [--proxies N] [--proxies-per-connection N] [--hot-share F]
                    [--get-bytes N] [--outbound-bytes N] [--rounds N] [--busy N]
                    [--round-gap MS]
                    [--quiet-wait SECS]

  --proxies N                 proxies played (default 25000, as scale-bench)
  --proxies-per-connection N  proxies sharing one connection (default 25)
  --hot-share F               share of proxies watching the hot Service, each
                              with two streams (Get, OutboundPolicies.Watch)
                              (default 0.1)
  --get-bytes N               bytes of a Get stream's update (default 180)
  --outbound-bytes N          bytes of an OutboundPolicies.Watch update
                              (default 1200)
  --rounds N                  fan-outs per set (default 50)
  --round-gap MS              pause before each fan-out, after the last one's
                              updates arrived (default 0: back to back)
  --busy N                    CPU hogs of the busy sets (default 2; 0: none)
  --quiet-wait SECS           wait up to SECS for the machine to be quiet
                              before each set (default 0)";

#[derive(Clone)]
struct Opts {
    proxies: usize,
    per_connection: usize,
    hot_share: f64,
    get_bytes: usize,
    outbound_bytes: usize,
    rounds: usize,
    round_gap: Duration,
    busy: usize,
    quiet_wait: Duration,
}

fn opts(args: &mut ballast_bench::Flags) -> anyhow::Result<Opts> {
    let mut o = Opts {
        proxies: 25_000,
        per_connection: 25,
        hot_share: 0.1,
        get_bytes: 180,
        outbound_bytes: 1200,
        rounds: 50,
        round_gap: Duration::ZERO,
        busy: 2,
        quiet_wait: Duration::ZERO,
    };
    while let Some(flag) = args.next_flag() {
        match flag.as_str() {
            "--proxies" => o.proxies = args.parse()?,
            "--proxies-per-connection" => o.per_connection = args.parse()?,
            "--hot-share" => o.hot_share = args.parse()?,
            "--get-bytes" => o.get_bytes = args.parse()?,
            "--outbound-bytes" => o.outbound_bytes = args.parse()?,
            "--rounds" => o.rounds = args.parse()?,
            "--round-gap" => o.round_gap = Duration::from_millis(args.parse()?),
            "--busy" => o.busy = args.parse()?,
            "--quiet-wait" => o.quiet_wait = Duration::from_secs(args.parse()?),
            other => return Err(args.unknown(other)),
        }
    }
    anyhow::ensure!(
        o.proxies >= 1
            && o.per_connection >= 1
            && o.rounds >= 1
            && o.get_bytes >= 1
            && o.outbound_bytes >= 1
            && (0.0..=1.0).contains(&o.hot_share),
        "--proxies, --proxies-per-connection, --rounds and the byte counts must be at \
         least 1, --hot-share within 0..=1\n{USAGE}"
    );
    Ok(o)
}

/// How the writer writes a connection's updates.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Writes {
    PerStream,
    PerConnection,
}

impl Writes {
    fn byte(self) -> u8 {
        match self {
            Writes::PerStream => b's',
            Writes::PerConnection => b'c',
        }
    }

    fn name(self) -> &'static str {
        match self {
            Writes::PerStream => "per stream",
            Writes::PerConnection => "per connection",
        }
    }
}

/// Each connection's updates in one fan-out: the byte counts of its hot
/// streams' updates, in order (empty for a connection with none). Proxies
/// are hot as in `scale-bench` (spread evenly, Bresenham).
fn plan(o: &Opts) -> Vec<Vec<usize>> {
    let connections = o.proxies.div_ceil(o.per_connection);
    let hot = ((o.proxies as f64) * o.hot_share).round() as usize;
    let mut plan = vec![Vec::new(); connections];
    for k in 0..o.proxies {
        if (k + 1) * hot / o.proxies != k * hot / o.proxies {
            let c = &mut plan[k / o.per_connection];
            c.push(o.get_bytes);
            c.push(o.outbound_bytes);
        }
    }
    plan
}

fn main() -> anyhow::Result<()> {
    let mut args = ballast_bench::flags(USAGE);
    let serve = std::env::args().nth(1).as_deref() == Some("--serve");
    if serve {
        args.next_flag();
    }
    let o = opts(&mut args)?;
    if serve {
        return writer(&o);
    }
    tokio::runtime::Runtime::new()?.block_on(bench(o))
}

/// The writer process: accepts the control connection and then one per
/// data connection (each announces its index in 4 bytes), then for each
/// trigger byte on the control connection writes one fan-out from two
/// threads, each owning every other hot connection.
fn writer(o: &Opts) -> anyhow::Result<()> {
    let plan = plan(o);
    let listener = TcpListener::bind("127.0.0.1:0")?;
    println!("{}", listener.local_addr()?.port());
    std::io::stdout().flush()?;
    let (mut control, _) = listener.accept()?;
    let mut conns: Vec<Option<TcpStream>> = (0..plan.len()).map(|_| None).collect();
    for _ in 0..plan.len() {
        let (mut s, _) = listener.accept()?;
        let mut id = [0u8; 4];
        s.read_exact(&mut id)?;
        let id = u32::from_be_bytes(id) as usize;
        anyhow::ensure!(id < conns.len(), "connection index {id} out of range");
        s.set_nodelay(true)?;
        conns[id] = Some(s);
    }
    let zeros = Arc::new(vec![
        0u8;
        plan.iter()
            .map(|c| c.iter().sum::<usize>())
            .max()
            .unwrap_or(0)
    ]);
    let mut workers = Vec::new();
    let mut done = Vec::new();
    for t in 0..2 {
        let mine: Vec<(TcpStream, Vec<usize>)> = conns
            .iter_mut()
            .zip(&plan)
            .enumerate()
            .filter(|(i, (_, p))| !p.is_empty() && i % 2 == t)
            .filter_map(|(_, (s, p))| Some((s.take()?, p.clone())))
            .collect();
        let (tx, rx) = std_mpsc::channel::<Writes>();
        let (done_tx, done_rx) = std_mpsc::channel::<std::io::Result<()>>();
        let zeros = zeros.clone();
        std::thread::spawn(move || {
            let mut mine = mine;
            while let Ok(writes) = rx.recv() {
                let result = mine.iter_mut().try_for_each(|(s, chunks)| match writes {
                    Writes::PerStream => chunks.iter().try_for_each(|n| s.write_all(&zeros[..*n])),
                    Writes::PerConnection => s.write_all(&zeros[..chunks.iter().sum()]),
                });
                if done_tx.send(result).is_err() {
                    return;
                }
            }
        });
        workers.push(tx);
        done.push(done_rx);
    }
    let mut trigger = [0u8; 1];
    while control.read_exact(&mut trigger).is_ok() {
        let writes = if trigger[0] == Writes::PerConnection.byte() {
            Writes::PerConnection
        } else {
            Writes::PerStream
        };
        for w in &workers {
            w.send(writes)?;
        }
        for d in &done {
            d.recv()??;
        }
    }
    Ok(())
}

/// One set's figures.
struct Set {
    name: String,
    latencies: Vec<Duration>,
    /// The writer's and the bench's CPU per fan-out, ms.
    cpu: (f64, f64),
    quiet: Option<bool>,
}

async fn bench(o: Opts) -> anyhow::Result<()> {
    let plan = plan(&o);
    let want: usize = plan.iter().map(Vec::len).sum();
    anyhow::ensure!(want > 0, "no proxy watches the hot Service (--hot-share)");
    raise_nofile((plan.len() + 64) as u64);
    let mut child = dies_with_bench(
        tokio::process::Command::new(std::env::current_exe()?)
            .arg("--serve")
            .args(std::env::args().skip(1))
            .stdout(Stdio::piped()),
    )
    .spawn()?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| anyhow::anyhow!("no stdout"))?;
    let mut line = String::new();
    tokio::io::BufReader::new(stdout)
        .read_line(&mut line)
        .await?;
    let port: u16 = line
        .trim()
        .parse()
        .map_err(|e| anyhow::anyhow!("the writer's port {line:?}: {e}"))?;
    let writer_pid = child
        .id()
        .ok_or_else(|| anyhow::anyhow!("the writer exited"))?;
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut control = tokio::net::TcpStream::connect(addr).await?;
    control.set_nodelay(true)?;
    // Each connection's reader reports an arrival as its bytes cross each
    // update's end.
    let (tx, mut rx) = mpsc::unbounded_channel::<Instant>();
    let mut readers = Vec::new();
    for (i, chunks) in plan.iter().enumerate() {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        s.write_all(&(i as u32).to_be_bytes()).await?;
        let ends: Vec<usize> = chunks
            .iter()
            .scan(0, |sum, n| {
                *sum += n;
                Some(*sum)
            })
            .collect();
        let tx = tx.clone();
        readers.push(tokio::spawn(async move {
            // Fan-outs never overlap (the next waits for every update), so a
            // read holds bytes of one fan-out only.
            let (mut pos, mut next) = (0usize, 0usize);
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                let n = s.read(&mut buf).await?;
                if n == 0 {
                    return anyhow::Ok(());
                }
                pos += n;
                let at = Instant::now();
                while next < ends.len() && pos >= ends[next] {
                    let _ = tx.send(at);
                    next += 1;
                }
                if next == ends.len() {
                    (pos, next) = (0, 0);
                }
            }
        }));
    }
    drop(tx);
    let tck = clock_ticks();
    let mut sets = Vec::new();
    for busy in [0, o.busy] {
        if busy == 0 && !sets.is_empty() {
            continue;
        }
        let mut hogs = hogs(busy)?;
        if busy > 0 {
            // Let the hogs take their share of the cores first.
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        for writes in [Writes::PerStream, Writes::PerConnection] {
            let quiet = if busy == 0 && !o.quiet_wait.is_zero() {
                let patience = o.quiet_wait;
                Some(
                    tokio::task::spawn_blocking(move || wait_for_quiet(tck, 0.3, patience))
                        .await?
                        .1,
                )
            } else {
                None
            };
            let cpu_before = (cpu_ticks(writer_pid), cpu_ticks(std::process::id()));
            let mut latencies = Vec::with_capacity(want * o.rounds);
            for r in 0..o.rounds {
                if !o.round_gap.is_zero() {
                    tokio::time::sleep(o.round_gap).await;
                }
                let t0 = Instant::now();
                control.write_all(&[writes.byte()]).await?;
                for got in 0..want {
                    let at = tokio::time::timeout(Duration::from_secs(10), rx.recv())
                        .await
                        .map_err(|_| {
                            anyhow::anyhow!(
                                "round {}: {got} of {want} updates arrived; none more in 10 s",
                                r + 1
                            )
                        })?
                        .ok_or_else(|| anyhow::anyhow!("every reader is gone"))?;
                    latencies.push(at.duration_since(t0));
                }
            }
            let per_round = |ticks: u64| ticks as f64 / tck * 1e3 / o.rounds as f64;
            let cpu = (
                per_round(cpu_ticks(writer_pid).saturating_sub(cpu_before.0)),
                per_round(cpu_ticks(std::process::id()).saturating_sub(cpu_before.1)),
            );
            latencies.sort();
            let hogs_named = if busy == 0 {
                "no CPU hog".to_string()
            } else {
                format!("{busy} CPU hogs")
            };
            sets.push(Set {
                name: format!("{}, {hogs_named}", writes.name()),
                latencies,
                cpu,
                quiet,
            });
        }
        for h in &mut hogs {
            let _ = h.kill().await;
        }
    }
    let hot_connections = plan.iter().filter(|c| !c.is_empty()).count();
    println!(
        "fanout-floor: {} connections ({} proxies, {} per connection), {} hot ({} updates \
         per fan-out: {} B per Get update, {} B per OutboundPolicies.Watch update), {} rounds \
         per set, {} ms apart",
        plan.len(),
        o.proxies,
        o.per_connection,
        hot_connections,
        want,
        o.get_bytes,
        o.outbound_bytes,
        o.rounds,
        o.round_gap.as_millis()
    );
    println!("| writes, set | p50 | p99 | max | writer CPU per fan-out | bench CPU per fan-out |");
    println!("|---|---|---|---|---|---|");
    for s in &sets {
        let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1e3);
        println!(
            "| {}{} | {} | {} | {} | {:.1} ms | {:.1} ms |",
            s.name,
            match s.quiet {
                Some(false) => " (machine not quiet)",
                _ => "",
            },
            ms(percentile(&s.latencies, 0.5)),
            ms(percentile(&s.latencies, 0.99)),
            ms(percentile(&s.latencies, 1.0)),
            s.cpu.0,
            s.cpu.1
        );
    }
    drop(control);
    for r in readers {
        r.abort();
    }
    let _ = child.kill().await;
    anyhow::ensure!(
        sets.iter().all(|s| s.latencies.len() == want * o.rounds),
        "a set lost updates"
    );
    Ok(())
}
