//! Opaque TCP: bytes forwarded both ways, unchanged, to an endpoint the
//! balancer chose.

use crate::{
    balance::{BalanceError, Balancer, MAX_CONNECT_ATTEMPTS},
    connect::Dialer,
    io::Counted,
    metrics::{Metrics, Peer, TcpMetrics},
};
use std::sync::Arc;
use tokio::{
    io::{AsyncRead, AsyncWrite},
    time::Instant,
};

/// The balancer of an opaque TCP target: endpoints carry no connection
/// state, each client connection gets its own.
pub type TcpBalancer = Balancer<()>;

/// Forwards `client` to an endpoint of `balancer`, trying others while
/// connects fail, until the failfast deadline. Returns whether the
/// connection ended cleanly.
pub async fn forward<C>(
    mut client: C,
    balancer: &TcpBalancer,
    dialer: &Dialer,
    metrics: &Arc<Metrics>,
) -> bool
where
    C: AsyncRead + AsyncWrite + Unpin,
{
    let deadline = Instant::now() + balancer.failfast_timeout();
    let mut failed_connects = 0;
    loop {
        let endpoint = match balancer.select(deadline).await {
            Ok(e) => e,
            Err(e) => {
                if e == BalanceError::NotFound {
                    metrics.error(balancer.direction(), e.reason());
                }
                tracing::debug!(authority = %balancer.authority(), error = %e, "no endpoint for a TCP connection");
                return false;
            }
        };
        match dialer.dial(&endpoint.endpoint, true).await {
            Ok((server, tls)) => {
                endpoint.connect_succeeded();
                let in_flight = endpoint.start();
                in_flight.observe();
                let dst = TcpMetrics::open(metrics, Peer::dst, endpoint.labels.clone(), tls);
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
