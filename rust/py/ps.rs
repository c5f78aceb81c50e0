//! `jaxcluster._core.PsServer` and `PsClient`.
//!
//! The server serves entirely on the shared tokio runtime: no request ever takes the GIL,
//! so a `jaxcluster ps` process's interpreter only waits for SIGTERM. The client converts
//! numpy values with the GIL held, then waits for the RPC with it released (see
//! `blocking::wait_for`), so many Python threads can update variables at once.

mod arrays;
pub mod optim;

use std::sync::Arc;
use std::time::Duration;

use pyo3::exceptions::{PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

use super::blocking::{block_detached, finish_serving, in_runtime, wait_for};
use super::convert::{client_config, duration, server_limits};
use super::status::PsStatus;
use crate::ps::{Op, PsClient, PsConfig, PsError, PsServer};
use crate::rpc::pb;
use crate::rpc::server::connections::{
    DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_STREAMS_PER_CONNECTION,
};
use crate::rpc::wire::limits::DEFAULT_MAX_MESSAGE_BYTES;
use crate::rpc::wire::session::SessionId;
use arrays::{check_name, missing, to_array, to_indices, to_tensor, to_tensor_borrowing};

/// How long `apply_update(borrow=True)` waits, once its call ended, for the lent gradient
/// to be let go of (it is at once after an answer; a frame's write after a deadline).
const LENT_GRACE: Duration = Duration::from_secs(10);

fn ps_error(error: PsError) -> PyErr {
    match error {
        PsError::Config(message) => PyValueError::new_err(message),
        PsError::Bind { .. } => PyOSError::new_err(error.to_string()),
    }
}

/// A parameter server (see `_core.pyi` for the Python-facing docs).
#[pyclass(module = "jaxcluster._core", name = "PsServer", frozen)]
pub struct PyPsServer {
    inner: Arc<PsServer>,
}

#[pymethods]
impl PyPsServer {
    #[new]
    #[pyo3(signature = (address="127.0.0.1:0", *, auth_token=None, index=0,
                        max_message_bytes=DEFAULT_MAX_MESSAGE_BYTES, tls_cert=None, tls_key=None,
                        max_connections=DEFAULT_MAX_CONNECTIONS,
                        max_streams_per_connection=DEFAULT_MAX_STREAMS_PER_CONNECTION,
                        handshake_timeout=5.0, state_ttl=3600.0))]
    #[allow(clippy::too_many_arguments)] // the Python signature, keyword-only
    fn new(
        py: Python<'_>,
        address: &str,
        auth_token: Option<String>,
        index: i64,
        max_message_bytes: usize,
        tls_cert: Option<Vec<u8>>,
        tls_key: Option<Vec<u8>>,
        max_connections: usize,
        max_streams_per_connection: u32,
        handshake_timeout: f64,
        state_ttl: f64,
    ) -> PyResult<Self> {
        let state_ttl = duration(Some(state_ttl), "state_ttl")?.unwrap_or_default();
        let tls = crate::rpc::security::tls::server_tls(tls_cert, tls_key)
            .map_err(PyValueError::new_err)?;
        let limits = server_limits(
            max_connections,
            max_streams_per_connection,
            handshake_timeout,
        )?;
        let config = PsConfig {
            tls,
            address: address.to_owned(),
            auth_token,
            ps_index: index,
            max_message_bytes,
            limits,
            state_ttl,
        };
        let server = block_detached(py, PsServer::start(config))?.map_err(ps_error)?;
        Ok(Self {
            inner: Arc::new(server),
        })
    }

    #[getter]
    fn address(&self) -> String {
        self.inner.local_addr().to_string()
    }

    #[getter]
    fn port(&self) -> u16 {
        self.inner.local_addr().port()
    }

    #[getter]
    fn index(&self) -> i64 {
        self.inner.status().ps_index
    }

    fn status(&self) -> PsStatus {
        PsStatus::from(&self.inner.status())
    }

    fn shutdown(&self, py: Python<'_>) -> PyResult<()> {
        let Some(task) = self.inner.stop_serving() else {
            return Ok(());
        };
        match finish_serving(py, task)? {
            Some(e) => Err(PyRuntimeError::new_err(format!(
                "the ps's gRPC server failed: {e}"
            ))),
            None => Ok(()),
        }
    }

    fn __repr__(&self) -> String {
        format!("PsServer(address={:?})", self.address())
    }
}

/// Blocking client for one ps task (see `_core.pyi`).
#[pyclass(module = "jaxcluster._core", name = "PsClient", frozen)]
pub struct PyPsClient {
    inner: PsClient,
    timeout: Option<Duration>,
}

impl PyPsClient {
    fn timeout(&self, timeout: Option<f64>) -> PyResult<Option<Duration>> {
        Ok(duration(timeout, "timeout")?.or(self.timeout))
    }

    /// The reply of an update: the new version, or the value after it when asked.
    fn updated<'py>(
        py: Python<'py>,
        response: &pb::UpdateResponse,
        read_value: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        if !read_value {
            return Ok(response.version.into_pyobject(py)?.into_any());
        }
        let value = response
            .value
            .as_ref()
            .ok_or_else(|| missing(py, "the updated value"))?;
        to_array(py, value)
    }

    fn update<'py>(
        &self,
        py: Python<'py>,
        op: Op,
        name: String,
        value: &Bound<'py, PyAny>,
        read_value: bool,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        check_name(&name)?;
        let what = format!("the value for {} to {name:?}", op.verb());
        let request = pb::UpdateRequest {
            value: Some(to_tensor(value, &what)?),
            name,
            read_value,
        };
        let timeout = self.timeout(timeout)?;
        let response = wait_for(py, self.inner.update(op, request, timeout))?;
        Self::updated(py, &response, read_value)
    }
}

#[pymethods]
impl PyPsClient {
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
        if let Some(id) = &session {
            SessionId::new(id).map_err(PyValueError::new_err)?;
        }
        config.session = session;
        let timeout = duration(timeout, "timeout")?;
        let inner = in_runtime(py, || PsClient::connect_lazy(&config))?;
        Ok(Self { inner, timeout })
    }

    #[getter]
    fn address(&self) -> &str {
        self.inner.address()
    }

    #[pyo3(signature = (*, timeout=None))]
    fn get_status(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<PsStatus> {
        let timeout = self.timeout(timeout)?;
        let status = wait_for(py, self.inner.get_status(timeout))?;
        Ok(PsStatus::from(&status))
    }

    #[pyo3(signature = (name, initial_value, *, replace=false, timeout=None))]
    fn create_variable(
        &self,
        py: Python<'_>,
        name: String,
        initial_value: &Bound<'_, PyAny>,
        replace: bool,
        timeout: Option<f64>,
    ) -> PyResult<bool> {
        check_name(&name)?;
        let what = format!("the initial value of {name:?}");
        let request = pb::CreateVariableRequest {
            initial_value: Some(to_tensor(initial_value, &what)?),
            name,
            replace,
        };
        let timeout = self.timeout(timeout)?;
        wait_for(py, self.inner.create_variable(request, timeout))
    }

    #[pyo3(signature = (name, *, timeout=None))]
    fn read<'py>(
        &self,
        py: Python<'py>,
        name: String,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        Ok(self.read_versioned(py, name, timeout)?.0)
    }

    #[pyo3(signature = (name, *, timeout=None))]
    fn read_versioned<'py>(
        &self,
        py: Python<'py>,
        name: String,
        timeout: Option<f64>,
    ) -> PyResult<(Bound<'py, PyAny>, u64)> {
        check_name(&name)?;
        let timeout = self.timeout(timeout)?;
        let response = wait_for(py, self.inner.read(name, timeout))?;
        let value = response
            .value
            .as_ref()
            .ok_or_else(|| missing(py, "the variable's value"))?;
        Ok((to_array(py, value)?, response.version))
    }

    #[pyo3(signature = (name, value, *, read_value=false, timeout=None))]
    fn assign<'py>(
        &self,
        py: Python<'py>,
        name: String,
        value: &Bound<'py, PyAny>,
        read_value: bool,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.update(py, Op::Assign, name, value, read_value, timeout)
    }

    #[pyo3(signature = (name, delta, *, read_value=false, timeout=None))]
    fn assign_add<'py>(
        &self,
        py: Python<'py>,
        name: String,
        delta: &Bound<'py, PyAny>,
        read_value: bool,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.update(py, Op::Add, name, delta, read_value, timeout)
    }

    #[pyo3(signature = (name, delta, *, read_value=false, timeout=None))]
    fn assign_sub<'py>(
        &self,
        py: Python<'py>,
        name: String,
        delta: &Bound<'py, PyAny>,
        read_value: bool,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.update(py, Op::Sub, name, delta, read_value, timeout)
    }

    #[pyo3(signature = (name, indices, updates, *, read_value=false, timeout=None))]
    fn scatter_add<'py>(
        &self,
        py: Python<'py>,
        name: String,
        indices: &Bound<'py, PyAny>,
        updates: &Bound<'py, PyAny>,
        read_value: bool,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        check_name(&name)?;
        let what = format!("the updates for scatter_add to {name:?}");
        let request = pb::ScatterAddRequest {
            indices: to_indices(indices)?,
            updates: Some(to_tensor(updates, &what)?),
            name,
            read_value,
        };
        let timeout = self.timeout(timeout)?;
        let response = wait_for(py, self.inner.scatter_add(request, timeout))?;
        Self::updated(py, &response, read_value)
    }

    #[pyo3(signature = (
        name, slot_prefix, spec, gradient, *, gradient_scale=0.0, read_value=false,
        timeout=None, borrow=false
    ))]
    #[allow(clippy::too_many_arguments)]
    fn apply_update<'py>(
        &self,
        py: Python<'py>,
        name: String,
        slot_prefix: String,
        spec: &optim::PyOptimizerSpec,
        gradient: &Bound<'py, PyAny>,
        gradient_scale: f64,
        read_value: bool,
        timeout: Option<f64>,
        borrow: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        check_name(&name)?;
        let what = format!("the gradient for apply_update to {name:?}");
        let (gradient, lent) = to_tensor_borrowing(gradient, &what, borrow)?;
        let request = pb::ApplyUpdateRequest {
            gradient: Some(gradient),
            optimizer: Some(spec.spec.clone()),
            name,
            slot_prefix,
            read_value,
            gradient_scale,
        };
        let timeout = self.timeout(timeout)?;
        let response = wait_for(py, self.inner.apply_update(request, timeout));
        if let Some(lent) = lent {
            // The call is over (its future dropped): HTTP/2 lets go of the gradient's
            // memory now if it has not yet, and it must not be read once we return.
            if !py.detach(move || lent.wait(LENT_GRACE)) {
                tracing::warn!(
                    "apply_update: the gradient's memory is still referenced {} s after the \
                     call ended",
                    LENT_GRACE.as_secs()
                );
            }
        }
        Self::updated(py, &response?, read_value)
    }

    #[pyo3(signature = (*, timeout=None))]
    fn list_variables<'py>(
        &self,
        py: Python<'py>,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyList>> {
        let timeout = self.timeout(timeout)?;
        let variables = wait_for(py, self.inner.list_variables(timeout))?;
        let list = PyList::empty(py);
        for v in variables {
            let d = PyDict::new(py);
            let dtype = crate::ps::DType::from_pb(v.dtype).map_or("unknown", |d| d.name());
            d.set_item("name", &v.name)?;
            d.set_item("dtype", dtype)?;
            d.set_item("shape", PyTuple::new(py, &v.shape)?)?;
            d.set_item("version", v.version)?;
            list.append(d)?;
        }
        Ok(list)
    }

    #[pyo3(signature = (names=None, *, timeout=None))]
    fn read_many<'py>(
        &self,
        py: Python<'py>,
        names: Option<Vec<String>>,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let timeout = self.timeout(timeout)?;
        let items = wait_for(py, self.inner.read_many(names.unwrap_or_default(), timeout))?;
        let out = PyDict::new(py);
        for item in &items {
            let value = item
                .value
                .as_ref()
                .ok_or_else(|| missing(py, "a variable's value"))?;
            out.set_item(&item.name, to_array(py, value)?)?;
        }
        Ok(out)
    }

    #[pyo3(signature = (values, *, create_missing=false, timeout=None))]
    fn assign_many(
        &self,
        py: Python<'_>,
        values: Vec<(String, Bound<'_, PyAny>)>,
        create_missing: bool,
        timeout: Option<f64>,
    ) -> PyResult<(u32, u32)> {
        let mut variables = Vec::with_capacity(values.len());
        for (name, value) in values {
            check_name(&name)?;
            let what = format!("the value for {name:?}");
            variables.push(pb::NamedTensor {
                value: Some(to_tensor(&value, &what)?),
                name,
                version: 0,
            });
        }
        let request = pb::AssignManyRequest {
            variables,
            create_missing,
        };
        let timeout = self.timeout(timeout)?;
        wait_for(py, self.inner.assign_many(request, timeout))
    }

    #[pyo3(signature = (names, *, timeout=None))]
    fn delete_variables(
        &self,
        py: Python<'_>,
        names: Vec<String>,
        timeout: Option<f64>,
    ) -> PyResult<u32> {
        let timeout = self.timeout(timeout)?;
        wait_for(py, self.inner.delete_variables(names, timeout))
    }

    #[pyo3(signature = (*, timeout=None))]
    fn end_session(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<u64> {
        let timeout = self.timeout(timeout)?;
        Ok(wait_for(py, self.inner.end_session(timeout))?.0)
    }

    #[pyo3(signature = (name, dtype, shape, *, timeout=None))]
    fn reattach(
        &self,
        py: Python<'_>,
        name: String,
        dtype: &str,
        shape: Vec<u64>,
        timeout: Option<f64>,
    ) -> PyResult<Option<Vec<String>>> {
        check_name(&name)?;
        let dtype = crate::ps::DType::from_name(dtype).ok_or_else(|| {
            PyValueError::new_err(format!(
                "reattach of {name:?}: dtype {dtype:?} is not one a ps variable holds; \
                 expected a numpy dtype name such as 'float32'"
            ))
        })?;
        let request = pb::ReattachRequest {
            name,
            dtype: dtype.to_pb().into(),
            shape,
        };
        let timeout = self.timeout(timeout)?;
        wait_for(py, self.inner.reattach(request, timeout))
    }

    fn __repr__(&self) -> String {
        format!("PsClient({:?})", self.inner.address())
    }
}
