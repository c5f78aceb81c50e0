//! Whether a link's worker is alive, and what its deaths cost: heartbeats on the stream
//! (pings while closures are outstanding, silence declared a failure), deaths charged to
//! the closure that was running (`deaths.rs` says what counts), the post-mortem of a
//! closure that used up `max_closure_retries`, and failing what is scheduled while no
//! worker of the cluster was ever reached (`connect_timeout`).
//!
//! # Heartbeats
//!
//! With a worker of protocol revision 4 or later, the link opens its stream with a lease
//! of nine tenths of `heartbeat_timeout` and, while closures are outstanding, pings every
//! fifth of it; the worker's tokio runtime answers a ping at once, whatever its Python
//! executor is doing, so a long closure never looks like silence. Nor does a large value:
//! a ping sent after a chunked argument waits behind its chunks, so the worker sends a
//! heartbeat as the chunks arrive (`worker/reader.rs`), and a chunked answer's chunks count
//! as they arrive (`ClosureChannel::last_received`). Every message either way
//! carries the heartbeat fields: the worker's messages a heartbeat, the link's the highest
//! heartbeat received (`heartbeat_ack`), which renews the worker's lease. A worker that
//! sends nothing for `heartbeat_timeout` is declared failed: its stream is dropped, the
//! closures outstanding on it go back to the queue for other workers, and its running
//! closure is retried. How the worker learns its queued closures were withdrawn: it does
//! not need to. Its lease on them ran out before the link declared it failed, so it will
//! not start them if it comes back (`worker/stream.rs` has the argument); they are dropped
//! unrun when the cancelled stream reaches it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Link;
use crate::dispatch::closure::Work;
use crate::dispatch::deaths::{self, Death, POSTMORTEM_WAIT};
use crate::dispatch::failure::ClosureFailure;
use crate::dispatch::resources::ResourceState;
use crate::dispatch::status::Incarnation;
use crate::dispatch::transport::WorkerTransport;
use crate::rpc::pb;

impl<T: WorkerTransport> Link<T> {
    /// The heartbeat timeout with this link's worker; `None` when heartbeats are off
    /// (turned off, or a worker older than protocol revision 4).
    pub(super) fn heartbeat_timeout(&self) -> Option<Duration> {
        self.heartbeats
            .then_some(self.shared.config.heartbeat_timeout)
            .flatten()
    }

    /// The lease to open a stream with, in milliseconds (0: none).
    pub(super) fn lease_ms(&self) -> u32 {
        self.heartbeat_timeout()
            .and(self.shared.config.lease())
            .map_or(0, |lease| {
                u32::try_from(lease.as_millis()).unwrap_or(u32::MAX)
            })
    }

    /// Records a message from the worker: it is alive, its heartbeat is to be acknowledged,
    /// and it runs `running_closure_id`. Acknowledges at once when closures wait for it;
    /// acts on a preemption notice it carries.
    pub(super) fn heard(&mut self, response: &pb::RunClosuresResponse) {
        let pipeline = &mut self.pipeline;
        pipeline.last_heard = Some(Instant::now());
        pipeline.ack = pipeline.ack.max(response.heartbeat);
        pipeline.running = response.running_closure_id;
        if response.draining && pipeline.going_away.is_none() {
            // Send nothing more: it would be refused. Collect the answers still due.
            pipeline.going_away = Some(format!(
                "worker {} is draining (shutting down)",
                self.transport.address()
            ));
        }
        if response.wants_ack {
            let ack = pipeline.ack;
            self.send_control(pb::RunClosuresRequest {
                heartbeat_ack: ack,
                ..pb::RunClosuresRequest::default()
            });
        }
        if let Some(notice) = &response.preemption {
            self.noticed(notice);
        }
    }

    /// Asks the worker for a sign of life (and acknowledges its last heartbeat).
    pub(super) fn ping(&mut self) {
        self.pipeline.last_ping = Some(Instant::now());
        let ack = self.pipeline.ack;
        self.send_control(pb::RunClosuresRequest {
            ping: true,
            heartbeat_ack: ack,
            ..pb::RunClosuresRequest::default()
        });
    }

    fn send_control(&self, message: pb::RunClosuresRequest) {
        if let Some(channel) = &self.pipeline.channel {
            // A closed channel means the stream ended; the wait for answers sees that.
            channel.send(message);
        }
    }

    /// The worker sent nothing for `timeout` while closures were outstanding: it is
    /// declared failed. The death counts against the oldest closure only if the worker's
    /// last message said it was running it.
    pub(super) fn fell_silent(&mut self, timeout: Duration) {
        let charge = self.runs_oldest();
        let reason = format!(
            "worker {} sent nothing for {:.1} s while running closures (heartbeat_timeout): \
             it is frozen, its host hung, or the network to it is cut",
            self.address(),
            timeout.as_secs_f64()
        );
        tracing::warn!(target: "jaxcluster.dispatch", worker = self.address(), "{reason}");
        // Dropping the stream cancels it; the worker's lease on what it had queued has run
        // out, so it starts none of it even if it wakes up.
        self.pipeline.drop_stream();
        self.worker_died(&reason, charge, self.incarnation);
    }

    /// A draining worker ended its stream with closures outstanding: they never started,
    /// except one it said it was running (its drain deadline passed meanwhile), whose
    /// answer will not come. All go back to the queue; only that one is charged.
    pub(super) fn drained_away(&mut self) {
        let reason = format!(
            "worker {} drained and ended its RunClosures stream",
            self.address()
        );
        let charge = self.runs_oldest();
        self.pipeline.drop_stream();
        self.worker_died(&reason, charge, self.incarnation);
    }

    /// Whether the worker's last message said it was running the oldest closure
    /// outstanding.
    fn runs_oldest(&self) -> bool {
        let running = self.pipeline.running;
        running != 0
            && self
                .pipeline
                .outstanding
                .front()
                .is_some_and(|sent| sent.closure.id() == running)
    }

    /// The worker failed with closures outstanding on its stream (`reason` says how);
    /// `charge`: the oldest one was running, and the death counts against it. `before` is the
    /// worker process known before the failure.
    /// A worker that announced its preemption charges nothing (see `preemption.rs`).
    pub(super) fn worker_died(&mut self, reason: &str, charge: bool, before: Option<Incarnation>) {
        if charge && !self.preempted() {
            let address = self.address().to_owned();
            let death = Death::new(self.index, &address, reason, before);
            if let Some(front) = self.pipeline.outstanding.front_mut() {
                front.closure.deaths.push(Arc::clone(&death));
                let closure = &front.closure;
                let limit = self.shared.config.max_closure_retries;
                let limit_text = limit.map_or_else(|| "no limit".to_owned(), |l| l.to_string());
                tracing::warn!(
                    target: "jaxcluster.dispatch",
                    closure = closure.id(),
                    worker = %address,
                    deaths = closure.deaths.len(),
                    "closure {} was running on worker {address} when it failed ({reason}); {}",
                    closure.id(),
                    if deaths::exhausted(closure, limit) {
                        format!("that was its last retry (max_closure_retries={limit_text})")
                    } else {
                        format!(
                            "it runs again, alone (death {} of max_closure_retries={limit_text})",
                            closure.deaths.len()
                        )
                    }
                );
                // The worker may already have answered as a new process (a probe while
                // deciding this was a failure).
                match (before, self.incarnation) {
                    (Some(then), Some(now)) if then != now => {
                        death.explain(now, &self.previous_exit);
                    }
                    _ => self.postmortems.push(death),
                }
            }
        }
        self.worker_failed(reason);
    }

    /// Explains this worker's unexplained deaths from its `GetStatus` answer.
    pub(super) fn explain_deaths(&mut self, status: &pb::GetStatusResponse) {
        for death in self.postmortems.drain(..) {
            death.explain(Incarnation::of(status), &status.previous_exit);
        }
    }

    /// Fails the closures that used up their retries once each death is explained or has
    /// waited [`POSTMORTEM_WAIT`] for that; `all`: every one now.
    pub(super) fn settle_doomed(&mut self, all: bool) {
        if self.doomed.is_empty() {
            return;
        }
        let (ready, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.doomed)
            .into_iter()
            .partition(|closure| {
                all || closure.deaths.last().map_or(true, |death| {
                    death.is_explained() || death.at.elapsed() >= POSTMORTEM_WAIT
                })
            });
        self.doomed = waiting;
        let limit = self.shared.config.max_closure_retries.unwrap_or(0);
        for closure in ready {
            let failure = deaths::crashed(&closure, limit);
            tracing::error!(target: "jaxcluster.dispatch", closure = closure.id(), "{}", failure.message);
            self.finish(closure, Err(failure));
        }
    }

    /// How long until a closure that used up its retries must be failed; `None` if none
    /// waits.
    pub(super) fn doomed_due(&self) -> Option<Duration> {
        self.doomed
            .iter()
            .filter_map(|closure| closure.deaths.last())
            .map(|death| POSTMORTEM_WAIT.saturating_sub(death.at.elapsed()))
            .min()
    }

    /// While no worker of the cluster was ever reached and `connect_timeout` has passed:
    /// fails whatever reaches this link for up to `pause`, with `message` (which names
    /// every worker and its last error). Returns `false` once the dispatcher stopped.
    pub(super) async fn fail_arrivals(&mut self, message: &str, pause: Duration) -> bool {
        let until = Instant::now() + pause;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return !*self.stop.borrow();
            }
            let arrived = self
                .call(self.shared.queue.get_async(Some(self.tag()), Some(left)))
                .await
                .flatten();
            match arrived {
                None => return !*self.stop.borrow(),
                // Another link reached its worker meanwhile: the cluster is usable again,
                // so this closure goes back for that link (and this one probes again).
                Some(Work::Closure(closure)) if !self.shared.is_unreachable() => {
                    self.requeue(closure);
                    return !*self.stop.borrow();
                }
                Some(Work::Closure(closure)) => {
                    let text = format!("closure {} could not run: {message}", closure.id());
                    let failure =
                        ClosureFailure::infra(tonic::Code::Unavailable, text, self.address());
                    self.finish(closure, Err(failure));
                }
                Some(Work::CreateResource { resource, worker }) => {
                    if let Some(resource) = resource.upgrade() {
                        resource.set_state(worker, ResourceState::Aborted);
                    }
                }
                Some(Work::ReleaseResource { .. }) => {}
                // This worker is being removed: stop recovering it.
                Some(Work::Retire) => return false,
            }
        }
    }
}
