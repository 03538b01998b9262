use std::io::IsTerminal;
use tracing_subscriber::{filter::Targets, prelude::*};

/// Logs go to stderr, one line per event, coloured only on a terminal.
/// `filter` is a default level and per-target levels, as in
/// `warn,ballast=debug` (tracing's `Targets` syntax: no span or field
/// filters, and so no regular-expression engine in the sidecar binary).
pub fn init(filter: &str) -> anyhow::Result<()> {
    let filter = parse(filter)?;
    let stderr = std::io::stderr();
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(stderr.is_terminal())
        .with_target(false);
    tracing_subscriber::registry()
        .with(fmt.with_filter(filter))
        .try_init()
        .map_err(|e| anyhow::anyhow!("cannot start logging: {e}"))
}

fn parse(filter: &str) -> anyhow::Result<Targets> {
    filter
        .parse()
        .map_err(|e| anyhow::anyhow!("invalid --log filter {filter:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing::Level;

    #[test]
    fn levels_apply_by_target_prefix_and_bad_filters_are_refused() {
        let t = parse("warn,ballast=debug").expect("a filter");
        assert!(t.would_enable("ballast_proxy::outbound", &Level::DEBUG));
        assert!(!t.would_enable("h2::proto", &Level::INFO));
        assert!(t.would_enable("h2::proto", &Level::WARN));
        assert!(parse("ballast=loud").is_err());
    }
}
