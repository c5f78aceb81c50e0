//! Conversions for the dispatcher binding (`dispatch.rs`): dispatcher errors and closure
//! failures to Python exceptions, and metrics and worker statuses to dicts.

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use super::blocking::interrupted;
use super::client::status_dict;
use super::errors::new_error;
use super::outcome::PyClosureError;
use crate::dispatch::{
    ClosureFailure, DispatchError, LatencySnapshot, LinkState, MetricsSnapshot, WorkerSnapshot,
};

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

/// The exception for a closure's failure: Python's
/// `jaxcluster.coordinator._errors.build_exception` rebuilds it from the `ClosureError`,
/// as it does for a `RemoteValue`, so both raise the same thing.
fn closure_error(py: Python<'_>, failure: &ClosureFailure) -> PyErr {
    let built = (|| -> PyResult<PyErr> {
        let error = Bound::new(py, PyClosureError::from_failure(failure))?;
        let builder = py
            .import(intern!(py, "jaxcluster.coordinator._errors"))?
            .getattr(intern!(py, "build_exception"))?;
        Ok(PyErr::from_value(builder.call1((error,))?))
    })();
    built.unwrap_or_else(|e| e)
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
        w.set_item("index", worker.index)?;
        w.set_item("address", &worker.address)?;
        w.set_item("state", worker.state.label())?;
        w.set_item("in_state_seconds", worker.in_state_for.as_secs_f64())?;
        w.set_item("completed", worker.completed)?;
        w.set_item("failed", worker.failed)?;
        w.set_item("retried", worker.retried)?;
        w.set_item("failures", worker.failures)?;
        w.set_item("last_error", worker.last_error.as_deref())?;
        workers.append(w)?;
    }
    d.set_item("workers", workers)?;
    let latency = latency_dict(py, &m.latency)?;
    d.set_item("latency", latency)?;
    Ok(d)
}

/// A latency histogram as a dict: `bounds` (seconds), `counts` (one per bound, then the
/// overflow bucket), `count`, `sum`, `max`, `p50`, `p99`.
pub(super) fn latency_dict<'py>(
    py: Python<'py>,
    latency: &LatencySnapshot,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("bounds", &latency.bounds)?;
    d.set_item("counts", &latency.counts)?;
    d.set_item("count", latency.count)?;
    d.set_item("sum", latency.sum)?;
    d.set_item("max", latency.max)?;
    d.set_item("p50", latency.quantile(0.5))?;
    d.set_item("p99", latency.quantile(0.99))?;
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
    if let (Some(status), Some(age)) = (&w.status, w.status_age) {
        // The worker's own last error, kept apart from the link's (`last_error`).
        d.set_item("worker_last_error", &status.last_error)?;
        d.set_item("status_age_seconds", age.as_secs_f64())?;
        if w.state == LinkState::Up {
            // Uptime goes on between answers: reported plus the answer's age.
            d.set_item("uptime_seconds", status.uptime_seconds + age.as_secs_f64())?;
        }
    }
    d.set_item("index", w.index)?;
    d.set_item("address", &w.address)?;
    d.set_item("state", w.state.label())?;
    d.set_item("in_state_seconds", w.in_state_for.as_secs_f64())?;
    d.set_item("last_error", w.last_error.as_deref())?;
    d.set_item("completed", w.completed)?;
    d.set_item("failed", w.failed)?;
    d.set_item("retried", w.retried)?;
    d.set_item("failures", w.failures)?;
    Ok(d)
}
