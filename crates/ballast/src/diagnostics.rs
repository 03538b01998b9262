use ballast_diagnostics as diag;
use ballast_flags::TIMEOUT;
use clap::{Args as ClapArgs, Subcommand, ValueEnum};
use std::time::Duration;

#[derive(Subcommand)]
pub enum Command {
    /// The endpoints `Get` answers for AUTHORITY (NAME.NS.svc.CLUSTER_DOMAIN:PORT or IP:PORT).
    Endpoints(Query),
    /// The profile `GetProfile` answers for AUTHORITY, and what kind it is: from a
    /// ServiceProfile, the defaults for a service without one, the defaults for
    /// an unknown service (told apart by asking `Get` too), or an endpoint's.
    Profile(Query),
    /// The policy the controller answers a proxy: outbound for a service
    /// (`svc/NAME PORT`, as `OutboundPolicies.Get`), or inbound for a pod's
    /// port (`po/NAME PORT`, as `InboundServerPolicies.GetPort`); printed as
    /// the message the proxy receives.
    Policy(PolicyQuery),
}

#[derive(ClapArgs)]
pub struct PolicyQuery {
    /// `svc/NAME` (outbound policy of a Service) or `po/NAME` (inbound policy of a pod).
    #[arg(value_parser = resource)]
    resource: (ResourceKind, String),
    /// The port: the Service's port, or the pod's container port.
    #[arg(value_parser = clap::value_parser!(u16).range(1..))]
    port: u16,
    /// The namespace of the Service or pod.
    #[arg(short, long, default_value = "default", value_parser = ballast_flags::dns_label)]
    namespace: String,
    /// The cluster's DNS domain (outbound: NAME.NS.svc.CLUSTER_DOMAIN:PORT is asked for).
    #[arg(long, default_value = "cluster.local", value_parser = ballast_flags::dns_name)]
    cluster_domain: String,
    /// Address of the destination controller's gRPC server (it serves the policy APIs there too).
    #[arg(long, env = "BALLAST_DESTINATION", default_value = "127.0.0.1:8086")]
    destination: String,
    /// How long to wait for the controller's answer.
    #[arg(long, default_value = "5s", value_parser = TIMEOUT)]
    timeout: Duration,
}

#[derive(Clone, Copy, Debug)]
enum ResourceKind {
    Service,
    Pod,
}

fn resource(s: &str) -> Result<(ResourceKind, String), String> {
    let (kind, name) = s
        .split_once('/')
        .ok_or_else(|| format!("{s:?} is not svc/NAME or po/NAME"))?;
    let kind = match kind {
        "svc" | "service" | "services" => ResourceKind::Service,
        "po" | "pod" | "pods" => ResourceKind::Pod,
        other => return Err(format!("{other:?} is not svc or po")),
    };
    let name = ballast_flags::dns_name(name).map_err(|e| e.to_string())?;
    Ok((kind, name))
}

#[derive(ClapArgs)]
pub struct Query {
    /// What to ask about: NAME.NS.svc.CLUSTER_DOMAIN:PORT, NAME.NS[:PORT] or IP:PORT.
    /// An authority, as Linkerd's `diagnostics` takes: a URL (`http://web.shop:80`)
    /// is refused, with the authority it holds suggested.
    #[arg(value_parser = diag::authority)]
    authority: String,
    /// Address of the destination controller's gRPC server (`ballast destination --addr`);
    /// a server there that does not speak gRPC (an admin port, say) is reported as such.
    #[arg(long, env = "BALLAST_DESTINATION", default_value = "127.0.0.1:8086")]
    destination: String,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
    output: Output,
    /// How long to wait for the controller's first answer.
    #[arg(long, default_value = "5s", value_parser = TIMEOUT)]
    timeout: Duration,
}

#[derive(Copy, Clone, ValueEnum)]
enum Output {
    Table,
    Json,
}

pub async fn run(cmd: Command) -> anyhow::Result<()> {
    match cmd {
        Command::Endpoints(q) => {
            let answer = diag::endpoints(&q.destination, &q.authority, q.timeout).await?;
            match q.output {
                Output::Table => print!("{}", diag::endpoints_table(&q.authority, &answer)),
                Output::Json => println!("{:#}", diag::endpoints_json(&answer)),
            }
        }
        Command::Policy(q) => {
            let (kind, name) = &q.resource;
            match kind {
                ResourceKind::Service => {
                    let authority =
                        format!("{name}.{}.svc.{}:{}", q.namespace, q.cluster_domain, q.port);
                    let policy =
                        diag::outbound_policy(&q.destination, &authority, &q.namespace, q.timeout)
                            .await?;
                    println!("# outbound policy of {authority}");
                    println!("{policy:#?}");
                }
                ResourceKind::Pod => {
                    let server =
                        diag::inbound_policy(&q.destination, &q.namespace, name, q.port, q.timeout)
                            .await?;
                    println!(
                        "# inbound policy of pod {}/{name} port {}",
                        q.namespace, q.port
                    );
                    println!("{server:#?}");
                }
            }
        }
        Command::Profile(q) => {
            let profile = diag::profile(&q.destination, &q.authority, q.timeout).await?;
            match q.output {
                Output::Table => print!("{}", diag::profile_table(&profile)),
                Output::Json => println!("{:#}", diag::profile_json(&profile)),
            }
        }
    }
    Ok(())
}
