//! Scheduling closures for any worker: registering functions, building closures,
//! queueing them, and waiting for the queue (`join`, `done`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;

use super::Dispatcher;
use crate::dispatch::closure::{Closure, Work};
use crate::dispatch::failure::ClosureFailure;
use crate::dispatch::functions::FunctionKind;
use crate::dispatch::resources::PerWorkerResource;
use crate::dispatch::result_cell::{EncodedValue, ResultCell};
use crate::dispatch::DispatchError;
use crate::queue::{QueueError, TryPutError, WaitPolicy};

/// Closure ids are unique in the process (workers echo them; logs can correlate them).
static NEXT_CLOSURE_ID: AtomicU64 = AtomicU64::new(1);

impl Dispatcher {
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
            pinned: None,
            keep_result_id: None,
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
