//! Preparing one closure for a link's worker — its per-worker inputs first, then its
//! function (registered once per worker connection) — and what a worker's error for it
//! means. Sending it and reading the answer is in `stream.rs` and `answers.rs` (this folder).

use std::sync::Arc;
use std::time::Duration;

use super::{Interruption, Link};
use crate::dispatch::closure::Closure;
use crate::dispatch::failure::{ClosureFailure, FailureKind};
use crate::dispatch::functions::Function;
use crate::dispatch::metrics::Counters;
use crate::dispatch::resources::{ResourceInner, ResourceState};
use crate::dispatch::result_cell::EncodedValue;
use crate::dispatch::transport::WorkerTransport;
use crate::log_target::DISPATCH;
use crate::rpc::{pb, RpcError};

/// Bound on sending a function payload (up to the message limit) to a worker.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(60);
/// How often a worker-reported infrastructure error is retried before the closure fails.
pub(super) const MAX_INFRA_RETRIES: u32 = 3;

/// What one execution attempt came to.
pub(super) enum Verdict {
    /// The closure ended: settle it.
    Done(Result<EncodedValue, ClosureFailure>),
    /// The worker is gone: put the closure back and recover the worker.
    WorkerFailed(String),
    /// The worker reported an infrastructure error (its message): put the closure back.
    Retry(String),
    /// The dispatcher is stopping.
    Stopped,
}

impl From<Interruption> for Verdict {
    fn from(interruption: Interruption) -> Self {
        match interruption {
            Interruption::Stopped => Self::Stopped,
            Interruption::WorkerFailed(reason) => Self::WorkerFailed(reason),
        }
    }
}

/// A registration that did not leave the function on the worker.
enum NotRegistered {
    Interrupted(Interruption),
    /// The worker refused the payload; the closure (or resource) fails with this.
    Refused(ClosureFailure),
}

impl<T: WorkerTransport> Link<T> {
    /// Makes `closure` ready to send to this worker: its inputs built, its function
    /// registered. The error is what to do with the closure instead.
    // The large error is the verdict itself, moved once on a rare path.
    #[allow(clippy::result_large_err)]
    pub(super) async fn prepare(&mut self, closure: &Closure) -> Result<(), Verdict> {
        for resource in &closure.resources {
            self.ensure_input(resource).await?;
        }
        self.ensure_function_verdict(closure).await
    }

    /// Registers `closure`'s function on this worker unless it holds it already.
    #[allow(clippy::result_large_err)]
    pub(super) async fn ensure_function_verdict(
        &mut self,
        closure: &Closure,
    ) -> Result<(), Verdict> {
        match self.ensure_function(&closure.function).await {
            Ok(()) => Ok(()),
            Err(NotRegistered::Interrupted(interruption)) => Err(interruption.into()),
            Err(NotRegistered::Refused(failure)) => Err(Verdict::Done(Err(failure))),
        }
    }

    /// What a worker-reported error for `closure` means.
    pub(super) async fn read_error(
        &mut self,
        error: pb::ClosureError,
        closure: &Closure,
    ) -> Verdict {
        let kind = pb::ErrorKind::try_from(error.kind).unwrap_or(pb::ErrorKind::Unspecified);
        if kind == pb::ErrorKind::Infrastructure && closure.infra_retries < MAX_INFRA_RETRIES {
            return Verdict::Retry(error.message);
        }
        // A resource the worker does not have, although we built it there, means the
        // worker restarted unnoticed: rebuild rather than fail the closure.
        if kind == pb::ErrorKind::Input && error.resource_id.is_some() && self.worker_lost().await {
            return Verdict::WorkerFailed(
                "the worker restarted and lost its per-worker resources".to_owned(),
            );
        }
        Verdict::Done(Err(ClosureFailure::from_worker(error, self.address())))
    }

    /// Makes sure `resource` is usable on this worker, building it first if needed.
    // The large error is the verdict itself, moved once on a rare path.
    #[allow(clippy::result_large_err)]
    async fn ensure_input(&mut self, resource: &Arc<ResourceInner>) -> Result<(), Verdict> {
        if resource.is_released() {
            return Err(Verdict::Done(Err(released_input(resource, self.address()))));
        }
        if let ResourceState::Pending | ResourceState::Aborted = resource.state(self.index) {
            self.create_resource(resource).await?;
        }
        match resource.state(self.index) {
            ResourceState::Ready => Ok(()),
            ResourceState::Failed(failure) | ResourceState::Lost(failure) => {
                Err(Verdict::Done(Err(failure.as_input())))
            }
            ResourceState::Pending | ResourceState::Aborted => {
                Err(Verdict::Done(Err(released_input(resource, self.address()))))
            }
        }
    }

    /// Builds `resource` on this worker. A build that fails for the user's reasons leaves
    /// the state `Failed` and is `Ok` here; only stopping or losing the worker is an error.
    pub(super) async fn create_resource(
        &mut self,
        resource: &ResourceInner,
    ) -> Result<(), Interruption> {
        if resource.is_released() || resource.is_lost(self.index) {
            return Ok(());
        }
        resource.set_state(self.index, ResourceState::Pending);
        let mut registered_again = false;
        loop {
            match self.ensure_function(&resource.function).await {
                Ok(()) => {}
                Err(NotRegistered::Interrupted(interruption)) => return Err(interruption),
                Err(NotRegistered::Refused(failure)) => {
                    resource.set_state(self.index, ResourceState::Failed(Arc::new(failure)));
                    return Ok(());
                }
            }
            let args = resource.build_args(self.index);
            let from_copy = args.is_some();
            let request = pb::CreateResourceRequest {
                resource_id: resource.id,
                function_hash: resource.function.hash_bytes(),
                args,
                worker_index: i64::try_from(self.index).ok(),
                name: resource.name.clone(),
            };
            // Building runs user code (e.g. a dataset_fn) for as long as it takes, like a
            // closure without a timeout; a vanished worker is noticed by keepalive.
            let create = self.transport.create_resource(request, None);
            let Some(answer) = self.call(create).await else {
                return Err(Interruption::Stopped);
            };
            let state = match answer {
                Ok(pb::CreateResourceResponse {
                    error: None,
                    reattached,
                    ..
                }) => {
                    resource.set_reattached(self.index, reattached);
                    if from_copy && resource.take_build_args(self.index) {
                        tracing::info!(
                            target: DISPATCH,
                            worker = self.address(),
                            "per-worker value {} was rebuilt on worker {} ({}) from the copy \
                             saved before its preemption; the copy is dropped",
                            resource.id,
                            self.index,
                            self.address(),
                        );
                    }
                    if !resource.mark_ready(self.index) {
                        // Released while it was being built: drop it at once.
                        self.release_now(resource).await;
                    }
                    return Ok(());
                }
                Ok(pb::CreateResourceResponse {
                    error: Some(error), ..
                }) => ResourceState::Failed(Arc::new(ClosureFailure::from_worker(
                    error,
                    self.address(),
                ))),
                Err(RpcError::NotFound(_)) if !registered_again => {
                    if self.worker_lost().await {
                        return Err(Interruption::WorkerFailed(
                            "the worker restarted and lost its functions".to_owned(),
                        ));
                    }
                    self.sent.remove(resource.function.hash());
                    registered_again = true;
                    continue;
                }
                Err(error) => {
                    if self.is_worker_failure(&error).await {
                        return Err(Interruption::WorkerFailed(error.message().to_owned()));
                    }
                    ResourceState::Failed(Arc::new(ClosureFailure::from_rpc(
                        &error,
                        self.address(),
                    )))
                }
            };
            resource.set_state(self.index, state);
            return Ok(());
        }
    }

    /// Sends `function` to this worker unless it already holds it.
    // The large error is a failure moved once on a rare path.
    #[allow(clippy::result_large_err)]
    async fn ensure_function(&mut self, function: &Function) -> Result<(), NotRegistered> {
        if self.sent.contains(function.hash()) {
            return Ok(());
        }
        let register = self
            .transport
            .register_function(function.register_request(), Some(REGISTER_TIMEOUT));
        let Some(answer) = self.call(register).await else {
            return Err(NotRegistered::Interrupted(Interruption::Stopped));
        };
        match answer {
            Ok(_) => {
                Counters::bump(&self.shared.counters.functions_registered);
                self.sent.insert(*function.hash());
                Ok(())
            }
            Err(error) => {
                if self.is_worker_failure(&error).await {
                    Err(NotRegistered::Interrupted(Interruption::WorkerFailed(
                        error.message().to_owned(),
                    )))
                } else {
                    Err(NotRegistered::Refused(ClosureFailure::from_rpc(
                        &error,
                        self.address(),
                    )))
                }
            }
        }
    }
}

/// The input error of a closure whose resource was released before it ran.
fn released_input(resource: &ResourceInner, worker: &str) -> ClosureFailure {
    let message = format!(
        "per-worker resource {} was released before the closure that uses it ran; keep the \
         per-worker value referenced until its closures are done",
        resource.id
    );
    ClosureFailure {
        kind: FailureKind::Input,
        resource_id: Some(resource.id),
        ..ClosureFailure::infra(tonic::Code::FailedPrecondition, message, worker)
    }
}
