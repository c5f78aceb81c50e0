//! Conversions for the dispatcher binding (`dispatch.rs`): dispatcher errors and closure
//! failures to Python exceptions, outcomes to the result tuples, and metrics and worker
//! statuses to dicts.

use pyo3::exceptions::{PyKeyboardInterrupt, PyRuntimeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};

use super::client::status_dict;
use super::convert::bytes_list;
use super::errors::{error_type, new_error};
use crate::dispatch::{
    ClosureFailure, DispatchError, FailureKind, MetricsSnapshot, Outcome, WorkerSnapshot,
};

/// The exception a signal handler raised while a call waited, else `KeyboardInterrupt`.
pub(super) fn interrupted(interrupt: Option<PyErr>) -> PyErr {
    interrupt.unwrap_or_else(|| PyKeyboardInterrupt::new_err("interrupted while waiting"))
}

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
    }
}

/// The exception for a closure's failure, built by Python's `build_exception` when it
/// exists.
fn closure_error(py: Python<'_>, failure: &ClosureFailure) -> PyErr {
    let built = (|| -> PyResult<PyErr> {
        let tuple = failure_tuple(py, failure)?;
        let builder = match py.import(intern!(py, "jaxcluster.coordinator._errors")) {
            Ok(module) => module.getattr(intern!(py, "build_exception"))?,
            Err(missing) if missing.is_instance_of::<pyo3::exceptions::PyImportError>(py) => {
                return fallback_error(py, failure);
            }
            Err(other) => return Err(other),
        };
        Ok(PyErr::from_value(builder.call1((tuple,))?))
    })();
    built.unwrap_or_else(|e| e)
}

/// What `build_exception` would raise, for when the Python module is not there yet.
fn fallback_error(py: Python<'_>, failure: &ClosureFailure) -> PyResult<PyErr> {
    let message = format!("{} (on worker {})", failure.message, failure.worker);
    let remote = || {
        error_type(py, "RemoteError")?.call1((
            failure.type_name.as_str(),
            message.as_str(),
            failure.traceback.as_str(),
        ))
    };
    Ok(match failure.kind {
        FailureKind::User => PyErr::from_value(remote()?),
        FailureKind::Input => {
            PyErr::from_value(error_type(py, "ClosureInputError")?.call1((remote()?,))?)
        }
        FailureKind::Infra(_) => new_error(py, &failure.type_name, message),
    })
}

fn failure_tuple<'py>(py: Python<'py>, f: &ClosureFailure) -> PyResult<Bound<'py, PyTuple>> {
    (
        "error",
        f.kind.label(),
        f.type_name.as_str(),
        f.module.as_str(),
        f.message.as_str(),
        f.traceback.as_str(),
        PyBytes::new(py, &f.pickled_exception),
        f.worker.as_str(),
        f.ps_task,
    )
        .into_pyobject(py)
}

pub(super) fn outcome_tuple<'py>(
    py: Python<'py>,
    outcome: &Outcome,
) -> PyResult<Bound<'py, PyTuple>> {
    match outcome {
        Outcome::Value(value) => (
            "ok",
            PyBytes::new(py, &value.pickle),
            bytes_list(py, &value.buffers)?,
        )
            .into_pyobject(py),
        Outcome::Failed(failure) => failure_tuple(py, failure),
        Outcome::Cancelled(why) => ("cancelled", why.as_str()).into_pyobject(py),
    }
}

pub(super) fn metrics_dict<'py>(
    py: Python<'py>,
    m: &MetricsSnapshot,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("queued", m.queued)?;
    d.set_item("inflight", m.inflight)?;
    d.set_item("completed", m.completed)?;
    d.set_item("failed", m.failed)?;
    d.set_item("cancelled", m.cancelled)?;
    d.set_item("retried", m.retried)?;
    d.set_item("worker_failures", m.worker_failures)?;
    d.set_item("ps_failures", m.ps_failures)?;
    d.set_item("functions_registered", m.functions_registered)?;
    let workers = PyList::empty(py);
    for worker in &m.workers {
        let w = PyDict::new(py);
        w.set_item("address", &worker.address)?;
        w.set_item("state", worker.state.label())?;
        workers.append(w)?;
    }
    d.set_item("workers", workers)?;
    let latency = PyDict::new(py);
    latency.set_item("bounds", &m.latency.bounds)?;
    latency.set_item("counts", &m.latency.counts)?;
    latency.set_item("count", m.latency.count)?;
    latency.set_item("sum", m.latency.sum)?;
    latency.set_item("max", m.latency.max)?;
    latency.set_item("p50", m.latency.quantile(0.5))?;
    latency.set_item("p99", m.latency.quantile(0.99))?;
    d.set_item("latency", latency)?;
    Ok(d)
}

pub(super) fn worker_dict<'py>(
    py: Python<'py>,
    w: &WorkerSnapshot,
) -> PyResult<Bound<'py, PyDict>> {
    let d = match &w.status {
        Some(status) => {
            let d = status_dict(py, status)?;
            // The worker's own serving state, kept apart from the link's state.
            if let Some(serving) = d.get_item("state")? {
                d.set_item("serving_state", serving)?;
            }
            d
        }
        None => PyDict::new(py),
    };
    d.set_item("index", w.index)?;
    d.set_item("address", &w.address)?;
    d.set_item("state", w.state.label())?;
    d.set_item("in_state_seconds", w.in_state_for.as_secs_f64())?;
    d.set_item("last_error", w.last_error.as_deref())?;
    Ok(d)
}
