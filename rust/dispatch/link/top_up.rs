//! Taking work: an idle link waits for it (asking a pipelining link to reclaim, and
//! watching its stream meanwhile), a busy one tops its pipeline up as far as the
//! pipelining rule allows, and a link asked to reclaim has its worker hand back what it
//! has queued. Part of the pipeline (`pipeline.rs`); the rule is `balance.rs`'s.

use super::pipeline::Idle;
use super::Link;
use crate::dispatch::closure::{Closure, Work};
use crate::dispatch::resources::ResourceState;
use crate::dispatch::transport::WorkerTransport;
use crate::queue::TryGetError;
use crate::rpc::pb;

impl<T: WorkerTransport> Link<T> {
    /// Whether a busy link may send another closure now (no link idle, see `balance.rs`):
    /// not while its worker is going away, nor while a closure whose worker died under it
    /// before is outstanding (it runs alone, see `deaths.rs`).
    pub(super) fn may_pipeline(&self) -> bool {
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
                // A late heartbeat: nothing to do but note it, unless it says the worker
                // is being preempted: then it takes nothing more.
                self.heard(&response);
                if self.preempted() {
                    self.pipeline.drop_stream();
                    self.worker_failed(&self.preempted_reason());
                    return Idle::Lost;
                }
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
    pub(super) fn inputs_ready_here(&self, closure: &Closure) -> bool {
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

    /// Asks the worker for its queued closures back, if a closure failed (under
    /// `cancel_all`) or a link is idle while this one has closures queued.
    pub(super) fn reclaim(&mut self) {
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
}
