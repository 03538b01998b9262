//! Following one server stream from the controller: open it, hand every
//! message on, and open it again after a backoff when it fails, until the
//! controller gives a final answer.

use super::control::ControlPlane;
use super::metrics::StreamLabels;
use ballast_backoff::Backoff;
use std::{future::Future, time::Duration};
use tonic::{codec::Streaming, transport::Channel, Code, Response, Status};

/// Statuses that no retry will change.
pub(crate) fn is_final(status: &Status) -> bool {
    matches!(status.code(), Code::InvalidArgument | Code::Unimplemented)
}

/// The decoder refused a message over the size limit (tonic reports it as
/// `OUT_OF_RANGE` or `RESOURCE_EXHAUSTED`, naming the size).
fn is_too_large(status: &Status) -> bool {
    matches!(status.code(), Code::OutOfRange | Code::ResourceExhausted)
        && status.message().contains("too large")
}

/// How long to wait before opening the stream again: the backoff's step,
/// or longer when the controller said so (gRPC's `grpc-retry-pushback-ms`,
/// which Ballast's controller sends when it refuses a stream for memory).
fn retry_delay(backoff: Duration, status: Option<&Status>) -> Duration {
    let hint = status
        .and_then(|s| s.metadata().get(ballast_backoff::RETRY_PUSHBACK_KEY))
        .and_then(|v| v.to_str().ok());
    ballast_backoff::with_pushback(backoff, hint)
}

/// Decrements the open-streams gauge however the stream ends (the task may
/// be aborted mid-stream).
struct OpenStream<'a>(&'a ControlPlane, &'static str);

impl Drop for OpenStream<'_> {
    fn drop(&mut self) {
        self.0
            .metrics
            .discovery
            .control_streams
            .get_or_create(&StreamLabels { rpc: self.1 })
            .dec();
    }
}

/// Follows the stream that `open` starts. `on_message` gets each message and
/// whether it is the first of its stream (a Reset). Returns only on a final
/// status.
pub(crate) async fn follow<M, Open, Fut, OnMessage>(
    control: &ControlPlane,
    rpc: &'static str,
    mut open: Open,
    mut on_message: OnMessage,
) -> Status
where
    Open: FnMut(Channel) -> Fut,
    Fut: Future<Output = Result<Response<Streaming<M>>, Status>>,
    OnMessage: FnMut(M, bool),
{
    let labels = StreamLabels { rpc };
    let metrics = control.metrics.clone();
    let mut backoff = Backoff::new(&control.config.backoff);
    loop {
        let failure = match open(control.channel()).await {
            Ok(response) => {
                metrics
                    .discovery
                    .control_streams
                    .get_or_create(&labels)
                    .inc();
                let _open = OpenStream(control, rpc);
                let mut stream = response.into_inner();
                let mut first = true;
                loop {
                    match stream.message().await {
                        Ok(Some(message)) => {
                            control.healthy();
                            backoff.reset();
                            metrics
                                .discovery
                                .control_messages_total
                                .get_or_create(&labels)
                                .inc();
                            on_message(message, first);
                            first = false;
                        }
                        // The controller ended the stream (it is shutting
                        // down): open it again, elsewhere or later.
                        Ok(None) => break None,
                        Err(status) => break Some(status),
                    }
                }
            }
            Err(status) => Some(status),
        };
        let delay = retry_delay(backoff.next_delay(), failure.as_ref());
        match failure {
            Some(status) if is_final(&status) => return status,
            Some(status) => {
                metrics
                    .discovery
                    .control_stream_errors_total
                    .get_or_create(&labels)
                    .inc();
                if is_too_large(&status) {
                    metrics
                        .discovery
                        .control_messages_too_large_total
                        .get_or_create(&labels)
                        .inc();
                    tracing::warn!(
                        rpc,
                        limit = control.config.max_message_bytes,
                        message = status.message(),
                        "the controller sent a message over --control-max-message-bytes; \
                         keeping the last known state and retrying"
                    );
                }
                control.unhealthy(status.message());
                tracing::debug!(rpc, code = ?status.code(), message = status.message(), "controller stream failed");
            }
            None => control.unhealthy("the controller ended the stream"),
        }
        tokio::time::sleep(delay).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retry_hint_lengthens_the_wait_within_a_bound() {
        let step = Duration::from_millis(200);
        let hinted = |v: &str| {
            let mut s = Status::resource_exhausted("memory");
            s.metadata_mut()
                .insert("grpc-retry-pushback-ms", v.parse().expect("ascii"));
            s
        };
        assert_eq!(retry_delay(step, None), step);
        assert_eq!(retry_delay(step, Some(&Status::unavailable("x"))), step);
        assert_eq!(
            retry_delay(step, Some(&hinted("5000"))),
            Duration::from_secs(5)
        );
        // A hint shorter than the backoff does not hurry it.
        assert_eq!(retry_delay(step, Some(&hinted("10"))), step);
        assert_eq!(
            retry_delay(step, Some(&hinted("999999999"))),
            ballast_backoff::MAX_PUSHBACK
        );
        for junk in ["-1", "1.5", "soon", ""] {
            assert_eq!(retry_delay(step, Some(&hinted(junk))), step, "{junk:?}");
        }
    }

    #[test]
    fn oversized_messages_are_told_from_other_failures() {
        let too_large = Status::out_of_range(
            "Error, decoded message length too large: found 9000000 bytes, the limit is: 4194304 bytes",
        );
        assert!(is_too_large(&too_large));
        assert!(!is_too_large(&Status::unavailable("connection refused")));
        assert!(!is_too_large(&Status::out_of_range("index out of range")));
    }
}
