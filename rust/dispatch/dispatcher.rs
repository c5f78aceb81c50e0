//! [`Dispatcher`]: the public face of the dispatcher and the state its links share.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;

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
    /// One per worker, by index.
    pub links: Vec<LinkStatus>,
    /// `true` once shutdown began; every in-flight RPC and sleep of the links ends.
    pub stop: watch::Sender<bool>,
    /// How many links have given up.
    pub given_up: watch::Sender<usize>,
    /// What links tell each other so that pipelining stays work-conserving: idle links,
    /// closures outstanding per link, reclaim requests, a pending `cancel_all` failure.
    pub balance: Balance,
    /// Parameter-server failures reported by closures, counted per ps task.
    pub ps_failures: PsFailures,
}

impl Shared {
    /// Asks each worker in `holders` to drop resource `id` (as tagged work, so it is sent
    /// after anything queued for that worker before it).
    pub fn send_releases(&self, id: u64, holders: &[usize]) {
        for &worker in holders {
            if self.links[worker].state() == LinkState::GivenUp {
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

/// Moves closures to workers: one link (thread) per worker, one closure at a time each.
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
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// Each link's transport, shared with the link, for [`Dispatcher::refresh_statuses`].
    probes: Vec<Arc<dyn StatusProbe>>,
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
        let runtime = crate::runtime::runtime()?.handle().clone();
        let links = transports
            .iter()
            .enumerate()
            .map(|(index, transport)| LinkStatus::new(index, transport.address().to_owned()))
            .collect();
        let shared = Arc::new(Shared {
            queue: ClosureQueue::new(config.max_queue_size),
            ps_failures: PsFailures::new(config.transient_ps_failures),
            balance: Balance::new(transports.len()),
            config,
            functions: FunctionRegistry::default(),
            resources: ResourceRegistry::default(),
            counters: Counters::default(),
            latency: Histogram::default(),
            cancel: Arc::new(CancelContext::default()),
            links,
            stop: watch::Sender::new(false),
            given_up: watch::Sender::new(0),
        });
        let transports: Vec<Arc<T>> = transports.into_iter().map(Arc::new).collect();
        let dispatcher = Self {
            shared: Arc::clone(&shared),
            threads: Mutex::new(Vec::new()),
            probes: transports
                .iter()
                .map(|transport| Arc::clone(transport) as Arc<dyn StatusProbe>)
                .collect(),
        };
        for (index, transport) in transports.into_iter().enumerate() {
            let link = Link::new(index, transport, Arc::clone(&shared), runtime.clone());
            let thread = std::thread::Builder::new()
                .name(format!("jaxcluster-link-{index}"))
                .spawn(move || link.run())
                .map_err(|e| {
                    DispatchError::Internal(format!("could not start a link thread: {e}"))
                })?; // dropping `dispatcher` here stops the links already started
            dispatcher.lock_threads().push(thread);
        }
        Ok(dispatcher)
    }

    /// How many workers (links) there are.
    pub fn num_workers(&self) -> usize {
        self.shared.links.len()
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
        self.shared
            .functions
            .register(hash, kind, payload)
            .map(drop)
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
        let workers = self.num_workers();
        let inner = Arc::new(ResourceInner::new(
            NEXT_RESOURCE_ID.fetch_add(1, Ordering::Relaxed),
            function,
            rebuild,
            workers,
            Arc::downgrade(&self.shared),
        ));
        self.shared.resources.insert(&inner);
        for worker in 0..workers {
            if self.shared.links[worker].state() == LinkState::GivenUp {
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
        Ok(PerWorkerResource::new(inner, workers))
    }

    /// Waits per `policy` until nothing is queued or running: `Ok(true)`, `Ok(false)` when
    /// the deadline passed, or the pending closure error.
    pub fn join(&self, policy: &mut WaitPolicy<'_>) -> Result<bool, DispatchError> {
        let waited = self.shared.queue.wait_with(policy);
        self.raised(waited)
    }

    /// Whether nothing is queued or running; raises the pending closure error instead
    /// (waiting per `policy` for running closures to end first).
    pub fn done(&self, policy: &mut WaitPolicy<'_>) -> Result<bool, DispatchError> {
        let done = self.shared.queue.done_with(policy);
        self.raised(done)
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
        self.shared.links.iter().map(LinkStatus::snapshot).collect()
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
            .links
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
        let probes: Vec<(usize, Arc<dyn StatusProbe>)> = stale
            .into_iter()
            .map(|index| (index, Arc::clone(&self.probes[index])))
            .collect();
        runtime.block_on(async move {
            let mut calls = tokio::task::JoinSet::new();
            for (index, probe) in probes {
                calls.spawn(async move { (index, probe.probe(timeout).await) });
            }
            let mut answered = 0;
            while let Some(joined) = calls.join_next().await {
                if let Ok((index, Ok(status))) = joined {
                    shared.links[index].record_status(status);
                    answered += 1;
                }
            }
            answered
        })
    }

    /// Stops dispatching: in-flight RPCs are abandoned, queued and in-flight closures are
    /// cancelled, link threads are joined. Idempotent; also run on drop.
    pub fn shutdown(&self) {
        self.shared.cancel.stopping.store(true, Ordering::Release);
        self.shared.stop.send_replace(true);
        self.shared.queue.stop();
        let threads = std::mem::take(&mut *self.lock_threads());
        for thread in threads {
            // A link that panicked has nothing left to clean up; the others are unaffected.
            let _ = thread.join();
        }
    }

    /// Whether [`shutdown`](Self::shutdown) was called.
    pub fn is_shut_down(&self) -> bool {
        *self.shared.stop.borrow()
    }

    fn lock_threads(&self) -> std::sync::MutexGuard<'_, Vec<JoinHandle<()>>> {
        self.threads.lock().unwrap_or_else(PoisonError::into_inner)
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
