//! `jaxcluster._core.WorkerClient`: blocking calls on the Rust worker client, made with
//! the GIL released (see [`super::blocking::wait_for`]).

use std::time::Duration;

use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::{PyBytes, PyDict, PyList};

use super::blocking::{in_runtime, wait_for};
use super::buffer::{buffer_list, bytes_of, bytes_of_all};
use super::convert::{client_config, duration, to_bytes};
use super::enums::function_kind_arg;
use super::errors::new_error;
use super::outcome::{PyClosureError, PyEncodedValue};
use super::status::WorkerReport;
use crate::rpc::wire::limits::DEFAULT_MAX_MESSAGE_BYTES;
use crate::rpc::{pb, WorkerClient};

fn value(
    pickle: Option<&Bound<'_, PyAny>>,
    buffers: &[Bound<'_, PyAny>],
) -> PyResult<Option<pb::Value>> {
    pickle
        .map(|p| {
            Ok(pb::Value {
                pickle: bytes_of(p, "args")?,
                buffers: bytes_of_all(buffers, "each buffer")?,
            })
        })
        .transpose()
}

/// A worker's structured error as the `ClosureError` the dispatcher's failures also are.
fn reported_error<'py>(
    py: Python<'py>,
    e: &pb::ClosureError,
    worker: &str,
) -> PyResult<Bound<'py, PyClosureError>> {
    Bound::new(py, PyClosureError::from_reported(e, worker))
}

fn run_dict<'py>(
    py: Python<'py>,
    r: &pb::RunClosureResponse,
    worker: &str,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("closure_id", r.closure_id)?;
    match &r.outcome {
        Some(pb::run_closure_response::Outcome::Result(v)) => {
            d.set_item("value", PyBytes::new(py, &v.pickle))?;
            d.set_item("buffers", buffer_list(py, &v.buffers)?)?;
            d.set_item("error", py.None())?;
        }
        Some(pb::run_closure_response::Outcome::Error(e)) => {
            d.set_item("value", py.None())?;
            d.set_item("buffers", PyList::empty(py))?;
            d.set_item("error", reported_error(py, e, worker)?)?;
        }
        None => {
            return Err(new_error(
                py,
                "InternalError",
                format!(
                    "the worker answered closure {} with neither a result nor an error",
                    r.closure_id
                ),
            ))
        }
    }
    Ok(d)
}

/// Blocking client for one worker (see `_core.pyi` for the Python-facing docs).
#[pyclass(module = "jaxcluster._core", name = "WorkerClient", frozen)]
pub struct PyWorkerClient {
    inner: WorkerClient,
    timeout: Option<Duration>,
}

impl PyWorkerClient {
    fn control_timeout(&self, timeout: Option<f64>) -> PyResult<Option<Duration>> {
        Ok(duration(timeout, "timeout")?.or(self.timeout))
    }
}

#[pymethods]
impl PyWorkerClient {
    #[new]
    #[pyo3(signature = (address, auth_token=None, timeout=Some(30.0), *, connect_timeout=10.0,
                        max_message_bytes=DEFAULT_MAX_MESSAGE_BYTES, tls_ca=None, tls_domain=None,
                        session=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        address: String,
        auth_token: Option<String>,
        timeout: Option<f64>,
        connect_timeout: f64,
        max_message_bytes: usize,
        tls_ca: Option<Vec<u8>>,
        tls_domain: Option<String>,
        session: Option<String>,
    ) -> PyResult<Self> {
        let mut config = client_config(
            address,
            auth_token,
            connect_timeout,
            max_message_bytes,
            tls_ca,
            tls_domain,
        )?;
        config.session = session.filter(|s| !s.is_empty());
        let timeout = duration(timeout, "timeout")?;
        let inner = in_runtime(py, || WorkerClient::connect_lazy(&config))?;
        Ok(Self { inner, timeout })
    }

    #[getter]
    fn address(&self) -> &str {
        self.inner.address()
    }

    #[pyo3(signature = (timeout=None))]
    fn get_status(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<WorkerReport> {
        let timeout = self.control_timeout(timeout)?;
        let status = wait_for(py, self.inner.get_status(timeout))?;
        Ok(WorkerReport::from(&status))
    }

    #[pyo3(signature = (timeout=None))]
    fn list_devices<'py>(
        &self,
        py: Python<'py>,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyList>> {
        let timeout = self.control_timeout(timeout)?;
        let devices = wait_for(py, self.inner.list_devices(timeout))?;
        let list = PyList::empty(py);
        for device in devices {
            let d = PyDict::new(py);
            d.set_item("name", device.name)?;
            d.set_item("device_type", device.device_type)?;
            list.append(d)?;
        }
        Ok(list)
    }

    #[pyo3(signature = (function_hash, kind, payload, *, timeout=None))]
    fn register_function(
        &self,
        py: Python<'_>,
        function_hash: PyBackedBytes,
        kind: &Bound<'_, PyAny>,
        payload: PyBackedBytes,
        timeout: Option<f64>,
    ) -> PyResult<bool> {
        let request = pb::RegisterFunctionRequest {
            function_hash: to_bytes(function_hash),
            kind: function_kind_arg(kind)?.into(),
            payload: to_bytes(payload),
        };
        let timeout = self.control_timeout(timeout)?;
        let response = wait_for(py, self.inner.register_function(request, timeout))?;
        Ok(response.already_registered)
    }

    #[pyo3(signature = (function_hash, args=None, buffers=Vec::new(), *, closure_id=0, timeout=None, worker_index=None,
                        preemption_save=false, keep_result_id=None))]
    #[allow(clippy::needless_pass_by_value)] // PyO3 extracts owned arguments
    #[allow(clippy::too_many_arguments)] // the Python signature, keyword-only
    fn run_closure<'py>(
        &self,
        py: Python<'py>,
        function_hash: PyBackedBytes,
        args: Option<Bound<'py, PyAny>>,
        buffers: Vec<Bound<'py, PyAny>>,
        closure_id: u64,
        timeout: Option<f64>,
        worker_index: Option<i64>,
        preemption_save: bool,
        keep_result_id: Option<u64>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let request = pb::RunClosureRequest {
            function_hash: to_bytes(function_hash),
            args: value(args.as_ref(), &buffers)?,
            closure_id,
            // None: the worker's own --index (a slice's rank 0 passes on the coordinator's).
            worker_index,
            preemption_save,
            keep_result_id,
        };
        let timeout = duration(timeout, "timeout")?;
        let response = wait_for(py, self.inner.run_closure(request, timeout))?;
        run_dict(py, &response, self.inner.address())
    }

    #[pyo3(signature = (resource_id, function_hash, args=None, buffers=Vec::new(), *, timeout=None,
                        worker_index=None, name=String::new()))]
    #[allow(clippy::needless_pass_by_value, clippy::too_many_arguments)] // PyO3 extracts owned arguments
    fn create_resource<'py>(
        &self,
        py: Python<'py>,
        resource_id: u64,
        function_hash: PyBackedBytes,
        args: Option<Bound<'py, PyAny>>,
        buffers: Vec<Bound<'py, PyAny>>,
        timeout: Option<f64>,
        worker_index: Option<i64>,
        name: String,
    ) -> PyResult<Bound<'py, PyDict>> {
        let request = pb::CreateResourceRequest {
            resource_id,
            function_hash: to_bytes(function_hash),
            args: value(args.as_ref(), &buffers)?,
            worker_index,
            name,
        };
        let timeout = duration(timeout, "timeout")?;
        let response = wait_for(py, self.inner.create_resource(request, timeout))?;
        let d = PyDict::new(py);
        d.set_item("resource_id", response.resource_id)?;
        d.set_item("reattached", response.reattached)?;
        match &response.error {
            Some(e) => d.set_item("error", reported_error(py, e, self.inner.address())?)?,
            None => d.set_item("error", py.None())?,
        }
        Ok(d)
    }

    #[pyo3(signature = (resource_ids, *, timeout=None))]
    fn release_resource(
        &self,
        py: Python<'_>,
        resource_ids: Vec<u64>,
        timeout: Option<f64>,
    ) -> PyResult<u32> {
        let timeout = self.control_timeout(timeout)?;
        wait_for(py, self.inner.release_resource(resource_ids, timeout))
    }

    #[pyo3(signature = (value_id, *, timeout=None))]
    fn read_value(
        &self,
        py: Python<'_>,
        value_id: u64,
        timeout: Option<f64>,
    ) -> PyResult<PyEncodedValue> {
        let timeout = self.control_timeout(timeout)?;
        let value = wait_for(py, self.inner.read_value(value_id, timeout))?;
        Ok(PyEncodedValue::from_message(value))
    }

    #[pyo3(signature = (*, timeout=None))]
    fn end_session(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        let timeout = self.control_timeout(timeout)?;
        wait_for(py, self.inner.end_session(timeout))
    }

    fn __repr__(&self) -> String {
        format!("WorkerClient({:?})", self.inner.address())
    }
}
