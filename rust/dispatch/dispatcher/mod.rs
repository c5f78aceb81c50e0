//! [`Dispatcher`]: the public face of the dispatcher. One type whose `impl` is split by
//! concern, all in this folder (as `link/` splits `Link`):
//!
//! - `mod.rs` (this file): the type, starting its links, shutting down.
//! - `shared.rs`: [`Shared`], the state the links and the dispatcher share, and its views.
//! - `membership.rs`: workers joining and leaving, and the worker table as Python reads it.
//! - `scheduling.rs`: functions, closures for any worker, the queue's waits.
//! - `per_worker.rs`: work aimed at one worker (resource builds, `schedule_on`).
//! - `views.rs`: metrics and worker statuses.
//! - `direct.rs`: calls to one worker beside its link (`GetStatus`, `ReadValue`).

mod direct;
mod membership;
mod per_worker;
mod scheduling;
mod shared;
mod views;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::Instant;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::closure::{CancelContext, Work};
use super::config::DispatcherConfig;
use super::functions::FunctionRegistry;
use super::link::balance::Balance;
use super::link::Link;
use super::metrics::{Counters, Histogram};
use super::ps_failures::PsFailures;
use super::resources::ResourceRegistry;
use super::status::LinkStatus;
use super::transport::WorkerTransport;
use super::DispatchError;
use crate::queue::{ClosureQueue, Tag};
use direct::DirectCalls;
pub use membership::Removal;
pub(crate) use shared::Shared;
pub use views::MetricsSnapshot;

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
    /// Each link's transport, shared with the link, for the calls of `direct.rs`
    /// ([`Dispatcher::refresh_statuses`], [`Dispatcher::read_value`]).
    direct: Mutex<Vec<Arc<dyn DirectCalls>>>,
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
            reports: watch::Sender::new(0),
        });
        let dispatcher = Self {
            shared,
            links: Mutex::new(HashMap::new()),
            direct: Mutex::new(Vec::new()),
            membership: Mutex::new(()),
        };
        // Dropping `dispatcher` on an error stops the links already started.
        let sizes: Vec<u32> = (0..transports.len())
            .map(|index| dispatcher.shared.config.slice_size(index))
            .collect();
        dispatcher.start_links(transports.into_iter().zip(sizes).collect())?;
        Ok(dispatcher)
    }

    /// Starts one link per transport (each with the hosts its worker's slice must have,
    /// 1 for a worker of its own), with the next free indices (returned). A link starts
    /// `recovering`; the per-worker resources alive now are queued for its worker ahead
    /// of any closure.
    fn start_links<T: WorkerTransport>(
        &self,
        transports: Vec<(T, u32)>,
    ) -> Result<Vec<usize>, DispatchError> {
        let runtime = crate::runtime::runtime()?.handle().clone();
        let _membership = self.lock_membership();
        let resources = self.shared.resources.live();
        let mut indices = Vec::with_capacity(transports.len());
        for (transport, slice_size) in transports {
            let transport = Arc::new(transport);
            let status = {
                let mut links = self
                    .shared
                    .links
                    .write()
                    .unwrap_or_else(PoisonError::into_inner);
                let status = Arc::new(LinkStatus::new(
                    links.len(),
                    transport.address().to_owned(),
                    slice_size,
                ));
                links.push(Arc::clone(&status));
                status
            };
            let index = status.index();
            self.lock_direct()
                .push(Arc::clone(&transport) as Arc<dyn DirectCalls>);
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

    /// from 0 to this, and are never reused.
    pub fn num_workers(&self) -> usize {
        self.shared.num_links()
    }

    /// The configuration in use.
    pub fn config(&self) -> &DispatcherConfig {
        &self.shared.config
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

    fn lock_direct(&self) -> MutexGuard<'_, Vec<Arc<dyn DirectCalls>>> {
        self.direct.lock().unwrap_or_else(PoisonError::into_inner)
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
