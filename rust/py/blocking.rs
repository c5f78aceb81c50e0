//! Running work on the shared tokio runtime from a Python thread.
//!
//! Every binding that waits goes through here, so the two rules hold everywhere: the GIL is
//! released while Rust waits (other Python threads keep running, and a tokio task that
//! needs the GIL cannot deadlock against us), and a wait that can last long wakes up often
//! enough for Ctrl-C to get through.

use std::future::Future;
use std::time::Duration;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use tokio::runtime::Runtime;
use tokio::task::JoinHandle;

use super::errors::rpc_error;
use crate::rpc::RpcError;
use crate::runtime::runtime;

/// How often a blocking RPC wakes up to let Python handle signals.
const SIGNAL_POLL: Duration = Duration::from_millis(100);

/// How long stopping a server lets in-flight RPCs complete after closing the listener.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// The shared runtime, or a `RuntimeError` saying why there is none (e.g. after a fork).
pub(crate) fn runtime_or_err() -> PyResult<&'static Runtime> {
    runtime().map_err(|e| PyRuntimeError::new_err(e.to_string()))
}

/// Runs `make` inside the shared runtime's context: a lazily connecting client spawns its
/// connection's task there, and a tonic channel only works on the runtime that spawned it.
pub(crate) fn in_runtime<T>(
    py: Python<'_>,
    make: impl FnOnce() -> Result<T, RpcError>,
) -> PyResult<T> {
    let _guard = runtime_or_err()?.enter();
    make().map_err(|e| rpc_error(py, &e))
}

/// Runs a short `future` (one that cannot hang, such as binding a server) to completion
/// with the GIL released; it is not interruptible.
pub(crate) fn block_detached<F>(py: Python<'_>, future: F) -> PyResult<F::Output>
where
    F: Future + Send,
    F::Output: Send,
{
    let rt = runtime_or_err()?;
    Ok(py.detach(|| rt.block_on(future)))
}

/// Runs `future` on the shared runtime with the GIL released, checking for signals
/// between short waits; a pending `KeyboardInterrupt` drops (cancels) the future.
pub(crate) fn wait_for<F, T>(py: Python<'_>, future: F) -> PyResult<T>
where
    F: Future<Output = Result<T, RpcError>> + Send,
    T: Send,
{
    let rt = runtime_or_err()?;
    let mut future = Box::pin(future);
    loop {
        // The timer must be created inside the runtime, hence the async block.
        let polled = py
            .detach(|| rt.block_on(async { tokio::time::timeout(SIGNAL_POLL, &mut future).await }));
        match polled {
            Ok(result) => return result.map_err(|e| rpc_error(py, &e)),
            Err(_elapsed) => py.check_signals()?,
        }
    }
}

/// Waits up to [`STOP_GRACE`] for a stopped server's serving task, aborting it if it
/// overruns. Returns the error the server failed with, if any; a task that was aborted or
/// panicked counts as stopped, since the server is gone either way.
pub(crate) fn finish_serving(
    py: Python<'_>,
    task: JoinHandle<Result<(), tonic::transport::Error>>,
) -> PyResult<Option<tonic::transport::Error>> {
    let abort = task.abort_handle();
    let finished = block_detached(py, async { tokio::time::timeout(STOP_GRACE, task).await })?;
    Ok(match finished {
        Ok(Ok(Err(e))) => Some(e),
        Ok(Ok(Ok(())) | Err(_)) => None,
        Err(_elapsed) => {
            abort.abort();
            None
        }
    })
}
