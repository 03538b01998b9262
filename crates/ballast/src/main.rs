//! `ballast`: the one binary. It parses flags and wires the libraries.

#![forbid(unsafe_code)]

mod destination;
mod diagnostics;
mod logging;
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
    /// Ask a destination controller what it answers.
    #[command(subcommand)]
    Diagnostics(diagnostics::Command),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    if let Err(e) = logging::init(&cli.log) {
        eprintln!("ballast: {e}");
        return std::process::ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ballast: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Destination(args) => destination::run(*args).await,
            Command::Diagnostics(cmd) => diagnostics::run(cmd).await,
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ballast: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
