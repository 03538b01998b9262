use clap::{Args as ClapArgs, ValueEnum};
use std::{ffi::OsString, io::IsTerminal};
use tracing_subscriber::{filter::Targets, prelude::*};

/// The logging flags every command takes (`ballast` and `ballast-proxy`).
#[derive(ClapArgs, Clone, Debug)]
pub struct LogArgs {
    /// Log filter: a default level and per-target levels (e.g. `info`, `warn,ballast=debug`).
    #[arg(long, global = true, env = "BALLAST_LOG", default_value = "info", value_parser = parse)]
    pub log: Targets,

    /// Log line format: `plain` (one line per event, coloured only when stderr
    /// is a terminal and NO_COLOR is unset) or `json` (one JSON object per
    /// line: timestamp, level, target, fields with the message).
    #[arg(long, global = true, env = "BALLAST_LOG_FORMAT", value_enum, default_value_t = LogFormat::Plain)]
    pub log_format: LogFormat,
}

/// How log events are written to stderr.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event.
    #[default]
    Plain,
    /// One JSON object per line, for log collectors.
    Json,
}

/// Logs go to stderr, one line per event. `filter` is a default level and
/// per-target levels, as in `warn,ballast=debug` (tracing's `Targets`
/// syntax: no span or field filters, and so no regular-expression engine in
/// the sidecar binary).
pub fn init(args: &LogArgs) -> anyhow::Result<()> {
    let ansi = colours(
        args.log_format,
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR"),
    );
    let plain = (args.log_format == LogFormat::Plain).then(|| {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(ansi)
            .with_target(false)
    });
    let json = (args.log_format == LogFormat::Json).then(|| {
        tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .with_span_list(false)
    });
    tracing_subscriber::registry()
        .with(plain.with_filter(args.log.clone()))
        .with(json.with_filter(args.log.clone()))
        .try_init()
        .map_err(|e| anyhow::anyhow!("cannot start logging: {e}"))
}

/// Colour escapes only for people: plain lines on a terminal, unless
/// NO_COLOR is set to something (https://no-color.org). A pipe (a file,
/// `kubectl logs`, a log collector) never gets them.
fn colours(format: LogFormat, stderr_is_terminal: bool, no_color: Option<OsString>) -> bool {
    format == LogFormat::Plain && stderr_is_terminal && no_color.is_none_or(|v| v.is_empty())
}

fn parse(filter: &str) -> Result<Targets, String> {
    filter
        .parse()
        .map_err(|e| format!("not a log filter (LEVEL or TARGET=LEVEL, comma-separated): {e}"))
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

    #[test]
    fn colours_only_for_plain_lines_on_a_terminal_without_no_color() {
        assert!(colours(LogFormat::Plain, true, None));
        assert!(colours(LogFormat::Plain, true, Some(OsString::new())));
        assert!(!colours(LogFormat::Plain, false, None));
        assert!(!colours(LogFormat::Plain, true, Some("1".into())));
        assert!(!colours(LogFormat::Json, true, None));
    }

    #[test]
    fn the_flags_parse_from_the_command_line() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            log: LogArgs,
        }
        let cli = Cli::try_parse_from(["t", "--log-format", "json", "--log", "warn"]).unwrap();
        assert_eq!(cli.log.log_format, LogFormat::Json);
        assert!(!cli.log.log.would_enable("x", &Level::INFO));
        assert!(Cli::try_parse_from(["t", "--log-format", "xml"]).is_err());
        assert!(Cli::try_parse_from(["t", "--log", "ballast=loud"]).is_err());
    }
}
