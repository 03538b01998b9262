//! `ballast stat`, `edges`, `routes`, `tap` and `top`: flags only; the
//! client and the printing live in `ballast_viz::cli`.

use std::time::Duration;

use ballast_flags::{duration, DurationRange, HOUR};
use ballast_viz::cli::{self, CliError, Output, TapOutput};
use clap::{Args as ClapArgs, ValueEnum};

/// `-t` windows: from one second to the collector's history at most (the
/// server answers with what it has).
const WINDOW: DurationRange = duration(Duration::from_secs(1), HOUR);
/// `top --interval`.
const INTERVAL: DurationRange = duration(Duration::from_millis(100), HOUR);
/// `top --duration`.
const RUN_FOR: DurationRange = duration(Duration::from_millis(100), ballast_flags::DAY);

/// Where the viz server is (every command).
#[derive(ClapArgs, Clone)]
pub struct VizAddr {
    /// The viz server's API (`ballast viz --addr`): HOST:PORT.
    #[arg(long, env = "BALLAST_VIZ_ADDR", default_value = cli::DEFAULT_VIZ_ADDR, value_name = "HOST:PORT", value_parser = ballast_flags::host_port)]
    viz_addr: String,
}

/// Namespace selection of stat and edges.
#[derive(ClapArgs, Clone)]
pub struct Namespaces {
    /// Namespace of the resources.
    #[arg(short = 'n', long, default_value = "default", value_parser = ballast_flags::dns_label)]
    namespace: String,
    /// Every namespace (adds a NAMESPACE column).
    #[arg(short = 'A', long, conflicts_with = "namespace")]
    all_namespaces: bool,
}

impl Namespaces {
    fn selected(&self) -> Option<String> {
        (!self.all_namespaces).then(|| self.namespace.clone())
    }
}

#[derive(Copy, Clone, ValueEnum)]
enum TableOutput {
    Table,
    Wide,
    Json,
}

impl From<TableOutput> for Output {
    fn from(o: TableOutput) -> Output {
        match o {
            TableOutput::Table => Output::Table,
            TableOutput::Wide => Output::Wide,
            TableOutput::Json => Output::Json,
        }
    }
}

/// A kind as the API takes it (`deploy`, `po`, `svc`, `ns`, `rt` ...).
fn kind(s: &str) -> Result<String, String> {
    ballast_vizcore::mesh::canonical_kind(s)
        .map(|_| s.to_ascii_lowercase())
        .map_err(|_| {
            format!(
                "unknown kind {s:?}: expected deploy, sts, ds, job, rs, po, svc, ns or rt (or their long names)"
            )
        })
}

/// `KIND[/NAME]`.
#[derive(Clone)]
struct KindName {
    kind: String,
    name: Option<String>,
}

fn kind_name(s: &str) -> Result<KindName, String> {
    let (k, name) = match s.split_once('/') {
        Some((k, n)) if !n.is_empty() => (k, Some(n.to_string())),
        Some((k, _)) => (k, None),
        None => (s, None),
    };
    Ok(KindName {
        kind: kind(k)?,
        name,
    })
}

#[derive(ClapArgs)]
#[command(
    after_help = "Examples:\n  ballast stat deploy -n demo\n  ballast stat deploy/web -n demo -t 1m\n  ballast stat ns\n  ballast stat po -A -o wide\n  ballast stat svc/web -n demo -o json"
)]
pub struct StatArgs {
    /// What to show: KIND or KIND/NAME (deploy, sts, ds, job, po, svc, ns, rt).
    #[arg(value_parser = kind_name, value_name = "KIND[/NAME]")]
    resource: KindName,
    #[command(flatten)]
    namespaces: Namespaces,
    /// The window the figures cover (default: the server's).
    #[arg(short = 't', long = "time-window", value_parser = WINDOW)]
    window: Option<Duration>,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = TableOutput::Table)]
    output: TableOutput,
    #[command(flatten)]
    viz: VizAddr,
}

#[derive(ClapArgs)]
#[command(after_help = "Examples:\n  ballast edges deploy -n demo\n  ballast edges po -A -o wide")]
pub struct EdgesArgs {
    /// Which workloads' edges: deploy, sts, ds, job, po, ...
    #[arg(value_parser = kind, value_name = "KIND")]
    kind: String,
    #[command(flatten)]
    namespaces: Namespaces,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = TableOutput::Table)]
    output: TableOutput,
    #[command(flatten)]
    viz: VizAddr,
}

#[derive(ClapArgs)]
#[command(
    after_help = "Examples:\n  ballast routes svc/web -n demo\n  ballast routes svc/web -n demo -o json"
)]
pub struct RoutesArgs {
    /// The routes of this Service (svc/NAME); all routes when left out.
    #[arg(value_name = "svc/NAME")]
    target: Option<String>,
    /// Namespace of the Service.
    #[arg(short = 'n', long, default_value = "default", value_parser = ballast_flags::dns_label)]
    namespace: String,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = TableOutput::Table)]
    output: TableOutput,
    #[command(flatten)]
    viz: VizAddr,
}

/// What to tap (tap and top).
#[derive(ClapArgs)]
pub struct TapFilterArgs {
    /// What to tap: deploy/NAME, sts/NAME, ds/NAME, job/NAME, pod/NAME, ns/NAME (or KIND for every one in the namespace).
    #[arg(value_name = "RESOURCE")]
    resource: String,
    /// Namespace of the resource.
    #[arg(short = 'n', long, default_value = "default", value_parser = ballast_flags::dns_label)]
    namespace: String,
    /// Only requests to this resource (deploy/NAME, svc/NAME, pod/NAME, ns/NAME ...).
    #[arg(long)]
    to: Option<String>,
    /// Namespace of the --to resource (default: --namespace).
    #[arg(long)]
    to_namespace: Option<String>,
    /// Only requests with this HTTP method.
    #[arg(long)]
    method: Option<String>,
    /// Only requests whose path starts with this.
    #[arg(long)]
    path: Option<String>,
    /// Only requests with this :authority.
    #[arg(long)]
    authority: Option<String>,
    /// Requests per second shown at most (the server's default and cap when left out).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    max_rps: Option<u32>,
    /// Stop after this many requests.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    limit: Option<u64>,
    #[command(flatten)]
    viz: VizAddr,
}

impl TapFilterArgs {
    fn filter(&self) -> cli::TapFilter {
        cli::TapFilter {
            viz_addr: self.viz.viz_addr.clone(),
            resource: self.resource.clone(),
            namespace: self.namespace.clone(),
            to: self.to.clone(),
            to_namespace: self.to_namespace.clone(),
            method: self.method.clone(),
            path: self.path.clone(),
            authority: self.authority.clone(),
            max_rps: self.max_rps,
            limit: self.limit,
        }
    }
}

#[derive(Copy, Clone, ValueEnum)]
enum TapFormat {
    Plain,
    Wide,
    Json,
}

#[derive(ClapArgs)]
#[command(
    after_help = "Examples:\n  ballast tap deploy/load -n demo\n  ballast tap deploy/load -n demo --to deploy/web --method GET --path /api\n  ballast tap deploy/load -n demo -o json --limit 100"
)]
pub struct TapArgs {
    #[command(flatten)]
    filter: TapFilterArgs,
    /// Output format: req/rsp/end lines (plain, wide adds workloads and
    /// identities) or one JSON event per line.
    #[arg(short = 'o', long, value_enum, default_value_t = TapFormat::Plain)]
    output: TapFormat,
}

#[derive(ClapArgs)]
#[command(
    after_help = "On a terminal the table is redrawn every second; otherwise (or with --plain, or -o json: one JSON document a line) it is printed every --interval. Stops after --duration, or when the tap ends (--limit)."
)]
pub struct TopArgs {
    #[command(flatten)]
    filter: TapFilterArgs,
    /// Leave out the SOURCE column.
    #[arg(long)]
    hide_sources: bool,
    /// How often the table is printed in plain mode.
    #[arg(long, default_value = "2s", value_parser = INTERVAL)]
    interval: Duration,
    /// Stop after this long.
    #[arg(long, value_parser = RUN_FOR)]
    duration: Option<Duration>,
    /// Plain tables even on a terminal.
    #[arg(long)]
    plain: bool,
    /// Rows shown at most (the busiest).
    #[arg(long, default_value_t = 40, value_parser = ballast_flags::count(1, 10_000))]
    max_rows: usize,
    /// Output format: the table, or the same rows as one JSON document a
    /// line (printed every --interval, never redrawn).
    #[arg(short = 'o', long, value_enum, default_value_t = TopFormat::Table)]
    output: TopFormat,
}

#[derive(Clone, Copy, ValueEnum)]
enum TopFormat {
    Table,
    Json,
}

pub async fn stat(args: StatArgs) -> anyhow::Result<()> {
    let o = cli::StatOptions {
        viz_addr: args.viz.viz_addr,
        kind: args.resource.kind,
        name: args.resource.name,
        namespace: args.namespaces.selected(),
        window: args.window,
        output: args.output.into(),
    };
    finish(cli::stat(&o, &mut std::io::stdout().lock()).await)
}

pub async fn edges(args: EdgesArgs) -> anyhow::Result<()> {
    let o = cli::EdgesOptions {
        viz_addr: args.viz.viz_addr,
        kind: args.kind,
        namespace: args.namespaces.selected(),
        output: args.output.into(),
    };
    finish(cli::edges(&o, &mut std::io::stdout().lock()).await)
}

pub async fn routes(args: RoutesArgs) -> anyhow::Result<()> {
    let o = cli::RoutesOptions {
        viz_addr: args.viz.viz_addr,
        target: args.target,
        namespace: Some(args.namespace),
        output: args.output.into(),
    };
    finish(cli::routes(&o, &mut std::io::stdout().lock()).await)
}

pub async fn tap(args: TapArgs) -> anyhow::Result<()> {
    let output = match args.output {
        TapFormat::Plain => TapOutput::Plain,
        TapFormat::Wide => TapOutput::Wide,
        TapFormat::Json => TapOutput::Json,
    };
    let mut out = std::io::stdout();
    finish(cli::tap(&args.filter.filter(), output, &mut out).await)
}

pub async fn top(args: TopArgs) -> anyhow::Result<()> {
    let o = cli::TopOptions {
        filter: args.filter.filter(),
        hide_sources: args.hide_sources,
        interval: args.interval,
        duration: args.duration,
        plain: args.plain,
        max_rows: args.max_rows,
        json: matches!(args.output, TopFormat::Json),
    };
    let mut out = std::io::stdout();
    finish(cli::top(&o, &mut out).await)
}

/// A reader that went away (`| head`) ends the command quietly.
fn finish(result: Result<(), CliError>) -> anyhow::Result<()> {
    match result {
        Err(e) if cli::is_broken_pipe(&e) => Ok(()),
        other => other.map_err(anyhow::Error::from),
    }
}
