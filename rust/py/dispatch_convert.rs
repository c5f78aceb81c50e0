//! Conversions for the dispatcher binding (`dispatch.rs`): dispatcher errors and closure
//! failures to Python exceptions.

use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

use super::blocking::interrupted;
use super::errors::new_error;
use super::outcome::PyClosureError;
use crate::dispatch::{ClosureFailure, DispatchError};

/// The one mapping from dispatcher errors to Python exceptions.
pub(super) fn dispatch_error(py: Python<'_>, error: DispatchError) -> PyErr {
    match error {
        DispatchError::ClosureFailed(failure) => closure_error(py, &failure),
        DispatchError::InvalidArgument(message) => PyValueError::new_err(message),
        DispatchError::Stopped => PyRuntimeError::new_err(
            "the dispatcher was shut down; create a new coordinator to schedule more closures",
        ),
        DispatchError::TimedOut => new_error(py, "DeadlineExceededError", error.to_string()),
        DispatchError::Interrupted => interrupted(None),
        DispatchError::Runtime(e) => PyRuntimeError::new_err(e.to_string()),
        DispatchError::Internal(message) => new_error(py, "InternalError", message),
        DispatchError::Unavailable(message) => new_error(py, "UnavailableError", message),
    }
}

/// The callable that turns a `ClosureError` into the exception it stands for, registered
/// once by Python (`jaxcluster._native`, which every import of `_core` goes through).
static EXCEPTION_BUILDER: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// Registers `builder(closure_error) -> BaseException`, which rebuilds a closure's
/// failure into the exception to raise: Python owns rebuilding user exceptions (see
/// `jaxcluster.coordinator._errors.build_exception`). The first registration stands.
#[pyfunction]
pub(super) fn set_exception_builder(py: Python<'_>, builder: Bound<'_, PyAny>) -> PyResult<()> {
    if !builder.is_callable() {
        return Err(PyTypeError::new_err(
            "set_exception_builder(): the builder must be callable as builder(closure_error)",
        ));
    }
    let _ = EXCEPTION_BUILDER.set(py, builder.unbind());
    Ok(())
}

/// The exception for a closure's failure: the registered builder rebuilds it from the
/// `ClosureError`, as it does for a `RemoteValue`, so both raise the same thing.
fn closure_error(py: Python<'_>, failure: &ClosureFailure) -> PyErr {
    let error = PyClosureError::from_failure(failure);
    let Some(builder) = EXCEPTION_BUILDER.get(py) else {
        return PyRuntimeError::new_err(format!(
            "{error:?} (no exception builder is registered; import jaxcluster first)"
        ));
    };
    let built = (|| -> PyResult<PyErr> {
        let error = Bound::new(py, error)?;
        Ok(PyErr::from_value(builder.bind(py).call1((error,))?))
    })();
    built.unwrap_or_else(|e| e)
}
