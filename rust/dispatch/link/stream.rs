//! Opening a link's `RunClosures` stream and sending closures on it: gathered into
//! messages of at most half a frame, the stream opened with the first of them (bounded
//! like a running worker's silence), and a worker that just came up watched through a
//! stream opened before it has work. Part of the pipeline (`pipeline.rs`).

use std::sync::Arc;
use std::time::Instant;

use prost::Message;

use super::outstanding::Sent;
use super::Link;
use crate::dispatch::closure::Closure;
use crate::dispatch::config::ErrorPolicy;
use crate::dispatch::transport::WorkerTransport;
use crate::rpc::wire::limits::BATCH_MESSAGE_BYTES;
use crate::rpc::{pb, RpcError};

/// What wrapping one closure in a `RunClosuresRequest` adds at most (tag and length).
const REQUEST_FRAMING: usize = 16;

impl<T: WorkerTransport> Link<T> {
    /// Sends `closures` (ready to run here), opening the stream first if needed.
    pub(super) async fn send(&mut self, closures: Vec<Closure>) {
        self.send_closures(closures, false).await;
    }

    /// [`send`](Self::send); `registered_again` marks closures retried after their
    /// function was registered again.
    pub(super) async fn send_closures(&mut self, closures: Vec<Closure>, registered_again: bool) {
        let was_idle = self.pipeline.outstanding.is_empty();
        if was_idle {
            self.check_idle_stream();
        }
        let mut requests = Vec::with_capacity(closures.len());
        for mut closure in closures {
            requests.push(closure.request(self.index));
            closure.attempts += 1;
            self.pipeline.outstanding.push_back(Sent {
                closure,
                since: Instant::now(),
                registered_again,
            });
        }
        let messages = gather(requests, self.transport.max_message_bytes());
        self.publish(0);
        let sent_any = !messages.is_empty();
        for mut message in messages {
            message.resume = std::mem::take(&mut self.pipeline.resume);
            message.heartbeat_ack = self.pipeline.ack;
            if let Some(channel) = &self.pipeline.channel {
                // A closed channel means the stream ended; the next wait for answers sees
                // that and puts the outstanding closures back.
                channel.send(message);
                continue;
            }
            if !self.open(self.opening(message)).await {
                return;
            }
        }
        if sent_any {
            // Its answer is due within a round trip.
            crate::runtime::awake::expect();
        }
        if was_idle && sent_any {
            // The worker had nothing to say while idle: its silence counts from now, after
            // the sending (encoding a large argument takes a while, and the worker cannot
            // answer what it has not been sent).
            let now = Instant::now();
            self.pipeline.last_heard = Some(now);
            self.pipeline.last_ping = Some(now);
        }
    }

    /// Before sending to a worker that was idle: reads what its stream delivered
    /// meanwhile (late heartbeats), and drops a stream that ended, so a worker that died
    /// while idle costs the closures about to be sent nothing (a new stream is opened, and
    /// fails to open if the worker is gone).
    pub(super) fn check_idle_stream(&mut self) {
        loop {
            let Some(channel) = self.pipeline.channel.as_mut() else {
                return;
            };
            match channel.try_next() {
                None => return,
                Some(Some(Ok(response))) => self.heard(&response),
                Some(Some(Err(_)) | None) => {
                    self.pipeline.drop_stream();
                    return;
                }
            }
        }
    }

    /// Opens the stream of a worker that just came up, before it has work: an idle link
    /// watches its stream (`take_when_idle`), so a worker that dies before its first
    /// closure is noticed when its connection breaks, as one that ran closures is, instead
    /// of showing `up` until a closure is sent to it. Only after coming up, not whenever
    /// the link is idle without a stream: a stream the worker ended while idle is not
    /// reopened until there is work for it (no loop of opening against a worker that ends
    /// every stream).
    pub(super) async fn watch_idle_worker(&mut self) {
        if self.pipeline.channel.is_some() || !self.pipeline.outstanding.is_empty() {
            return;
        }
        let first = self.opening(pb::RunClosuresRequest::default());
        // Bounded like a probe: a worker that takes longer to accept a stream (frozen, say)
        // must not keep this link from taking work; unwatched, it is as before.
        let opening = tokio::time::timeout(
            self.shared.config.probe_timeout,
            self.transport.run_closures(first),
        );
        let Some(opened) = self.call(opening).await else {
            return; // stopping
        };
        let Ok(opened) = opened else {
            return; // not accepted within the probe timeout
        };
        match opened {
            Ok(channel) => self.pipeline.channel = Some(channel),
            Err(error) => {
                if self.is_worker_failure(&error).await {
                    self.worker_failed(&format!(
                        "its RunClosures stream could not be opened: {}",
                        error.message()
                    ));
                }
                // Otherwise (e.g. refused): the first closure sent opens the stream again
                // and meets the error, as it would have without this.
            }
        }
    }

    /// `first` with the options a stream is opened with (they apply to the whole stream).
    pub(super) fn opening(&self, first: pb::RunClosuresRequest) -> pb::RunClosuresRequest {
        pb::RunClosuresRequest {
            halt_on_error: self.shared.config.error_policy == ErrorPolicy::CancelAll,
            lease_ms: self.lease_ms(),
            ..first
        }
    }

    /// Opens the stream with `first`; `false` if that failed (the outstanding closures
    /// were then settled or put back).
    ///
    /// Bounded as a running worker's silence is: a worker that has not accepted the stream
    /// within the heartbeat timeout is probed; one that does not answer the probe either
    /// (frozen, cut off) has failed and its closures go back to the queue, while one that
    /// answers is slow, not gone, and is waited for. Unbounded, a worker frozen with its
    /// connection open held its closures until HTTP/2's keepalive gave up (about 35 s).
    pub(super) async fn open(&mut self, first: pb::RunClosuresRequest) -> bool {
        let transport = Arc::clone(&self.transport);
        let opening = transport.run_closures(first);
        tokio::pin!(opening);
        // The configured timeout, whatever the worker's protocol: accepting a stream is not
        // a heartbeat, and the probe decides.
        let bound = self.shared.config.heartbeat_timeout;
        let opened = loop {
            let attempt = async {
                match bound {
                    Some(bound) => tokio::time::timeout(bound, &mut opening).await.ok(),
                    None => Some((&mut opening).await),
                }
            };
            let Some(outcome) = self.call(attempt).await else {
                self.abandon();
                return false;
            };
            if let Some(opened) = outcome {
                break opened;
            }
            if self.worker_lost().await {
                let error = RpcError::DeadlineExceeded(format!(
                    "worker {} accepted no RunClosures stream within {:.1} s and did not \
                     answer a status probe",
                    self.address(),
                    bound.unwrap_or_default().as_secs_f64()
                ));
                // A closure in the first message may have reached the worker: charged.
                self.stream_failed(&error, true).await;
                return false;
            }
        };
        match opened {
            Ok(channel) => {
                // `ack` and `running` are 0: they went with the last stream (`drop_stream`).
                self.pipeline.channel = Some(channel);
                true
            }
            Err(error) => {
                // Refused or unreachable before anything was queued: no closure ran.
                self.stream_failed(&error, false).await;
                false
            }
        }
    }
}

/// Gathers closures' requests into messages, in order: each message at most
/// [`BATCH_MESSAGE_BYTES`] (or `limit`, if lower), so that it arrives inside one HTTP/2
/// frame; a request larger than that goes alone in its message, which the channel sends in
/// chunks if it is above `limit` (or refuses, for a worker that cannot assemble them).
fn gather(requests: Vec<pb::RunClosureRequest>, limit: usize) -> Vec<pb::RunClosuresRequest> {
    let batch = limit.min(BATCH_MESSAGE_BYTES);
    let mut messages: Vec<pb::RunClosuresRequest> = Vec::new();
    let mut size = batch; // forces a first message
    for request in requests {
        let needed = (request.encoded_len() + REQUEST_FRAMING).min(batch);
        if size + needed > batch {
            messages.push(pb::RunClosuresRequest::default());
            size = 0;
        }
        size += needed;
        if let Some(message) = messages.last_mut() {
            message.closures.push(request);
        }
    }
    messages
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use prost::Message;

    use super::{gather, BATCH_MESSAGE_BYTES};
    use crate::rpc::pb;

    fn request(id: u64, bytes: usize) -> pb::RunClosureRequest {
        pb::RunClosureRequest {
            closure_id: id,
            args: Some(pb::Value {
                pickle: Bytes::from_static(b"\x80\x05N."),
                buffers: vec![Bytes::from(vec![1u8; bytes])],
            }),
            ..pb::RunClosureRequest::default()
        }
    }

    #[test]
    fn batches_fit_half_a_frame_and_large_closures_go_alone() {
        let sizes = [64 * 1024; 20]
            .into_iter()
            .chain([
                3 * BATCH_MESSAGE_BYTES,
                100,
                100,
                BATCH_MESSAGE_BYTES - 50,
                10,
            ])
            .collect::<Vec<_>>();
        let requests: Vec<_> = (0_u64..)
            .zip(&sizes)
            .map(|(id, &bytes)| request(id, bytes))
            .collect();
        let messages = gather(requests, 64 << 20);
        let order: Vec<u64> = messages
            .iter()
            .flat_map(|m| m.closures.iter().map(|c| c.closure_id))
            .collect();
        assert_eq!(
            order,
            (0..sizes.len() as u64).collect::<Vec<_>>(),
            "in order, none lost"
        );
        for message in &messages {
            let len = message.encoded_len();
            assert!(
                len <= BATCH_MESSAGE_BYTES || message.closures.len() == 1,
                "a {len}-byte message of {} closures",
                message.closures.len()
            );
        }
        // Twenty 64 KiB closures: seven to a 512 KiB message, not all twenty in one.
        assert_eq!(messages[0].closures.len(), 7);
        assert_eq!(messages.len(), 3 + 1 + 1 + 1 + 1);
        // Under a lower message limit, that limit bounds a batch instead.
        let small = gather((0..10).map(|id| request(id, 1000)).collect(), 4096);
        assert!(small.iter().all(|m| m.encoded_len() <= 4096), "{small:?}");
        assert_eq!(small.iter().map(|m| m.closures.len()).sum::<usize>(), 10);
    }
}
