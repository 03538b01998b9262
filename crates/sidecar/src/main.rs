//! `ballast-proxy`: the sidecar image's binary. With no subcommand it runs
//! the proxy (the flags of `ballast proxy`); `ballast-proxy init` sets up
//! the pod's iptables rules (the flags of `ballast init`); `ballast-proxy
//! await` waits for the proxy to be ready (its postStart hook).

#![forbid(unsafe_code)]

use ballast_sidecar::{init, logging, proxy, ready};
use clap::{Parser, Subcommand};
use std::process::ExitCode;

// jemalloc bounds fragmentation and lets /metrics report allocated/resident.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(
    name = "ballast-proxy",
    version,
    about = "Ballast's sidecar proxy: carry a workload's traffic, resolved through the \
destination controller and balanced across endpoints",
    args_conflicts_with_subcommands = true,
    propagate_version = true
)]
struct Cli {
    #[command(flatten)]
    log: logging::LogArgs,

    #[command(subcommand)]
    command: Option<Command>,

    #[command(flatten)]
    proxy: Box<proxy::Args>,
}

#[derive(Subcommand)]
enum Command {
    /// Set up the iptables nat rules that send a pod's TCP through its proxy
    /// (run once per pod, as an init container, in the pod's network namespace).
    Init(Box<init::Args>),
    /// Wait until this pod's proxy answers /ready (the proxy container's
    /// postStart hook, so that the app starts after its proxy).
    Await(ready::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(e) = logging::init(&cli.log) {
        eprintln!("ballast-proxy: {e}");
        return ExitCode::from(2);
    }
    let result = match cli.command {
        // Init only runs iptables: no runtime.
        Some(Command::Init(args)) => init::run(*args),
        Some(Command::Await(args)) => ready::run(args),
        None => proxy::run_blocking(*cli.proxy),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ballast-proxy: {e:#}");
            // Flags that cannot work together are a usage error, as clap's.
            if e.downcast_ref::<ballast_flags::UsageError>().is_some() {
                return ExitCode::from(2);
            }
            ExitCode::FAILURE
        }
    }
}
