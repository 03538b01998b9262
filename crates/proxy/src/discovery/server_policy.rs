//! `InboundServerPolicies.WatchPort`: what the controller says of one of
//! this pod's inbound ports, as a latest-value watch. The stream shares the
//! one controller connection and follows its backoff; a lost stream keeps
//! the last answer. The translation of a `Server` is the caller's: this
//! module knows nothing of what a policy means.

use super::{
    control::ControlPlane,
    snapshot::{self, Held, Kind},
    stream, AbortOnDrop,
};
use linkerd2_proxy_api::inbound::{
    inbound_server_policies_client::InboundServerPoliciesClient, PortSpec, Server,
};
use prost::Message;
use std::sync::Arc;
use tokio::sync::watch;
use tonic::Code;

/// What is known of a port's policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PortAnswer<T> {
    /// Nothing heard yet.
    Pending,
    /// The controller's latest answer (kept while the stream is re-opened).
    Known(T),
    /// The controller does not serve inbound policies at all.
    Unimplemented,
    /// The controller refused the request for good (`INVALID_ARGUMENT`).
    Refused,
}

/// The answer a final status leaves, given the last one known: a controller
/// without the API says so; a refusal keeps what it said before, if
/// anything.
pub(crate) fn after_final<T>(code: Code, last: PortAnswer<T>) -> PortAnswer<T> {
    match (code, last) {
        (Code::Unimplemented, _) => PortAnswer::Unimplemented,
        (_, PortAnswer::Known(t)) => PortAnswer::Known(t),
        _ => PortAnswer::Refused,
    }
}

/// The `PortSpec.workload` of a pod, as Linkerd's proxy sends it:
/// `{"ns":"NAMESPACE","pod":"NAME"}`.
pub fn workload_json(namespace: &str, pod: &str) -> String {
    fn escaped(s: &str) -> String {
        let mut out = String::with_capacity(s.len());
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
                c => out.push(c),
            }
        }
        out
    }
    format!(
        "{{\"ns\":\"{}\",\"pod\":\"{}\"}}",
        escaped(namespace),
        escaped(pod)
    )
}

/// One port's policy stream, kept current while this handle lives.
#[derive(Debug)]
pub struct PortPolicyWatch<T> {
    pub rx: watch::Receiver<PortAnswer<T>>,
    _task: AbortOnDrop,
}

impl<T: Send + Sync + 'static> PortPolicyWatch<T> {
    /// Starts watching `port` of `workload` (see [`workload_json`]); each
    /// `Server` is turned into a `T` once, by `translate`.
    pub(crate) fn spawn(
        control: ControlPlane,
        workload: Arc<str>,
        port: u16,
        translate: Arc<dyn Fn(Server) -> T + Send + Sync>,
    ) -> Self {
        let (tx, rx) = watch::channel(PortAnswer::Pending);
        let request = PortSpec {
            workload: workload.to_string(),
            port: u32::from(port),
        };
        let max_message = control.config.max_message_bytes;
        let key: Arc<str> = Arc::from(port.to_string());
        let restored = control.restored(Kind::Inbound, &key);
        let task = tokio::spawn(async move {
            let alive = Arc::new(());
            let serving = std::sync::Mutex::new(None);
            // The newest message not yet in force: with a snapshot, each is
            // written to it before it takes effect (a restarted proxy never
            // starts from a policy wider than the one that was in force).
            let (latest_tx, mut latest_rx) = watch::channel::<Option<Server>>(None);
            let follow = stream::follow(
                &control,
                "watch_port",
                |channel| {
                    let request = request.clone();
                    async move {
                        InboundServerPoliciesClient::new(channel)
                            .max_decoding_message_size(max_message)
                            .watch_port(request)
                            .await
                    }
                },
                |server: Server, _| {
                    latest_tx.send_replace(Some(server));
                },
            );
            let book = control.book.clone();
            let apply = |server: Server| {
                let (book, serving, key, alive, tx, translate) =
                    (&book, &serving, &key, &alive, &tx, &translate);
                async move {
                    if let Some(book) = book {
                        let held = Held::Encoded(server.encode_to_vec().into());
                        book.record_durably(Kind::Inbound, key, held, alive).await;
                    }
                    snapshot::answered(serving);
                    tx.send_replace(PortAnswer::Known(translate(server)));
                }
            };
            let in_force = async {
                while latest_rx.changed().await.is_ok() {
                    let next = latest_rx.borrow_and_update().clone();
                    if let Some(server) = next {
                        apply(server).await;
                    }
                }
                std::future::pending::<std::convert::Infallible>().await
            };
            let from_snapshot = snapshot::serve_after_wait(
                restored,
                Kind::Inbound,
                &serving,
                || matches!(*tx.borrow(), PortAnswer::Pending),
                |message| match Server::decode(message) {
                    Ok(server) => {
                        tx.send_replace(PortAnswer::Known(translate(server)));
                        true
                    }
                    Err(_) => false,
                },
            );
            let status = tokio::select! {
                status = follow => status,
                never = in_force => match never {},
                never = from_snapshot => match never {},
            };
            // The last message takes effect before the final status (its
            // turn may have been cut short).
            let last = latest_rx.borrow().clone();
            if let Some(server) = last {
                apply(server).await;
            }
            drop(serving);
            tracing::debug!(port, code = ?status.code(), message = status.message(), "the controller gave a final answer for an inbound port's policy");
            tx.send_modify(|a| {
                let last = std::mem::replace(a, PortAnswer::Pending);
                *a = after_final(status.code(), last);
            });
            // Receivers keep the final answer; the sender may go.
        });
        Self {
            rx,
            _task: AbortOnDrop(task.abort_handle()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_controller_without_the_api_means_unimplemented_whatever_came_before() {
        assert_eq!(
            after_final(Code::Unimplemented, PortAnswer::Known(1)),
            PortAnswer::Unimplemented
        );
        assert_eq!(
            after_final::<u8>(Code::Unimplemented, PortAnswer::Pending),
            PortAnswer::Unimplemented
        );
        assert_eq!(
            after_final(Code::InvalidArgument, PortAnswer::Known(1)),
            PortAnswer::Known(1)
        );
        assert_eq!(
            after_final::<u8>(Code::InvalidArgument, PortAnswer::Pending),
            PortAnswer::Refused
        );
    }

    #[test]
    fn the_workload_is_linkerds_json() {
        assert_eq!(
            workload_json("shop", "web-0"),
            r#"{"ns":"shop","pod":"web-0"}"#
        );
        assert_eq!(
            workload_json("a\"b", "c\\d"),
            r#"{"ns":"a\"b","pod":"c\\d"}"#
        );
    }
}
