//! Work aimed at one worker: per-worker resources built on every worker, and closures
//! that must run on one given worker (`schedule_on`, e.g. reading that worker's
//! per-worker state). Both travel tagged with their worker, in one FIFO per worker, so a
//! closure queued after a resource build on that worker runs after it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::Dispatcher;
use crate::dispatch::closure::Work;
use crate::dispatch::failure::ClosureFailure;
use crate::dispatch::resources::{PerWorkerResource, ResourceInner, ResourceState};
use crate::dispatch::result_cell::{EncodedValue, Outcome, ResultCell};
use crate::dispatch::status::{LinkState, LinkStatus};
use crate::dispatch::DispatchError;
use crate::queue::{Tag, TryPutError};

/// Resource ids are unique in the process, so two dispatchers sharing a worker never
/// collide on it.
static NEXT_RESOURCE_ID: AtomicU64 = AtomicU64::new(1);

impl Dispatcher {
    /// Queues a closure of a registered function that runs on worker `worker` alone
    /// (e.g. reading that worker's per-worker state), and returns its cell at once.
    ///
    /// It is tagged work: served before the worker's next global closure and after what
    /// was queued for that worker before it (a resource build, say), and not counted by
    /// `join()`/`done()`; its error never cancels other closures. It inherits the
    /// dispatcher's handling of that worker: a worker that fails while running it runs it
    /// again once it is back (its per-worker resources rebuilt first), closure timeouts
    /// and retry bounds apply, and a worker removed or given up fails it with an
    /// `ABORTED` error naming the worker and why (the cell is returned already failed if
    /// that was so before queueing). `InvalidArgument` for an index out of range.
    pub fn schedule_on(
        &self,
        worker: usize,
        function_hash: &[u8],
        args: EncodedValue,
        resources: &[PerWorkerResource],
    ) -> Result<Arc<ResultCell>, DispatchError> {
        self.schedule_on_keeping(worker, function_hash, args, resources, None)
    }

    /// [`schedule_on`](Self::schedule_on), the worker keeping the result under
    /// `keep_result_id` when given (dataflow: a consumer placed where its input lives).
    pub fn schedule_on_keeping(
        &self,
        worker: usize,
        function_hash: &[u8],
        args: EncodedValue,
        resources: &[PerWorkerResource],
        keep_result_id: Option<u64>,
    ) -> Result<Arc<ResultCell>, DispatchError> {
        let Some(link) = self.shared.link(worker) else {
            return Err(DispatchError::InvalidArgument(format!(
                "schedule_on(): there is no worker {worker}; the indices are 0 to {}",
                self.num_workers().saturating_sub(1)
            )));
        };
        let mut closure = self.closure(function_hash, args, resources)?;
        closure.pinned = Some(worker);
        closure.keep_result_id = keep_result_id;
        let cell = closure.cell();
        if let Some(why) = unable(&link) {
            let message = format!(
                "closure {} for worker {worker} ({}) did not run: {why}",
                closure.id(),
                link.address()
            );
            let failure = ClosureFailure::infra(tonic::Code::Aborted, message, link.address());
            closure.settle(Outcome::Failed(Arc::new(failure)));
            return Ok(cell);
        }
        match self
            .shared
            .queue
            .try_put(Work::Closure(closure), Some(worker as Tag))
        {
            Ok(()) => {}
            Err(TryPutError::Stopped(work)) => {
                crate::queue::Cancel::cancel(work);
                return Err(DispatchError::Stopped);
            }
            Err(refused) => {
                crate::queue::Cancel::cancel(refused.into_inner());
                return Err(DispatchError::Internal(
                    "the queue refused a tagged closure".to_owned(),
                ));
            }
        }
        // The link drains its tagged closures when it leaves or gives up, after its state
        // says so; looking again after queueing means one of the two sees this closure.
        if let Some(why) = unable(&link) {
            self.shared.fail_pinned(worker, &why);
        }
        Ok(cell)
    }

    /// Creates a per-worker resource: each worker runs the registered function
    /// `function_hash` (no arguments) and keeps the result. Returns at once; the builds
    /// are queued for each worker ahead of its closures. With `rebuild`, a worker that
    /// failed or restarted builds it again when it returns (as for datasets); without,
    /// the resource is `Lost` on that worker and closures using it there fail.
    pub fn create_resource(
        &self,
        function_hash: &[u8],
        rebuild: bool,
    ) -> Result<PerWorkerResource, DispatchError> {
        self.create_named_resource(function_hash, rebuild, "")
    }

    /// As [`Self::create_resource`], for named state: each worker that holds a live value
    /// of `name` (left by an earlier session, e.g. a coordinator that was killed) adopts it
    /// instead of running the function ([`PerWorkerResource::is_reattached`] says where).
    pub fn create_named_resource(
        &self,
        function_hash: &[u8],
        rebuild: bool,
        name: &str,
    ) -> Result<PerWorkerResource, DispatchError> {
        let function = self
            .shared
            .functions
            .lookup(function_hash, "create_resource()")?;
        if self.is_shut_down() {
            return Err(DispatchError::Stopped);
        }
        let _membership = self.lock_membership();
        let workers = self.num_workers();
        let mut inner = ResourceInner::new(
            NEXT_RESOURCE_ID.fetch_add(1, Ordering::Relaxed),
            function,
            rebuild,
            workers,
            Arc::downgrade(&self.shared),
        );
        name.clone_into(&mut inner.name);
        let inner = Arc::new(inner);
        self.shared.resources.insert(&inner);
        for (worker, link) in self.shared.link_statuses().iter().enumerate() {
            if link.state().is_out_of_service() || link.is_retiring() {
                inner.set_state(worker, ResourceState::Aborted);
                continue;
            }
            let work = Work::CreateResource {
                resource: Arc::downgrade(&inner),
                worker,
            };
            if let Err(refused) = self.shared.queue.try_put(work, Some(worker as Tag)) {
                crate::queue::Cancel::cancel(refused.into_inner());
            }
        }
        Ok(PerWorkerResource::new(inner))
    }

    /// A fresh id from the counter per-worker resources draw from: the id a kept result
    /// (dataflow) is stored under, in one id space with the session's resources.
    pub fn new_resource_id(&self) -> u64 {
        NEXT_RESOURCE_ID.fetch_add(1, Ordering::Relaxed)
    }

    /// Asks worker `worker` to drop the kept value `value_id` (tagged work, after what is
    /// queued for that worker). Nothing is sent to a worker out of service: its values went
    /// with its process, or go with the session's `--state-ttl`.
    pub fn release_value(&self, worker: usize, value_id: u64) {
        self.shared.send_releases(value_id, &[worker]);
    }

    /// Whether worker `worker` is up and has nothing outstanding or queued for it alone (a
    /// pending release aside): dataflow runs a consumer on its input's worker only then
    /// ("when that worker is free"), else anywhere.
    pub fn worker_free(&self, worker: usize) -> bool {
        let Some(link) = self.shared.link(worker) else {
            return false;
        };
        link.state() == LinkState::Up
            && !link.is_retiring()
            && link.snapshot().preemption.is_none()
            && link.counters.outstanding.load(Ordering::Relaxed) == 0
            && !self.shared.queue.tagged_any(
                Tag::try_from(worker).unwrap_or(Tag::MAX),
                // A pending release is a small RPC, not work to queue behind: the holder
                // of a kept value is still free while the collected ones before it are
                // released (a chain dropping each step's value left every next step
                // looking busy, and it ran elsewhere and pulled its input).
                |work| !matches!(work, Work::ReleaseResource { .. }),
            )
    }

    /// Wakes `watch` (its waiter returns with nothing settled) each time a worker's
    /// preemption notice is acted on, from now on: the coordinator's preemption saver
    /// sleeps on it and then reads the worker statuses, instead of polling them.
    pub fn watch_preemptions(&self, watch: &Arc<crate::dispatch::CellWatch>) {
        self.shared.counters.preemption_watches.add(watch);
    }

    /// Whether a closure error is pending under `cancel_all` (not raised yet): dataflow
    /// cancels a consumer that became ready meanwhile instead of queueing it.
    pub fn failure_pending(&self) -> bool {
        self.shared.balance.failure_pending()
    }

    /// Work queued for worker `index` alone (resource builds and releases), for tests.
    #[cfg(test)]
    pub(crate) fn queued_for(&self, index: usize) -> usize {
        self.shared
            .queue
            .tagged_len(crate::queue::Tag::try_from(index).unwrap_or(crate::queue::Tag::MAX))
    }
}

/// Why the worker of `link` will never run closures for it (removed, leaving or given up),
/// or `None` while it may.
fn unable(link: &LinkStatus) -> Option<String> {
    if link.is_retiring() || link.state() == LinkState::Removed {
        return Some("the worker was removed (remove_workers)".to_owned());
    }
    if link.state() == LinkState::GivenUp {
        let reason = link
            .last_error()
            .unwrap_or_else(|| "it did not answer within recovery_timeout".to_owned());
        return Some(format!("the worker was given up: {reason}"));
    }
    None
}
