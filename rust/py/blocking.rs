//! Running work on the shared tokio runtime from a Python thread.
//!
//! Every binding that waits goes through here, so the two rules hold everywhere: the GIL is
//! released while Rust waits (other Python threads keep running, and a tokio task that
//! needs the GIL cannot deadlock against us), and a wait that can last long wakes up every
//! [`SIGNAL_POLL`] to take the GIL just long enough to run Python's signal handlers, so
//! Ctrl-C (or any handler that raises) ends it. [`detach_interruptible`] is that one wait;
//! the others here are shapes of it (a future, a wait in slices, a [`WaitPolicy`]).

use std::future::Future;
use std::time::{Duration, Instant};

use pyo3::exceptions::{PyKeyboardInterrupt, PyRuntimeError};
use pyo3::prelude::*;
use tokio::runtime::Runtime;
use tokio::task::JoinHandle;

use super::errors::rpc_error;
use crate::queue::WaitPolicy;
use crate::rpc::RpcError;
use crate::runtime::runtime;

/// How often a blocked call on Python's main thread takes the GIL to run signal handlers:
/// the longest Ctrl-C waits to be noticed. Each check costs a GIL round trip (a few
/// microseconds), so 20 a second is free for a wait and quick for a person.
pub(crate) const SIGNAL_POLL: Duration = Duration::from_millis(50);

/// How often a blocked call on any other thread wakes. Python runs signal handlers only on
/// its main thread, so a check elsewhere does nothing: an idle worker's executor and value
/// reader waited in 50 ms slices and woke 40 times a second for nothing (an idle worker
/// was at 49 wake-ups a second). The waits end when notified, not by polling; the slice is
/// kept, long, only as a bound should a notification ever be missed.
const OFF_MAIN_POLL: Duration = Duration::from_secs(1);

thread_local! {
    /// Whether this OS thread is Python's main thread, learnt on its first wait (a thread
    /// never becomes or stops being the main thread).
    static ON_MAIN_THREAD: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

/// How long a wait on the calling thread may block before it checks for signals:
/// [`SIGNAL_POLL`] on Python's main thread, where handlers run, [`OFF_MAIN_POLL`] elsewhere.
pub(crate) fn signal_poll(py: Python<'_>) -> Duration {
    let on_main = ON_MAIN_THREAD.with(|cached| {
        if let Some(known) = cached.get() {
            return known;
        }
        let known = is_main_thread(py).unwrap_or(true); // unknown: poll as the main thread
        cached.set(Some(known));
        known
    });
    if on_main {
        SIGNAL_POLL
    } else {
        OFF_MAIN_POLL
    }
}

/// `threading.get_ident() == threading.main_thread().ident`.
fn is_main_thread(py: Python<'_>) -> PyResult<bool> {
    let threading = py.import("threading")?;
    let main = threading.call_method0("main_thread")?.getattr("ident")?;
    let current = threading.call_method0("get_ident")?;
    main.eq(current)
}

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

/// Runs `wait` with the GIL released, handing it a `check` to call every [`SIGNAL_POLL`]
/// while it blocks. `check` takes the GIL, runs Python's signal handlers and returns `true`
/// once one raised; `wait` should then stop. Returns what `wait` returned and the
/// exception the handler raised, if one did (see [`interrupted`]).
pub(crate) fn detach_interruptible<R: Send>(
    py: Python<'_>,
    wait: impl FnOnce(&mut dyn FnMut() -> bool) -> R + Send,
) -> (R, Option<PyErr>) {
    let mut raised: Option<PyErr> = None;
    let result = py.detach(|| {
        // The method path is not general enough over the GIL lifetime, hence the closure.
        #[allow(clippy::redundant_closure_for_method_calls)]
        let mut check = || match Python::attach(|py| py.check_signals()) {
            Ok(()) => false,
            Err(err) => {
                raised = Some(err);
                true
            }
        };
        wait(&mut check)
    });
    (result, raised)
}

/// The exception for a wait a signal cut short: the one its handler raised, else
/// `KeyboardInterrupt`.
pub(crate) fn interrupted(raised: Option<PyErr>) -> PyErr {
    raised.unwrap_or_else(|| PyKeyboardInterrupt::new_err("interrupted while waiting"))
}

/// Runs a blocking core operation (a queue or dispatcher call taking a [`WaitPolicy`])
/// until `deadline`, interruptibly. `Ok` is the operation's own result; `Err(raised)`
/// means the operation reported an interrupt and carries the handler's exception.
pub(crate) fn with_wait_policy<R: Send>(
    py: Python<'_>,
    deadline: Option<Instant>,
    op: impl FnOnce(&mut WaitPolicy<'_>) -> R + Send,
) -> (R, Option<PyErr>) {
    let every = signal_poll(py);
    // These waits do not spin: the runtime's driver thread does the work they wait for.
    crate::runtime::lend::nudge();
    detach_interruptible(py, |check| {
        let mut policy = WaitPolicy::until(deadline).interruptible(every, check);
        op(&mut policy)
    })
}

/// Calls `ready(slice)` (which may block up to `slice`, a [`signal_poll`]) until it returns `true`, the
/// `timeout` passes (`false`), or a signal handler raises (its exception).
pub(crate) fn wait_in_slices(
    py: Python<'_>,
    timeout: Option<Duration>,
    mut ready: impl FnMut(Duration) -> bool + Send,
) -> PyResult<bool> {
    let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
    let every = signal_poll(py);
    let (result, raised) = detach_interruptible(py, |check| loop {
        let slice = deadline.map_or(every, |d| {
            d.saturating_duration_since(Instant::now()).min(every)
        });
        if ready(slice) {
            return Some(true);
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Some(false);
        }
        if check() {
            return None;
        }
    });
    result.ok_or_else(|| interrupted(raised))
}

/// Runs `future` on the shared runtime with the GIL released, checking for signals every
/// [`SIGNAL_POLL`]; a handler that raises drops (cancels) the future.
pub(crate) fn wait_for<F, T>(py: Python<'_>, future: F) -> PyResult<T>
where
    F: Future<Output = Result<T, RpcError>> + Send,
    T: Send,
{
    let rt = runtime_or_err()?;
    let mut future = Box::pin(future);
    let every = signal_poll(py);
    let (result, raised) = detach_interruptible(py, |check| loop {
        // The timer must be created inside the runtime, hence the async block.
        let polled = rt.block_on(async { tokio::time::timeout(every, &mut future).await });
        match polled {
            Ok(result) => return Some(result),
            Err(_elapsed) if check() => return None,
            Err(_elapsed) => {}
        }
    });
    match result {
        Some(result) => result.map_err(|e| rpc_error(py, &e)),
        None => Err(interrupted(raised)),
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
