//! A link's `RunClosures` stream to its worker, the closures outstanding on it, and
//! sending more while busy (pipelining).
//!
//! Whether a busy link may pipeline, and how an idle link gets closures back from busy
//! ones, is the handshake of `balance.rs` (with the argument that keeps it
//! work-conserving); this file sends, reads answers and reclaims by its verdicts.
//!
//! # Depth
//!
//! `benches/cpu_breakdown.py`, 30,000 closures on two local workers (a shared 2-core
//! machine: rates swing about 20 % between runs), closures/s and CPU per closure over all
//! three processes, trivial / small-array:
//!
//! | depth | trivial | small-array |
//! |---|---|---|
//! | unary `RunClosure`, one at a time (before streams) | 5,700-7,600/s, 230-250 us | - |
//! | 0 (stream, no pipelining) | 14,800/s, 114 us | 10,800/s, 157 us |
//! | 2 | 44,000/s, 39 us | 15,800/s, 118 us |
//! | 8 | 61,000/s, 30 us | 18,700/s, 104 us |
//! | 16 | 72,000/s, 25 us | 29,000/s, 66 us |
//! | 64 | 68,000/s, 26 us | 26,000/s, 76 us |
//!
//! Past 8 the gain was within the noise on two workers, and 16 was the default until the
//! 1,000-worker bench (`benches/scale.rs`) showed what a deeper pipeline buys once messages
//! are the cost: each message carries more closures, and every connection is touched less
//! often. Depth 16 against 64, interleaved runs on one day:
//!
//! | bench | 16 | 64 |
//! |---|---|---|
//! | `scale`, 10 / 1,000 Rust echo workers | 214-301k / 161-166k per s | 331-386k / 283-308k per s |
//! | `coordinator_bench.py`, trivial, many in flight / sustained 3 s | 56-63k / 56-78k per s | 75-77k / 89-90k per s |
//! | `coordinator_bench.py`, small-array, many in flight | 23-26k per s | 26-30k per s |
//! | `wire_bench.py`, 64 KiB in and out | 9.5-11.7k per s | 10.5-12.6k per s |
//!
//! 64 is the default. A deep pipeline is for small closures; a link also stops pipelining
//! once the arguments it has outstanding reach `pipeline_bytes` (32 MiB by default), so 64
//! large arrays are never stacked on one worker (at depth 16, seventeen 16 MiB arguments
//! could be). Refilling only once half the pipeline has drained (bigger messages, fewer of
//! them) made no difference that the noise did not swamp, so a link refills after every
//! message of answers.
//!
//! # Failures
//!
//! Under `cancel_all` the stream is opened with `halt_on_error`: after a closure fails, the
//! worker starts none of the stream's queued closures but hands them back (and they are
//! cancelled, the error being pending), and a link that settles a failure asks every other
//! link to reclaim too, so no pipelined closure starts after a failure is known. The next
//! message after an error carries `resume`. A broken stream (the worker died) puts every
//! outstanding closure back: at least once, never lost. `closure_timeout` turns pipelining
//! off (an execution's clock must start when it starts, which only an idle worker
//! guarantees), and the link times the one closure outstanding itself.

use std::sync::Arc;
use std::time::{Duration, Instant};

use prost::Message;

use super::execute::Verdict;
use super::outstanding::{Outstanding, Sent};
use super::{until_stopped, Link};
use crate::dispatch::closure::{Closure, Work};
use crate::dispatch::config::ErrorPolicy;
use crate::dispatch::deaths;
use crate::dispatch::failure::ClosureFailure;
use crate::dispatch::resources::ResourceState;
use crate::dispatch::result_cell::EncodedValue;
use crate::dispatch::transport::WorkerTransport;
use crate::queue::TryGetError;
use crate::rpc::limits::BATCH_MESSAGE_BYTES;
use crate::rpc::{pb, ClosureChannel, RpcError};

/// What wrapping one closure in a `RunClosuresRequest` adds at most (tag and length).
const REQUEST_FRAMING: usize = 16;

/// The stream and what is outstanding on it.
#[derive(Default)]
pub(super) struct Pipeline {
    pub channel: Option<ClosureChannel>,
    pub outstanding: Outstanding,
    /// The worker halted the stream after an error: the next message carries `resume`.
    resume: bool,
    /// The worker refused a closure with `UNAVAILABLE` (it is shutting down): send nothing
    /// more, collect the answers still due, then recover.
    going_away: Option<String>,
    /// When the worker was last heard from (or closures were sent to an idle worker).
    pub last_heard: Option<Instant>,
    /// When the link last pinged.
    pub last_ping: Option<Instant>,
    /// The highest heartbeat received, echoed in `heartbeat_ack`.
    pub ack: u64,
    /// The closure the worker's last message said it was running (0: none).
    pub running: u64,
    /// The worker just came up and has no stream yet: one is opened before the link waits
    /// for work ([`Link::watch_idle_worker`]).
    pub unwatched: bool,
}

impl Pipeline {
    /// Forgets the stream (dropping it cancels it), keeping what is outstanding. Its
    /// heartbeat acknowledgement goes with it: heartbeats count from each stream's opening,
    /// so one echoed on the next stream would grant that stream a lease nothing vouches for.
    pub fn drop_stream(&mut self) {
        self.channel = None;
        self.resume = false;
        self.ack = 0;
        self.running = 0;
    }
}

/// What an idle link's wait for work ended with.
pub(super) enum Idle {
    Work(Work),
    /// The queue was stopped.
    Stopped,
    /// The worker was found gone; the link is recovering.
    Lost,
}

/// What ended a wait for answers.
enum Event {
    Answers(Option<Result<pb::RunClosuresResponse, RpcError>>),
    Reclaim,
    TimedOut,
    /// Time to ping the worker.
    Ping,
    /// The worker sent nothing for the heartbeat timeout.
    Silent(Duration),
}

impl<T: WorkerTransport> Link<T> {
    /// Closures this link may have outstanding: one running, plus the pipeline depth
    /// (none under `closure_timeout`).
    fn capacity(&self) -> usize {
        let config = &self.shared.config;
        1 + if config.closure_timeout.is_some() {
            0
        } else {
            config.pipeline_depth
        }
    }

    /// Publishes how many closures this link has outstanding, plus `extra` taken and not
    /// sent yet (read by idle links, see `balance.rs`).
    fn publish(&self, extra: usize) {
        let count = self.pipeline.outstanding.len() + extra;
        self.slot.publish(count);
    }

    /// Whether a busy link may send another closure now (no link idle, see `balance.rs`):
    /// not while its worker is going away, nor while a closure whose worker died under it
    /// before is outstanding (it runs alone, see `deaths.rs`).
    fn may_pipeline(&self) -> bool {
        self.pipeline.going_away.is_none()
            && !self
                .pipeline
                .outstanding
                .iter()
                .any(|sent| sent.closure.runs_alone())
            && self.shared.balance.may_pipeline()
    }

    /// Takes work as an idle link: without waiting if some is queued, else after asking a
    /// pipelining link to reclaim, waiting until work arrives. Meanwhile it watches the
    /// open stream: a worker that dies while idle is noticed when its connection breaks,
    /// not only when the next closure is sent to it (a dashboard would show it up).
    pub(super) async fn take_when_idle(&mut self) -> Idle {
        loop {
            let shared = &self.shared;
            let tag = self.tag();
            let take = async {
                match shared.queue.try_get(Some(tag)) {
                    Ok(work) => Some(work),
                    Err(TryGetError::Stopped) => None,
                    Err(TryGetError::Empty) => {
                        shared.balance.ask_a_pipelining_link_to_reclaim();
                        shared.queue.get_async(Some(tag), None).await
                    }
                }
            };
            let channel = self.pipeline.channel.as_mut();
            let ended = async {
                match channel {
                    Some(channel) => channel.next().await,
                    None => std::future::pending().await,
                }
            };
            let message = tokio::select! {
                biased;
                work = shared.balance.while_idle(take) => {
                    return work.map_or(Idle::Stopped, Idle::Work);
                }
                message = ended => message,
            };
            if let Some(Ok(response)) = message {
                // A late heartbeat: nothing to do but note it.
                self.heard(&response);
                continue;
            }
            // The stream ended or broke.
            self.pipeline.drop_stream();
            if self.worker_lost().await {
                self.worker_failed(&format!(
                    "its connection closed while it was idle (worker {} does not answer, is \
                     shutting down, or restarted)",
                    self.address()
                ));
                return Idle::Lost;
            }
        }
    }

    /// Sends as many queued closures as the pipelining rule allows, in one message.
    pub(super) async fn top_up(&mut self) {
        self.send_with_top_up(Vec::new()).await;
    }

    /// Sends `batch` (closures already taken and prepared for this worker) together with
    /// as many queued closures as the pipelining rule allows, in one message. Gathering
    /// before sending means that once the worker has a closure, this link is done taking
    /// from the queue until its next answer: nothing queued after the worker started can
    /// slip into this link's pipeline.
    pub(super) async fn send_with_top_up(&mut self, mut batch: Vec<Closure>) {
        let capacity = self.capacity();
        let budget = self.shared.config.pipeline_bytes;
        let mut bytes = self.pipeline.outstanding.bytes()
            + batch
                .iter()
                .map(|closure| closure.args.byte_len())
                .sum::<usize>();
        while self.held.is_none()
            && self.pipeline.outstanding.len() + batch.len() < capacity
            && bytes < budget
            && !batch.iter().any(Closure::runs_alone)
            && self.may_pipeline()
        {
            let Ok(work) = self.shared.queue.try_get(Some(self.tag())) else {
                break;
            };
            let closure = match work {
                // Served like resource work, once the pipeline has drained.
                Work::Closure(closure) if closure.pinned().is_some() => {
                    self.held = Some(Work::Closure(closure));
                    break;
                }
                Work::Closure(closure) if closure.runs_alone() => {
                    // It runs alone, on an idle worker: leave it to one.
                    self.requeue(closure);
                    break;
                }
                Work::Closure(closure) if self.inputs_ready_here(&closure) => closure,
                Work::Closure(closure) => {
                    // A per-worker input must be built here first, behind what is running:
                    // leave it to an idle worker, or to this one once it is idle.
                    self.requeue(closure);
                    break;
                }
                other => {
                    // Resource work for this worker: served once the pipeline has drained.
                    self.held = Some(other);
                    break;
                }
            };
            self.publish(batch.len() + 1);
            if !self.may_pipeline() {
                // A link went idle meanwhile (or a closure failed): it gets this one.
                self.publish(batch.len());
                self.requeue(closure);
                break;
            }
            // A function new to this worker is registered right away: the worker stores it
            // without waiting for its executor.
            if let Err(verdict) = self.ensure_function_verdict(&closure).await {
                for taken in batch {
                    self.requeue(taken);
                }
                self.publish(0);
                self.settle(closure, verdict);
                return;
            }
            bytes += closure.args.byte_len();
            batch.push(closure);
        }
        self.send(batch).await;
    }

    /// Whether `closure`'s per-worker inputs are built on this worker.
    fn inputs_ready_here(&self, closure: &Closure) -> bool {
        closure.resources.iter().all(|resource| {
            !resource.is_released() && resource.state(self.index) == ResourceState::Ready
        })
    }

    /// Re-queues a closure this link took but did not send (not a retry).
    pub(super) fn requeue(&self, closure: Closure) {
        if closure.pinned().is_some() {
            return self.give_back(closure);
        }
        let verdict = self.shared.queue.put_back(Work::Closure(closure));
        debug_assert!(verdict.is_ok(), "a link put back a closure it did not take");
    }

    /// Sends `closures` (ready to run here), opening the stream first if needed.
    pub(super) async fn send(&mut self, closures: Vec<Closure>) {
        self.send_closures(closures, false).await;
    }

    /// [`send`](Self::send); `registered_again` marks closures retried after their
    /// function was registered again.
    async fn send_closures(&mut self, closures: Vec<Closure>, registered_again: bool) {
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
    fn check_idle_stream(&mut self) {
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
    fn opening(&self, first: pb::RunClosuresRequest) -> pb::RunClosuresRequest {
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
    async fn open(&mut self, first: pb::RunClosuresRequest) -> bool {
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

    /// Waits for the worker's next answers (or a reclaim request, or the closure timeout)
    /// and acts on them.
    pub(super) async fn await_answers(&mut self) {
        let deadline = self.shared.config.closure_timeout.and_then(|limit| {
            self.pipeline
                .outstanding
                .front()
                .map(|sent| sent.since + limit)
        });
        let heartbeat = self.heartbeat_timeout();
        let now = Instant::now();
        let silent_at = heartbeat.map(|timeout| self.pipeline.last_heard.unwrap_or(now) + timeout);
        let ping_at = self
            .shared
            .config
            .ping_interval()
            .filter(|_| heartbeat.is_some())
            .map(|every| self.pipeline.last_ping.unwrap_or(now) + every);
        let Some(channel) = self.pipeline.channel.as_mut() else {
            // Only reachable if opening failed without settling; put everything back.
            self.abandon();
            return;
        };
        let reclaim = self.slot.reclaim_requested();
        let event = until_stopped(&self.stop, async {
            tokio::select! {
                biased;
                answers = channel.next() => Event::Answers(answers),
                () = reclaim => Event::Reclaim,
                () = sleep_until(deadline) => Event::TimedOut,
                () = sleep_until(silent_at) => Event::Silent(heartbeat.unwrap_or_default()),
                () = sleep_until(ping_at) => Event::Ping,
            }
        })
        .await;
        match event {
            None => self.abandon(),
            Some(Event::Ping) => self.ping(),
            Some(Event::Silent(timeout)) => {
                // A large answer arrives in chunks for a while; each shows the worker alive.
                let chunk = self
                    .pipeline
                    .channel
                    .as_ref()
                    .and_then(ClosureChannel::last_received);
                match chunk {
                    Some(at) if at.elapsed() < timeout => self.pipeline.last_heard = Some(at),
                    _ => self.fell_silent(timeout),
                }
            }
            Some(Event::Answers(Some(Ok(response)))) => {
                self.heard(&response);
                for reply in response.replies {
                    self.on_reply(reply).await;
                }
                if self.pipeline.outstanding.is_empty() {
                    if let Some(reason) = self.pipeline.going_away.take() {
                        self.worker_failed(&reason);
                        return;
                    }
                }
                if !self.pipeline.outstanding.is_empty() {
                    self.top_up().await;
                }
            }
            Some(Event::Answers(Some(Err(error)))) => self.stream_failed(&error, true).await,
            Some(Event::Answers(None)) => {
                let error = RpcError::Unavailable(format!(
                    "worker {} ended the RunClosures stream with closures outstanding",
                    self.address()
                ));
                self.stream_failed(&error, true).await;
            }
            Some(Event::Reclaim) => self.reclaim(),
            Some(Event::TimedOut) => {
                if let Some(sent) = self.pipeline.outstanding.pop_front() {
                    // The worker still runs it and will answer, under the same closure id
                    // a retry here would use: drop the stream so that answer goes nowhere.
                    self.pipeline.drop_stream();
                    self.publish(0);
                    self.timed_out(sent.closure).await;
                }
            }
        }
    }

    /// Asks the worker for its queued closures back, if a closure failed (under
    /// `cancel_all`) or a link is idle while this one has closures queued.
    fn reclaim(&mut self) {
        self.slot.reclaim_taken();
        let outstanding = self.pipeline.outstanding.len();
        let failed = self.shared.balance.failure_pending();
        let starving = self.shared.balance.any_idle();
        if (failed && outstanding >= 1) || (starving && outstanding >= 2) {
            if let Some(channel) = &self.pipeline.channel {
                channel.send(pb::RunClosuresRequest {
                    return_queued: true,
                    ..pb::RunClosuresRequest::default()
                });
            }
        }
    }

    /// Acts on one answer.
    async fn on_reply(&mut self, reply: pb::ClosureReply) {
        use pb::closure_reply::Outcome;
        let halts = self.shared.config.error_policy == ErrorPolicy::CancelAll;
        if halts && matches!(reply.outcome, Some(Outcome::Error(_) | Outcome::Refused(_))) {
            // The worker halted the stream, whether or not the closure is still ours.
            self.pipeline.resume = true;
        }
        let Some(position) = self
            .pipeline
            .outstanding
            .iter()
            .position(|sent| sent.closure.id() == reply.closure_id)
        else {
            return; // a closure that timed out here earlier: already dealt with
        };
        let Some(mut sent) = self.pipeline.outstanding.remove(position) else {
            return;
        };
        self.publish(0);
        let verdict = match reply.outcome {
            Some(Outcome::Result(value)) => Verdict::Done(Ok(EncodedValue {
                pickle: value.pickle,
                buffers: value.buffers,
            })),
            Some(Outcome::Error(error)) => self.read_error(error, &sent.closure).await,
            Some(Outcome::Refused(refusal)) => {
                let code = tonic::Code::from(refusal.code);
                let error = RpcError::from_code(code, refusal.message)
                    .with_context(&format!("RunClosures on worker {}", self.address()));
                return self.refused(sent, error).await;
            }
            Some(Outcome::Returned(_)) => {
                // It never started: back to the queue, not counted as a retry.
                sent.closure.attempts -= 1;
                return self.requeue(sent.closure);
            }
            None => {
                let message = format!(
                    "worker {} answered closure {} with neither a result nor an error",
                    self.address(),
                    sent.closure.id()
                );
                let failure = ClosureFailure::infra(tonic::Code::Internal, message, self.address());
                Verdict::Done(Err(failure))
            }
        };
        self.settle(sent.closure, verdict);
    }

    /// Acts on a refused closure as on the same error from unary `RunClosure`.
    async fn refused(&mut self, sent: Sent, error: RpcError) {
        let verdict = match error {
            RpcError::NotFound(_) if !sent.registered_again => {
                // The worker lost the function: a restart (then everything it held is
                // gone) or an eviction (then registering again and retrying is enough).
                if self.worker_lost().await {
                    Verdict::WorkerFailed("the worker restarted and lost its functions".to_owned())
                } else {
                    self.sent.remove(sent.closure.function.hash());
                    match self.ensure_function_verdict(&sent.closure).await {
                        Ok(()) => return self.send_closures(vec![sent.closure], true).await,
                        Err(verdict) => verdict,
                    }
                }
            }
            RpcError::Unavailable(message) => {
                // The worker is shutting down: it refuses what it has not started and
                // finishes what it has; collect those answers, then recover.
                self.pipeline.going_away = Some(message);
                return self.put_back(sent.closure);
            }
            error => {
                if self.is_worker_failure(&error).await {
                    Verdict::WorkerFailed(error.message().to_owned())
                } else {
                    Verdict::Done(Err(ClosureFailure::from_rpc(&error, self.address())))
                }
            }
        };
        self.settle(sent.closure, verdict);
    }

    /// The stream failed: the worker is gone (everything outstanding goes back to the
    /// queue; with `charge`, the death counts against the closure it was running), or it
    /// refused the call (everything outstanding fails with that error).
    pub(super) async fn stream_failed(&mut self, error: &RpcError, charge: bool) {
        self.pipeline.drop_stream();
        if self.pipeline.outstanding.is_empty() {
            return;
        }
        let before = self.incarnation;
        if self.is_worker_failure(error).await {
            let reason = format!("its RunClosures stream broke: {}", error.message());
            self.worker_died(&reason, charge, before);
            return;
        }
        let failure = ClosureFailure::from_rpc(error, self.address());
        for sent in self.pipeline.outstanding.take() {
            self.finish(sent.closure, Err(failure.clone()));
        }
        self.publish(0);
    }

    /// Puts every closure outstanding or held back in the queue and drops the stream (the
    /// worker is gone). Returns how many closures went back (a closure out of retries is
    /// held for its post-mortem instead, see `liveness.rs`).
    pub(super) fn forget_pipeline(&mut self) -> usize {
        let limit = self.shared.config.max_closure_retries;
        let mut put_back = 0;
        for sent in self.pipeline.outstanding.take() {
            if deaths::exhausted(&sent.closure, limit) {
                // Failed once its post-mortem is in (`liveness.rs`).
                self.doomed.push(sent.closure);
            } else {
                self.put_back(sent.closure);
                put_back += 1;
            }
        }
        self.publish(0);
        match self.held.take() {
            Some(Work::Closure(closure)) => {
                self.requeue(closure);
                put_back += 1;
            }
            // Built again with every live resource once the worker answers (`reconnected`).
            Some(Work::CreateResource { .. }) | None => {}
            // Still owed once the worker answers: served first then. A release dropped
            // here left the resource allocated on a worker that came back as the same
            // process.
            other => self.held = other,
        }
        self.pipeline = Pipeline::default();
        put_back
    }

    /// The dispatcher is stopping: everything outstanding or held is put back (so
    /// cancelled, the queue being stopped).
    pub(super) fn abandon(&mut self) {
        for sent in self.pipeline.outstanding.take() {
            self.put_back(sent.closure);
        }
        for closure in std::mem::take(&mut self.doomed) {
            self.put_back(closure);
        }
        self.publish(0);
        match self.held.take() {
            Some(Work::Closure(closure)) => self.give_back(closure),
            Some(other) => crate::queue::Cancel::cancel(other),
            None => {}
        }
        self.pipeline = Pipeline::default();
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

/// Sleeps until `deadline`, or forever without one.
async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline.into()).await,
        None => std::future::pending().await,
    }
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
