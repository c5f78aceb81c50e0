//! What travels through the dispatcher's queue: [`Closure`]s (global) and per-worker
//! resource work (tagged), and what cancelling each of them means.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

use super::deaths::Death;
use super::functions::Function;
use super::resources::ResourceInner;
use super::result_cell::{EncodedValue, Outcome, ResultCell};
use crate::queue::Cancel;
use crate::rpc::pb;

/// Facts a cancellation needs, shared by every closure of one dispatcher (no reference
/// back to the dispatcher, so queued closures never keep it alive).
#[derive(Debug, Default)]
pub(crate) struct CancelContext {
    /// Set by `shutdown()`: cancellations from then on are due to it.
    pub stopping: AtomicBool,
    /// Closures cancelled so far.
    pub cancelled: AtomicU64,
}

/// One scheduled call: a registered function, its encoded arguments, the per-worker
/// resources those arguments use, and the cell its outcome goes to.
///
/// Owned by exactly one place at a time (the queue, or the link running it), and it ends
/// by being consumed: settled through its cell, put back, or cancelled. So a cell is
/// settled at most once by construction.
pub struct Closure {
    pub(crate) function: Arc<Function>,
    /// `Arc`ed so putting a closure back and retrying never copies the arguments.
    pub(crate) args: Arc<EncodedValue>,
    /// Slot k is the k-th per-worker resource the arguments refer to.
    pub(crate) resources: Vec<Arc<ResourceInner>>,
    pub(crate) cell: Arc<ResultCell>,
    /// Executions started so far (at-least-once: a retry after a worker failure counts).
    pub(crate) attempts: u32,
    /// Executions that hit `closure_timeout`, and where.
    pub(crate) timed_out_on: Vec<String>,
    /// Worker-reported infrastructure errors retried so far.
    pub(crate) infra_retries: u32,
    /// Deaths of its worker while it ran (see `deaths.rs`); a closure with any runs alone.
    pub(crate) deaths: Vec<Arc<Death>>,
    pub(crate) context: Arc<CancelContext>,
    /// The worker a closure from `schedule_on` must run on: it travels tagged with that
    /// worker, is never inflight in the queue (`join`/`done` do not count it, and its
    /// error never cancels other closures), and goes back to that worker's sub-queue when
    /// the worker fails under it. `None`: any worker.
    pub(crate) pinned: Option<usize>,
    /// Dataflow: the worker keeps the result under this id (`keep_result=True`) and
    /// answers only its description. `None`: the result comes back.
    pub(crate) keep_result_id: Option<u64>,
}

impl Closure {
    /// The closure's id.
    pub fn id(&self) -> u64 {
        self.cell.id()
    }

    /// The cell the closure's outcome lands in.
    pub fn cell(&self) -> Arc<ResultCell> {
        Arc::clone(&self.cell)
    }

    /// Whether a worker died under it before: then it runs alone, so a death is its own.
    pub(crate) fn runs_alone(&self) -> bool {
        !self.deaths.is_empty()
    }

    /// When the closure was scheduled.
    pub(crate) fn scheduled_at(&self) -> Instant {
        self.cell.scheduled_at()
    }

    /// The `RunClosure` request for one attempt on worker `worker` (cheap: every field is
    /// reference-counted).
    pub(crate) fn request(&self, worker: usize) -> pb::RunClosureRequest {
        let args = if self.args.pickle.is_empty() && self.args.buffers.is_empty() {
            None
        } else {
            Some(pb::Value {
                pickle: self.args.pickle.clone(),
                buffers: self.args.buffers.clone(),
            })
        };
        pb::RunClosureRequest {
            function_hash: self.function.hash_bytes(),
            args,
            closure_id: self.id(),
            worker_index: i64::try_from(worker).ok(),
            // Closures of the stream are never preemption saves (those are unary).
            preemption_save: false,
            keep_result_id: self.keep_result_id,
        }
    }

    /// Has the worker keep the result under `id` instead of sending it back (dataflow's
    /// `keep_result=True`); the id comes from [`Dispatcher::new_resource_id`](super::Dispatcher::new_resource_id).
    pub fn keep_result(&mut self, id: u64) {
        self.keep_result_id = Some(id);
    }

    /// The worker it must run on (`schedule_on`), if any.
    pub(crate) fn pinned(&self) -> Option<usize> {
        self.pinned
    }

    /// Settles the cell; the closure is done.
    pub(crate) fn settle(self, outcome: Outcome) {
        self.cell.settle(outcome);
    }
}

impl Cancel for Closure {
    fn cancel(self) {
        let why = if self.context.stopping.load(Ordering::Acquire) {
            "the closure was cancelled because the coordinator was shut down before it ran"
        } else {
            "the closure was cancelled because another closure failed first \
             (error_policy='cancel_all'); the first error was raised by schedule(), join() or \
             done()"
        };
        if self.cell.settle(Outcome::Cancelled(why.to_owned())) && self.pinned.is_none() {
            self.context.cancelled.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl std::fmt::Debug for Closure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Closure")
            .field("id", &self.id())
            .field("attempts", &self.attempts)
            .field("pinned", &self.pinned)
            .field("resources", &self.resources.len())
            .finish_non_exhaustive()
    }
}

/// An item in the dispatcher's queue.
#[derive(Debug)]
pub(crate) enum Work {
    /// A closure for any worker (untagged).
    Closure(Closure),
    /// Build `resource` on `worker` (tagged with that worker). Weak: a resource released
    /// before its turn is simply skipped.
    CreateResource {
        resource: Weak<ResourceInner>,
        worker: usize,
    },
    /// Drop `resource_id` on the tagged worker.
    ReleaseResource { resource_id: u64 },
    /// The tagged worker is being removed: its link drains and leaves (tagged work is
    /// taken before closures, so this wakes a link waiting for work at once).
    Retire,
}

impl Cancel for Work {
    fn cancel(self) {
        match self {
            Self::Closure(closure) => closure.cancel(),
            Self::CreateResource { resource, worker } => {
                if let Some(resource) = resource.upgrade() {
                    resource.abort_pending(worker);
                }
            }
            // The worker process goes with the dispatcher's cluster; nothing to undo.
            Self::ReleaseResource { .. } | Self::Retire => {}
        }
    }
}
