//! One policy watch per inbound port, shared by its connections: the
//! controller's latest answer (`WatchPort`), or, while it has not answered,
//! the default policy.
//!
//! The first connection to a port waits for the controller's first answer
//! at most the profile timeout from when the port's watch started; after
//! that, until an answer comes, the default policy applies and nobody
//! waits. A controller that does not serve the API leaves the port open
//! (the proxy's behaviour without policies); one that refuses the request
//! leaves the default. Lost streams keep the last answer (see
//! `discovery::server_policy`). Watches go when unused for the discovery
//! idle timeout; at most `--max-targets` exist at once
//! (`inbound_policy_ports`).

use super::policy::ServerPolicy;
use crate::{
    cache::IdleCache,
    config::DefaultInboundPolicy,
    discovery::{Discovery, PortAnswer, PortPolicyWatch},
    metrics::{Direction, Metrics},
    network::IpNetwork,
};
use std::{sync::Arc, time::Duration};
use tokio::{sync::watch, time::Instant};

type Answer = PortAnswer<Arc<ServerPolicy>>;

/// What a port falls back to without an answer.
#[derive(Clone, Debug)]
pub struct Fallbacks {
    /// `--default-inbound-policy`: no answer within the wait, or a refusal.
    pub default: Arc<ServerPolicy>,
    /// A controller without the API: everyone admitted.
    pub open: Arc<ServerPolicy>,
}

impl Fallbacks {
    /// The fallbacks of a port, detecting or opaque.
    pub fn new(default: DefaultInboundPolicy, cluster: &[IpNetwork], opaque: bool) -> Self {
        Self {
            default: Arc::new(ServerPolicy::default_for(default, cluster, opaque)),
            open: Arc::new(ServerPolicy::default_for(
                DefaultInboundPolicy::AllUnauthenticated,
                cluster,
                opaque,
            )),
        }
    }
}

/// Counts a port watch in `inbound_policy_ports` while it lives.
#[derive(Debug)]
struct Counted(Arc<Metrics>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.authz.policy_ports.dec();
    }
}

/// The policy of one port, shared by its connections.
#[derive(Debug)]
pub struct PortPolicy {
    rx: watch::Receiver<Answer>,
    /// Until then, a connection waits for the first answer.
    deadline: Instant,
    fallbacks: Fallbacks,
    _stream: Option<PortPolicyWatch<Arc<ServerPolicy>>>,
    _counted: Option<Counted>,
}

impl PortPolicy {
    /// A port's policy following `rx`; waits for a first answer until
    /// `deadline`.
    pub fn new(rx: watch::Receiver<Answer>, deadline: Instant, fallbacks: Fallbacks) -> Self {
        Self {
            rx,
            deadline,
            fallbacks,
            _stream: None,
            _counted: None,
        }
    }

    /// A port that follows no controller: its default policy.
    pub fn fixed(fallbacks: Fallbacks) -> Self {
        let (_, rx) = watch::channel(PortAnswer::Refused);
        Self::new(rx, Instant::now(), fallbacks)
    }

    /// The policy in force given `answer`; `None` while waiting for the
    /// first one.
    fn in_force(&self, answer: &Answer, now: Instant) -> Option<Arc<ServerPolicy>> {
        match answer {
            PortAnswer::Known(p) => Some(p.clone()),
            PortAnswer::Unimplemented => Some(self.fallbacks.open.clone()),
            PortAnswer::Refused => Some(self.fallbacks.default.clone()),
            PortAnswer::Pending if now >= self.deadline => Some(self.fallbacks.default.clone()),
            PortAnswer::Pending => None,
        }
    }

    /// Follows the port's policy from now on.
    pub fn follow(self: &Arc<Self>) -> Follow {
        Follow {
            port: self.clone(),
            rx: self.rx.clone(),
            seen: None,
        }
    }

    /// The policy in force, waiting for the first answer within the bound.
    pub async fn current(self: &Arc<Self>) -> Arc<ServerPolicy> {
        self.follow().current().await
    }
}

/// One connection's view of its port's policy: what is in force now, and
/// each change after.
#[derive(Debug)]
pub struct Follow {
    port: Arc<PortPolicy>,
    rx: watch::Receiver<Answer>,
    /// The policy last returned.
    seen: Option<Arc<ServerPolicy>>,
}

impl Follow {
    /// The policy in force, waiting (within the bound) for the first one.
    pub async fn current(&mut self) -> Arc<ServerPolicy> {
        loop {
            let answer = self.rx.borrow_and_update().clone();
            if let Some(p) = self.port.in_force(&answer, Instant::now()) {
                self.seen = Some(p.clone());
                return p;
            }
            self.wait().await;
        }
    }

    /// The policy in force once it differs from the one last returned (a
    /// new answer, or the end of the wait for the first one). Never
    /// returns once the controller has given a final answer.
    pub async fn changed(&mut self) -> Arc<ServerPolicy> {
        loop {
            let answer = self.rx.borrow_and_update().clone();
            if let Some(p) = self.port.in_force(&answer, Instant::now()) {
                if self.seen.as_ref().is_none_or(|s| !Arc::ptr_eq(s, &p)) {
                    self.seen = Some(p.clone());
                    return p;
                }
            }
            self.wait().await;
        }
    }

    /// Until the answer changes, or the wait for a first one ends.
    async fn wait(&mut self) {
        let pending = matches!(*self.rx.borrow(), PortAnswer::Pending);
        let deadline = self.port.deadline;
        if pending && Instant::now() < deadline {
            tokio::select! {
                r = self.rx.changed() => if r.is_err() { tokio::time::sleep_until(deadline).await },
                () = tokio::time::sleep_until(deadline) => {}
            }
        } else if self.rx.changed().await.is_err() {
            // The stream gave its final answer: nothing changes any more.
            std::future::pending::<()>().await;
        }
    }
}

/// Every port's policy watch.
pub struct PortPolicies {
    ports: IdleCache<u16, PortPolicy>,
    discovery: Discovery,
    workload: Arc<str>,
    wait: Duration,
    detecting: Fallbacks,
    opaque: Fallbacks,
    opaque_ports: Vec<u16>,
    metrics: Arc<Metrics>,
    translate: Arc<dyn Fn(linkerd2_proxy_api::inbound::Server) -> Arc<ServerPolicy> + Send + Sync>,
}

/// What [`PortPolicies`] is built from.
pub struct PortPoliciesConfig {
    pub discovery: Discovery,
    /// `PortSpec.workload`.
    pub workload: Arc<str>,
    /// How long a port's first connection waits for the first answer.
    pub wait: Duration,
    pub default: DefaultInboundPolicy,
    pub cluster_networks: Vec<IpNetwork>,
    /// Ports whose default policies are opaque.
    pub opaque_ports: Vec<u16>,
    /// Most ports watched at once.
    pub max_ports: usize,
    /// An unused watch goes after this long.
    pub idle: Duration,
    pub metrics: Arc<Metrics>,
}

impl PortPolicies {
    pub fn new(c: PortPoliciesConfig) -> Self {
        Self {
            ports: IdleCache::new(c.max_ports, c.idle),
            detecting: Fallbacks::new(c.default, &c.cluster_networks, false),
            opaque: Fallbacks::new(c.default, &c.cluster_networks, true),
            discovery: c.discovery,
            workload: c.workload,
            wait: c.wait,
            opaque_ports: c.opaque_ports,
            metrics: c.metrics,
            translate: Arc::new(|s| Arc::new(ServerPolicy::from_wire(s))),
        }
    }

    fn fallbacks(&self, port: u16) -> &Fallbacks {
        if self.opaque_ports.contains(&port) {
            &self.opaque
        } else {
            &self.detecting
        }
    }

    /// The policy of `port`, its watch started if there is none. Past the
    /// bound on watches, the port gets its default policy.
    pub fn get(&self, port: u16) -> Arc<PortPolicy> {
        let made = self.ports.get_or_insert_with(&port, || {
            let stream =
                self.discovery
                    .watch_port(self.workload.clone(), port, self.translate.clone());
            self.metrics.authz.policy_ports.inc();
            PortPolicy {
                rx: stream.rx.clone(),
                deadline: Instant::now() + self.wait,
                fallbacks: self.fallbacks(port).clone(),
                _stream: Some(stream),
                _counted: Some(Counted(self.metrics.clone())),
            }
        });
        match made {
            Ok(p) => p,
            Err(e) => {
                self.metrics
                    .error(Direction::inbound, "too_many_policy_ports");
                tracing::warn!(error = %e, port, "no policy watch for an inbound port; its default policy applies");
                Arc::new(PortPolicy::fixed(self.fallbacks(port).clone()))
            }
        }
    }

    /// Drops the watches of ports unused for the idle timeout.
    pub fn sweep(&self) {
        self.ports.sweep();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fallbacks() -> Fallbacks {
        Fallbacks::new(DefaultInboundPolicy::Deny, &[], false)
    }

    fn answered(name: &str) -> Arc<ServerPolicy> {
        let mut p = ServerPolicy::default_for(DefaultInboundPolicy::AllAuthenticated, &[], false);
        p.meta = crate::metrics::authz::PolicyMeta::default_named(name);
        Arc::new(p)
    }

    fn watched(wait: Duration) -> (watch::Sender<Answer>, Arc<PortPolicy>) {
        let (tx, rx) = watch::channel(PortAnswer::Pending);
        let p = Arc::new(PortPolicy::new(rx, Instant::now() + wait, fallbacks()));
        (tx, p)
    }

    fn name(p: &Arc<ServerPolicy>) -> &str {
        &p.meta.name
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_connection_waits_for_the_first_answer_within_the_bound() {
        let (tx, port) = watched(Duration::from_millis(500));
        let started = Instant::now();
        let waiting = tokio::spawn({
            let port = port.clone();
            async move { port.current().await }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!waiting.is_finished(), "it waits for the controller");
        tx.send_replace(PortAnswer::Known(answered("web")));
        let got = waiting.await.unwrap();
        assert_eq!(name(&got), "web");
        assert_eq!(started.elapsed(), Duration::from_millis(200));
    }

    #[tokio::test(start_paused = true)]
    async fn without_an_answer_the_default_applies_at_the_bound_and_then_at_once() {
        let (tx, port) = watched(Duration::from_millis(500));
        let started = Instant::now();
        let got = port.current().await;
        assert_eq!(name(&got), "deny");
        assert_eq!(started.elapsed(), Duration::from_millis(500));
        // Later connections do not wait again.
        let again = Instant::now();
        assert_eq!(name(&port.current().await), "deny");
        assert_eq!(again.elapsed(), Duration::ZERO);
        // A late answer replaces the default.
        tx.send_replace(PortAnswer::Known(answered("late")));
        assert_eq!(name(&port.current().await), "late");
    }

    #[tokio::test(start_paused = true)]
    async fn a_controller_without_the_api_leaves_the_port_open_and_a_refusal_the_default() {
        let (tx, port) = watched(Duration::from_secs(5));
        tx.send_replace(PortAnswer::Unimplemented);
        let open = port.current().await;
        assert_eq!(name(&open), "all-unauthenticated");
        let (tx, port) = watched(Duration::from_secs(5));
        tx.send_replace(PortAnswer::Refused);
        assert_eq!(name(&port.current().await), "deny");
    }

    #[tokio::test(start_paused = true)]
    async fn connections_follow_live_changes() {
        let (tx, port) = watched(Duration::from_millis(500));
        tx.send_replace(PortAnswer::Known(answered("v1")));
        let mut follow = port.follow();
        assert_eq!(name(&follow.current().await), "v1");
        let next = tokio::spawn(async move {
            let p = follow.changed().await;
            (p, follow)
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!next.is_finished(), "no change, nothing reported");
        tx.send_replace(PortAnswer::Known(answered("v2")));
        let (p, mut follow) = next.await.unwrap();
        assert_eq!(name(&p), "v2");
        // The controller going away for good (its final answer) leaves no
        // change to report.
        drop(tx);
        let ended = tokio::time::timeout(Duration::from_secs(60), follow.changed()).await;
        assert!(ended.is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn the_end_of_the_first_wait_is_a_change() {
        let (tx, port) = watched(Duration::from_millis(500));
        let mut follow = port.follow();
        let started = Instant::now();
        let changed = follow.changed().await;
        assert_eq!(name(&changed), "deny");
        assert_eq!(started.elapsed(), Duration::from_millis(500));
        tx.send_replace(PortAnswer::Known(answered("web")));
        assert_eq!(name(&follow.changed().await), "web");
    }
}
