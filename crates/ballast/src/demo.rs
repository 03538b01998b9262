//! `ballast demo`: the controllers and the proxies as processes, three
//! backends behind their own proxies, steady traffic in mutual TLS, and the
//! destination controller killed while a backend is removed. Flags only; the
//! scenario lives in `ballast-demo`.

use anyhow::Context;
use ballast_demo::{DemoConfig, ViewMode};
use ballast_flags::{count, duration, HOUR};
use clap::Args as ClapArgs;
use std::time::Duration;

/// Demo steps: long enough to see traffic, short enough to watch.
const DEMO_STEP: ballast_flags::DurationRange = duration(Duration::from_millis(100), HOUR);

#[derive(ClapArgs)]
#[command(
    after_help = "Identity: the demo generates a trust anchor and issuer for the run (in its temporary \
directory, removed at the end) and runs `ballast identity`; the load client's proxy (service account \
`load`) and each backend's own proxy (service account `web`) get certificates from it, so every \
request from load to web crosses in mutual TLS.\n\
Steps: (a) steady traffic through the proxy to web-a, web-b and web-c; (b) the destination \
controller is killed with SIGKILL and stays down; (c) web-c is removed from the manifests and the \
controller restarts on its old address; (d) the proxy stops sending to web-c and the rest carry \
the traffic; (e) the proxies' own metrics show every connection from load to web was mutual TLS. \
Every request must succeed throughout. Exits non-zero if any step did not hold.\n\
`ballast viz` runs beside them for the whole demo (the proxies are the meshed pods of Deployments \
`load` and `web` in namespace `demo`; viz taps them over mutual TLS as its own identity): its \
dashboard's address is printed once it is ready and again in the summary; `ballast stat deploy -n \
demo --viz-addr ADDR`, `ballast edges deploy -n demo --viz-addr ADDR` and `ballast tap deploy/load \
-n demo --viz-addr ADDR` read it meanwhile.\n\
Every flag can also be set by the environment variable shown."
)]
pub struct Args {
    /// Requests per second sent through the proxy.
    #[arg(long, env = "BALLAST_DEMO_RPS", default_value_t = 200,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(ballast_demo::load::MAX_RPS)))]
    rps: u32,

    /// Keep-alive connections the requests are spread over.
    #[arg(long, env = "BALLAST_DEMO_CONNECTIONS", default_value_t = 4,
          value_parser = count(1, 1024))]
    connections: usize,

    /// How long the controller stays down.
    #[arg(long, env = "BALLAST_DEMO_DOWN_FOR", default_value = "10s", value_parser = DEMO_STEP)]
    down_for: Duration,

    /// Length of the steady steps (before the outage, and once converged).
    #[arg(long, env = "BALLAST_DEMO_STEADY_FOR", default_value = "5s", value_parser = DEMO_STEP)]
    steady_for: Duration,

    /// Deadline for the proxy to stop sending to the removed backend once
    /// the controller is back.
    #[arg(long, env = "BALLAST_DEMO_CONVERGE_WITHIN", default_value = "20s", value_parser = DEMO_STEP)]
    converge_within: Duration,

    /// Plain progress lines even on a terminal.
    #[arg(long, env = "BALLAST_DEMO_PLAIN")]
    plain: bool,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let ballast = std::env::current_exe()
        .context("cannot find the ballast executable to run the controller and the proxy")?;
    let config = DemoConfig {
        rps: args.rps,
        connections: args.connections,
        steady_for: args.steady_for,
        down_for: args.down_for,
        converge_within: args.converge_within,
        view: if args.plain {
            ViewMode::Plain
        } else {
            ViewMode::Auto
        },
        ..DemoConfig::new(ballast)
    };
    // On SIGTERM or Ctrl-C the demo is dropped, which kills the processes
    // it started rather than leaving them running, and removes its directory.
    let outcome = tokio::select! {
        outcome = ballast_demo::run(config) => outcome?,
        () = ballast_sidecar::signal::shutdown() => anyhow::bail!("the demo was interrupted"),
    };
    anyhow::ensure!(
        outcome.passed,
        "the demo failed: a step did not hold (see the summary above)"
    );
    Ok(())
}
