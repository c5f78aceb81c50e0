//! Why a closure failed: [`ClosureFailure`], built from a worker's structured error or from
//! an RPC error, and carried to Python as a `ClosureError` (rust/py/outcome.rs).

use tonic::Code;

use crate::rpc::wire::codes::{error_class, error_kind_name};
use crate::rpc::{pb, RpcError};

/// What kind of failure ended a closure; decides the Python exception class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// The function raised (or could not be loaded on the worker): re-raised as its own
    /// type where Python can rebuild it.
    User,
    /// An input could not be produced (a per-worker resource failed):
    /// `ClosureInputError` with the original.
    Input,
    /// The infrastructure failed with this gRPC code (e.g. `DeadlineExceeded` after the
    /// closure timeout, `Unavailable` when every worker was given up).
    Infra(Code),
}

impl FailureKind {
    /// The kind's name, as [`crate::rpc::wire::codes::error_kind_name`] spells it: `"user"`,
    /// `"input"` or `"infrastructure"`.
    pub fn name(self) -> &'static str {
        error_kind_name(match self {
            Self::User => pb::ErrorKind::User,
            Self::Input => pb::ErrorKind::Input,
            Self::Infra(_) => pb::ErrorKind::Infrastructure,
        })
    }

    /// The gRPC code of an infrastructure failure; `None` for the others.
    pub fn code(self) -> Option<Code> {
        match self {
            Self::Infra(code) => Some(code),
            Self::User | Self::Input => None,
        }
    }
}

/// Everything known about one closure's failure.
///
/// ```
/// use _core::dispatch::{ClosureFailure, FailureKind};
///
/// let failure = ClosureFailure::infra(
///     tonic::Code::Unavailable,
///     "every worker was given up".to_owned(),
///     "127.0.0.1:8470",
/// );
/// assert_eq!(failure.kind.name(), "infrastructure");
/// assert_eq!(failure.kind.code(), Some(tonic::Code::Unavailable));
/// assert!(failure.to_string().contains("127.0.0.1:8470"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{type_name}: {message} (on worker {worker})")]
pub struct ClosureFailure {
    /// User, input or infrastructure.
    pub kind: FailureKind,
    /// The exception's `__qualname__` (for infrastructure failures, the jaxcluster class).
    pub type_name: String,
    /// The exception's `__module__`.
    pub module: String,
    /// The exception's message.
    pub message: String,
    /// The formatted remote traceback, or empty.
    pub traceback: String,
    /// The pickled exception when the worker could pickle it without out-of-band buffers;
    /// else empty (Python then raises a `RemoteError`).
    pub pickled_exception: Vec<u8>,
    /// Address of the worker the failure happened on.
    pub worker: String,
    /// The ps task a parameter-server failure names (`ClosureError.ps_task`), else `None`.
    pub ps_task: Option<i64>,
    /// For an input failure, the per-worker resource or kept value that could not be used
    /// (`ClosureError.resource_id`): the dataflow re-makes a lost kept value by this id.
    pub resource_id: Option<u64>,
}

impl ClosureFailure {
    /// An infrastructure failure with gRPC `code`, attributed to `worker`.
    pub fn infra(code: Code, message: String, worker: &str) -> Self {
        Self {
            kind: FailureKind::Infra(code),
            type_name: error_class(code).to_owned(),
            module: "jaxcluster.errors".to_owned(),
            message,
            traceback: String::new(),
            pickled_exception: Vec::new(),
            worker: worker.to_owned(),
            ps_task: None,
            resource_id: None,
        }
    }

    /// The failure a failed RPC means for the closure that made it.
    pub fn from_rpc(error: &RpcError, worker: &str) -> Self {
        Self::infra(error.code(), error.message().to_owned(), worker)
    }

    /// The failure a worker reported in `RunClosureResponse.error` or
    /// `CreateResourceResponse.error`.
    pub fn from_worker(error: pb::ClosureError, worker: &str) -> Self {
        let kind = match pb::ErrorKind::try_from(error.kind) {
            // A payload that does not load on the worker (a module missing there, say) is
            // the user's to fix, and their own exception type says the most about it.
            Ok(pb::ErrorKind::User | pb::ErrorKind::FunctionLoad) => FailureKind::User,
            Ok(pb::ErrorKind::Input) => FailureKind::Input,
            Ok(pb::ErrorKind::Infrastructure | pb::ErrorKind::Unspecified) | Err(_) => {
                FailureKind::Infra(Code::Internal)
            }
        };
        // Out-of-band buffers cannot travel in the binding's tuple; without them the pickle
        // would not load, so Python falls back to RemoteError instead.
        let pickled_exception = match error.exception {
            Some(value) if value.buffers.is_empty() => value.pickle.to_vec(),
            _ => Vec::new(),
        };
        Self {
            kind,
            type_name: error.type_name,
            module: error.module,
            message: error.message,
            traceback: error.traceback,
            pickled_exception,
            worker: worker.to_owned(),
            ps_task: error.ps_task,
            resource_id: error.resource_id,
        }
    }

    /// This failure as the cause of a closure's input error (a per-worker resource that
    /// failed to build on the executing worker).
    #[must_use]
    pub fn as_input(&self) -> Self {
        Self {
            kind: FailureKind::Input,
            ..self.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn worker_error(kind: pb::ErrorKind, buffers: Vec<Bytes>) -> pb::ClosureError {
        pb::ClosureError {
            kind: kind.into(),
            type_name: "ValueError".into(),
            module: "builtins".into(),
            message: "bad".into(),
            traceback: "Traceback...".into(),
            exception: Some(pb::Value {
                pickle: Bytes::from_static(b"\x80\x05."),
                buffers,
            }),
            resource_id: None,
            ps_task: None,
        }
    }

    #[test]
    fn worker_error_kinds_map_to_failure_kinds() {
        let user = ClosureFailure::from_worker(worker_error(pb::ErrorKind::User, vec![]), "w");
        assert_eq!(user.kind, FailureKind::User);
        assert_eq!(user.pickled_exception, b"\x80\x05.");
        let load =
            ClosureFailure::from_worker(worker_error(pb::ErrorKind::FunctionLoad, vec![]), "w");
        assert_eq!(load.kind, FailureKind::User);
        let input = ClosureFailure::from_worker(worker_error(pb::ErrorKind::Input, vec![]), "w");
        assert_eq!(input.kind.name(), "input");
        let infra =
            ClosureFailure::from_worker(worker_error(pb::ErrorKind::Infrastructure, vec![]), "w");
        assert_eq!(infra.kind.name(), "infrastructure");
        assert_eq!(infra.kind.code(), Some(Code::Internal));
        assert_eq!(infra.ps_task, None);
    }

    #[test]
    fn the_ps_task_of_a_worker_error_is_kept() {
        let mut error = worker_error(pb::ErrorKind::User, vec![]);
        error.ps_task = Some(1);
        let failure = ClosureFailure::from_worker(error, "w");
        assert_eq!(failure.ps_task, Some(1));
        assert_eq!(failure.as_input().ps_task, Some(1));
        assert_eq!(failure.resource_id, None);
    }

    #[test]
    fn the_resource_of_a_worker_input_error_is_kept() {
        let mut error = worker_error(pb::ErrorKind::Input, vec![]);
        error.resource_id = Some(42);
        let failure = ClosureFailure::from_worker(error, "w");
        assert_eq!(failure.kind, FailureKind::Input);
        assert_eq!(failure.resource_id, Some(42));
    }

    #[test]
    fn a_pickle_with_out_of_band_buffers_is_dropped() {
        let error = worker_error(pb::ErrorKind::User, vec![Bytes::from_static(b"x")]);
        let failure = ClosureFailure::from_worker(error, "w");
        assert!(failure.pickled_exception.is_empty());
        assert_eq!(failure.type_name, "ValueError");
    }

    #[test]
    fn rpc_errors_become_infra_failures_naming_the_class() {
        let failure =
            ClosureFailure::from_rpc(&RpcError::DeadlineExceeded("too slow".into()), "h:1");
        assert_eq!(failure.kind, FailureKind::Infra(Code::DeadlineExceeded));
        assert_eq!(failure.type_name, "DeadlineExceededError");
        assert_eq!(
            failure.to_string(),
            "DeadlineExceededError: too slow (on worker h:1)"
        );
    }
}
