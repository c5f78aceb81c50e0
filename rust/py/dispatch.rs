//! `jaxcluster._core.Dispatcher`, `ResultCell` and `PerWorkerResource`: the Python face of
//! `crate::dispatch`. Documented for users in `_core.pyi`.
//!
//! The GIL is held only to convert arguments and results. Every wait (a full queue in
//! `schedule`, `join`, `done`, `ResultCell.wait`) runs with the GIL released and takes it
//! back now and then just long enough to run signal handlers, so Ctrl-C interrupts it
//! (`super::blocking`); `shutdown` waits for the link tasks with the GIL released (the
//! links take it only to log, so they cannot deadlock on it). A settled cell
//! (`super::result_cell`) hands Python an
//! `EncodedValue` or a `ClosureError` (`super::outcome`), and a closure's failure raised
//! here becomes a Python exception through the builder Python registers once
//! (`_core.set_exception_builder`; Python owns rebuilding user exceptions).

use std::sync::Arc;
use std::time::Instant;

use pyo3::exceptions::{PyIndexError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;

use super::blocking::{in_runtime, interrupted, wait_for, wait_in_slices, with_wait_policy};
use super::buffer::{bytes_of, bytes_of_all};
use super::convert::{deadline_after, duration, to_bytes};
use super::dispatch_convert::dispatch_error;
use super::enums::{function_kind_arg, ResourceState};
use super::metrics::Metrics;
use super::outcome::PyEncodedValue;
use super::result_cell::PyResultCell;
use super::status::WorkerStatus;
use crate::dispatch::{
    DispatchError, Dispatcher, DispatcherConfig, EncodedValue, ErrorPolicy, PerWorkerResource,
    Versions,
};
use crate::queue::WaitPolicy;
use crate::rpc::{pb, ClientConfig, WorkerClient};

/// The Python-facing dispatcher; documented in `_core.pyi`.
#[pyclass(frozen, module = "jaxcluster._core", name = "Dispatcher")]
pub struct PyDispatcher {
    /// Shared with the helper thread of an interruptible `refresh_statuses`.
    inner: Arc<Dispatcher>,
    /// How to reach a worker (token, message cap, TLS), for the workers `add_workers`
    /// brings: the same as for the first ones.
    client: ClientConfig,
}

#[pymethods]
impl PyDispatcher {
    #[new]
    // Literal defaults, so `inspect.signature` (and stubtest) show them: TF's queue bound
    // (`DEFAULT_MAX_QUEUE_SIZE`) and 64 MiB (`DEFAULT_MAX_MESSAGE_BYTES`).
    #[pyo3(signature = (
        addresses, *, auth_token = None, max_queue_size = 262_144,
        error_policy = "cancel_all", closure_timeout = None, recovery_timeout = None,
        max_message_bytes = 67_108_864, tls_ca = None, heartbeat_timeout = None,
        max_closure_retries = None, connect_timeout = None, slice_sizes = Vec::new(),
        python_version = None, jax_version = None, jaxcluster_version = None,
        session_id = None
    ))]
    #[allow(clippy::too_many_arguments)] // the Python signature, keyword-only
    #[allow(clippy::needless_pass_by_value)] // PyO3 extracts owned lists
    fn new(
        py: Python<'_>,
        addresses: Vec<String>,
        auth_token: Option<&str>,
        max_queue_size: i64,
        error_policy: &str,
        closure_timeout: Option<f64>,
        recovery_timeout: Option<f64>,
        max_message_bytes: usize,
        tls_ca: Option<Vec<u8>>,
        heartbeat_timeout: Option<f64>,
        max_closure_retries: Option<i64>,
        connect_timeout: Option<f64>,
        slice_sizes: Vec<u32>,
        python_version: Option<String>,
        jax_version: Option<String>,
        jaxcluster_version: Option<String>,
        session_id: Option<String>,
    ) -> PyResult<Self> {
        let tls =
            crate::rpc::security::tls::client_tls(tls_ca, None).map_err(PyValueError::new_err)?;
        if !slice_sizes.is_empty() && slice_sizes.len() != addresses.len() {
            return Err(PyValueError::new_err(format!(
                "slice_sizes has {} entries for {} addresses; expected one per address (or \
                 none)",
                slice_sizes.len(),
                addresses.len()
            )));
        }
        let mut config = DispatcherConfig::from_env().map_err(|e| dispatch_error(py, e))?;
        // <= 0 means unbounded, as for TF's queue.Queue(maxsize).
        config.max_queue_size = usize::try_from(max_queue_size).unwrap_or(0);
        config.error_policy =
            ErrorPolicy::parse(error_policy).map_err(|e| dispatch_error(py, e))?;
        config.closure_timeout = duration(closure_timeout, "closure_timeout")?;
        if config.closure_timeout.is_some_and(|t| t.is_zero()) {
            return Err(PyValueError::new_err(
                "closure_timeout=0 would time out every closure; expected a positive number of \
                 seconds, or None for no limit",
            ));
        }
        if let Some(recovery) = duration(recovery_timeout, "recovery_timeout")? {
            config.recovery_timeout = recovery;
        }
        // None keeps the environment's value or the default; infinity (or a negative
        // count) means no bound.
        if let Some(timeout) = bound(heartbeat_timeout, "heartbeat_timeout")? {
            config.heartbeat_timeout = timeout;
        }
        if let Some(timeout) = bound(connect_timeout, "connect_timeout")? {
            config.connect_timeout = timeout;
        }
        if let Some(retries) = max_closure_retries {
            config.max_closure_retries = u32::try_from(retries).ok();
        }
        config.slice_sizes = slice_sizes;
        // The coordinator's own versions: each link checks its worker's against them.
        if python_version.is_some() || jax_version.is_some() || jaxcluster_version.is_some() {
            config.versions = Some(Versions {
                python: python_version.unwrap_or_default(),
                jax: jax_version.unwrap_or_default(),
                jaxcluster: jaxcluster_version.unwrap_or_default(),
            });
        }
        let mut client = ClientConfig::new(String::new());
        client.auth_token = auth_token.map(str::to_owned);
        client.session = session_id.filter(|s| !s.is_empty());
        client.max_message_bytes = max_message_bytes;
        client.tls = tls;
        let clients = connect_all(py, &client, &addresses)?;
        let inner = Dispatcher::new(clients, config).map_err(|e| dispatch_error(py, e))?;
        Ok(Self {
            inner: Arc::new(inner),
            client,
        })
    }

    #[pyo3(signature = (addresses, *, slice_size = 1))]
    #[allow(clippy::needless_pass_by_value)] // PyO3 extracts owned lists
    fn add_workers(
        &self,
        py: Python<'_>,
        addresses: Vec<String>,
        slice_size: u32,
    ) -> PyResult<Vec<usize>> {
        if slice_size == 0 {
            return Err(PyValueError::new_err(
                "slice_size=0; expected at least 1 host per slice (1: workers of their own)",
            ));
        }
        let clients = connect_all(py, &self.client, &addresses)?;
        self.inner
            .add_slices(clients, slice_size)
            .map_err(|e| dispatch_error(py, e))
    }

    #[allow(clippy::needless_pass_by_value)] // PyO3 extracts owned lists
    fn remove_workers(&self, py: Python<'_>, indices: Vec<usize>) -> PyResult<()> {
        let mut removal = self
            .inner
            .begin_removal(&indices)
            .map_err(|e| dispatch_error(py, e))?;
        // Waits for the leaving links (which never need the GIL) interruptibly; a Ctrl-C
        // stops the wait, not the removal.
        wait_in_slices(py, None, |slice| removal.wait(slice)).map(|_| ())
    }

    #[pyo3(signature = (hash, kind, payload, name = ""))]
    fn register_function(
        &self,
        py: Python<'_>,
        hash: &[u8],
        kind: &Bound<'_, PyAny>,
        payload: PyBackedBytes,
        name: &str,
    ) -> PyResult<()> {
        let kind = function_kind_arg(kind)?;
        self.inner
            .register_named_function(hash, kind, to_bytes(payload), name)
            .map_err(|e| dispatch_error(py, e))
    }

    #[pyo3(signature = (function_hash, args, buffers, resources, *, keep_result_id = None))]
    #[allow(clippy::needless_pass_by_value)] // PyO3 extracts owned lists
    fn schedule(
        &self,
        py: Python<'_>,
        function_hash: &[u8],
        args: PyBackedBytes,
        buffers: Vec<Bound<'_, PyAny>>,
        resources: Vec<PyRef<'_, PyPerWorkerResource>>,
        keep_result_id: Option<u64>,
    ) -> PyResult<PyResultCell> {
        let (args, resources) = closure_inputs(args, &buffers, &resources, "schedule")?;
        let mut closure = self
            .inner
            .closure(function_hash, args, &resources)
            .map_err(|e| dispatch_error(py, e))?;
        if let Some(id) = keep_result_id {
            closure.keep_result(id);
        }
        let cell = PyResultCell {
            inner: closure.cell(),
        };
        // Fast path with the GIL held: appending needs no waiting.
        match self.inner.try_enqueue(closure) {
            Ok(None) => Ok(cell),
            Ok(Some(closure)) => {
                blocking(py, None, |policy| self.inner.enqueue(closure, policy))?;
                Ok(cell)
            }
            Err(e) => Err(dispatch_error(py, e)),
        }
    }

    #[pyo3(signature = (function_hash, *, rebuild = true, name = ""))]
    fn create_resource(
        &self,
        py: Python<'_>,
        function_hash: &[u8],
        rebuild: bool,
        name: &str,
    ) -> PyResult<PyPerWorkerResource> {
        let inner = self
            .inner
            .create_named_resource(function_hash, rebuild, name)
            .map_err(|e| dispatch_error(py, e))?;
        Ok(PyPerWorkerResource { inner })
    }

    #[pyo3(signature = (timeout = None))]
    fn join(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        let deadline = deadline_after(timeout, "join")?;
        blocking(py, deadline, |policy| self.inner.join(policy))
    }

    fn done(&self, py: Python<'_>) -> PyResult<bool> {
        blocking(py, None, |policy| self.inner.done(policy))
    }

    fn metrics(&self) -> Metrics {
        Metrics::from(&self.inner.metrics())
    }

    fn worker_statuses(&self) -> Vec<WorkerStatus> {
        self.inner
            .worker_statuses()
            .iter()
            .map(WorkerStatus::from)
            .collect()
    }

    #[pyo3(signature = (max_age = 1.0, timeout = 1.0))]
    fn refresh_statuses(&self, py: Python<'_>, max_age: f64, timeout: f64) -> PyResult<usize> {
        let max_age = duration(Some(max_age), "refresh_statuses(): max_age")?.unwrap_or_default();
        let timeout = duration(Some(timeout), "refresh_statuses(): timeout")?.unwrap_or_default();
        // On a helper thread, so this one can check for Ctrl-C while the probes run (each
        // bounded by `timeout`; an interrupted refresh finishes in the background).
        let (sender, answered) = std::sync::mpsc::channel();
        let inner = Arc::clone(&self.inner);
        std::thread::Builder::new()
            .name("jaxcluster-refresh-statuses".to_owned())
            .spawn(move || {
                let _ = sender.send(inner.refresh_statuses(max_age, timeout));
            })
            .map_err(|e| PyRuntimeError::new_err(format!("refresh_statuses(): {e}")))?;
        let mut count = 0;
        let slot = &mut count;
        wait_in_slices(py, None, move |slice| match answered.recv_timeout(slice) {
            Ok(answered) => {
                *slot = answered;
                true
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => false,
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => true,
        })?;
        Ok(count)
    }

    // --- one worker: the worker table and work aimed at one worker ---

    #[pyo3(signature = (
        worker, function_hash, args, buffers, resources, *, keep_result_id = None
    ))]
    #[allow(clippy::needless_pass_by_value)] // PyO3 extracts owned lists
    #[allow(clippy::too_many_arguments)] // the Python signature
    fn schedule_on(
        &self,
        py: Python<'_>,
        worker: usize,
        function_hash: &[u8],
        args: PyBackedBytes,
        buffers: Vec<Bound<'_, PyAny>>,
        resources: Vec<PyRef<'_, PyPerWorkerResource>>,
        keep_result_id: Option<u64>,
    ) -> PyResult<PyResultCell> {
        let (args, resources) = closure_inputs(args, &buffers, &resources, "schedule_on")?;
        let inner = self
            .inner
            .schedule_on_keeping(worker, function_hash, args, &resources, keep_result_id)
            .map_err(|e| dispatch_error(py, e))?;
        Ok(PyResultCell { inner })
    }

    // --- dataflow: kept results ---

    fn new_resource_id(&self) -> u64 {
        self.inner.new_resource_id()
    }

    fn release_value(&self, worker: usize, value_id: u64) {
        self.inner.release_value(worker, value_id);
    }

    #[pyo3(signature = (worker, value_id, *, timeout = None))]
    fn read_value(
        &self,
        py: Python<'_>,
        worker: usize,
        value_id: u64,
        timeout: Option<f64>,
    ) -> PyResult<PyEncodedValue> {
        let timeout = duration(timeout, "read_value(): timeout")?;
        Ok(wait_for(py, self.inner.read_value(worker, value_id, timeout))?.into())
    }

    fn worker_free(&self, worker: usize) -> bool {
        self.inner.worker_free(worker)
    }

    fn failure_pending(&self) -> bool {
        self.inner.failure_pending()
    }

    fn watch_preemptions(&self, watch: &Bound<'_, super::cell_watch::PyCellWatch>) {
        self.inner.watch_preemptions(&watch.get().inner);
    }

    #[pyo3(signature = (timeout = None))]
    fn wait_reported(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        let timeout = duration(timeout, "wait_reported(): timeout")?;
        wait_in_slices(py, timeout, |slice| self.inner.wait_reported(slice))
    }

    fn worker_addresses(&self) -> Vec<String> {
        self.inner.addresses()
    }

    fn is_removed(&self, index: usize) -> bool {
        self.inner.is_removed(index)
    }

    fn active_workers(&self) -> Vec<(String, usize)> {
        self.inner.active()
    }

    fn given_up_workers(&self) -> Vec<String> {
        self.inner.given_up()
    }

    fn shutdown(&self, py: Python<'_>) {
        py.detach(|| self.inner.shutdown());
    }

    #[getter]
    fn num_workers(&self) -> usize {
        self.inner.num_workers()
    }

    fn __repr__(&self) -> String {
        let metrics = self.inner.metrics();
        let addresses: Vec<String> = metrics
            .workers
            .iter()
            .filter(|worker| worker.state != crate::dispatch::LinkState::Removed)
            .map(|worker| worker.address.clone())
            .collect();
        format!(
            "Dispatcher(workers={addresses:?}, queued={}, inflight={}, shut_down={})",
            metrics.queued,
            metrics.inflight,
            if self.inner.is_shut_down() {
                "True"
            } else {
                "False"
            }
        )
    }
}

/// A dispatcher garbage-collected without `shutdown()` (a coordinator never closed) is
/// shut down here, with the GIL released: its links log as they stop (each closure they
/// cancel), logging takes the GIL, and the thread running this holds it while it awaits them.
/// Dropped with the GIL held, the dispatcher deadlocked against its own links.
impl Drop for PyDispatcher {
    fn drop(&mut self) {
        if !self.inner.is_shut_down() {
            Python::attach(|py| py.detach(|| self.inner.shutdown()));
        }
    }
}

/// The Python-facing per-worker resource handle; documented in `_core.pyi`.
#[pyclass(frozen, module = "jaxcluster._core", name = "PerWorkerResource")]
pub struct PyPerWorkerResource {
    inner: PerWorkerResource,
}

#[pymethods]
impl PyPerWorkerResource {
    #[getter]
    fn num_workers(&self) -> usize {
        self.inner.num_workers()
    }

    #[getter]
    fn resource_id(&self) -> u64 {
        self.inner.id()
    }

    fn state(&self, worker: i64) -> PyResult<ResourceState> {
        let workers = self.inner.num_workers();
        match usize::try_from(worker) {
            Ok(index) if index < workers => Ok(self.inner.state(index).status().into()),
            _ => Err(PyIndexError::new_err(format!(
                "PerWorkerResource.state(): worker {worker} is out of range; expected 0 to {}",
                workers.saturating_sub(1)
            ))),
        }
    }

    fn reattached(&self, worker: i64) -> bool {
        usize::try_from(worker).is_ok_and(|index| self.inner.is_reattached(index))
    }

    #[pyo3(signature = (worker, args, buffers=Vec::new()))]
    #[allow(clippy::needless_pass_by_value)] // PyO3 extracts owned arguments
    fn set_build_args(
        &self,
        worker: i64,
        args: Bound<'_, PyAny>,
        buffers: Vec<Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let workers = self.inner.num_workers();
        let index = usize::try_from(worker)
            .ok()
            .filter(|index| *index < workers)
            .ok_or_else(|| {
                PyIndexError::new_err(format!(
                    "PerWorkerResource.set_build_args(): worker {worker} is out of range; \
                     expected 0 to {}",
                    workers.saturating_sub(1)
                ))
            })?;
        let value = pb::Value {
            pickle: bytes_of(&args, "args")?,
            buffers: bytes_of_all(&buffers, "each buffer")?,
        };
        self.inner.set_build_args(index, value);
        Ok(())
    }

    fn has_build_args(&self, worker: i64) -> bool {
        usize::try_from(worker).is_ok_and(|index| self.inner.has_build_args(index))
    }

    fn release(&self) {
        self.inner.release();
    }

    fn __repr__(&self) -> String {
        let states: Vec<&str> = (0..self.inner.num_workers())
            .map(|worker| self.inner.state(worker).label())
            .collect();
        format!(
            "PerWorkerResource(resource_id={}, states={states:?})",
            self.inner.id()
        )
    }
}

/// A lazily connecting client per address, configured as `template` says.
fn connect_all(
    py: Python<'_>,
    template: &ClientConfig,
    addresses: &[String],
) -> PyResult<Vec<WorkerClient>> {
    in_runtime(py, || {
        addresses
            .iter()
            .map(|address| {
                let mut client = template.clone();
                client.address.clone_from(address);
                WorkerClient::connect_lazy(&client)
            })
            .collect::<Result<Vec<_>, _>>()
    })
}

/// Runs a blocking dispatcher call with the GIL released, interruptibly.
fn blocking<R, F>(py: Python<'_>, deadline: Option<Instant>, op: F) -> PyResult<R>
where
    R: Send,
    F: FnOnce(&mut WaitPolicy<'_>) -> Result<R, DispatchError> + Send,
{
    let (outcome, raised) = with_wait_policy(py, deadline, op);
    outcome.map_err(|e| match e {
        DispatchError::Interrupted => interrupted(raised),
        e => dispatch_error(py, e),
    })
}

/// A bound in seconds from Python: `None` keeps the configured value (`Ok(None)`),
/// infinity means no bound (`Some(None)`), a positive number that many seconds.
#[allow(clippy::option_option)]
fn bound(seconds: Option<f64>, what: &str) -> PyResult<Option<Option<std::time::Duration>>> {
    match seconds {
        None => Ok(None),
        Some(s) if s == f64::INFINITY => Ok(Some(None)),
        // Longer than anything a clock holds is no bound either.
        Some(s) if s > super::convert::LONGEST_SECONDS => Ok(Some(None)),
        Some(s) if s.is_finite() && s > 0.0 => {
            Ok(Some(Some(std::time::Duration::from_secs_f64(s))))
        }
        Some(s) => Err(PyValueError::new_err(format!(
            "{what}={s} is not valid; expected a positive number of seconds, or None for no \
             bound"
        ))),
    }
}

/// A closure's arguments and the per-worker resources they refer to, as `schedule` and
/// `schedule_on` both take them from Python.
fn closure_inputs(
    args: PyBackedBytes,
    buffers: &[Bound<'_, PyAny>],
    resources: &[PyRef<'_, PyPerWorkerResource>],
    method: &str,
) -> PyResult<(EncodedValue, Vec<PerWorkerResource>)> {
    let args = EncodedValue {
        pickle: to_bytes(args),
        buffers: bytes_of_all(buffers, &format!("Dispatcher.{method}(): each buffer"))?,
    };
    Ok((args, resources.iter().map(|r| r.inner.clone()).collect()))
}
