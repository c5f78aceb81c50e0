//! One link per worker: a thread that serves its worker one work item at a time, and the
//! worker's state machine (`up` → `recovering` → `up` | `given_up`) with reconnection
//! backoff and resource rebuilding.
//!
//! Running one closure (inputs, function registration, the RPC and what its answer means)
//! is in `execute.rs`; this file is the loop around it.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::runtime::Handle;
use tokio::sync::watch;

use super::closure::{Closure, Work};
use super::config::{BackoffConfig, ErrorPolicy};
use super::execute::Verdict;
use super::failure::ClosureFailure;
use super::functions::SentFunctions;
use super::metrics::Counters;
use super::resources::{ResourceInner, ResourceState};
use super::result_cell::{EncodedValue, Outcome};
use super::transport::WorkerTransport;
use super::{LinkState, Shared};
use crate::queue::Tag;
use crate::rpc::{pb, RpcError};

/// Bound on a `ReleaseResource` call; a worker that does not answer loses nothing by it.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(10);
/// First and largest pause between idleness polls after a closure timed out.
const IDLE_POLL: (Duration, Duration) = (Duration::from_millis(20), Duration::from_secs(1));

/// Exponential reconnection delays: `initial`, doubling, capped at `max`.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    pub fn new(config: BackoffConfig) -> Self {
        Self {
            next: config.initial.min(config.max),
            max: config.max,
        }
    }

    /// The next delay to wait.
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = self.next.saturating_mul(2).min(self.max);
        delay
    }
}

/// Why a step on a worker did not complete.
#[derive(Debug)]
pub(crate) enum Interruption {
    /// The dispatcher is stopping.
    Stopped,
    /// The worker is gone (the message says how); recover it.
    WorkerFailed(String),
}

/// How a recovery attempt ended.
enum Recovery {
    Up,
    GaveUp,
    Stopped,
}

/// The serving side of one worker; owned by its thread.
pub(crate) struct Link<T> {
    pub(super) index: usize,
    pub(super) transport: T,
    pub(super) shared: Arc<Shared>,
    pub(super) runtime: Handle,
    pub(super) stop: watch::Receiver<bool>,
    /// Functions this worker holds since it last (re)connected.
    pub(super) sent: SentFunctions,
    /// The worker process last seen (`GetStatus.pid`), to notice a restart.
    pub(super) incarnation: Option<u64>,
    /// When the current recovery began (the dispatcher's creation for the first one).
    recovering_since: Instant,
}

impl<T: WorkerTransport> Link<T> {
    pub fn new(index: usize, transport: T, shared: Arc<Shared>, runtime: Handle) -> Self {
        let stop = shared.stop.subscribe();
        Self {
            index,
            transport,
            shared,
            runtime,
            stop,
            sent: SentFunctions::default(),
            incarnation: None,
            recovering_since: Instant::now(),
        }
    }

    pub(super) fn tag(&self) -> Tag {
        self.index as Tag
    }

    pub(super) fn address(&self) -> &str {
        self.transport.address()
    }

    /// The thread body: connect, wait out the staggered start, then serve until stopped.
    pub fn run(mut self) {
        let serve_from = Instant::now() + self.shared.config.start_delay.for_worker(self.index);
        loop {
            if *self.stop.borrow() {
                return;
            }
            match self.shared.links[self.index].state() {
                LinkState::Recovering => match self.recover() {
                    Recovery::Up | Recovery::GaveUp => {}
                    Recovery::Stopped => return,
                },
                LinkState::Up if Instant::now() < serve_from => {
                    if !self.sleep(serve_from - Instant::now()) {
                        return;
                    }
                }
                LinkState::Up => {
                    let Some(work) = self.shared.queue.get(Some(self.tag()), None) else {
                        return; // the queue was stopped
                    };
                    self.serve(work);
                }
                LinkState::GivenUp => return self.drain_when_all_given_up(),
            }
        }
    }

    fn serve(&mut self, work: Work) {
        match work {
            Work::Closure(closure) => self.run_closure(closure),
            Work::CreateResource { resource, .. } => {
                let Some(resource) = resource.upgrade() else {
                    return; // released before its turn
                };
                if matches!(
                    resource.state(self.index),
                    ResourceState::Pending | ResourceState::Aborted
                ) {
                    if let Err(Interruption::WorkerFailed(reason)) = self.create_resource(&resource)
                    {
                        self.worker_failed(&reason);
                    }
                }
            }
            Work::ReleaseResource { resource_id } => {
                let release = self
                    .transport
                    .release_resource(vec![resource_id], Some(RELEASE_TIMEOUT));
                if let Some(Err(error)) = self.call(release) {
                    if self.is_worker_failure(&error) {
                        self.worker_failed(error.message());
                    }
                }
            }
        }
    }

    /// Runs one closure and settles it, puts it back, or retries it.
    fn run_closure(&mut self, mut closure: Closure) {
        if self.shared.failure_pending.load(Ordering::SeqCst) {
            // A closure failed under cancel_all: nothing queued starts until the error is
            // raised. Handing the closure back cancels it (the queue holds the error); in
            // the instant after the error was raised it is simply queued again.
            let verdict = self.shared.queue.put_back(Work::Closure(closure));
            debug_assert!(verdict.is_ok(), "a link put back a closure it did not take");
            std::thread::yield_now();
            return;
        }
        closure.attempts += 1;
        match self.execute(&closure) {
            Verdict::Done(result) => self.finish(closure, result),
            Verdict::WorkerFailed(reason) => {
                self.worker_failed(&reason);
                self.put_back(closure);
            }
            Verdict::Retry => {
                closure.infra_retries += 1;
                self.put_back(closure);
            }
            Verdict::TimedOut => self.timed_out(closure),
            // The queue is stopped, so this cancels it.
            Verdict::Stopped => self.put_back(closure),
        }
    }

    /// `closure_timeout` expired: retry elsewhere once, then fail naming the workers; this
    /// worker takes nothing new until it reports idle.
    fn timed_out(&mut self, mut closure: Closure) {
        let address = self.address().to_owned();
        closure.timed_out_on.push(address.clone());
        if closure.timed_out_on.len() >= 2 {
            let limit = self.shared.config.closure_timeout.unwrap_or_default();
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
        self.wait_until_idle();
    }

    /// Polls `GetStatus` until the worker has nothing queued or running.
    fn wait_until_idle(&mut self) {
        let mut pause = IDLE_POLL.0;
        loop {
            let Some(status) = self.call(
                self.transport
                    .get_status(Some(self.shared.config.probe_timeout)),
            ) else {
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
                Err(error) if self.is_worker_failure(&error) => {
                    self.worker_failed(error.message());
                    return;
                }
                // A definite answer (e.g. a refused token) means the worker is not busy
                // with our closure any more; serving resumes and reports that error.
                Err(_) => return,
            }
            if !self.sleep(pause) {
                return;
            }
            pause = (pause * 2).min(IDLE_POLL.1);
        }
    }

    /// Settles `closure` with its value or error and tells the queue, per the policy.
    pub(super) fn finish(&self, closure: Closure, result: Result<EncodedValue, ClosureFailure>) {
        let shared = &self.shared;
        shared.latency.observe(closure.scheduled_at().elapsed());
        // The cell is settled before the queue hears of it, so a join() that returns has
        // every cell ready.
        let verdict = match result {
            Ok(value) => {
                Counters::bump(&shared.counters.completed);
                closure.settle(Outcome::Value(value));
                shared.queue.mark_finished()
            }
            Err(failure) => {
                Counters::bump(&shared.counters.failed);
                let failure = Arc::new(failure);
                closure.settle(Outcome::Failed(Arc::clone(&failure)));
                match shared.config.error_policy {
                    ErrorPolicy::CancelAll => {
                        // Set first, so no link starts a closure the raise will cancel.
                        shared.failure_pending.store(true, Ordering::SeqCst);
                        shared.queue.mark_failed(failure)
                    }
                    ErrorPolicy::PerClosure => shared.queue.mark_finished(),
                }
            }
        };
        debug_assert!(verdict.is_ok(), "a link settled a closure it did not take");
    }

    fn put_back(&self, closure: Closure) {
        Counters::bump(&self.shared.counters.retried);
        let verdict = self.shared.queue.put_back(Work::Closure(closure));
        debug_assert!(verdict.is_ok(), "a link put back a closure it did not take");
    }

    /// Marks the worker failed: its resources are aborted and the link starts recovering.
    pub(super) fn worker_failed(&mut self, reason: &str) {
        Counters::bump(&self.shared.counters.worker_failures);
        self.recovering_since = Instant::now();
        self.shared.links[self.index].set(LinkState::Recovering, Some(reason.to_owned()));
        for resource in self.shared.resources.live() {
            resource.set_state(self.index, ResourceState::Aborted);
        }
    }

    /// Probes with backoff until the worker answers (then rebuilds its resources and
    /// serves again), the recovery bound passes (given up), or the dispatcher stops.
    fn recover(&mut self) -> Recovery {
        let mut backoff = Backoff::new(self.shared.config.backoff);
        let bound = self.shared.config.recovery_timeout;
        loop {
            let elapsed = self.recovering_since.elapsed();
            if elapsed >= bound {
                self.give_up(bound);
                return Recovery::GaveUp;
            }
            let remaining = bound.saturating_sub(elapsed);
            let probe_timeout = self.shared.config.probe_timeout.min(remaining);
            let Some(answer) = self.call(self.transport.get_status(Some(probe_timeout))) else {
                return Recovery::Stopped;
            };
            let rebuilt = match answer {
                Ok(status) if status.state == pb::ServingState::Draining as i32 => Err(
                    Interruption::WorkerFailed("the worker is shutting down".to_owned()),
                ),
                Ok(status) => {
                    self.observe(status);
                    self.reconnected()
                }
                Err(error) if reachable(&error) => self.reconnected(),
                Err(error) => Err(Interruption::WorkerFailed(error.message().to_owned())),
            };
            match rebuilt {
                Ok(()) => {
                    self.shared.links[self.index].set(LinkState::Up, None);
                    return Recovery::Up;
                }
                Err(Interruption::Stopped) => return Recovery::Stopped,
                Err(Interruption::WorkerFailed(reason)) => {
                    self.shared.links[self.index].note_error(reason);
                }
            }
            let pause = backoff
                .next_delay()
                .min(bound.saturating_sub(self.recovering_since.elapsed()));
            if !self.sleep(pause) {
                return Recovery::Stopped;
            }
        }
    }

    /// The worker answers: forget what it held and rebuild every live resource before it
    /// serves closures.
    fn reconnected(&mut self) -> Result<(), Interruption> {
        self.sent.clear();
        for resource in self.shared.resources.live() {
            self.create_resource(&resource)?;
        }
        Ok(())
    }

    fn give_up(&mut self, bound: Duration) {
        let reason = format!(
            "gave up on worker {} after it did not answer for {bound:?} \
             (JAXCLUSTER_WORKER_RECOVERY_SEC / recovery_timeout)",
            self.address(),
        );
        self.shared.links[self.index].set(LinkState::GivenUp, Some(reason));
        for resource in self.shared.resources.live() {
            resource.set_state(self.index, ResourceState::Aborted);
        }
        self.shared.given_up.send_modify(|count| *count += 1);
    }

    /// A given-up link waits until every link has given up; from then on it fails whatever
    /// reaches the queue, so nothing scheduled hangs.
    fn drain_when_all_given_up(&mut self) {
        let links = self.shared.links.len();
        let mut given_up = self.shared.given_up.subscribe();
        if self.call(async move { given_up.wait_for(|count| *count >= links).await.is_ok() })
            != Some(true)
        {
            return;
        }
        while let Some(work) = self.shared.queue.get(Some(self.tag()), None) {
            match work {
                Work::Closure(closure) => {
                    let message = format!(
                        "closure {} could not run: all {links} workers were given up after not \
                         answering for {:?} (JAXCLUSTER_WORKER_RECOVERY_SEC / \
                         recovery_timeout)",
                        closure.id(),
                        self.shared.config.recovery_timeout
                    );
                    let failure =
                        ClosureFailure::infra(tonic::Code::Unavailable, message, self.address());
                    self.finish(closure, Err(failure));
                }
                Work::CreateResource { resource, worker } => {
                    if let Some(resource) = resource.upgrade() {
                        resource.set_state(worker, ResourceState::Aborted);
                    }
                }
                Work::ReleaseResource { .. } => {}
            }
        }
    }

    /// Records a `GetStatus` answer; returns whether it comes from a different worker
    /// process than the previous one (the worker restarted and lost its state).
    pub(super) fn observe(&mut self, status: pb::GetStatusResponse) -> bool {
        let restarted = self.incarnation.is_some_and(|pid| pid != status.pid);
        self.incarnation = Some(status.pid);
        self.shared.links[self.index].record_status(status);
        restarted
    }

    /// Runs `future` on the shared runtime from this thread; `None` if the dispatcher
    /// stopped first (the future is dropped, cancelling its RPC).
    pub(super) fn call<F: Future>(&self, future: F) -> Option<F::Output> {
        let mut stop = self.stop.clone();
        self.runtime.block_on(async move {
            tokio::select! {
                biased;
                _ = stop.wait_for(|stopped| *stopped) => None,
                output = future => Some(output),
            }
        })
    }

    /// Sleeps unless the dispatcher stops first; returns whether it slept through.
    pub(super) fn sleep(&self, pause: Duration) -> bool {
        // Built inside the runtime: a tokio timer cannot be created outside one.
        self.call(async move { tokio::time::sleep(pause).await })
            .is_some()
    }

    /// Whether a failed call means the worker is gone (put the work back, recover) rather
    /// than a definite refusal of this request.
    pub(super) fn is_worker_failure(&mut self, error: &RpcError) -> bool {
        match error {
            RpcError::Unavailable(_) | RpcError::DeadlineExceeded(_) => true,
            // A connection cut mid-call surfaces as one of these; ask the worker.
            RpcError::Internal(_) | RpcError::Cancelled(_) | RpcError::Aborted(_) => {
                self.worker_lost()
            }
            _ => false,
        }
    }

    /// Asks the worker whether it is still the process we knew: `true` if it does not
    /// answer, is shutting down, or restarted.
    pub(super) fn worker_lost(&mut self) -> bool {
        let probe = self
            .transport
            .get_status(Some(self.shared.config.probe_timeout));
        match self.call(probe) {
            None => true,
            Some(Ok(status)) if status.state == pb::ServingState::Draining as i32 => true,
            Some(Ok(status)) => self.observe(status),
            Some(Err(error)) => !reachable(&error),
        }
    }

    /// Releases `resource` on this worker right away (it was released while being built).
    pub(super) fn release_now(&self, resource: &ResourceInner) {
        let release = self
            .transport
            .release_resource(vec![resource.id], Some(RELEASE_TIMEOUT));
        let _ = self.call(release);
    }
}

/// Whether an RPC error is a definite answer from a live worker (so it is reachable).
fn reachable(error: &RpcError) -> bool {
    matches!(
        error,
        RpcError::Unauthenticated(_)
            | RpcError::InvalidArgument(_)
            | RpcError::NotFound(_)
            | RpcError::FailedPrecondition(_)
            | RpcError::ResourceExhausted(_)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let mut backoff = Backoff::new(BackoffConfig {
            initial: Duration::from_millis(50),
            max: Duration::from_millis(300),
        });
        let delays: Vec<u128> = (0..6).map(|_| backoff.next_delay().as_millis()).collect();
        assert_eq!(delays, [50, 100, 200, 300, 300, 300]);
    }

    #[test]
    fn the_default_backoff_is_capped_at_ten_seconds() {
        let mut backoff = Backoff::new(BackoffConfig::default());
        let last = (0..40).map(|_| backoff.next_delay()).last().unwrap();
        assert_eq!(last, Duration::from_secs(10));
    }
}
