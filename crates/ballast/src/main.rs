//! `ballast`: the one binary. It parses flags and wires the libraries.

#![forbid(unsafe_code)]

mod backend;
mod demo;
mod destination;
mod diagnostics;
mod init;
mod logging;
mod proxy;
mod signal;

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
    /// Log filter, in `tracing` EnvFilter syntax (e.g. `info`, `ballast=debug`).
    #[arg(long, global = true, env = "BALLAST_LOG", default_value = "info")]
    log: String,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the destination controller: watch a cluster (or a manifests
    /// directory standing in for one) and serve Linkerd's Destination API.
    Destination(Box<destination::Args>),
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
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    if let Err(e) = logging::init(&cli.log) {
        eprintln!("ballast: {e}");
        return std::process::ExitCode::from(2);
    }
    // Init only runs iptables: no runtime.
    let command = match cli.command {
        Command::Init(args) => return exit(init::run(*args)),
        other => other,
    };
    // The proxy sizes its own runtime: one thread by default, as a sidecar
    // with one core.
    let built = match &command {
        Command::Proxy(args) if args.workers == 1 => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        Command::Proxy(args) => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(usize::from(args.workers))
            .enable_all()
            .build(),
        _ => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build(),
    };
    let runtime = match built {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ballast: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match command {
            Command::Destination(args) => destination::run(*args).await,
            Command::Proxy(args) => proxy::run(*args).await,
            Command::Diagnostics(cmd) => diagnostics::run(cmd).await,
            Command::Backend(args) => backend::run(args).await,
            Command::Demo(args) => demo::run(args).await,
            Command::Init(args) => init::run(*args),
        }
    });
    exit(result)
}

fn exit(result: anyhow::Result<()>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ballast: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
