//! [`Dispatcher`]: the public face of the dispatcher and the state its links share.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::closure::{CancelContext, Closure, Work};
use super::config::DispatcherConfig;
use super::failure::ClosureFailure;
use super::functions::{FunctionKind, FunctionRegistry};
use super::link::balance::Balance;
use super::link::Link;
use super::metrics::{Counters, Histogram, LatencySnapshot};
use super::ps_failures::PsFailures;
use super::resources::{PerWorkerResource, ResourceInner, ResourceRegistry, ResourceState};
use super::result_cell::{EncodedValue, ResultCell};
use super::status::{LinkState, LinkStatus, WorkerSnapshot};
use super::transport::WorkerTransport;
use super::DispatchError;
use crate::queue::{ClosureQueue, QueueError, Tag, TryPutError, WaitPolicy};
use crate::rpc::{pb, RpcError};

/// A boxed `GetStatus` call, so the dispatcher can hold its links' transports without
/// knowing their type.
type StatusCall<'a> =
    Pin<Box<dyn Future<Output = Result<pb::GetStatusResponse, RpcError>> + Send + 'a>>;

/// `GetStatus` on one worker, object-safe (a [`WorkerTransport`]'s methods return
/// `impl Future`, so it cannot be a trait object itself).
trait StatusProbe: Send + Sync {
    fn probe(&self, timeout: Duration) -> StatusCall<'_>;
}

impl<T: WorkerTransport> StatusProbe for T {
    fn probe(&self, timeout: Duration) -> StatusCall<'_> {
        Box::pin(self.get_status(Some(timeout)))
    }
}

/// Closure ids are unique in the process (workers echo them; logs can correlate them).
static NEXT_CLOSURE_ID: AtomicU64 = AtomicU64::new(1);
/// Resource ids are unique in the process, so two dispatchers sharing a worker never
/// collide on it.
static NEXT_RESOURCE_ID: AtomicU64 = AtomicU64::new(1);

/// Everything the links and the [`Dispatcher`] share.
pub(crate) struct Shared {
    pub queue: ClosureQueue<Work, Arc<ClosureFailure>>,
    pub config: DispatcherConfig,
    pub functions: FunctionRegistry,
    pub resources: ResourceRegistry,
    pub counters: Counters,
    pub latency: Histogram,
    pub cancel: Arc<CancelContext>,
    /// One per worker, by index; only ever appended to (a removed worker keeps its index,
    /// `removed`). Each link holds its own `Arc`, so the lock is off the per-closure path.
    pub links: RwLock<Vec<Arc<LinkStatus>>>,
    /// `true` once shutdown began; every in-flight RPC and sleep of the links ends.
    pub stop: watch::Sender<bool>,
    /// Bumped whenever the set of workers in service changes (one gave up, left or
    /// joined), so given-up links re-check whether every worker is out of service.
    pub membership: watch::Sender<u64>,
    /// What links tell each other so that pipelining stays work-conserving: idle links,
    /// closures outstanding per link, reclaim requests, a pending `cancel_all` failure.
    pub balance: Balance,
    /// Parameter-server failures reported by closures, counted per ps task.
    pub ps_failures: PsFailures,
    /// When the dispatcher started (for `connect_timeout`).
    pub started: Instant,
    /// Whether any worker has ever answered.
    pub reached: AtomicBool,
}

impl Shared {
    /// Every link's status, by index.
    pub fn link_statuses(&self) -> Vec<Arc<LinkStatus>> {
        self.links
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Link `index`'s status.
    pub fn link(&self, index: usize) -> Option<Arc<LinkStatus>> {
        self.links
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(index)
            .cloned()
    }

    /// How many links there are (removed ones included: indices are never reused).
    pub fn num_links(&self) -> usize {
        self.links
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Whether no worker can take closures any more: every one was given up or removed.
    pub fn all_out_of_service(&self) -> bool {
        self.link_statuses()
            .iter()
            .all(|link| link.state().is_out_of_service())
    }

    /// Tells given-up links that the set of workers in service changed.
    pub fn membership_changed(&self) {
        self.membership.send_modify(|generation| *generation += 1);
    }

    /// Whether no worker was reached within `connect_timeout` (cheap: no message built).
    pub fn is_unreachable(&self) -> bool {
        self.config.connect_timeout.is_some_and(|limit| {
            !self.reached.load(Ordering::Acquire) && self.started.elapsed() >= limit
        })
    }

    /// The error of a cluster none of whose workers was reached within `connect_timeout`,
    /// naming every worker and its last error; `None` while that is not the case.
    pub fn unreachable(&self) -> Option<String> {
        let limit = self.config.connect_timeout?;
        if !self.is_unreachable() {
            return None;
        }
        let workers: Vec<String> = self
            .link_statuses()
            .iter()
            .map(|link| {
                let snapshot = link.snapshot();
                let error = snapshot
                    .last_error
                    .unwrap_or_else(|| "no answer yet".to_owned());
                let hint = super::link::hang_up_hint(&error)
                    .map_or_else(String::new, |hint| format!(" ({hint})"));
                format!(
                    "worker {} at {}: {error}{hint}",
                    snapshot.index, snapshot.address
                )
            })
            .collect();
        Some(format!(
            "no worker of the cluster could be reached in the {:.0} s since the coordinator \
             started (connect_timeout; pass connect_timeout=None to wait as long as TF \
             does): {}",
            limit.as_secs_f64(),
            workers.join("; ")
        ))
    }

    /// Asks each worker in `holders` to drop resource `id` (as tagged work, so it is sent
    /// after anything queued for that worker before it).
    pub fn send_releases(&self, id: u64, holders: &[usize]) {
        for &worker in holders {
            if self
                .link(worker)
                .map_or(true, |link| link.state().is_out_of_service())
            {
                continue;
            }
            let release = Work::ReleaseResource { resource_id: id };
            // Refused only once stopped, when the workers are no longer ours to tidy.
            let _ = self.queue.try_put(release, Some(worker as Tag));
        }
    }
}

/// A snapshot of [`Dispatcher::metrics`].
#[derive(Debug, Clone, PartialEq)]
pub struct MetricsSnapshot {
    /// Closures queued, not yet taken by a worker.
    pub queued: usize,
    /// Closures taken by a worker and not yet settled.
    pub inflight: usize,
    /// Closures that returned a value.
    pub completed: u64,
    /// Closures that ended with an error.
    pub failed: u64,
    /// Closures cancelled (by a raised error under `cancel_all`, or by shutdown).
    pub cancelled: u64,
    /// Executions put back to run again (worker failures, timeouts, worker-side
    /// infrastructure errors, transient parameter-server failures).
    pub retried: u64,
    /// Times a worker was found failed.
    pub worker_failures: u64,
    /// Closure executions that failed because a parameter server was unreachable or had
    /// restarted (each one counted, whether retried as transient or raised).
    pub ps_failures: u64,
    /// Function payloads sent to workers.
    pub functions_registered: u64,
    /// Per-worker address and state.
    pub workers: Vec<WorkerSnapshot>,
    /// Schedule-to-result latency of settled closures.
    pub latency: LatencySnapshot,
}

/// Moves closures to workers: one link (a task on the shared runtime) per worker.
/// See the [module documentation](super) for threads, failures and ownership.
///
/// ```
/// use std::time::Duration;
/// use bytes::Bytes;
/// use _core::dispatch::fake::FakeCluster;
/// use _core::dispatch::{Dispatcher, DispatcherConfig, EncodedValue, FunctionKind, Outcome};
///
/// let cluster = FakeCluster::new(2);
/// let dispatcher = Dispatcher::new(cluster.transports(), DispatcherConfig::default()).unwrap();
/// let payload = Bytes::from_static(b"echo");
/// let hash = _core::rpc::content_hash(&payload);
/// dispatcher.register_function(&hash, FunctionKind::Cloudpickle, payload).unwrap();
/// let args = EncodedValue { pickle: Bytes::from_static(b"hi"), buffers: vec![] };
/// let cell = dispatcher.schedule(&hash, args.clone(), &[]).unwrap();
/// assert!(cell.wait(Some(std::time::Instant::now() + Duration::from_secs(30))));
/// assert_eq!(cell.outcome(), Some(Outcome::Value(args)));
/// dispatcher.shutdown();
/// ```
pub struct Dispatcher {
    shared: Arc<Shared>,
    /// Each running link's task, by worker index.
    links: Mutex<HashMap<usize, JoinHandle<()>>>,
    /// Each link's transport, shared with the link, for [`Dispatcher::refresh_statuses`].
    probes: Mutex<Vec<Arc<dyn StatusProbe>>>,
    /// Held while workers join or leave, and while a per-worker resource is created, so a
    /// new worker gets every resource exactly once and indices match across the tables.
    membership: Mutex<()>,
}

impl Dispatcher {
    /// Starts one link per transport (worker `i` is `transports[i]`). Never blocks on the
    /// workers: links connect in the background, starting `recovering`.
    pub fn new<T: WorkerTransport>(
        transports: Vec<T>,
        config: DispatcherConfig,
    ) -> Result<Self, DispatchError> {
        if transports.is_empty() {
            return Err(DispatchError::InvalidArgument(
                "a dispatcher needs at least one worker address; the cluster's 'worker' job \
                 has none"
                    .to_owned(),
            ));
        }
        let shared = Arc::new(Shared {
            queue: ClosureQueue::new(config.max_queue_size),
            ps_failures: PsFailures::new(config.transient_ps_failures),
            balance: Balance::new(),
            config,
            functions: FunctionRegistry::default(),
            resources: ResourceRegistry::default(),
            counters: Counters::default(),
            latency: Histogram::default(),
            cancel: Arc::new(CancelContext::default()),
            links: RwLock::new(Vec::new()),
            stop: watch::Sender::new(false),
            membership: watch::Sender::new(0),
            started: Instant::now(),
            reached: AtomicBool::new(false),
        });
        let dispatcher = Self {
            shared,
            links: Mutex::new(HashMap::new()),
            probes: Mutex::new(Vec::new()),
            membership: Mutex::new(()),
        };
        // Dropping `dispatcher` on an error stops the links already started.
        dispatcher.start_links(transports)?;
        Ok(dispatcher)
    }

    /// Starts one link per transport, with the next free indices (returned). A link
    /// starts `recovering`; the per-worker resources alive now are queued for its worker
    /// ahead of any closure.
    fn start_links<T: WorkerTransport>(
        &self,
        transports: Vec<T>,
    ) -> Result<Vec<usize>, DispatchError> {
        let runtime = crate::runtime::runtime()?.handle().clone();
        let _membership = self.lock_membership();
        let resources = self.shared.resources.live();
        let mut indices = Vec::with_capacity(transports.len());
        for transport in transports {
            let transport = Arc::new(transport);
            let status = {
                let mut links = self
                    .shared
                    .links
                    .write()
                    .unwrap_or_else(PoisonError::into_inner);
                let status = Arc::new(LinkStatus::new(links.len(), transport.address().to_owned()));
                links.push(Arc::clone(&status));
                status
            };
            let index = status.index();
            self.lock_probes()
                .push(Arc::clone(&transport) as Arc<dyn StatusProbe>);
            for resource in &resources {
                if resource.add_worker(index) {
                    let work = Work::CreateResource {
                        resource: Arc::downgrade(resource),
                        worker: index,
                    };
                    if let Err(refused) = self.shared.queue.try_put(work, Some(index as Tag)) {
                        crate::queue::Cancel::cancel(refused.into_inner());
                    }
                }
            }
            let slot = self.shared.balance.add_link();
            let link = Link::new(transport, Arc::clone(&self.shared), status, slot);
            let task = runtime.spawn(link.run());
            self.lock_links().insert(index, task);
            indices.push(index);
        }
        self.shared.membership_changed();
        Ok(indices)
    }

    /// Adds workers while closures run (elastic clusters): each gets the next index (an
    /// index is never reused), connects in the background like the first ones, builds
    /// every live per-worker resource, then takes closures. Returns the new indices.
    pub fn add_workers<T: WorkerTransport>(
        &self,
        transports: Vec<T>,
    ) -> Result<Vec<usize>, DispatchError> {
        if self.is_shut_down() {
            return Err(DispatchError::Stopped);
        }
        self.start_links(transports)
    }

    /// Removes workers `indices` and waits until each has left: a worker's link stops
    /// taking closures, lets what its worker is running (and has queued) finish and
    /// collects the results — a worker that is down has already given its closures back —
    /// releases the worker's per-worker resources, and ends. Nothing is lost: a closure
    /// whose result does not arrive runs elsewhere. Refused (nothing removed) for an
    /// unknown or already removed index, or if no worker able to run closures would
    /// remain.
    pub fn remove_workers(&self, indices: &[usize]) -> Result<(), DispatchError> {
        let leaving = {
            let _membership = self.lock_membership();
            let links = self.shared.link_statuses();
            let mut leaving: Vec<usize> = Vec::with_capacity(indices.len());
            for &index in indices {
                let Some(link) = links.get(index) else {
                    return Err(DispatchError::InvalidArgument(format!(
                        "remove_workers(): there is no worker {index}; the indices are 0 to {}",
                        links.len().saturating_sub(1)
                    )));
                };
                if link.is_retiring() || link.state() == LinkState::Removed {
                    return Err(DispatchError::InvalidArgument(format!(
                        "remove_workers(): worker {index} ({}) was already removed",
                        link.address()
                    )));
                }
                if !leaving.contains(&index) {
                    leaving.push(index);
                }
            }
            let remaining = links
                .iter()
                .filter(|link| {
                    !leaving.contains(&link.index())
                        && !link.is_retiring()
                        && !link.state().is_out_of_service()
                })
                .count();
            if remaining == 0 {
                return Err(DispatchError::InvalidArgument(format!(
                    "remove_workers(): removing workers {leaving:?} would leave no worker able \
                     to run closures; add workers first (add_workers) or shut the \
                     coordinator down"
                )));
            }
            for &index in &leaving {
                links[index].begin_retiring();
                // Wakes the link if it waits for work; served before any closure.
                let _ = self.shared.queue.try_put(Work::Retire, Some(index as Tag));
            }
            leaving
        };
        let tasks: Vec<JoinHandle<()>> = {
            let mut links = self.lock_links();
            leaving
                .iter()
                .filter_map(|index| links.remove(index))
                .collect()
        };
        await_links(tasks);
        self.shared.membership_changed();
        Ok(())
    }

    /// How many workers (links) there are, removed ones included: worker indices run
    /// from 0 to this, and are never reused.
    pub fn num_workers(&self) -> usize {
        self.shared.num_links()
    }

    /// The configuration in use.
    pub fn config(&self) -> &DispatcherConfig {
        &self.shared.config
    }

    /// Registers a function payload under `hash` (its SHA-256, checked). Links send it to
    /// each worker the first time a closure there needs it. Idempotent.
    pub fn register_function(
        &self,
        hash: &[u8],
        kind: FunctionKind,
        payload: Bytes,
    ) -> Result<(), DispatchError> {
        self.register_named_function(hash, kind, payload, "")
    }

    /// [`register_function`](Self::register_function), with the name errors call the
    /// function by (e.g. its `__qualname__`; the first name given wins).
    pub fn register_named_function(
        &self,
        hash: &[u8],
        kind: FunctionKind,
        payload: Bytes,
        name: &str,
    ) -> Result<(), DispatchError> {
        let function = self.shared.functions.register(hash, kind, payload)?;
        function.set_name(name);
        Ok(())
    }

    /// `Unavailable` once no worker was reached within `connect_timeout`.
    fn check_reachable(&self) -> Result<(), DispatchError> {
        match self.shared.unreachable() {
            Some(message) => Err(DispatchError::Unavailable(message)),
            None => Ok(()),
        }
    }

    /// Builds a closure of a registered function, not yet queued; its cell is
    /// [`Closure::cell`]. `resources` are the per-worker resources the arguments refer to.
    pub fn closure(
        &self,
        function_hash: &[u8],
        args: EncodedValue,
        resources: &[PerWorkerResource],
    ) -> Result<Closure, DispatchError> {
        let function = self.shared.functions.lookup(function_hash, "schedule()")?;
        self.check_reachable()?;
        let mut inputs = Vec::with_capacity(resources.len());
        for resource in resources {
            if !std::ptr::eq(resource.inner.owner_ptr(), Arc::as_ptr(&self.shared)) {
                return Err(DispatchError::InvalidArgument(format!(
                    "schedule(): per-worker resource {} belongs to another dispatcher; \
                     create it with this one's create_resource()",
                    resource.id()
                )));
            }
            if resource.is_released() {
                return Err(DispatchError::InvalidArgument(format!(
                    "schedule(): per-worker resource {} was released; a closure cannot use it",
                    resource.id()
                )));
            }
            inputs.push(Arc::clone(&resource.inner));
        }
        let id = NEXT_CLOSURE_ID.fetch_add(1, Ordering::Relaxed);
        Ok(Closure {
            function,
            args: Arc::new(args),
            resources: inputs,
            cell: Arc::new(ResultCell::new(id)),
            attempts: 0,
            timed_out_on: Vec::new(),
            infra_retries: 0,
            deaths: Vec::new(),
            context: Arc::clone(&self.shared.cancel),
        })
    }

    /// Queues `closure` if that needs no waiting; hands it back if the queue is full, a
    /// `join` is in progress or an error is pending (then call [`enqueue`](Self::enqueue)).
    pub fn try_enqueue(&self, closure: Closure) -> Result<Option<Closure>, DispatchError> {
        match self.shared.queue.try_put(Work::Closure(closure), None) {
            Ok(()) => Ok(None),
            Err(TryPutError::Stopped(work)) => {
                crate::queue::Cancel::cancel(work);
                Err(DispatchError::Stopped)
            }
            Err(TryPutError::Full(work) | TryPutError::Busy(work)) => match work {
                Work::Closure(closure) => Ok(Some(closure)),
                _ => Err(DispatchError::Internal(
                    "the queue handed back a different item".to_owned(),
                )),
            },
        }
    }

    /// Queues `closure`, waiting per `policy` while the queue is full. If a closure error
    /// is pending (`cancel_all`), the closure is queued and then cancelled with the rest,
    /// and the error is returned, as TF's `schedule` does.
    pub fn enqueue(
        &self,
        closure: Closure,
        policy: &mut WaitPolicy<'_>,
    ) -> Result<(), DispatchError> {
        let queued = self
            .shared
            .queue
            .put_with(Work::Closure(closure), None, policy);
        self.raised(queued)
    }

    /// Builds and queues a closure, waiting as long as the queue is full.
    pub fn schedule(
        &self,
        function_hash: &[u8],
        args: EncodedValue,
        resources: &[PerWorkerResource],
    ) -> Result<Arc<ResultCell>, DispatchError> {
        let closure = self.closure(function_hash, args, resources)?;
        let cell = closure.cell();
        if let Some(closure) = self.try_enqueue(closure)? {
            self.enqueue(closure, &mut WaitPolicy::forever())?;
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
        let function = self
            .shared
            .functions
            .lookup(function_hash, "create_resource()")?;
        if self.is_shut_down() {
            return Err(DispatchError::Stopped);
        }
        let _membership = self.lock_membership();
        let workers = self.num_workers();
        let inner = Arc::new(ResourceInner::new(
            NEXT_RESOURCE_ID.fetch_add(1, Ordering::Relaxed),
            function,
            rebuild,
            workers,
            Arc::downgrade(&self.shared),
        ));
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

    /// Waits per `policy` until nothing is queued or running: `Ok(true)`, `Ok(false)` when
    /// the deadline passed, or the pending closure error.
    pub fn join(&self, policy: &mut WaitPolicy<'_>) -> Result<bool, DispatchError> {
        let waited = self.shared.queue.wait_with(policy);
        let joined = self.raised(waited)?;
        self.check_reachable()?;
        Ok(joined)
    }

    /// Whether nothing is queued or running; raises the pending closure error instead
    /// (waiting per `policy` for running closures to end first).
    pub fn done(&self, policy: &mut WaitPolicy<'_>) -> Result<bool, DispatchError> {
        let done = self.shared.queue.done_with(policy);
        let done = self.raised(done)?;
        self.check_reachable()?;
        Ok(done)
    }

    /// Maps a queue result; a raised closure error is no longer pending, so links may
    /// start closures again.
    fn raised<R>(
        &self,
        result: Result<R, QueueError<Arc<ClosureFailure>>>,
    ) -> Result<R, DispatchError> {
        if let Err(QueueError::Failed(_)) = &result {
            self.shared.balance.clear_failure_pending();
        }
        result.map_err(from_queue)
    }

    /// Work queued for worker `index` alone (resource builds and releases), for tests.
    #[cfg(test)]
    pub(crate) fn queued_for(&self, index: usize) -> usize {
        self.shared
            .queue
            .tagged_len(crate::queue::Tag::try_from(index).unwrap_or(crate::queue::Tag::MAX))
    }

    /// Gauges, counters, worker states and the latency histogram, right now.
    pub fn metrics(&self) -> MetricsSnapshot {
        let shared = &self.shared;
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        MetricsSnapshot {
            queued: shared.queue.len(),
            inflight: shared.queue.inflight(),
            completed: load(&shared.counters.completed),
            failed: load(&shared.counters.failed),
            cancelled: load(&shared.cancel.cancelled),
            retried: load(&shared.counters.retried),
            worker_failures: load(&shared.counters.worker_failures),
            ps_failures: shared.ps_failures.reports(),
            functions_registered: load(&shared.counters.functions_registered),
            workers: self.worker_statuses(),
            latency: shared.latency.snapshot(),
        }
    }

    /// Each worker's address, state, last error and last `GetStatus` answer.
    pub fn worker_statuses(&self) -> Vec<WorkerSnapshot> {
        self.shared
            .link_statuses()
            .iter()
            .map(|link| link.snapshot())
            .collect()
    }

    /// Asks every `up` worker whose last `GetStatus` answer is older than `max_age` for a
    /// new one, all at once, each bounded by `timeout`; returns how many answered. Blocks
    /// the calling thread (not a runtime thread) for at most about `timeout`.
    ///
    /// The links record `GetStatus` only when they probe (connecting, recovering,
    /// checking for a restart), so a worker's own counters would otherwise age from the
    /// moment it connected; this is how `coordinator.workers` stays live without a poll
    /// per worker running all the time (at 1,000 workers, that is 1,000 RPCs per period
    /// for a view nobody may read). A failed probe is not a worker failure: the link
    /// finds out by itself when it next uses the worker.
    pub fn refresh_statuses(&self, max_age: Duration, timeout: Duration) -> usize {
        let stale: Vec<usize> = self
            .shared
            .link_statuses()
            .iter()
            .enumerate()
            .filter(|(_, link)| {
                link.state() == LinkState::Up
                    && !matches!(link.status_age(), Some(age) if age <= max_age)
            })
            .map(|(index, _)| index)
            .collect();
        if stale.is_empty() || self.is_shut_down() {
            return 0;
        }
        let Ok(runtime) = crate::runtime::runtime() else {
            return 0;
        };
        let shared = Arc::clone(&self.shared);
        let probes: Vec<(usize, Arc<dyn StatusProbe>)> = {
            let all = self.lock_probes();
            stale
                .into_iter()
                .filter_map(|index| Some((index, Arc::clone(all.get(index)?))))
                .collect()
        };
        runtime.block_on(async move {
            let mut calls = tokio::task::JoinSet::new();
            for (index, probe) in probes {
                calls.spawn(async move { (index, probe.probe(timeout).await) });
            }
            let mut answered = 0;
            while let Some(joined) = calls.join_next().await {
                if let Ok((index, Ok(status))) = joined {
                    if let Some(link) = shared.link(index) {
                        link.record_status(status);
                    }
                    answered += 1;
                }
            }
            answered
        })
    }

    /// Stops dispatching: in-flight RPCs are abandoned, queued and in-flight closures are
    /// cancelled, link tasks are awaited. Idempotent; also run on drop.
    pub fn shutdown(&self) {
        self.shared.cancel.stopping.store(true, Ordering::Release);
        self.shared.stop.send_replace(true);
        self.shared.queue.stop();
        let tasks = std::mem::take(&mut *self.lock_links());
        await_links(tasks.into_values().collect());
    }

    /// Whether [`shutdown`](Self::shutdown) was called.
    pub fn is_shut_down(&self) -> bool {
        *self.shared.stop.borrow()
    }

    fn lock_links(&self) -> MutexGuard<'_, HashMap<usize, JoinHandle<()>>> {
        self.links.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn lock_probes(&self) -> MutexGuard<'_, Vec<Arc<dyn StatusProbe>>> {
        self.probes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn lock_membership(&self) -> MutexGuard<'_, ()> {
        self.membership
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Dispatcher {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl std::fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher")
            .field("workers", &self.num_workers())
            .field("queue", &self.shared.queue)
            .finish_non_exhaustive()
    }
}

/// Waits until the link tasks `tasks` have ended (a link that panicked has nothing left to
/// clean up). Called from a thread outside the runtime, it blocks; from inside one (a
/// dispatcher dropped in async code) it cannot, and the links end on their own, having
/// been told to.
fn await_links(tasks: Vec<JoinHandle<()>>) {
    if tasks.is_empty() || tokio::runtime::Handle::try_current().is_ok() {
        return;
    }
    let Ok(runtime) = crate::runtime::runtime() else {
        return;
    };
    runtime.block_on(async {
        for task in tasks {
            let _ = task.await;
        }
    });
}

/// The one mapping from queue errors to dispatcher errors.
fn from_queue(error: QueueError<Arc<ClosureFailure>>) -> DispatchError {
    match error {
        QueueError::Failed(failure) => DispatchError::ClosureFailed(Arc::clone(&failure)),
        QueueError::Stopped => DispatchError::Stopped,
        QueueError::TimedOut => DispatchError::TimedOut,
        QueueError::Interrupted => DispatchError::Interrupted,
        error @ QueueError::NotInflight { .. } => DispatchError::Internal(error.to_string()),
    }
}
