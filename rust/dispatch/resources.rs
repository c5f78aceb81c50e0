//! Per-worker resources (e.g. dataset iterators): one value per worker, built by running a
//! registered function there, tracked per worker, rebuilt when a worker comes back, and
//! released on every worker when the handle goes away.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use super::failure::ClosureFailure;
use super::functions::Function;
use super::Shared;
use crate::rpc::pb;

/// Where one resource stands on one worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResourceState {
    /// Not built yet (or being built).
    Pending,
    /// Built; closures on this worker can use it.
    Ready,
    /// Building it failed; closures using it here fail with an input error carrying this.
    Failed(Arc<ClosureFailure>),
    /// Lost with its worker, given up, or released; rebuilt when the worker returns unless
    /// released.
    Aborted,
    /// Lost with its worker and not to be rebuilt (the resource was created with
    /// `rebuild = false`): closures using it on this worker fail with an input error
    /// carrying this, so nothing runs on a silently re-initialised value.
    Lost(Arc<ClosureFailure>),
}

impl ResourceState {
    /// The state without what it carries, for callers that only tell states apart.
    pub fn status(&self) -> ResourceStatus {
        match self {
            Self::Pending => ResourceStatus::Pending,
            Self::Ready => ResourceStatus::Ready,
            Self::Failed(_) => ResourceStatus::Failed,
            Self::Aborted => ResourceStatus::Aborted,
            Self::Lost(_) => ResourceStatus::Lost,
        }
    }

    /// The state as the binding spells it (see [`ResourceStatus::label`]).
    pub fn label(&self) -> &'static str {
        self.status().label()
    }
}

/// A [`ResourceState`] without its failure: what the Python binding's `ResourceState`
/// enum mirrors, one variant each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResourceStatus {
    /// See [`ResourceState::Pending`].
    Pending,
    /// See [`ResourceState::Ready`].
    Ready,
    /// See [`ResourceState::Failed`].
    Failed,
    /// See [`ResourceState::Aborted`].
    Aborted,
    /// See [`ResourceState::Lost`].
    Lost,
}

impl ResourceStatus {
    /// The one spelling of each state: `"pending"`, `"ready"`, `"failed"`, `"aborted"` or
    /// `"lost"`.
    pub fn label(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Ready => "ready",
            Self::Failed => "failed",
            Self::Aborted => "aborted",
            Self::Lost => "lost",
        }
    }
}

/// The shared state behind a [`PerWorkerResource`]; closures that use the resource hold it
/// too, so the workers keep their copies until the last such closure is done.
pub(crate) struct ResourceInner {
    pub id: u64,
    pub function: Arc<Function>,
    /// Whether a worker that lost the resource (it failed or restarted) builds it again;
    /// if not, the resource is `Lost` there.
    pub rebuild: bool,
    /// Named state: each worker adopts a live value of this name rather than building
    /// it (empty: an ordinary resource).
    pub name: String,
    /// The workers whose last build adopted a live named value instead of running the
    /// function.
    reattached: Mutex<std::collections::HashSet<usize>>,
    /// Arguments for the next build on a worker, by worker index, instead of none: a copy
    /// of that worker's device state saved before its preemption, which its replacement
    /// starts from. Dropped once a build with them succeeded.
    build_args: Mutex<HashMap<usize, pb::Value>>,
    states: Mutex<Vec<ResourceState>>,
    released: AtomicBool,
    owner: Weak<Shared>,
}

impl ResourceInner {
    pub fn new(
        id: u64,
        function: Arc<Function>,
        rebuild: bool,
        workers: usize,
        owner: Weak<Shared>,
    ) -> Self {
        Self {
            id,
            function,
            rebuild,
            name: String::new(),
            reattached: Mutex::default(),
            build_args: Mutex::default(),
            states: Mutex::new(vec![ResourceState::Pending; workers]),
            released: AtomicBool::new(false),
            owner,
        }
    }

    /// Records whether `worker`'s last build adopted a live named value.
    pub fn set_reattached(&self, worker: usize, reattached: bool) {
        let mut set = self
            .reattached
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if reattached {
            set.insert(worker);
        } else {
            set.remove(&worker);
        }
    }

    /// Whether `worker`'s last build adopted a live named value.
    pub fn is_reattached(&self, worker: usize) -> bool {
        self.reattached
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(&worker)
    }

    fn build_args_map(&self) -> MutexGuard<'_, HashMap<usize, pb::Value>> {
        self.build_args
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Makes the next build on `worker` pass `args` (see `build_args`), replacing any.
    pub fn set_build_args(&self, worker: usize, args: pb::Value) {
        self.build_args_map().insert(worker, args);
    }

    /// The arguments the next build on `worker` passes, if any were set.
    pub fn build_args(&self, worker: usize) -> Option<pb::Value> {
        self.build_args_map().get(&worker).cloned()
    }

    /// Drops `worker`'s build arguments; whether there were any.
    pub fn take_build_args(&self, worker: usize) -> bool {
        self.build_args_map().remove(&worker).is_some()
    }

    fn states(&self) -> MutexGuard<'_, Vec<ResourceState>> {
        self.states.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn state(&self, worker: usize) -> ResourceState {
        self.states()
            .get(worker)
            .cloned()
            .unwrap_or(ResourceState::Aborted)
    }

    /// Sets the state on `worker`; a released resource stays `Aborted` everywhere.
    pub fn set_state(&self, worker: usize, state: ResourceState) {
        let mut states = self.states();
        if self.is_released() {
            return;
        }
        if let Some(slot) = states.get_mut(worker) {
            *slot = state;
        }
    }

    /// Marks the resource built on `worker`; `false` if it was released meanwhile (the
    /// caller then drops the worker's copy). The flag is read under the states lock and
    /// [`release`](Self::release) sets it before taking that lock, so exactly one of the
    /// two sends the worker its `ReleaseResource`.
    pub fn mark_ready(&self, worker: usize) -> bool {
        let mut states = self.states();
        if self.is_released() {
            return false;
        }
        if let Some(slot) = states.get_mut(worker) {
            *slot = ResourceState::Ready;
        }
        true
    }

    /// `worker` failed (`why`, at `address`): a resource it held becomes `Aborted` (to be
    /// rebuilt when the worker returns) or, when it is not to be rebuilt, `Lost`. One never
    /// built there stays buildable.
    pub fn worker_failed(&self, worker: usize, address: &str, why: &str) {
        let mut states = self.states();
        if self.is_released() {
            return;
        }
        let Some(slot) = states.get_mut(worker) else {
            return;
        };
        *slot = match slot {
            ResourceState::Ready if !self.rebuild => {
                ResourceState::Lost(Arc::new(ClosureFailure::infra(
                    tonic::Code::Aborted,
                    format!(
                        "per-worker value {} was lost on worker {address}: {why}; it was \
                         created not to be rebuilt (on_worker_restart='lose')",
                        self.id
                    ),
                    address,
                )))
            }
            ResourceState::Lost(failure) => ResourceState::Lost(Arc::clone(failure)),
            _ => ResourceState::Aborted,
        };
    }

    /// A worker joined with index `worker`: the resource is to be built there. `false`
    /// if it was released (nothing to build).
    pub fn add_worker(&self, worker: usize) -> bool {
        let mut states = self.states();
        if self.is_released() {
            return false;
        }
        if states.len() <= worker {
            states.resize(worker + 1, ResourceState::Aborted);
        }
        states[worker] = ResourceState::Pending;
        true
    }

    /// How many workers the resource has a state for.
    pub fn num_workers(&self) -> usize {
        self.states().len()
    }

    /// Whether the resource was lost on `worker` for good.
    pub fn is_lost(&self, worker: usize) -> bool {
        matches!(self.state(worker), ResourceState::Lost(_))
    }

    /// A queued creation for `worker` was cancelled: it will not be built there now.
    pub fn abort_pending(&self, worker: usize) {
        if let Some(slot) = self.states().get_mut(worker) {
            if *slot == ResourceState::Pending {
                *slot = ResourceState::Aborted;
            }
        }
    }

    pub fn is_released(&self) -> bool {
        self.released.load(Ordering::Acquire)
    }

    /// The dispatcher state this resource belongs to (for identity checks only).
    pub fn owner_ptr(&self) -> *const Shared {
        self.owner.as_ptr()
    }

    /// Marks the resource released everywhere and returns the workers that hold it.
    fn take_release(&self) -> Vec<usize> {
        if self.released.swap(true, Ordering::AcqRel) {
            return Vec::new();
        }
        let mut states = self.states();
        let holders = states
            .iter()
            .enumerate()
            .filter(|(_, state)| **state == ResourceState::Ready)
            .map(|(worker, _)| worker)
            .collect();
        states.fill(ResourceState::Aborted);
        holders
    }

    /// Releases the resource on every worker that holds it (once; later calls do nothing).
    pub fn release(&self) {
        let holders = self.take_release();
        if let Some(owner) = self.owner.upgrade() {
            owner.resources.forget(self.id);
            owner.send_releases(self.id, &holders);
        }
    }
}

impl Drop for ResourceInner {
    fn drop(&mut self) {
        self.release();
    }
}

impl std::fmt::Debug for ResourceInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResourceInner")
            .field("id", &self.id)
            .field("states", &*self.states())
            .finish_non_exhaustive()
    }
}

/// A handle to a per-worker resource created by
/// [`Dispatcher::create_resource`](super::Dispatcher::create_resource).
///
/// Its `id` is what closure arguments carry (pickled as the persistent id
/// `("jaxcluster.resource", id)`) for the executing worker to substitute its own value.
/// Dropping the last handle, and the last closure using it, releases it on the workers.
///
/// ```no_run
/// # use _core::dispatch::Dispatcher;
/// # fn demo(dispatcher: &Dispatcher, dataset_fn: &[u8; 32]) {
/// let iterators = dispatcher.create_resource(dataset_fn, true).unwrap();
/// println!("resource {} on worker 0: {}", iterators.id(), iterators.state(0).label());
/// iterators.release();
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct PerWorkerResource {
    pub(crate) inner: Arc<ResourceInner>,
}

impl PerWorkerResource {
    pub(crate) fn new(inner: Arc<ResourceInner>) -> Self {
        Self { inner }
    }

    /// The id workers know this resource by.
    pub fn id(&self) -> u64 {
        self.inner.id
    }

    /// How many workers the resource spans (one state each; it grows as workers join).
    pub fn num_workers(&self) -> usize {
        self.inner.num_workers()
    }

    /// The resource's state on `worker` (`Aborted` for an index out of range).
    pub fn state(&self, worker: usize) -> ResourceState {
        self.inner.state(worker)
    }

    /// Whether `worker`'s value was a live named value adopted rather than built.
    pub fn is_reattached(&self, worker: usize) -> bool {
        self.inner.is_reattached(worker)
    }

    /// Makes the next build on `worker` call the function with `args` (a pickled
    /// `(args, kwargs)`) rather than with none: a preempted worker's replacement starts
    /// from the copy of its state. Dropped after a build with them succeeds there.
    pub fn set_build_args(&self, worker: usize, args: pb::Value) {
        self.inner.set_build_args(worker, args);
    }

    /// Whether `worker`'s next build still has arguments of [`Self::set_build_args`].
    pub fn has_build_args(&self, worker: usize) -> bool {
        self.inner.build_args(worker).is_some()
    }

    /// Releases the resource on every worker now; closures scheduled later with it fail
    /// with an input error. Idempotent.
    pub fn release(&self) {
        self.inner.release();
    }

    /// Whether `release` was called (or the resource was otherwise released).
    pub fn is_released(&self) -> bool {
        self.inner.is_released()
    }
}

/// The live resources of one dispatcher, so a reconnected worker can rebuild them all.
#[derive(Debug, Default)]
pub(crate) struct ResourceRegistry {
    live: Mutex<HashMap<u64, Weak<ResourceInner>>>,
}

impl ResourceRegistry {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Weak<ResourceInner>>> {
        self.live.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn insert(&self, resource: &Arc<ResourceInner>) {
        self.lock().insert(resource.id, Arc::downgrade(resource));
    }

    pub fn forget(&self, id: u64) {
        self.lock().remove(&id);
    }

    /// Every resource not yet released, in creation order. Strong references are taken
    /// under the lock but handed out after it is released: dropping one may run
    /// [`ResourceInner::release`], which takes this lock.
    pub fn live(&self) -> Vec<Arc<ResourceInner>> {
        let mut live: Vec<Arc<ResourceInner>> =
            self.lock().values().filter_map(Weak::upgrade).collect();
        live.retain(|resource| !resource.is_released());
        live.sort_by_key(|resource| resource.id);
        live
    }
}
