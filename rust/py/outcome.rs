//! How a closure's outcome crosses into Python: [`PyEncodedValue`] for a result and
//! [`PyClosureError`] for a failure or cancellation, both frozen and typed (documented for
//! users in `_core.pyi`). Python (`jaxcluster.coordinator._errors`) rebuilds the exception
//! to raise from a `ClosureError`'s attributes; the dispatcher's failures, a cancellation
//! and a `WorkerClient`'s raw replies all arrive as this one class.

use bytes::Bytes;
use pyo3::exceptions::{PyKeyError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use super::buffer::{buffer_list, bytes_of, bytes_of_all};
use super::enums::{error_kind_arg, ErrorKind};
use crate::dispatch::{ClosureFailure, EncodedValue, Outcome};
use crate::rpc::pb;
use crate::rpc::wire::codes::{code_name, error_class, parse_code};

/// A closure's result as the worker sent it: a pickle and its out-of-band buffers.
#[pyclass(frozen, module = "jaxcluster._core", name = "EncodedValue")]
pub struct PyEncodedValue {
    value: EncodedValue,
}

impl PyEncodedValue {
    /// A value as a worker sent it (e.g. a kept value read with `ReadValue`).
    pub(crate) fn from_message(value: pb::Value) -> Self {
        Self {
            value: EncodedValue {
                pickle: value.pickle,
                buffers: value.buffers,
            },
        }
    }
}

impl From<EncodedValue> for PyEncodedValue {
    fn from(value: EncodedValue) -> Self {
        Self { value }
    }
}

#[pymethods]
impl PyEncodedValue {
    #[new]
    #[pyo3(signature = (pickle, buffers = Vec::new()))]
    #[allow(clippy::needless_pass_by_value)] // PyO3 extracts owned lists
    fn new(pickle: &Bound<'_, PyAny>, buffers: Vec<Bound<'_, PyAny>>) -> PyResult<Self> {
        Ok(Self {
            value: EncodedValue {
                pickle: bytes_of(pickle, "pickle")?,
                buffers: bytes_of_all(&buffers, "each buffer")?,
            },
        })
    }

    #[getter]
    fn pickle<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.value.pickle)
    }

    #[getter]
    fn buffers<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        buffer_list(py, &self.value.buffers)
    }

    fn __repr__(&self) -> String {
        format!(
            "EncodedValue(pickle=<{} bytes>, buffers={})",
            self.value.pickle.len(),
            self.value.buffers.len()
        )
    }
}

/// Why a closure did not produce a value; see `_core.pyi`.
#[pyclass(frozen, module = "jaxcluster._core", name = "ClosureError")]
#[derive(Debug, Clone)]
pub struct PyClosureError {
    kind: ErrorKind,
    code: Option<&'static str>,
    type_name: String,
    module: String,
    message: String,
    traceback: String,
    exception: Option<Bytes>,
    exception_buffers: Vec<Bytes>,
    worker: String,
    ps_task: Option<i64>,
    resource_id: Option<u64>,
}

impl PyClosureError {
    /// A failure the dispatcher recorded for a closure.
    pub(crate) fn from_failure(failure: &ClosureFailure) -> Self {
        Self {
            kind: failure.kind.into(),
            code: failure.kind.code().map(code_name),
            type_name: failure.type_name.clone(),
            module: failure.module.clone(),
            message: failure.message.clone(),
            traceback: failure.traceback.clone(),
            exception: (!failure.pickled_exception.is_empty())
                .then(|| Bytes::copy_from_slice(&failure.pickled_exception)),
            exception_buffers: Vec::new(),
            worker: failure.worker.clone(),
            ps_task: failure.ps_task,
            resource_id: failure.resource_id,
        }
    }

    /// A cancellation: `why` says what cancelled the closure.
    pub(crate) fn cancelled(why: &str) -> Self {
        let code = tonic::Code::Cancelled;
        Self {
            kind: ErrorKind::Cancelled,
            code: Some(code_name(code)),
            type_name: error_class(code).to_owned(),
            module: "jaxcluster.errors".to_owned(),
            message: why.to_owned(),
            traceback: String::new(),
            exception: None,
            exception_buffers: Vec::new(),
            worker: String::new(),
            ps_task: None,
            resource_id: None,
        }
    }

    /// An error a worker reported verbatim (a `WorkerClient` reply), from `worker`.
    pub(crate) fn from_reported(error: &pb::ClosureError, worker: &str) -> Self {
        let kind = ErrorKind::from(error.kind());
        let (exception, exception_buffers) = match &error.exception {
            Some(value) if !value.pickle.is_empty() => {
                (Some(value.pickle.clone()), value.buffers.clone())
            }
            _ => (None, Vec::new()),
        };
        Self {
            kind,
            code: (kind == ErrorKind::Infrastructure).then(|| code_name(tonic::Code::Internal)),
            type_name: error.type_name.clone(),
            module: error.module.clone(),
            message: error.message.clone(),
            traceback: error.traceback.clone(),
            exception,
            exception_buffers,
            worker: worker.to_owned(),
            ps_task: error.ps_task,
            resource_id: error.resource_id,
        }
    }
}

#[pymethods]
impl PyClosureError {
    #[new]
    #[pyo3(signature = (
        kind, *, type_name, message, module = String::new(), traceback = String::new(),
        code = None, exception = None, exception_buffers = Vec::new(), worker = String::new(),
        ps_task = None, resource_id = None
    ))]
    #[allow(clippy::too_many_arguments)] // the Python signature, keyword-only
    fn new(
        kind: &Bound<'_, PyAny>,
        type_name: String,
        message: String,
        module: String,
        traceback: String,
        code: Option<&str>,
        exception: Option<Vec<u8>>,
        exception_buffers: Vec<Vec<u8>>,
        worker: String,
        ps_task: Option<i64>,
        resource_id: Option<u64>,
    ) -> PyResult<Self> {
        let kind = error_kind_arg(kind)?;
        let code = match code {
            None => None,
            Some(name) => Some(parse_code(name).map(code_name).ok_or_else(|| {
                PyValueError::new_err(format!(
                    "ClosureError code {name:?} is not a gRPC status code name; expected e.g. \
                     'DEADLINE_EXCEEDED' or 'UNAVAILABLE'"
                ))
            })?),
        };
        Ok(Self {
            kind,
            code,
            type_name,
            module,
            message,
            traceback,
            exception: exception.map(Bytes::from),
            exception_buffers: exception_buffers.into_iter().map(Bytes::from).collect(),
            worker,
            ps_task,
            resource_id,
        })
    }

    #[getter]
    fn kind(&self) -> ErrorKind {
        self.kind
    }

    #[getter]
    fn code(&self) -> Option<&'static str> {
        self.code
    }

    #[getter]
    fn type_name(&self) -> &str {
        &self.type_name
    }

    #[getter]
    fn module(&self) -> &str {
        &self.module
    }

    #[getter]
    fn message(&self) -> &str {
        &self.message
    }

    #[getter]
    fn traceback(&self) -> &str {
        &self.traceback
    }

    #[getter]
    fn exception<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        self.exception
            .as_ref()
            .map(|pickle| PyBytes::new(py, pickle))
    }

    #[getter]
    fn exception_buffers<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        buffer_list(py, &self.exception_buffers)
    }

    #[getter]
    fn worker(&self) -> &str {
        &self.worker
    }

    #[getter]
    fn ps_task(&self) -> Option<i64> {
        self.ps_task
    }

    #[getter]
    fn resource_id(&self) -> Option<u64> {
        self.resource_id
    }

    /// Item access by field name, so a raw `WorkerClient` reply reads like the dict its
    /// other fields are (`reply["error"]["kind"]`).
    fn __getitem__<'py>(slf: &Bound<'py, Self>, key: &str) -> PyResult<Bound<'py, PyAny>> {
        const FIELDS: [&str; 11] = [
            "kind",
            "code",
            "type_name",
            "module",
            "message",
            "traceback",
            "exception",
            "exception_buffers",
            "worker",
            "ps_task",
            "resource_id",
        ];
        if !FIELDS.contains(&key) {
            return Err(PyKeyError::new_err(format!(
                "ClosureError has no field {key:?}; its fields are {FIELDS:?}"
            )));
        }
        slf.getattr(key)
    }

    fn __repr__(&self) -> String {
        let worker = if self.worker.is_empty() {
            String::new()
        } else {
            format!(", worker={:?}", self.worker)
        };
        format!(
            "ClosureError(kind={:?}, type_name={:?}, message={:?}{worker})",
            self.kind.spelling(),
            self.type_name,
            self.message
        )
    }
}

/// A settled cell's outcome as Python sees it: an `EncodedValue` or a `ClosureError`.
pub(crate) fn outcome_object<'py>(
    py: Python<'py>,
    outcome: &Outcome,
) -> PyResult<Bound<'py, PyAny>> {
    Ok(match outcome {
        Outcome::Value(value) => Bound::new(
            py,
            PyEncodedValue {
                value: value.clone(),
            },
        )?
        .into_any(),
        Outcome::Failed(failure) => {
            Bound::new(py, PyClosureError::from_failure(failure))?.into_any()
        }
        Outcome::Cancelled(why) => Bound::new(py, PyClosureError::cancelled(why))?.into_any(),
    })
}
