use ballast_destination::diagnostics as diag;
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
