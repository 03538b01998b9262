//! `ballast backend`: one demo HTTP backend as its own process.

use anyhow::Context;
use ballast_demo::Backend;
use clap::Args as ClapArgs;
use std::net::SocketAddr;

#[derive(ClapArgs)]
#[command(
    after_help = "Answers every request 200 with the body `NAME\\n` and the header \
`x-backend: NAME`, over HTTP/1.1 and HTTP/2 (prior knowledge) on one port. Steer it with \
`POST /_backend/delay?ms=N`, `POST /_backend/fail?rate=R` (0 to 1) and read \
`GET /_backend/stats`.\n\
Every flag can also be set by the environment variable shown."
)]
pub struct Args {
    /// Address to listen on (port 0 lets the OS pick one; the log says which).
    #[arg(long, env = "BALLAST_BACKEND_ADDR", default_value = "127.0.0.1:8080")]
    addr: SocketAddr,

    /// Name given in every answer's body and `x-backend` header.
    #[arg(long, env = "BALLAST_BACKEND_NAME", default_value = "backend",
          value_parser = ballast_flags::non_empty)]
    name: String,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let backend = Backend::start(&args.name, args.addr)
        .await
        .with_context(|| format!("cannot start backend {:?} on {}", args.name, args.addr))?;
    tracing::info!("backend {} listening on {}", backend.name(), backend.addr());
    ballast_sidecar::signal::shutdown().await;
    tracing::info!(
        requests = backend.requests(),
        "backend {} stopped",
        backend.name()
    );
    Ok(())
}
