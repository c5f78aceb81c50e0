//! `jaxcluster._core.WorkerServer`: the Python executor's view of the Rust worker server.
//! `next_job` waits with the GIL released and hands out a `WorkerJob` (`worker_job.rs`);
//! the GIL is held only while Python runs a job and while it builds the reply.

use std::sync::Arc;

use pyo3::exceptions::{PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use super::blocking::{block_detached, finish_serving, runtime_or_err, wait_for, wait_in_slices};
use super::convert::{duration, server_limits};
use super::metrics::LatencyHistogram;
use super::outcome::PyEncodedValue;
use super::status::WorkerReport;
use super::value_reads::PyValueRead;
use super::worker_job::PyWorkerJob;
use crate::rpc::pb;
use crate::rpc::server::connections::{
    DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_STREAMS_PER_CONNECTION,
};
use crate::rpc::server::sessions::Held;
use crate::rpc::wire::limits::DEFAULT_MAX_MESSAGE_BYTES;
use crate::rpc::wire::session::SessionId;
use crate::worker::reads::ReadPop;
use crate::worker::store::DEFAULT_MAX_FUNCTION_BYTES;
use crate::worker::{Pop, WorkerConfig, WorkerError, WorkerServer};

/// Least time a shutdown waits for acknowledgements of the last answers, even when the
/// running closure used up its drain deadline.
const ACK_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

fn worker_error(error: WorkerError) -> PyErr {
    match error {
        WorkerError::Config(message) => PyValueError::new_err(message),
        WorkerError::Bind { .. } => PyOSError::new_err(error.to_string()),
        WorkerError::Serve(message) => PyRuntimeError::new_err(message),
    }
}

/// A worker's gRPC server (see `_core.pyi` for the Python-facing docs).
#[pyclass(module = "jaxcluster._core", name = "WorkerServer", frozen)]
pub struct PyWorkerServer {
    inner: Arc<WorkerServer>,
}

#[pymethods]
impl PyWorkerServer {
    #[new]
    #[pyo3(signature = (address="127.0.0.1:0", *, auth_token=None, worker_index=0,
                        max_message_bytes=DEFAULT_MAX_MESSAGE_BYTES, devices=Vec::new(),
                        jax_version=String::new(), platform=String::new(),
                        device_kind=String::new(),
                        tls_cert=None, tls_key=None,
                        max_connections=DEFAULT_MAX_CONNECTIONS,
                        max_streams_per_connection=DEFAULT_MAX_STREAMS_PER_CONNECTION,
                        handshake_timeout=5.0,
                        max_function_bytes=DEFAULT_MAX_FUNCTION_BYTES,
                        previous_exit=String::new(), python_version=None,
                        slice_index=None, slice_rank=None, slice_size=None, state_ttl=3600.0,
                        peer_tls_ca=None, peer_tls_domain=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        address: &str,
        auth_token: Option<String>,
        worker_index: i64,
        max_message_bytes: usize,
        devices: Vec<(String, String)>,
        jax_version: String,
        platform: String,
        device_kind: String,
        tls_cert: Option<Vec<u8>>,
        tls_key: Option<Vec<u8>>,
        max_connections: usize,
        max_streams_per_connection: u32,
        handshake_timeout: f64,
        max_function_bytes: usize,
        previous_exit: String,
        python_version: Option<String>,
        slice_index: Option<u32>,
        slice_rank: Option<u32>,
        slice_size: Option<u32>,
        state_ttl: f64,
        peer_tls_ca: Option<Vec<u8>>,
        peer_tls_domain: Option<String>,
    ) -> PyResult<Self> {
        let peer_tls = crate::rpc::security::tls::client_tls(peer_tls_ca, peer_tls_domain)
            .map_err(PyValueError::new_err)?;
        let state_ttl = duration(Some(state_ttl), "state_ttl")?.unwrap_or_default();
        let slice = slice_membership(slice_index, slice_rank, slice_size)?;
        let tls = crate::rpc::security::tls::server_tls(tls_cert, tls_key)
            .map_err(PyValueError::new_err)?;
        let limits = server_limits(
            max_connections,
            max_streams_per_connection,
            handshake_timeout,
        )?;
        let config = WorkerConfig {
            limits,
            max_function_bytes,
            previous_exit,
            slice,
            tls,
            address: address.to_owned(),
            auth_token,
            worker_index,
            max_message_bytes,
            devices: devices
                .into_iter()
                .map(|(name, device_type)| pb::Device { name, device_type })
                .collect(),
            jax_version,
            // This interpreter's unless the caller says (a test plays another Python).
            python_version: python_version.unwrap_or_else(|| {
                let v = py.version_info();
                format!("{}.{}.{}", v.major, v.minor, v.patch)
            }),
            platform,
            device_kind,
            state_ttl,
            peer_tls,
        };
        let server = block_detached(py, WorkerServer::start(config))?.map_err(worker_error)?;
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
    fn draining(&self) -> bool {
        self.inner.is_draining()
    }

    #[pyo3(signature = (timeout=None, *, while_draining=false))]
    fn next_job(
        &self,
        py: Python<'_>,
        timeout: Option<f64>,
        while_draining: bool,
    ) -> PyResult<Option<PyWorkerJob>> {
        let timeout = duration(timeout, "timeout")?;
        // A job already queued (the usual case when closures are pipelined) is taken with
        // the GIL held: releasing and re-taking it would cost more than the lookup.
        let mut found = match self.inner.try_next_job() {
            Pop::Empty => None,
            other => Some(other),
        };
        if found.is_none() {
            let server = &self.inner;
            let pop = |slice| {
                if while_draining {
                    server.next_job_while_draining(slice)
                } else {
                    server.next_job(slice)
                }
            };
            wait_in_slices(py, timeout, |slice| match pop(slice) {
                Pop::Empty => false,
                other => {
                    found = Some(other);
                    true
                }
            })?;
        }
        match found {
            None | Some(Pop::Empty | Pop::Drained) => Ok(None),
            Some(Pop::Job(job)) => Ok(Some(PyWorkerJob::new(job))),
            Some(Pop::Busy) => Err(PyRuntimeError::new_err(
                "next_job() was called while the previous job is still unanswered; a worker \
                 runs one job at a time, so answer it with reply_ok, reply_error or \
                 reply_status first",
            )),
        }
    }

    fn begin_shutdown(&self) -> bool {
        self.inner.begin_shutdown()
    }

    #[pyo3(signature = (source, deadline=0.0, detail=""))]
    fn preempt(&self, source: &str, deadline: f64, detail: &str) -> bool {
        self.inner.preempt(source, deadline, detail)
    }

    #[pyo3(signature = (timeout=None))]
    fn wait_idle(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        let timeout = duration(timeout, "timeout")?;
        let server = &self.inner;
        wait_in_slices(py, timeout, |slice| server.wait_idle(slice))
    }

    #[pyo3(signature = (timeout=None))]
    fn shutdown(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        self.inner.begin_shutdown();
        let started = std::time::Instant::now();
        let idle = self.wait_idle(py, timeout)?;
        if idle {
            // The answers just sent must reach their coordinators before the process may
            // exit (else it runs those closures again elsewhere): within the drain
            // deadline, but a closure answered at the deadline still gets a moment.
            let left = duration(timeout, "timeout")?
                .map(|t| t.saturating_sub(started.elapsed()).max(ACK_GRACE));
            let server = &self.inner;
            wait_in_slices(py, left, |slice| server.wait_acknowledged(slice))?;
        }
        let unacknowledged = self.inner.release_streams();
        if !unacknowledged.is_empty() {
            tracing::warn!(
                target: crate::log_target::WORKER,
                "worker {} stopped before its coordinator acknowledged the answers to \
                 closure(s) {unacknowledged:?}: they may run again on another worker",
                self.inner.status().worker_index,
            );
        }
        let logging = self.inner.take_pending_logs();
        if !logging.is_empty() {
            // Bounded: a log line is not worth holding up a shutdown for.
            block_detached(py, async {
                let until = tokio::time::Instant::now() + std::time::Duration::from_secs(1);
                for task in logging {
                    let _ = tokio::time::timeout_at(until, task).await;
                }
            })?;
        }
        if let Some(task) = self.inner.stop_serving() {
            if let Some(e) = finish_serving(py, task)? {
                return Err(worker_error(WorkerError::Serve(e.to_string())));
            }
        }
        Ok(idle)
    }

    fn status(&self) -> WorkerReport {
        WorkerReport::from(&self.inner.status())
    }

    #[pyo3(signature = (session, *, values, bytes, named))]
    fn set_session_held(
        &self,
        session: &str,
        values: u64,
        bytes: u64,
        named: bool,
    ) -> PyResult<()> {
        let session = SessionId::new(session).map_err(PyValueError::new_err)?;
        self.inner.set_session_held(
            &session,
            Held {
                values,
                bytes,
                named,
            },
        );
        Ok(())
    }

    #[pyo3(signature = (timeout=None))]
    fn next_read(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<PyValueRead>> {
        let timeout = duration(timeout, "timeout")?;
        let mut found = None;
        wait_in_slices(py, timeout, |slice| match self.inner.next_read(slice) {
            ReadPop::Empty => false,
            other => {
                found = Some(other);
                true
            }
        })?;
        Ok(match found {
            Some(ReadPop::Read(read)) => Some(PyValueRead::new(read)),
            _ => None,
        })
    }

    #[getter]
    fn reads_closed(&self) -> bool {
        self.inner.reads_closed()
    }

    #[pyo3(signature = (holder, value_id, *, session, timeout=None))]
    fn pull_value(
        &self,
        py: Python<'_>,
        holder: &str,
        value_id: u64,
        session: &str,
        timeout: Option<f64>,
    ) -> PyResult<PyEncodedValue> {
        let session = SessionId::new(session).map_err(PyValueError::new_err)?;
        let timeout = duration(timeout, "timeout")?;
        let _guard = runtime_or_err()?.enter();
        let value = wait_for(
            py,
            self.inner.pull_value(holder, &session, value_id, timeout),
        )?;
        Ok(PyEncodedValue::from_message(value))
    }

    #[getter]
    fn pulls_use_tls(&self) -> bool {
        self.inner.pulls_use_tls()
    }

    fn execution_seconds(&self) -> LatencyHistogram {
        LatencyHistogram::from(&self.inner.execution_times())
    }

    fn __repr__(&self) -> String {
        format!("WorkerServer(address={:?})", self.address())
    }
}

/// The slice a worker server reports: all three of index, rank and size, or none.
fn slice_membership(
    index: Option<u32>,
    rank: Option<u32>,
    size: Option<u32>,
) -> PyResult<Option<pb::SliceMembership>> {
    match (index, rank, size) {
        (None, None, None) => Ok(None),
        (Some(index), Some(rank), Some(size)) if size >= 1 && rank < size => {
            Ok(Some(pb::SliceMembership { index, rank, size }))
        }
        (Some(_), Some(rank), Some(size)) => Err(PyValueError::new_err(format!(
            "slice_rank={rank} and slice_size={size}; expected a size of at least 1 and a \
             rank below it"
        ))),
        _ => Err(PyValueError::new_err(
            "slice_index, slice_rank and slice_size go together: give all three or none",
        )),
    }
}
