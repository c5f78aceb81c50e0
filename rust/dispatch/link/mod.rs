//! One link per worker: a task that feeds its worker closures over a `RunClosures`
//! stream, and the worker's state machine (`up` → `recovering` → `up` | `given_up`) with
//! reconnection backoff and resource rebuilding.
//!
//! [`Link`] is one type whose `impl` is split by concern, all in this folder:
//!
//! - `mod.rs` (this file): the type, the task's loop over the states, serving one piece
//!   of work, settling a closure, and running a future on the shared runtime.
//! - `execute.rs`: preparing a closure (its per-worker inputs, its function registered)
//!   and what a worker's error for it means (its `Verdict`).
//! - `pipeline.rs`: the `RunClosures` stream and the closures outstanding on it (the
//!   `Pipeline`), how many a link may have, letting them go; its concerns in three files:
//!   - `stream.rs`: opening the stream, sending closures on it;
//!   - `answers.rs`: reading answers, settling closures by them, a failed stream (its
//!     waits share one kept timer, `alarm.rs`);
//!   - `top_up.rs`: taking work idle or more while busy, reclaiming.
//! - `outstanding.rs`: what is outstanding on the stream, and its arguments' bytes.
//! - `balance.rs`: `Balance`, the counters and flags links share so that
//!   pipelining stays work-conserving, with the memory-ordering argument.
//! - `recovery.rs`: the state machine off the happy path (worker failed, probing with
//!   backoff, rebuilding, giving up).
//! - `preemption.rs`: a worker's preemption notice: nothing more sent, queued closures
//!   taken back, the running one finished or re-run by the deadline, all uncharged.
//! - `liveness.rs`: heartbeats, deaths charged to closures and their post-mortem, and
//!   failing what is scheduled while no worker was ever reached.
//!
//! Per-worker resource work (builds, releases) is served only when nothing is
//! outstanding, one item at a time, as before pipelining.

mod alarm;
mod answers;
pub(crate) mod balance;
mod execute;
mod liveness;
mod outstanding;
mod pipeline;
mod preemption;
mod recovery;
mod stream;
mod top_up;

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::closure::{Closure, Work};
use super::config::ErrorPolicy;
use super::deaths::Death;
use super::failure::ClosureFailure;
use super::functions::SentFunctions;
use super::metrics::Counters;
use super::resources::{ResourceInner, ResourceState};
use super::result_cell::{EncodedValue, Outcome};
use super::status::{Incarnation, LinkStatus};
use super::transport::WorkerTransport;
use super::versions::VersionCheck;
use super::{LinkState, Shared};
use crate::log_target::DISPATCH;
use crate::queue::Tag;
use balance::LinkSlot;
use execute::Verdict;
use pipeline::{Idle, Pipeline};
pub(crate) use recovery::hang_up_hint;
use recovery::Recovery;

/// Bound on a `ReleaseResource` call; a worker that does not answer loses nothing by it.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(10);
/// First and largest pause between idleness polls after a closure timed out.
const IDLE_POLL: (Duration, Duration) = (Duration::from_millis(20), Duration::from_secs(1));

/// Why a step on a worker did not complete.
#[derive(Debug)]
enum Interruption {
    /// The dispatcher is stopping.
    Stopped,
    /// The worker is gone (the message says how); recover it.
    WorkerFailed(String),
}

/// The serving side of one worker; owned by its task. Its fields are private to this
/// folder: the parts of its `impl` share them, nothing else does.
pub(crate) struct Link<T> {
    index: usize,
    /// This link's entry in the dispatcher's table (state, counters, retiring flag).
    status: Arc<LinkStatus>,
    /// This link's part of the pipelining handshake.
    slot: Arc<LinkSlot>,
    /// Turns `true` when `remove_workers` asks this link to leave.
    retiring: watch::Receiver<bool>,
    /// The link served its `Retire`: it leaves once nothing is outstanding.
    leaving: bool,
    /// Shared with the dispatcher, which probes `GetStatus` through it for a live view.
    transport: Arc<T>,
    shared: Arc<Shared>,
    stop: watch::Receiver<bool>,
    /// Functions this worker holds since it last (re)connected.
    sent: SentFunctions,
    /// The worker process last seen, to notice a restart.
    incarnation: Option<Incarnation>,
    /// Whether the worker ever answered (its first failure to answer is a warning).
    connected_once: bool,
    /// When the current recovery began (the dispatcher's creation for the first one).
    recovering_since: Instant,
    /// The stream to the worker and the closures outstanding on it.
    pipeline: Pipeline,
    /// Work taken while closures were outstanding that must wait until none is.
    held: Option<Work>,
    /// The worker answers heartbeats (protocol revision 4 or later, from `GetStatus`).
    heartbeats: bool,
    /// The worker's last `GetStatus.previous_exit`.
    previous_exit: String,
    /// Deaths of this worker under a closure, not yet explained (see `liveness.rs`).
    postmortems: Vec<Arc<Death>>,
    /// Closures that used up `max_closure_retries`, waiting for their post-mortem.
    doomed: Vec<Closure>,
    /// What this link logged about its worker's versions (once per link).
    versions: VersionCheck,
    /// The preemption notice of the worker process last seen, once it sent one.
    notice: Option<preemption::Noticed>,
    /// The one timer of the waits for answers, kept across them (`alarm.rs`).
    alarm: alarm::Alarm,
}

impl<T: WorkerTransport> Link<T> {
    /// The link of `status` (its index and address), talking to its worker through
    /// `transport`. Its status starts `recovering` until the worker first answers.
    pub fn new(
        transport: Arc<T>,
        shared: Arc<Shared>,
        status: Arc<LinkStatus>,
        slot: Arc<LinkSlot>,
    ) -> Self {
        let stop = shared.stop.subscribe();
        Self {
            index: status.index(),
            retiring: status.retiring_signal(),
            status,
            slot,
            leaving: false,
            transport,
            shared,
            stop,
            sent: SentFunctions::default(),
            incarnation: None,
            connected_once: false,
            recovering_since: Instant::now(),
            pipeline: Pipeline::default(),
            held: None,
            heartbeats: false,
            previous_exit: String::new(),
            postmortems: Vec::new(),
            doomed: Vec::new(),
            versions: VersionCheck::default(),
            notice: None,
            alarm: alarm::Alarm::default(),
        }
    }

    /// The queue tag of this link's per-worker work.
    fn tag(&self) -> Tag {
        self.index as Tag
    }

    /// The worker's address, for messages.
    fn address(&self) -> &str {
        self.transport.address()
    }

    /// The task body: connect, wait out the staggered start, then serve until stopped
    /// or removed.
    pub async fn run(mut self) {
        self.serve_until_stopped().await;
        if self.status.is_retiring() && !*self.stop.borrow() {
            self.leave().await;
        } else {
            self.abandon();
        }
    }

    async fn serve_until_stopped(&mut self) {
        let serve_from = Instant::now() + self.shared.config.start_delay.for_worker(self.index);
        loop {
            if *self.stop.borrow() {
                return;
            }
            // A worker being removed leaves once what it runs has answered; one that is
            // down (its closures went back when it failed) or given up leaves at once.
            if self.status.is_retiring()
                && (self.leaving || self.status.state() != LinkState::Up)
                && self.pipeline.outstanding.is_empty()
            {
                return;
            }
            match self.status.state() {
                LinkState::Recovering => match self.recover().await {
                    Recovery::Up => self.pipeline.unwatched = true,
                    Recovery::GaveUp => {}
                    Recovery::Stopped => return,
                },
                LinkState::Up if Instant::now() < serve_from => {
                    if !self.sleep(serve_from - Instant::now()).await {
                        return;
                    }
                }
                LinkState::Up if !self.pipeline.outstanding.is_empty() => {
                    self.await_answers().await;
                }
                // Held work first; the flag stays set until the watch is made.
                LinkState::Up if self.pipeline.unwatched && self.held.is_none() => {
                    self.pipeline.unwatched = false;
                    self.watch_idle_worker().await;
                }
                LinkState::Up => {
                    let work = match self.held.take() {
                        Some(work) => work,
                        None => match self.take_when_idle().await {
                            Idle::Work(work) => work,
                            Idle::Lost => continue,
                            Idle::Stopped => return,
                        },
                    };
                    self.serve(work).await;
                }
                LinkState::GivenUp => self.drain_when_all_given_up().await,
                LinkState::Removed => return,
            }
        }
    }

    /// Leaves the cluster (`remove_workers`): releases the worker's per-worker resources
    /// (the worker keeps running; its copies would otherwise stay allocated), hands back
    /// this worker's queued resource work, and marks the link `removed`.
    async fn leave(&mut self) {
        // Normally empty: the link drained before leaving. A closure still here is put
        // back, not cancelled (the queue runs on).
        self.abandon();
        let up = self.status.state() == LinkState::Up;
        let mut held = Vec::new();
        for resource in self.shared.resources.live() {
            if up && resource.state(self.index) == ResourceState::Ready {
                held.push(resource.id);
            }
            resource.set_state(self.index, ResourceState::Aborted);
        }
        if !held.is_empty() {
            let release = self.transport.release_resource(held, Some(RELEASE_TIMEOUT));
            let _ = self.call(release).await;
        }
        self.shared
            .fail_pinned(self.index, "the worker was removed (remove_workers)");
        for work in self.shared.queue.take_tagged(self.tag()) {
            crate::queue::Cancel::cancel(work);
        }
        self.status.set(LinkState::Removed, None);
        self.shared.balance.remove_link(&self.slot);
        // Here rather than in `remove_workers`, whose caller may stop waiting early.
        self.shared.membership_changed();
        tracing::info!(
            target: DISPATCH,
            worker = self.address(),
            worker_index = self.index,
            "worker {} (worker {}) left the cluster (remove_workers); closures run on the \
             other workers",
            self.address(),
            self.index,
        );
    }

    async fn serve(&mut self, work: Work) {
        match work {
            Work::Closure(closure) => self.run_closure(closure).await,
            Work::CreateResource { resource, .. } => {
                let Some(resource) = resource.upgrade() else {
                    return; // released before its turn
                };
                if matches!(
                    resource.state(self.index),
                    ResourceState::Pending | ResourceState::Aborted
                ) {
                    if let Err(Interruption::WorkerFailed(reason)) =
                        self.create_resource(&resource).await
                    {
                        self.worker_failed(&reason);
                    }
                }
            }
            Work::Retire => self.leaving = true,
            Work::ReleaseResource { resource_id } => {
                let release = self
                    .transport
                    .release_resource(vec![resource_id], Some(RELEASE_TIMEOUT));
                if let Some(Err(error)) = self.call(release).await {
                    if self.is_worker_failure(&error).await {
                        self.worker_failed(error.message());
                    }
                }
            }
        }
    }

    /// Starts one closure on an idle worker (then sends more if the pipelining rule
    /// allows), or settles it if it cannot start.
    async fn run_closure(&mut self, closure: Closure) {
        if closure.pinned().is_none() && self.shared.balance.failure_pending() {
            // A closure failed under cancel_all: nothing queued starts until the error is
            // raised. Handing the closure back cancels it (the queue holds the error); in
            // the instant after the error was raised it is simply queued again.
            let verdict = self.shared.queue.put_back(Work::Closure(closure));
            debug_assert!(verdict.is_ok(), "a link put back a closure it did not take");
            tokio::task::yield_now().await;
            return;
        }
        match self.prepare(&closure).await {
            Ok(()) => self.send_with_top_up(vec![closure]).await,
            Err(verdict) => self.settle(closure, verdict),
        }
    }

    /// Acts on what one execution attempt came to.
    fn settle(&mut self, mut closure: Closure, verdict: Verdict) {
        match verdict {
            // TF's transient-ps-failure rule: see ps_failures.rs.
            Verdict::Done(Err(failure)) => match self.shared.ps_failures.record(&failure) {
                Some(report) if report.transient => {
                    tracing::warn!(
                        target: DISPATCH,
                        worker = self.address(),
                        closure_id = closure.id(),
                        ps_task = report.task,
                        error = failure.message.as_str(),
                        "closure {} could not reach parameter server task {} (report {} of \
                         {} tolerated as transient, TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES); \
                         running it again: {}",
                        closure.id(),
                        report.task,
                        report.count,
                        report.threshold.saturating_sub(1),
                        failure.message,
                    );
                    self.put_back(closure);
                }
                Some(report) => {
                    tracing::warn!(
                        target: DISPATCH,
                        worker = self.address(),
                        closure_id = closure.id(),
                        ps_task = report.task,
                        error = failure.message.as_str(),
                        "closure {} fails with PSUnavailableError: parameter server task {} \
                         was reported unreachable {} time(s), no longer transient \
                         (TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES={}): {}",
                        closure.id(),
                        report.task,
                        report.count,
                        report.threshold,
                        failure.message,
                    );
                    self.finish(closure, Err(failure));
                }
                None => self.finish(closure, Err(failure)),
            },
            Verdict::Done(result) => self.finish(closure, result),
            Verdict::WorkerFailed(reason) => self.worker_failed_with(&reason, Some(closure)),
            Verdict::Retry(error) => {
                closure.infra_retries += 1;
                tracing::warn!(
                    target: DISPATCH,
                    worker = self.address(),
                    closure_id = closure.id(),
                    error = error.as_str(),
                    "worker {} reported an infrastructure error for closure {} (retry {} of \
                     {}): {}",
                    self.address(),
                    closure.id(),
                    closure.infra_retries,
                    execute::MAX_INFRA_RETRIES,
                    error,
                );
                self.put_back(closure);
            }
            // The queue is stopped, so this cancels it.
            Verdict::Stopped => self.put_back(closure),
        }
    }

    /// `closure_timeout` expired: retry elsewhere once, then fail naming the workers; this
    /// worker takes nothing new until it reports idle.
    async fn timed_out(&mut self, mut closure: Closure) {
        let address = self.address().to_owned();
        closure.timed_out_on.push(address.clone());
        let limit = self.shared.config.closure_timeout.unwrap_or_default();
        tracing::warn!(
            target: DISPATCH,
            worker = address.as_str(),
            closure_id = closure.id(),
            "closure {} did not finish within closure_timeout={:.3} s on worker {}; {}",
            closure.id(),
            limit.as_secs_f64(),
            address,
            if closure.timed_out_on.len() >= 2 {
                "it fails (it timed out twice)"
            } else {
                "running it again on another worker"
            },
        );
        if closure.timed_out_on.len() >= 2 {
            let message = format!(
                "closure {} did not finish within closure_timeout={:.3} s on worker {} (after \
                 also timing out on worker {}); it was not retried again",
                closure.id(),
                limit.as_secs_f64(),
                address,
                closure.timed_out_on[0]
            );
            let failure = ClosureFailure::infra(tonic::Code::DeadlineExceeded, message, &address);
            self.finish(closure, Err(failure));
        } else {
            self.put_back(closure);
        }
        self.wait_until_idle().await;
    }

    /// Polls `GetStatus` until the worker has nothing queued or running.
    async fn wait_until_idle(&mut self) {
        let mut pause = IDLE_POLL.0;
        loop {
            let Some(status) = self
                .call(
                    self.transport
                        .get_status(Some(self.shared.config.probe_timeout)),
                )
                .await
            else {
                return;
            };
            match status {
                Ok(status) => {
                    let idle = status.inflight == 0 && status.queued == 0;
                    let restarted = self.observe(status);
                    if restarted {
                        self.worker_failed("the worker restarted while a closure timed out");
                        return;
                    }
                    if idle {
                        return;
                    }
                }
                Err(error) => {
                    if self.is_worker_failure(&error).await {
                        self.worker_failed(error.message());
                    }
                    // Otherwise a definite answer (e.g. a refused token) means the worker
                    // is not busy with our closure any more; serving resumes and reports
                    // that error.
                    return;
                }
            }
            if !self.sleep(pause).await {
                return;
            }
            pause = (pause * 2).min(IDLE_POLL.1);
        }
    }

    /// Settles `closure` with its value or error and tells the queue, per the policy.
    fn finish(&self, closure: Closure, result: Result<EncodedValue, ClosureFailure>) {
        let shared = &self.shared;
        if result.is_ok() {
            // Where a kept result lives (dataflow); set before the cell wakes its readers.
            closure.cell.set_worker(self.index);
        }
        if closure.pinned().is_some() {
            // Not the queue's (never inflight) and not the user's workload: only its cell
            // hears of it.
            closure.settle(match result {
                Ok(value) => Outcome::Value(value),
                Err(failure) => Outcome::Failed(Arc::new(failure)),
            });
            return;
        }
        shared.latency.observe(closure.scheduled_at().elapsed());
        // The cell is settled before the queue hears of it, so a join() that returns has
        // every cell ready.
        let verdict = match result {
            Ok(value) => {
                Counters::bump(&shared.counters.completed);
                Counters::bump(&self.status.counters.completed);
                closure.settle(Outcome::Value(value));
                shared.queue.mark_finished()
            }
            Err(failure) => {
                Counters::bump(&shared.counters.failed);
                Counters::bump(&self.status.counters.failed);
                let failure = Arc::new(failure);
                closure.settle(Outcome::Failed(Arc::clone(&failure)));
                match shared.config.error_policy {
                    ErrorPolicy::CancelAll => {
                        // Set first, so no link starts a closure the raise will cancel,
                        // then have every link take back what its worker has queued.
                        shared.balance.set_failure_pending();
                        let verdict = shared.queue.mark_failed(failure);
                        shared.balance.ask_all_to_reclaim();
                        verdict
                    }
                    ErrorPolicy::PerClosure => shared.queue.mark_finished(),
                }
            }
        };
        debug_assert!(verdict.is_ok(), "a link settled a closure it did not take");
    }

    /// Re-queues a closure that started (or may have) and must run again; once the
    /// dispatcher is stopping, the stopped queue cancels it instead.
    fn put_back(&self, closure: Closure) {
        if closure.pinned().is_some() {
            return self.give_back(closure);
        }
        if self.shared.cancel.stopping.load(Ordering::Acquire) {
            // Shutting down: the stopped queue cancels it. Not a retry, and not said to be.
            tracing::debug!(
                target: DISPATCH,
                worker = self.address(),
                closure_id = closure.id(),
                "closure {} is cancelled: the coordinator shut down while it was on worker {}",
                closure.id(),
                self.address(),
            );
        } else {
            Counters::bump(&self.shared.counters.retried);
            Counters::bump(&self.status.counters.retried);
            tracing::debug!(
                target: DISPATCH,
                worker = self.address(),
                closure_id = closure.id(),
                "closure {} goes back to the queue to run again (it was on worker {})",
                closure.id(),
                self.address(),
            );
        }
        let verdict = self.shared.queue.put_back(Work::Closure(closure));
        debug_assert!(verdict.is_ok(), "a link put back a closure it did not take");
    }

    /// Hands a closure this link took back where it came from: a global one to the queue
    /// (it was inflight), a `schedule_on` one to this worker's sub-queue (it runs here or
    /// nowhere). Refused only once the queue stopped, which cancels it.
    fn give_back(&self, closure: Closure) {
        if closure.pinned().is_some() {
            if let Err(refused) = self
                .shared
                .queue
                .try_put(Work::Closure(closure), Some(self.tag()))
            {
                crate::queue::Cancel::cancel(refused.into_inner());
            }
            return;
        }
        // Refused (and so cancelled) only once the queue stopped.
        let _ = self.shared.queue.put_back(Work::Closure(closure));
    }

    /// Awaits `future` unless the dispatcher stops first: then `None` (the future is
    /// dropped, cancelling its RPC). The returned future holds no reference to the link
    /// (a link is `Send` but not `Sync`: its stream is not).
    fn call<F: Future>(&self, future: F) -> impl Future<Output = Option<F::Output>> {
        until_stopped(&self.stop, future)
    }

    /// Sleeps unless the dispatcher stops (or this link is asked to leave) first; returns
    /// whether it slept through.
    fn sleep(&self, pause: Duration) -> impl Future<Output = bool> {
        let mut retiring = self.retiring.clone();
        let slept = self.call(async move {
            tokio::select! {
                () = tokio::time::sleep(pause) => true,
                _ = retiring.wait_for(|retiring| *retiring) => false,
            }
        });
        async move { slept.await.unwrap_or(false) }
    }

    /// Releases `resource` on this worker right away (it was released while being built).
    async fn release_now(&mut self, resource: &ResourceInner) {
        let release = self
            .transport
            .release_resource(vec![resource.id], Some(RELEASE_TIMEOUT));
        let _ = self.call(release).await;
    }
}

/// Awaits `future` unless `stop` turns true first: then `None` (the future is dropped,
/// cancelling its RPC). A free function, so a caller can lend it a future that borrows
/// other fields of the link mutably.
fn until_stopped<F: Future>(
    stop: &watch::Receiver<bool>,
    future: F,
) -> impl Future<Output = Option<F::Output>> {
    let mut stop = stop.clone();
    async move {
        tokio::select! {
            biased;
            _ = stop.wait_for(|stopped| *stopped) => None,
            output = future => Some(output),
        }
    }
}
