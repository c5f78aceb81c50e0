//! `jaxcluster._core.ResultCell`: one closure's outcome as Python waits for it (the GIL
//! released, signal handlers run every [`signal_poll`]) and reads it. Documented for users
//! in `_core.pyi`.

use std::sync::Arc;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use super::blocking::{detach_interruptible, interrupted, signal_poll};
use super::convert::deadline_after;
use super::outcome::outcome_object;
use crate::dispatch::ResultCell;

/// The Python-facing result cell; documented in `_core.pyi`.
#[pyclass(frozen, module = "jaxcluster._core", name = "ResultCell")]
pub struct PyResultCell {
    pub(super) inner: Arc<ResultCell>,
}

#[pymethods]
impl PyResultCell {
    #[pyo3(signature = (timeout = None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        let deadline = deadline_after(timeout, "ResultCell.wait")?;
        if self.inner.outcome().is_some() {
            return Ok(true); // no GIL hand-off for a value that is already there
        }
        let every = signal_poll(py);
        let (waited, raised) = detach_interruptible(py, |check| {
            self.inner.wait_interruptible(deadline, every, check)
        });
        waited.map_err(|_| interrupted(raised))
    }

    #[getter]
    fn status(&self) -> i64 {
        self.inner.status() as i64
    }

    #[getter]
    fn closure_id(&self) -> u64 {
        self.inner.id()
    }

    #[getter]
    fn worker(&self) -> Option<usize> {
        self.inner.worker()
    }

    fn watch(&self, watch: &Bound<'_, super::cell_watch::PyCellWatch>) {
        self.inner.watch(&watch.get().inner);
    }

    fn result<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        match self.inner.outcome() {
            Some(outcome) => outcome_object(py, &outcome),
            None => Err(PyRuntimeError::new_err(format!(
                "ResultCell.result(): closure {} has not finished (status NOT_READY); call \
                 wait() until it returns True first",
                self.inner.id()
            ))),
        }
    }

    fn __repr__(&self) -> String {
        let status = ["NOT_READY", "ABORTED", "READY"][self.inner.status() as usize];
        format!(
            "ResultCell(closure_id={}, status={status})",
            self.inner.id()
        )
    }
}
