//! Reading a link's answers and settling by them: the wait for the worker's next message
//! (or a reclaim request, the closure timeout, a ping due, the worker's silence), each
//! answer turned into its closure's verdict, a refusal read as unary `RunClosure`'s error,
//! and a failed stream. Part of the pipeline (`pipeline.rs`).

use std::time::{Duration, Instant};

use super::alarm::earliest;
use super::execute::Verdict;
use super::outstanding::Sent;
use super::{until_stopped, Link};
use crate::dispatch::config::ErrorPolicy;
use crate::dispatch::failure::ClosureFailure;
use crate::dispatch::result_cell::EncodedValue;
use crate::dispatch::transport::WorkerTransport;
use crate::rpc::{pb, ClosureChannel, RpcError};

/// What ended a wait for answers.
enum Event {
    Answers(Option<Result<pb::RunClosuresResponse, RpcError>>),
    Reclaim,
    TimedOut,
    /// Time to ping the worker.
    Ping,
    /// The worker sent nothing for the heartbeat timeout.
    Silent(Duration),
    /// The worker's preemption deadline passed with closures outstanding.
    Preempted,
    /// The timer fired before any deadline was due (a timer's tick is coarser than an
    /// `Instant`); nothing to do.
    Early,
}

impl<T: WorkerTransport> Link<T> {
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
        let preempted_at = self.preemption_deadline();
        let Some(channel) = self.pipeline.channel.as_mut() else {
            // Only reachable if opening failed without settling; put everything back.
            self.abandon();
            return;
        };
        let reclaim = self.slot.reclaim_requested();
        // One kept timer for the four deadlines (`alarm.rs` says why); which one is due is
        // read when it fires, in the order a `biased` select of four timers would take.
        let wake_at = earliest(&[deadline, silent_at, ping_at, preempted_at]);
        let alarm = &mut self.alarm;
        let event = until_stopped(&self.stop, async {
            tokio::select! {
                biased;
                answers = channel.next() => Event::Answers(answers),
                () = reclaim => Event::Reclaim,
                () = alarm.until(wake_at) => {
                    let now = Instant::now();
                    let due = |at: Option<Instant>| at.is_some_and(|at| at <= now);
                    if due(deadline) {
                        Event::TimedOut
                    } else if due(silent_at) {
                        Event::Silent(heartbeat.unwrap_or_default())
                    } else if due(ping_at) {
                        Event::Ping
                    } else if due(preempted_at) {
                        Event::Preempted
                    } else {
                        Event::Early
                    }
                }
            }
        })
        .await;
        match event {
            None => self.abandon(),
            // Nothing due yet: the caller waits again.
            Some(Event::Early) => {}
            Some(Event::Ping) => self.ping(),
            Some(Event::Preempted) => self.preemption_deadline_passed(),
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
            Some(Event::Answers(None)) if self.pipeline.going_away.is_some() => {
                self.drained_away();
            }
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

    /// Acts on one answer.
    pub(super) async fn on_reply(&mut self, reply: pb::ClosureReply) {
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
        // A serial loop's next closure is due within a round trip of this answer.
        crate::runtime::awake::expect();
        self.settle(sent.closure, verdict);
    }

    /// Acts on a refused closure as on the same error from unary `RunClosure`.
    pub(super) async fn refused(&mut self, sent: Sent, error: RpcError) {
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
                if self.preempted() {
                    // Announced: never started there, so not a retry (see preemption.rs).
                    let mut closure = sent.closure;
                    closure.attempts -= 1;
                    return self.requeue(closure);
                }
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
}
