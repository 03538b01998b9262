//! `ballast`: the one binary. It parses flags and wires the libraries.

#![forbid(unsafe_code)]

mod backend;
mod check;
mod controller;
mod dashboard;
mod demo;
mod destination;
mod diagnostics;
mod identity;
mod inject;
mod injector;
mod install;
mod uninstall;
mod upgrade;
mod version;
mod viz;
mod viz_server;

use ballast_sidecar::{init, logging, proxy};
use clap::{Parser, Subcommand};

// jemalloc bounds fragmentation and lets /metrics report allocated/resident.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(
    name = "ballast",
    version,
    about = "Ballast: a service mesh core that speaks Linkerd's proxy API and stays up",
    propagate_version = true
)]
struct Cli {
    #[command(flatten)]
    log: logging::LogArgs,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the destination controller: watch a cluster (or a manifests
    /// directory standing in for one) and serve Linkerd's Destination API.
    Destination(Box<destination::Args>),
    /// Run the identity controller: a certificate authority serving
    /// Linkerd's Identity API (Certify); `identity generate` makes a trust
    /// anchor and issuer for local runs.
    Identity(Box<identity::Args>),
    /// Run the sidecar proxy: carry a workload's traffic, resolved through
    /// the destination controller and balanced across endpoints.
    Proxy(Box<proxy::Args>),
    /// Set up the iptables nat rules that send a pod's TCP through its proxy
    /// (run once per pod, as an init container, in the pod's network namespace).
    Init(Box<init::Args>),
    /// Ask a destination controller what it answers.
    #[command(subcommand)]
    Diagnostics(diagnostics::Command),
    /// Run one demo HTTP backend that names itself in every answer.
    Backend(backend::Args),
    /// Play the demo: kill the controller under steady traffic, change the
    /// cluster meanwhile, and watch the proxy carry on and converge.
    Demo(demo::Args),
    /// Print every manifest a cluster needs (`ballast install | kubectl apply -f -`).
    Install(Box<install::Args>),
    /// Print the installed control plane as this version renders it, keeping
    /// its settings and key material (`ballast upgrade | kubectl apply -f -`).
    Upgrade(Box<upgrade::Args>),
    /// Print references to everything `install` made (`ballast uninstall | kubectl delete -f -`).
    Uninstall(uninstall::Args),
    /// Print this binary's version and the installed control plane's.
    Version(version::Args),
    /// Add the proxy sidecar and init container to workload manifests
    /// (files, directories or stdin); `--uninject` removes them.
    Inject(Box<inject::Args>),
    /// Run the mutating admission webhook that injects pods annotated
    /// `linkerd.io/inject: enabled` (or in namespaces so annotated).
    Injector(Box<injector::Args>),
    /// Check a cluster (or a manifests directory) for a healthy Ballast and
    /// for the faults that take meshes down.
    Check(Box<check::Args>),
    /// Run the dashboard and metrics collector: scrape every meshed proxy
    /// (or read a Prometheus), serve the dashboard and the JSON API that
    /// `ballast stat`, `edges`, `routes`, `tap` and `top` read.
    Viz(Box<viz_server::Args>),
    /// Golden metrics (success rate, requests per second, latency) of
    /// workloads, pods, services, namespaces or routes, from `ballast viz`.
    Stat(Box<viz::StatArgs>),
    /// Which workloads call which, and whether the calls are mutual TLS.
    Edges(Box<viz::EdgesArgs>),
    /// Per-route golden metrics of a Service's clients.
    Routes(Box<viz::RoutesArgs>),
    /// Watch live requests through a workload's proxies.
    Tap(Box<viz::TapArgs>),
    /// Live requests through a workload's proxies, counted by source,
    /// destination, method and path.
    Top(Box<viz::TopArgs>),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    if let Err(e) = logging::init(&cli.log) {
        eprintln!("ballast: {e}");
        return std::process::ExitCode::from(2);
    }
    let result = match cli.command {
        Command::Destination(args) => on_runtime(destination::run(*args)),
        Command::Identity(args) => on_runtime(identity::run(*args)),
        // The proxy sizes its own runtime; init only runs iptables.
        Command::Proxy(args) => proxy::run_blocking(*args),
        Command::Init(args) => init::run(*args),
        Command::Diagnostics(cmd) => on_runtime(diagnostics::run(cmd)),
        Command::Backend(args) => on_runtime(backend::run(args)),
        Command::Demo(args) => on_runtime(demo::run(args)),
        Command::Install(args) => on_runtime(install::run(*args)),
        Command::Uninstall(args) => on_runtime(uninstall::run(args)),
        Command::Upgrade(args) => on_runtime(upgrade::run(*args)),
        Command::Version(args) => on_runtime(version::run(args)),
        Command::Inject(args) => on_runtime(inject::run(*args)),
        Command::Injector(args) => on_runtime(injector::run(*args)),
        Command::Check(args) => on_runtime(check::run(*args)),
        Command::Stat(args) => on_runtime(viz::stat(*args)),
        Command::Edges(args) => on_runtime(viz::edges(*args)),
        Command::Routes(args) => on_runtime(viz::routes(*args)),
        Command::Tap(args) => on_runtime(viz::tap(*args)),
        Command::Top(args) => on_runtime(viz::top(*args)),
        Command::Viz(args) => on_compact_runtime(viz_server::run(*args)),
    };
    exit(result)
}

/// Runs `command` on a multi-threaded runtime.
fn on_runtime(
    command: impl std::future::Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<()> {
    runtime(tokio::runtime::Builder::new_multi_thread(), command)
}

/// [`on_runtime`], every thread of it (this one included) allocating
/// from one arena without a thread cache: a long-running process whose
/// steady memory matters more than its allocation speed (`ballast viz`).
fn on_compact_runtime(
    command: impl std::future::Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<()> {
    ballast_admin::compact_thread_allocations();
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.on_thread_start(ballast_admin::compact_thread_allocations);
    runtime(builder, command)
}

fn runtime(
    mut builder: tokio::runtime::Builder,
    command: impl std::future::Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<()> {
    builder
        .enable_all()
        .build()
        .map_err(|e| anyhow::anyhow!("cannot start the async runtime: {e}"))?
        .block_on(command)
}

fn exit(result: anyhow::Result<()>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ballast: {e:#}");
            // Flags that cannot work together are a usage error, as clap's.
            if e.downcast_ref::<ballast_flags::UsageError>().is_some() {
                return std::process::ExitCode::from(2);
            }
            std::process::ExitCode::FAILURE
        }
    }
}
