//! `ballast check`: flags and wiring (being written).

use clap::Args as ClapArgs;

#[derive(ClapArgs)]
pub struct Args {}

pub async fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("`ballast check` is not built yet")
}
