//! `ballast viz dashboard`: flags, then wiring of the local forwarder
//! (`ballast_viz::forward`) to the Kubernetes API server's service proxy.

use anyhow::Context;
use ballast_flags::{count, dns_label, TIMEOUT};
use ballast_viz::forward::{self, Body, ForwardConfig, Upstream};
use clap::{Args as ClapArgs, ValueEnum};
use http_body_util::BodyExt;
use std::{
    net::{IpAddr, SocketAddr},
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

/// Linkerd's `viz dashboard` port.
const DEFAULT_PORT: u16 = 50750;

#[derive(ClapArgs)]
#[command(
    after_help = "The dashboard is reached through the Kubernetes API server's service \
proxy (services/proxy of the ballast-viz Service), as `kubectl proxy` reaches it: no port-forward \
to one pod, so it keeps working when viz's pod is replaced. It needs `get` on services/proxy in \
the control plane's namespace.\n\
Examples:\n  ballast viz dashboard\n  ballast viz dashboard --port 8084 --show url"
)]
pub struct Args {
    /// The control plane's namespace (where `ballast install` put viz).
    #[arg(long, default_value = ballast_controlplane::DEFAULT_NAMESPACE, value_parser = dns_label)]
    namespace: String,

    /// A kubeconfig (default: KUBECONFIG, ~/.kube/config, else in-cluster).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,

    /// Local address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    address: IpAddr,

    /// Local port to listen on (0 lets the OS pick one; the URL printed says which).
    #[arg(long, default_value_t = DEFAULT_PORT)]
    port: u16,

    /// What to do once the dashboard answers: open it in a browser
    /// (`xdg-open`), or only print its URL.
    #[arg(long, value_enum, default_value_t = Show::Browser)]
    show: Show,

    /// How long to wait for viz to answer ready before giving up.
    #[arg(long, default_value = "5m", value_parser = TIMEOUT)]
    wait: Duration,

    /// Local connections served at once (the rest wait in the listen backlog).
    #[arg(long, default_value_t = forward::DEFAULT_MAX_CONNECTIONS, value_parser = count(1, 1024))]
    max_connections: usize,

    /// Longest wait for the dashboard's answer to one request to start.
    #[arg(long, default_value = "30s", value_parser = TIMEOUT)]
    answer_timeout: Duration,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Show {
    Browser,
    Url,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let config = ballast_kubeconfig::load(args.kubeconfig.as_deref()).await?;
    let client = kube::Client::try_from(config)
        .map_err(|e| anyhow::anyhow!("cannot build a Kubernetes client: {e}"))?;
    let prefix = format!(
        "/api/v1/namespaces/{}/services/{}:{}/proxy",
        args.namespace,
        ballast_controlplane::object::VIZ,
        ballast_controlplane::port::VIZ
    );
    let upstream = kube_upstream(client);
    wait_ready(&upstream, &prefix, args.wait, &args.namespace).await?;

    let listen = SocketAddr::new(args.address, args.port);
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen} (is the port taken? see --port)"))?;
    let url = format!("http://{}/", listener.local_addr()?);
    println!("Ballast dashboard available at:\n{url}");
    if args.show == Show::Browser {
        let opened = std::process::Command::new("xdg-open")
            .arg(&url)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !opened {
            println!("(no browser could be opened here: open the URL yourself)");
        }
    }
    println!("Press Ctrl+C to stop.");
    forward::serve(
        listener,
        upstream,
        ForwardConfig {
            prefix,
            max_connections: args.max_connections,
            answer_timeout: args.answer_timeout,
            shutdown_grace: Duration::from_secs(1),
        },
        ballast_sidecar::signal::shutdown(),
    )
    .await;
    Ok(())
}

/// Requests sent through the API server with the kubeconfig's credentials.
fn kube_upstream(client: kube::Client) -> Upstream {
    Arc::new(move |req: http::Request<()>| {
        let client = client.clone();
        Box::pin(async move {
            let req = req.map(|()| kube::client::Body::empty());
            let rsp = client
                .send(req)
                .await
                .map_err(|e| ballast_kubeconfig::first_line(&e.to_string()).to_string())?;
            Ok(rsp.map(|body| -> Body {
                body.map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>)
                    .boxed_unsync()
            }))
        })
    })
}

/// Waits until viz answers `/ready` 200 through the API server, saying why
/// not every 10 s; an error after `wait`.
async fn wait_ready(
    upstream: &Upstream,
    prefix: &str,
    wait: Duration,
    namespace: &str,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut said = None::<Instant>;
    loop {
        let req = http::Request::get(format!("{prefix}/ready")).body(())?;
        let why = match upstream(req).await {
            Ok(rsp) if rsp.status().is_success() => return Ok(()),
            Ok(rsp) => {
                let status = rsp.status();
                let body = rsp.into_body().collect().await.map(|b| b.to_bytes());
                let text = body
                    .map(|b| String::from_utf8_lossy(&b).trim().to_string())
                    .unwrap_or_default();
                format!("{status}: {}", text.lines().next().unwrap_or(""))
            }
            Err(e) => e,
        };
        if started.elapsed() >= wait {
            anyhow::bail!(
                "the dashboard in namespace {namespace} did not become ready within {wait:?} ({why}); \
                 is viz installed there? (`ballast check`, --namespace)"
            );
        }
        if said.is_none_or(|at| at.elapsed() >= Duration::from_secs(10)) {
            eprintln!("Waiting for ballast-viz in namespace {namespace} to be ready ({why})");
            said = Some(Instant::now());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
