//! Running one closure on a link's worker: its per-worker inputs first, then its function
//! (registered once per worker connection), then `RunClosure`, and what the answer means.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::closure::Closure;
use super::failure::{ClosureFailure, FailureKind};
use super::functions::Function;
use super::link::{Interruption, Link};
use super::metrics::Counters;
use super::resources::{ResourceInner, ResourceState};
use super::result_cell::EncodedValue;
use super::transport::WorkerTransport;
use crate::rpc::{pb, RpcError};

/// Bound on sending a function payload (up to the message limit) to a worker.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(60);
/// How often a worker-reported infrastructure error is retried before the closure fails.
const MAX_INFRA_RETRIES: u32 = 3;

/// What one execution attempt came to.
pub(crate) enum Verdict {
    /// The closure ended: settle it.
    Done(Result<EncodedValue, ClosureFailure>),
    /// The worker is gone: put the closure back and recover the worker.
    WorkerFailed(String),
    /// The worker reported an infrastructure error: put the closure back.
    Retry,
    /// `closure_timeout` expired.
    TimedOut,
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
    /// One attempt at `closure` on this link's worker.
    pub(super) fn execute(&mut self, closure: &Closure) -> Verdict {
        for resource in &closure.resources {
            if let Err(verdict) = self.ensure_input(resource) {
                return verdict;
            }
        }
        let request = closure.request();
        let timeout = self.shared.config.closure_timeout;
        let mut registered_again = false;
        loop {
            match self.ensure_function(&closure.function) {
                Ok(()) => {}
                Err(NotRegistered::Interrupted(interruption)) => return interruption.into(),
                Err(NotRegistered::Refused(failure)) => return Verdict::Done(Err(failure)),
            }
            let started = Instant::now();
            let run = self.transport.run_closure(request.clone(), timeout);
            let Some(answer) = self.call(run) else {
                return Verdict::Stopped;
            };
            return match answer {
                Ok(response) => self.read_response(response, closure),
                Err(RpcError::NotFound(_)) if !registered_again => {
                    // The worker lost the function: a restart (then everything it held is
                    // gone) or an eviction (then registering again is enough).
                    if self.worker_lost() {
                        return Verdict::WorkerFailed(
                            "the worker restarted and lost its functions".to_owned(),
                        );
                    }
                    self.sent.remove(closure.function.hash());
                    registered_again = true;
                    continue;
                }
                Err(error) if timeout.is_some_and(|limit| expired(&error, started, limit)) => {
                    Verdict::TimedOut
                }
                Err(error) if self.is_worker_failure(&error) => {
                    Verdict::WorkerFailed(error.message().to_owned())
                }
                Err(error) => Verdict::Done(Err(ClosureFailure::from_rpc(&error, self.address()))),
            };
        }
    }

    fn read_response(&mut self, response: pb::RunClosureResponse, closure: &Closure) -> Verdict {
        use pb::run_closure_response::Outcome as Wire;
        let error = match response.outcome {
            Some(Wire::Result(value)) => {
                return Verdict::Done(Ok(EncodedValue {
                    pickle: value.pickle,
                    buffers: value.buffers,
                }))
            }
            Some(Wire::Error(error)) => error,
            None => {
                let message = format!(
                    "worker {} answered RunClosure for closure {} with neither a result nor \
                     an error",
                    self.address(),
                    closure.id()
                );
                let failure = ClosureFailure::infra(tonic::Code::Internal, message, self.address());
                return Verdict::Done(Err(failure));
            }
        };
        let kind = pb::ErrorKind::try_from(error.kind).unwrap_or(pb::ErrorKind::Unspecified);
        if kind == pb::ErrorKind::Infrastructure && closure.infra_retries < MAX_INFRA_RETRIES {
            return Verdict::Retry;
        }
        // A resource the worker does not have, although we built it there, means the
        // worker restarted unnoticed: rebuild rather than fail the closure.
        if kind == pb::ErrorKind::Input && error.resource_id.is_some() && self.worker_lost() {
            return Verdict::WorkerFailed(
                "the worker restarted and lost its per-worker resources".to_owned(),
            );
        }
        Verdict::Done(Err(ClosureFailure::from_worker(error, self.address())))
    }

    /// Makes sure `resource` is usable on this worker, building it first if needed.
    // The large error is the verdict itself, moved once on a rare path.
    #[allow(clippy::result_large_err)]
    fn ensure_input(&mut self, resource: &Arc<ResourceInner>) -> Result<(), Verdict> {
        if resource.is_released() {
            return Err(Verdict::Done(Err(released_input(resource, self.address()))));
        }
        if let ResourceState::Pending | ResourceState::Aborted = resource.state(self.index) {
            self.create_resource(resource)?;
        }
        match resource.state(self.index) {
            ResourceState::Ready => Ok(()),
            ResourceState::Failed(failure) => Err(Verdict::Done(Err(failure.as_input()))),
            ResourceState::Pending | ResourceState::Aborted => {
                Err(Verdict::Done(Err(released_input(resource, self.address()))))
            }
        }
    }

    /// Builds `resource` on this worker. A build that fails for the user's reasons leaves
    /// the state `Failed` and is `Ok` here; only stopping or losing the worker is an error.
    pub(super) fn create_resource(&mut self, resource: &ResourceInner) -> Result<(), Interruption> {
        if resource.is_released() {
            return Ok(());
        }
        resource.set_state(self.index, ResourceState::Pending);
        let mut registered_again = false;
        loop {
            match self.ensure_function(&resource.function) {
                Ok(()) => {}
                Err(NotRegistered::Interrupted(interruption)) => return Err(interruption),
                Err(NotRegistered::Refused(failure)) => {
                    resource.set_state(self.index, ResourceState::Failed(Arc::new(failure)));
                    return Ok(());
                }
            }
            let request = pb::CreateResourceRequest {
                resource_id: resource.id,
                function_hash: resource.function.hash_bytes(),
                args: None,
            };
            // Building runs user code (e.g. a dataset_fn) for as long as it takes, like a
            // closure without a timeout; a vanished worker is noticed by keepalive.
            let create = self.transport.create_resource(request, None);
            let Some(answer) = self.call(create) else {
                return Err(Interruption::Stopped);
            };
            let state = match answer {
                Ok(pb::CreateResourceResponse { error: None, .. }) => {
                    if !resource.mark_ready(self.index) {
                        // Released while it was being built: drop it at once.
                        self.release_now(resource);
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
                    if self.worker_lost() {
                        return Err(Interruption::WorkerFailed(
                            "the worker restarted and lost its functions".to_owned(),
                        ));
                    }
                    self.sent.remove(resource.function.hash());
                    registered_again = true;
                    continue;
                }
                Err(error) if self.is_worker_failure(&error) => {
                    return Err(Interruption::WorkerFailed(error.message().to_owned()));
                }
                Err(error) => ResourceState::Failed(Arc::new(ClosureFailure::from_rpc(
                    &error,
                    self.address(),
                ))),
            };
            resource.set_state(self.index, state);
            return Ok(());
        }
    }

    /// Sends `function` to this worker unless it already holds it.
    // The large error is a failure moved once on a rare path.
    #[allow(clippy::result_large_err)]
    fn ensure_function(&mut self, function: &Function) -> Result<(), NotRegistered> {
        if self.sent.contains(function.hash()) {
            return Ok(());
        }
        let register = self
            .transport
            .register_function(function.register_request(), Some(REGISTER_TIMEOUT));
        let Some(answer) = self.call(register) else {
            return Err(NotRegistered::Interrupted(Interruption::Stopped));
        };
        match answer {
            Ok(_) => {
                Counters::bump(&self.shared.counters.functions_registered);
                self.sent.insert(*function.hash());
                Ok(())
            }
            Err(error) if self.is_worker_failure(&error) => Err(NotRegistered::Interrupted(
                Interruption::WorkerFailed(error.message().to_owned()),
            )),
            Err(error) => Err(NotRegistered::Refused(ClosureFailure::from_rpc(
                &error,
                self.address(),
            ))),
        }
    }
}

/// Whether a failed `RunClosure` means its `limit` expired: the client's own timer says
/// `DEADLINE_EXCEEDED`, while a worker whose server enforced the `grpc-timeout` first
/// answers `CANCELLED` ("Timeout expired") once the limit has passed.
fn expired(error: &RpcError, started: Instant, limit: Duration) -> bool {
    match error {
        RpcError::DeadlineExceeded(_) => true,
        RpcError::Cancelled(_) => started.elapsed() >= limit,
        _ => false,
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
        ..ClosureFailure::infra(tonic::Code::FailedPrecondition, message, worker)
    }
}
