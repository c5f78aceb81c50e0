//! `jaxcluster._core.ValueRead`: one `ReadValue` call (dataflow) as the worker's reader
//! thread sees it, and the worker side's pulls handed to Python as `EncodedValue`s. The
//! `WorkerServer` methods that give them out (`next_read`, `pull_value`) are in
//! `worker.rs`; the queue and the clients are Rust's (`crate::worker::reads`, `peers`).

use pyo3::prelude::*;

use super::answer_once::{error_code, AnswerOnce};
use super::buffer::{bytes_of, bytes_of_all};
use crate::rpc::pb;
use crate::worker::reads::ValueRead;

/// A read of a kept value waiting for its answer (see `_core.pyi`).
#[pyclass(module = "jaxcluster._core", name = "ValueRead", frozen)]
pub struct PyValueRead {
    session: String,
    value_id: u64,
    read: AnswerOnce<ValueRead>,
}

impl PyValueRead {
    pub(crate) fn new(read: ValueRead) -> Self {
        Self {
            session: read.session.as_str().to_owned(),
            value_id: read.value_id,
            read: AnswerOnce::new(read, "read"),
        }
    }
}

#[pymethods]
impl PyValueRead {
    #[getter]
    fn session(&self) -> &str {
        &self.session
    }

    #[getter]
    fn value_id(&self) -> u64 {
        self.value_id
    }

    #[getter]
    fn replied(&self) -> bool {
        self.read.answered()
    }

    #[pyo3(signature = (value, buffers=Vec::new()))]
    #[allow(clippy::needless_pass_by_value)] // PyO3 extracts owned lists
    fn reply_ok(&self, value: &Bound<'_, PyAny>, buffers: Vec<Bound<'_, PyAny>>) -> PyResult<()> {
        let encoded = pb::Value {
            pickle: bytes_of(value, "value")?,
            buffers: bytes_of_all(&buffers, "each buffer")?,
        };
        self.read.take()?.reply(Ok(encoded));
        Ok(())
    }

    fn reply_status(&self, code: &str, message: &str) -> PyResult<()> {
        let code = error_code(code, "NOT_FOUND or INTERNAL")?;
        self.read
            .take()?
            .reply(Err(tonic::Status::new(code, message.to_owned())));
        Ok(())
    }

    fn __repr__(&self) -> String {
        format!(
            "ValueRead(value_id={}, replied={})",
            self.value_id,
            self.replied()
        )
    }
}
