//! The inbound side: connections redirected to the workload arrive here and
//! go on to the workload at their original port on 127.0.0.1, byte for byte.
//! (Protocol detection and per-request HTTP come with the inbound issue.)

use crate::{
    config::InboundConfig,
    http::connect,
    io::Counted,
    metrics::{Direction, DstLabels, Metrics, Peer, TcpMetrics},
    orig_dst::original_dst,
    own::OwnListeners,
};
use std::{
    net::{Ipv4Addr, SocketAddr},
    sync::Arc,
};
use tokio::net::TcpStream;

const DIRECTION: Direction = Direction::inbound;

pub struct Inbound {
    config: InboundConfig,
    metrics: Arc<Metrics>,
    own: Arc<OwnListeners>,
}

impl Inbound {
    pub fn new(config: InboundConfig, metrics: Arc<Metrics>, own: Arc<OwnListeners>) -> Arc<Self> {
        Arc::new(Self {
            config,
            metrics,
            own,
        })
    }

    pub async fn serve(self: Arc<Self>, stream: TcpStream) {
        let Some(orig) = original_dst(&stream) else {
            // Not redirected: there is no workload port to go to.
            self.metrics.error(DIRECTION, "no_original_dst");
            return;
        };
        let target = SocketAddr::new(Ipv4Addr::LOCALHOST.into(), orig.port());
        if self.own.is_own(target) {
            self.metrics.error(DIRECTION, "loop");
            return;
        }
        let mut labels = DstLabels::unknown(DIRECTION);
        labels.authority = Arc::from(orig.to_string());
        let src = TcpMetrics::open(&self.metrics, Peer::src, labels.clone());
        let mut client = Counted::new(stream, src.read.clone(), src.write.clone());
        let ok = match connect(target, self.config.connect_timeout).await {
            Ok(server) => {
                let dst = TcpMetrics::open(&self.metrics, Peer::dst, labels);
                let mut server = Counted::new(server, dst.read.clone(), dst.write.clone());
                let r = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                dst.close(r.is_ok());
                r.is_ok()
            }
            Err(e) => {
                tracing::debug!(error = %e, "workload connect failed");
                self.metrics.error(DIRECTION, "connect");
                false
            }
        };
        src.close(ok);
    }
}
