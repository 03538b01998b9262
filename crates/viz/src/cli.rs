//! `ballast stat`, `edges`, `routes`, `tap` and `top`: the viz JSON API
//! printed as `linkerd viz` prints it. [`client`] talks to the server,
//! [`render`] and [`top`] turn answers into text (pure, tested), and the
//! functions here run one command each, writing to the given output.

pub mod client;
pub mod render;
pub mod top;

use std::io::{IsTerminal, Write};
use std::time::Duration;

use ballast_vizcore::api::{EdgesResponse, RoutesResponse, StatResponse};
use serde::de::DeserializeOwned;

pub use client::{TapLine, VizClient};

/// The viz server the CLI asks when none is given (Linkerd viz web's port).
pub const DEFAULT_VIZ_ADDR: &str = "127.0.0.1:8084";

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("cannot reach ballast viz at {addr}: {reason} (is `ballast viz` running? set --viz-addr or BALLAST_VIZ_ADDR)")]
    Unreachable { addr: String, reason: String },
    /// The server refused the query; its message.
    #[error("{message}")]
    Api { status: u16, message: String },
    #[error("unexpected answer from ballast viz at {addr}: {reason}")]
    Protocol { addr: String, reason: String },
    #[error("{0}")]
    Usage(String),
    #[error("cannot write the output: {0}")]
    Output(#[from] std::io::Error),
}

/// How stat, edges and routes print.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Output {
    #[default]
    Table,
    /// The table with more columns.
    Wide,
    /// The API's answer as it is (pretty-printed).
    Json,
}

/// `ballast stat KIND[/NAME]`.
#[derive(Clone, Debug)]
pub struct StatOptions {
    pub viz_addr: String,
    /// As the API takes it (`deploy`, `po`, `ns`, ...).
    pub kind: String,
    pub name: Option<String>,
    /// `None`: every namespace (`-A`).
    pub namespace: Option<String>,
    pub window: Option<Duration>,
    pub output: Output,
}

pub async fn stat(o: &StatOptions, out: &mut dyn Write) -> Result<(), CliError> {
    let is_namespace = ballast_vizcore::mesh::canonical_kind(&o.kind).ok() == Some("namespace");
    let mut query = vec![("kind", o.kind.clone())];
    if let Some(n) = &o.name {
        query.push(("name", n.clone()));
    }
    // Namespaces are listed whatever namespace is current.
    if !is_namespace {
        if let Some(ns) = &o.namespace {
            query.push(("namespace", ns.clone()));
        }
    }
    if let Some(w) = o.window {
        query.push(("window", w.as_secs().max(1).to_string()));
    }
    let client = VizClient::new(&o.viz_addr);
    let value = client.get_json("/api/stat", &query).await?;
    if o.output == Output::Json {
        return print_json(&value, out);
    }
    let answer: StatResponse = typed(&client, value)?;
    if answer.rows.is_empty() {
        eprintln!("No traffic found.");
        return Ok(());
    }
    let view = render::StatView {
        namespaces: o.namespace.is_none() && !is_namespace,
        wide: o.output == Output::Wide,
    };
    out.write_all(render::stat_table(&answer, view).as_bytes())?;
    Ok(())
}

/// `ballast edges KIND`.
#[derive(Clone, Debug)]
pub struct EdgesOptions {
    pub viz_addr: String,
    pub kind: String,
    pub namespace: Option<String>,
    pub output: Output,
}

pub async fn edges(o: &EdgesOptions, out: &mut dyn Write) -> Result<(), CliError> {
    let mut query = vec![("kind", o.kind.clone())];
    if let Some(ns) = &o.namespace {
        query.push(("namespace", ns.clone()));
    }
    let client = VizClient::new(&o.viz_addr);
    let value = client.get_json("/api/edges", &query).await?;
    if o.output == Output::Json {
        return print_json(&value, out);
    }
    let answer: EdgesResponse = typed(&client, value)?;
    if answer.edges.is_empty() {
        eprintln!("No edges found.");
        return Ok(());
    }
    out.write_all(render::edges_table(&answer, o.output == Output::Wide).as_bytes())?;
    Ok(())
}

/// `ballast routes svc/NAME`.
#[derive(Clone, Debug)]
pub struct RoutesOptions {
    pub viz_addr: String,
    pub target: Option<String>,
    pub namespace: Option<String>,
    pub output: Output,
}

pub async fn routes(o: &RoutesOptions, out: &mut dyn Write) -> Result<(), CliError> {
    let mut query = Vec::new();
    if let Some(t) = &o.target {
        query.push(("target", t.clone()));
    }
    if let Some(ns) = &o.namespace {
        query.push(("namespace", ns.clone()));
    }
    let client = VizClient::new(&o.viz_addr);
    let value = client.get_json("/api/routes", &query).await?;
    if o.output == Output::Json {
        return print_json(&value, out);
    }
    let answer: RoutesResponse = typed(&client, value)?;
    if answer.rows.is_empty() {
        eprintln!("No traffic found.");
        return Ok(());
    }
    out.write_all(render::routes_table(&answer, o.output == Output::Wide).as_bytes())?;
    Ok(())
}

/// What a tap (or top) asks for.
#[derive(Clone, Debug, Default)]
pub struct TapFilter {
    pub viz_addr: String,
    /// `deploy/web`, `pod/web-1`, `ns/demo`, ...
    pub resource: String,
    pub namespace: String,
    pub to: Option<String>,
    pub to_namespace: Option<String>,
    pub method: Option<String>,
    pub path: Option<String>,
    pub authority: Option<String>,
    pub max_rps: Option<u32>,
    /// End after this many requests.
    pub limit: Option<u64>,
}

impl TapFilter {
    fn query(&self) -> Vec<(&'static str, String)> {
        let mut q = vec![
            ("target", self.resource.clone()),
            ("namespace", self.namespace.clone()),
        ];
        for (key, value) in [
            ("to", &self.to),
            ("to_namespace", &self.to_namespace),
            ("method", &self.method),
            ("path", &self.path),
            ("authority", &self.authority),
        ] {
            if let Some(v) = value {
                q.push((key, v.clone()));
            }
        }
        if let Some(r) = self.max_rps {
            q.push(("max_rps", r.to_string()));
        }
        if let Some(l) = self.limit {
            q.push(("limit", l.to_string()));
        }
        q
    }
}

/// How `ballast tap` prints.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TapOutput {
    /// `req` / `rsp` / `end` lines.
    #[default]
    Plain,
    /// The lines with workloads and identities.
    Wide,
    /// One `TapEvent` per line, as the API sends it.
    Json,
}

/// `ballast tap RESOURCE`: prints requests until the server ends the tap
/// (its `limit`) or the command is stopped. Notices go to stderr.
pub async fn tap(
    filter: &TapFilter,
    output: TapOutput,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let client = VizClient::new(&filter.viz_addr);
    let mut lines = client.tap(&filter.query()).await?;
    while let Some(raw) = lines.next_raw().await? {
        let line = TapLine::parse(&raw).map_err(|reason| CliError::Protocol {
            addr: client.addr().to_string(),
            reason,
        })?;
        match line {
            TapLine::Notice(n) => eprintln!("tap: {n}"),
            TapLine::Event(e) => {
                match output {
                    TapOutput::Json => {
                        out.write_all(&raw)?;
                        out.write_all(b"\n")?;
                    }
                    TapOutput::Plain => out.write_all(render::tap_lines(&e, false).as_bytes())?,
                    TapOutput::Wide => out.write_all(render::tap_lines(&e, true).as_bytes())?,
                }
                out.flush()?;
            }
        }
    }
    Ok(())
}

/// `ballast top RESOURCE`.
#[derive(Clone, Debug)]
pub struct TopOptions {
    pub filter: TapFilter,
    pub hide_sources: bool,
    /// Plain mode: print the table this often.
    pub interval: Duration,
    /// Stop after this long.
    pub duration: Option<Duration>,
    /// Plain tables even on a terminal.
    pub plain: bool,
    pub max_rows: usize,
    /// One JSON document a line instead of tables (never redrawn).
    pub json: bool,
}

/// Redraws of the live table.
const LIVE_EVERY: Duration = Duration::from_secs(1);
/// Notices kept under the live table.
const LIVE_NOTICES: usize = 3;

pub async fn top(o: &TopOptions, out: &mut dyn Write) -> Result<(), CliError> {
    let live = !o.plain && !o.json && std::io::stdout().is_terminal();
    let client = VizClient::new(&o.filter.viz_addr);
    let mut lines = client.tap(&o.filter.query()).await?;
    let mut counts = top::Top::new(top::MAX_KEYS);
    let view = top::TopView {
        hide_sources: o.hide_sources,
        max_rows: o.max_rows,
    };
    let every = if live { LIVE_EVERY } else { o.interval };
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let stop = async {
        match o.duration {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(stop);
    let mut notices: Vec<String> = Vec::new();
    let mut drawn: Option<u64> = None;
    let title = format!(
        "ballast top {} (namespace {})",
        o.filter.resource, o.filter.namespace
    );
    let draw =
        |counts: &top::Top, notices: &[String], out: &mut dyn Write| -> std::io::Result<()> {
            if o.json {
                let mut line = serde_json::to_vec(&counts.json(view))?;
                line.push(b'\n');
                out.write_all(&line)?;
                return out.flush();
            }
            let mut text = String::new();
            if live {
                // Home and clear, then the frame.
                text.push_str("\x1b[H\x1b[2J");
                text.push_str(&format!("{title}: {} requests\n\n", counts.total()));
            }
            text.push_str(&counts.render(view));
            if live {
                for n in notices.iter().rev().take(LIVE_NOTICES).rev() {
                    text.push_str(&format!("tap: {n}\n"));
                }
            } else {
                text.push('\n');
            }
            out.write_all(text.as_bytes())?;
            out.flush()
        };
    loop {
        tokio::select! {
            line = lines.next() => match line? {
                Some(TapLine::Event(e)) => counts.add(&e),
                Some(TapLine::Notice(n)) => {
                    if !live {
                        eprintln!("tap: {n}");
                    }
                    if notices.len() == LIVE_NOTICES {
                        notices.remove(0);
                    }
                    notices.push(n);
                }
                None => break,
            },
            _ = tick.tick() => {
                draw(&counts, &notices, out)?;
                drawn = Some(counts.total());
            }
            () = &mut stop => break,
        }
    }
    // The last table, unless it is on screen already.
    if drawn != Some(counts.total()) {
        draw(&counts, &notices, out)?;
    }
    Ok(())
}

fn print_json(value: &serde_json::Value, out: &mut dyn Write) -> Result<(), CliError> {
    let text = serde_json::to_string_pretty(value).map_err(|e| CliError::Usage(e.to_string()))?;
    out.write_all(text.as_bytes())?;
    out.write_all(b"\n")?;
    Ok(())
}

fn typed<T: DeserializeOwned>(client: &VizClient, value: serde_json::Value) -> Result<T, CliError> {
    serde_json::from_value(value).map_err(|e| CliError::Protocol {
        addr: client.addr().to_string(),
        reason: format!("the answer is not what this ballast reads: {e}"),
    })
}

/// Whether an output error is the reader going away (`| head`), which ends
/// a command quietly.
pub fn is_broken_pipe(e: &CliError) -> bool {
    matches!(e, CliError::Output(io) if io.kind() == std::io::ErrorKind::BrokenPipe)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tap_filters_become_the_query() {
        let f = TapFilter {
            viz_addr: "x".into(),
            resource: "deploy/load".into(),
            namespace: "demo".into(),
            to: Some("svc/web".into()),
            method: Some("GET".into()),
            max_rps: Some(5),
            limit: Some(10),
            ..TapFilter::default()
        };
        assert_eq!(
            f.query(),
            [
                ("target", "deploy/load".to_string()),
                ("namespace", "demo".to_string()),
                ("to", "svc/web".to_string()),
                ("method", "GET".to_string()),
                ("max_rps", "5".to_string()),
                ("limit", "10".to_string()),
            ]
        );
    }

    #[tokio::test]
    async fn an_unreachable_viz_is_one_line_naming_it() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        drop(listener);
        let o = StatOptions {
            viz_addr: addr.to_string(),
            kind: "deploy".into(),
            name: None,
            namespace: Some("demo".into()),
            window: None,
            output: Output::Table,
        };
        let mut out = Vec::new();
        let e = stat(&o, &mut out).await.expect_err("nothing listens");
        let text = e.to_string();
        assert!(
            text.starts_with(&format!("cannot reach ballast viz at {addr}: ")),
            "{text}"
        );
        assert!(text.contains("--viz-addr"), "{text}");
        assert!(!text.contains('\n'));
        assert!(out.is_empty());
    }
}
