//! Work aimed at one worker: per-worker resources built on every worker.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::Dispatcher;
use crate::dispatch::closure::Work;
use crate::dispatch::resources::{PerWorkerResource, ResourceInner, ResourceState};
use crate::dispatch::DispatchError;
use crate::queue::Tag;

/// Resource ids are unique in the process, so two dispatchers sharing a worker never
/// collide on it.
static NEXT_RESOURCE_ID: AtomicU64 = AtomicU64::new(1);

impl Dispatcher {
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

    /// Work queued for worker `index` alone (resource builds and releases), for tests.
    #[cfg(test)]
    pub(crate) fn queued_for(&self, index: usize) -> usize {
        self.shared
            .queue
            .tagged_len(crate::queue::Tag::try_from(index).unwrap_or(crate::queue::Tag::MAX))
    }
}
