//! The names of the protocol's enumerations, one table each: gRPC status codes (with the
//! `jaxcluster.errors` class each is raised as), function kinds, closure-error kinds and
//! serving states.
//!
//! Every other file spells these through here — the Python bindings, the worker's reply
//! path, the dispatcher's failures and `_core.pyi` — so a name means one thing everywhere:
//! gRPC codes by their canonical upper-case names (`"DEADLINE_EXCEEDED"`), kinds by the
//! proto enum's value name in lower case without its prefix (`"jax_export"`, `"user"`).

use tonic::Code;

use crate::rpc::pb;

/// Every gRPC code: its canonical name and the `jaxcluster.errors` class a failure with
/// that code is raised as. Codes without a class of their own fold into the nearest one,
/// as [`RpcError::from_code`](crate::rpc::RpcError::from_code) folds them.
const CODES: [(Code, &str, &str); 17] = [
    (Code::Ok, "OK", "InternalError"),
    (Code::Cancelled, "CANCELLED", "CancelledError"),
    (Code::Unknown, "UNKNOWN", "InternalError"),
    (
        Code::InvalidArgument,
        "INVALID_ARGUMENT",
        "InvalidArgumentError",
    ),
    (
        Code::DeadlineExceeded,
        "DEADLINE_EXCEEDED",
        "DeadlineExceededError",
    ),
    (Code::NotFound, "NOT_FOUND", "NotFoundError"),
    (
        Code::AlreadyExists,
        "ALREADY_EXISTS",
        "FailedPreconditionError",
    ),
    (
        Code::PermissionDenied,
        "PERMISSION_DENIED",
        "UnauthenticatedError",
    ),
    (
        Code::ResourceExhausted,
        "RESOURCE_EXHAUSTED",
        "ResourceExhaustedError",
    ),
    (
        Code::FailedPrecondition,
        "FAILED_PRECONDITION",
        "FailedPreconditionError",
    ),
    (Code::Aborted, "ABORTED", "AbortedError"),
    (Code::OutOfRange, "OUT_OF_RANGE", "ResourceExhaustedError"),
    (Code::Unimplemented, "UNIMPLEMENTED", "InternalError"),
    (Code::Internal, "INTERNAL", "InternalError"),
    (Code::Unavailable, "UNAVAILABLE", "UnavailableError"),
    (Code::DataLoss, "DATA_LOSS", "InternalError"),
    (
        Code::Unauthenticated,
        "UNAUTHENTICATED",
        "UnauthenticatedError",
    ),
];

fn entry(code: Code) -> &'static (Code, &'static str, &'static str) {
    // The table lists every variant of `Code`, in discriminant order.
    &CODES[code as usize]
}

/// The canonical upper-case name of a gRPC status code (`"DEADLINE_EXCEEDED"`).
///
/// ```
/// assert_eq!(_core::rpc::wire::codes::code_name(tonic::Code::NotFound), "NOT_FOUND");
/// ```
pub fn code_name(code: Code) -> &'static str {
    entry(code).1
}

/// The code a canonical name stands for, if it is one.
///
/// ```
/// use _core::rpc::wire::codes::parse_code;
/// assert_eq!(parse_code("ABORTED"), Some(tonic::Code::Aborted));
/// assert_eq!(parse_code("aborted"), None);
/// ```
pub fn parse_code(name: &str) -> Option<Code> {
    CODES
        .iter()
        .find(|(_, n, _)| *n == name)
        .map(|(c, _, _)| *c)
}

/// The `jaxcluster.errors` class a failure with `code` is raised as.
pub fn error_class(code: Code) -> &'static str {
    entry(code).2
}

/// The name of a function kind: `"cloudpickle"` or `"jax_export"` (`"unspecified"` for
/// the proto's zero value, which no valid request carries).
pub fn function_kind_name(kind: pb::FunctionKind) -> &'static str {
    match kind {
        pb::FunctionKind::Unspecified => "unspecified",
        pb::FunctionKind::Cloudpickle => "cloudpickle",
        pb::FunctionKind::JaxExport => "jax_export",
    }
}

/// The function kind named `name`, or an error listing the names there are.
///
/// ```
/// use _core::rpc::{pb::FunctionKind, wire::codes::parse_function_kind};
/// assert_eq!(parse_function_kind("jax_export"), Ok(FunctionKind::JaxExport));
/// assert!(parse_function_kind("pickle").unwrap_err().contains("'cloudpickle'"));
/// ```
pub fn parse_function_kind(name: &str) -> Result<pb::FunctionKind, String> {
    match name {
        "cloudpickle" => Ok(pb::FunctionKind::Cloudpickle),
        "jax_export" => Ok(pb::FunctionKind::JaxExport),
        other => Err(format!(
            "function kind {other:?} is not known; expected 'cloudpickle' or 'jax_export'"
        )),
    }
}

/// The name of a closure-error kind: `"user"`, `"input"`, `"function_load"` or
/// `"infrastructure"` (`"unspecified"` for the proto's zero value).
pub fn error_kind_name(kind: pb::ErrorKind) -> &'static str {
    match kind {
        pb::ErrorKind::Unspecified => "unspecified",
        pb::ErrorKind::User => "user",
        pb::ErrorKind::Input => "input",
        pb::ErrorKind::FunctionLoad => "function_load",
        pb::ErrorKind::Infrastructure => "infrastructure",
    }
}

/// The closure-error kind named `name`, or an error listing the names there are.
pub fn parse_error_kind(name: &str) -> Result<pb::ErrorKind, String> {
    match name {
        "user" => Ok(pb::ErrorKind::User),
        "input" => Ok(pb::ErrorKind::Input),
        "function_load" => Ok(pb::ErrorKind::FunctionLoad),
        "infrastructure" => Ok(pb::ErrorKind::Infrastructure),
        other => Err(format!(
            "error kind {other:?} is not known; expected 'user', 'input', 'function_load' or \
             'infrastructure'"
        )),
    }
}

/// The kind of a `ClosureError` for a closure cancelled before it ended; the protocol has
/// no such error kind (a worker never reports one), so it is spelled here beside them.
pub const CANCELLED_KIND: &str = "cancelled";

/// The name of a worker's serving state, as `GetStatus` reports it: `"serving"`,
/// `"draining"`, `"preempting"` (`"unspecified"` for the proto's zero value).
pub fn serving_state_name(state: pb::ServingState) -> &'static str {
    match state {
        pb::ServingState::Unspecified => "unspecified",
        pb::ServingState::Serving => "serving",
        pb::ServingState::Draining => "draining",
        pb::ServingState::Preempting => "preempting",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_is_in_the_table_at_its_own_place() {
        for (index, (code, name, class)) in CODES.iter().enumerate() {
            assert_eq!(*code as usize, index, "{name}");
            assert_eq!(parse_code(name), Some(*code));
            assert!(class.ends_with("Error"), "{class}");
        }
        assert_eq!(error_class(Code::DeadlineExceeded), "DeadlineExceededError");
        assert_eq!(error_class(Code::PermissionDenied), "UnauthenticatedError");
    }

    #[test]
    fn kinds_round_trip_through_their_names() {
        for kind in [pb::FunctionKind::Cloudpickle, pb::FunctionKind::JaxExport] {
            assert_eq!(parse_function_kind(function_kind_name(kind)), Ok(kind));
        }
        for kind in [
            pb::ErrorKind::User,
            pb::ErrorKind::Input,
            pb::ErrorKind::FunctionLoad,
            pb::ErrorKind::Infrastructure,
        ] {
            assert_eq!(parse_error_kind(error_kind_name(kind)), Ok(kind));
        }
        assert!(parse_error_kind("infra")
            .unwrap_err()
            .contains("'infrastructure'"));
    }
}
