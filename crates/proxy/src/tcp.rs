//! Opaque TCP: bytes forwarded both ways, unchanged, to an endpoint the
//! balancer chose.

use crate::{
    balance::{Balancer, MAX_CONNECT_ATTEMPTS},
    http::connect,
    io::Counted,
    metrics::{BalancerProtocol, Metrics, Peer, TcpMetrics},
};
use std::{sync::Arc, time::Duration};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    time::Instant,
};

/// Forwards `client` to an endpoint of `balancer`, trying others while
/// connects fail, until the failfast deadline. Returns whether the
/// connection ended cleanly.
pub async fn forward<C>(
    mut client: C,
    balancer: &Balancer,
    connect_timeout: Duration,
    metrics: &Arc<Metrics>,
) -> bool
where
    C: AsyncRead + AsyncWrite + Unpin,
{
    let deadline = Instant::now() + balancer.failfast_timeout();
    balancer.bind_protocol(BalancerProtocol::Tcp);
    let mut failed_connects = 0;
    loop {
        let endpoint = match balancer.select(deadline).await {
            Ok(e) => e,
            Err(e) => {
                tracing::debug!(authority = %balancer.authority(), error = %e, "no endpoint for a TCP connection");
                return false;
            }
        };
        match connect(endpoint.endpoint.addr, connect_timeout).await {
            Ok(server) => {
                endpoint.connect_succeeded();
                let in_flight = endpoint.start();
                in_flight.observe();
                let dst = TcpMetrics::open(metrics, Peer::dst, endpoint.labels.clone());
                let mut server = Counted::new(server, dst.read.clone(), dst.write.clone());
                let result = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                dst.close(result.is_ok());
                return result.is_ok();
            }
            Err(e) => {
                tracing::debug!(error = %e, "endpoint connect failed");
                endpoint.connect_failed();
                metrics.error(balancer.direction(), "connect");
                failed_connects += 1;
                if Instant::now() >= deadline || failed_connects >= MAX_CONNECT_ATTEMPTS {
                    return false;
                }
            }
        }
    }
}
