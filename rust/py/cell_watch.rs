//! `jaxcluster._core.CellWatch`: the Python face of `crate::dispatch::CellWatch`, which
//! dataflow's dependency tracker (`coordinator/dataflow.py`) sleeps on until a producer
//! ends. Documented for users in `_core.pyi`.

use std::sync::Arc;

use pyo3::prelude::*;

use super::blocking::{detach_interruptible, interrupted, signal_poll};
use super::convert::duration;
use crate::dispatch::CellWatch;

/// The Python-facing watch; documented in `_core.pyi`.
#[pyclass(frozen, module = "jaxcluster._core", name = "CellWatch")]
pub struct PyCellWatch {
    pub(super) inner: Arc<CellWatch>,
}

#[pymethods]
impl PyCellWatch {
    #[new]
    fn new() -> Self {
        Self {
            inner: Arc::new(CellWatch::default()),
        }
    }

    #[pyo3(signature = (timeout = None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Vec<u64>> {
        let timeout = duration(timeout, "CellWatch.wait(): timeout")?;
        let deadline = timeout.and_then(|t| std::time::Instant::now().checked_add(t));
        let every = signal_poll(py);
        let (ids, raised) = detach_interruptible(py, |check| {
            self.inner.wait_interruptible(deadline, every, check)
        });
        ids.map_err(|_| interrupted(raised))
    }

    fn wake(&self) {
        self.inner.wake();
    }
}
