//! `jaxcluster._core.ClosureQueue`: the closure queue holding Python closures.
//!
//! Fast path: `put`/`get` first try the non-blocking core operation while holding the GIL
//! (safe because no holder of the queue's lock ever waits for the GIL, see
//! `crate::queue`), which costs one lock round trip and no GIL hand-off. Only when the
//! call must block is the GIL released, and then the wait is the one interruptible wait of
//! `super::blocking`, so Ctrl-C interrupts a blocked `get()` in the main thread.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use pyo3::exceptions::{
    PyAssertionError, PyBaseException, PyKeyboardInterrupt, PyTypeError, PyValueError,
};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyType;

use super::blocking::with_wait_policy;
use super::errors::new_error;
use crate::queue::{Cancel, ClosureQueue, QueueError, Tag, TryGetError, WaitPolicy};

/// A queued Python closure; cancelling it calls its `mark_cancelled()`.
struct PyClosure(Py<PyAny>);

impl Cancel for PyClosure {
    fn cancel(self) {
        Python::attach(|py| {
            let closure = self.0.into_bound(py);
            if let Err(err) = closure.call_method0(intern!(py, "mark_cancelled")) {
                // Every closure must be cancelled even if one of them misbehaves, and the
                // caller is raising something else: report it the way `__del__` errors are.
                err.write_unraisable(py, Some(&closure));
            }
        });
    }
}

type Core = ClosureQueue<PyClosure, Py<PyBaseException>>;

/// The Python-facing queue; documented in `_core.pyi`.
#[pyclass(frozen, module = "jaxcluster._core", name = "ClosureQueue")]
pub struct PyClosureQueue {
    /// Boxed: the core keeps hot counters on their own 128-byte-aligned cache line, and
    /// Python allocates objects with only 16-byte alignment.
    core: Box<Core>,
    max_size: i64,
    known_type: KnownType,
}

#[pymethods]
impl PyClosureQueue {
    #[new]
    // TF's default _CLOSURE_QUEUE_MAX_SIZE; a literal so the text signature shows it.
    #[pyo3(signature = (max_size = 262_144))]
    fn new(max_size: i64) -> Self {
        // <= 0 means unbounded, as for TF's queue.Queue(maxsize).
        let bound = usize::try_from(max_size).unwrap_or(0);
        Self {
            core: Box::new(ClosureQueue::new(bound)),
            max_size,
            known_type: KnownType::default(),
        }
    }

    #[pyo3(signature = (closure, tag = None))]
    fn put(&self, py: Python<'_>, closure: Bound<'_, PyAny>, tag: Option<Tag>) -> PyResult<()> {
        self.known_type.require_cancellable(&closure, "put")?;
        match self.core.try_put(PyClosure(closure.unbind()), tag) {
            Ok(()) => Ok(()),
            Err(refused) => {
                let item = refused.into_inner();
                blocking(py, None, |policy| self.core.put_with(item, tag, policy))
            }
        }
    }

    #[pyo3(signature = (timeout = None, tag = None))]
    fn get(
        &self,
        py: Python<'_>,
        timeout: Option<f64>,
        tag: Option<Tag>,
    ) -> PyResult<Option<Py<PyAny>>> {
        let deadline = deadline_after(timeout, "get")?;
        match self.core.try_get(tag) {
            Ok(item) => Ok(Some(item.0)),
            Err(TryGetError::Stopped) => Ok(None),
            Err(TryGetError::Empty) => {
                let item = blocking(py, deadline, |policy| self.core.get_with(tag, policy))?;
                Ok(item.map(|item| item.0))
            }
        }
    }

    fn put_back(&self, py: Python<'_>, closure: Bound<'_, PyAny>) -> PyResult<()> {
        self.known_type.require_cancellable(&closure, "put_back")?;
        self.core
            .put_back(PyClosure(closure.unbind()))
            .map_err(|err| to_pyerr(py, err, None))
    }

    fn mark_finished(&self, py: Python<'_>) -> PyResult<()> {
        self.core
            .mark_finished()
            .map_err(|err| to_pyerr(py, err, None))
    }

    fn mark_failed(&self, py: Python<'_>, exc: Bound<'_, PyAny>) -> PyResult<()> {
        let exc = match exc.cast_into::<PyBaseException>() {
            Ok(exc) => exc,
            Err(err) => {
                let seen = err.into_inner();
                return Err(PyTypeError::new_err(format!(
                    "ClosureQueue.mark_failed() takes the exception the closure raised (a \
                     BaseException instance), got {} of type {}",
                    short_repr(&seen),
                    type_name(&seen)
                )));
            }
        };
        self.core
            .mark_failed(exc.unbind())
            .map_err(|err| to_pyerr(py, err, None))
    }

    #[pyo3(signature = (timeout = None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        let deadline = deadline_after(timeout, "wait")?;
        blocking(py, deadline, |policy| self.core.wait_with(policy))
    }

    fn done(&self, py: Python<'_>) -> PyResult<bool> {
        blocking(py, None, |policy| self.core.done_with(policy))
    }

    fn stop(&self) {
        self.core.stop();
    }

    fn __len__(&self) -> usize {
        self.core.len()
    }

    #[getter]
    fn inflight(&self) -> usize {
        self.core.inflight()
    }

    #[getter]
    fn max_size(&self) -> i64 {
        self.max_size
    }

    fn __repr__(&self) -> String {
        format!(
            "ClosureQueue(max_size={}, queued={}, inflight={}, stopped={})",
            self.max_size,
            self.core.len(),
            self.core.inflight(),
            if self.core.is_stopped() {
                "True"
            } else {
                "False"
            }
        )
    }
}

/// Runs a blocking core operation with the GIL released, interruptibly
/// (`super::blocking`); a signal handler's exception (e.g. `KeyboardInterrupt`) is raised.
fn blocking<R, F>(py: Python<'_>, deadline: Option<Instant>, op: F) -> PyResult<R>
where
    R: Send,
    F: FnOnce(&mut WaitPolicy<'_>) -> Result<R, QueueError<Py<PyBaseException>>> + Send,
{
    let (outcome, raised) = with_wait_policy(py, deadline, op);
    outcome.map_err(|err| to_pyerr(py, err, raised))
}

/// The one mapping from queue errors to Python exceptions.
fn to_pyerr(
    py: Python<'_>,
    err: QueueError<Py<PyBaseException>>,
    interrupt: Option<PyErr>,
) -> PyErr {
    match err {
        // The closure's own exception object, raised as is.
        QueueError::Failed(exc) => PyErr::from_value(exc.bind(py).clone().into_any()),
        QueueError::NotInflight { .. } => PyAssertionError::new_err(format!("ClosureQueue.{err}")),
        QueueError::Stopped => new_error(
            py,
            "CancelledError",
            "ClosureQueue.put(): the queue was stopped, so the closure was cancelled \
             (mark_cancelled() was called) instead of queued"
                .to_owned(),
        ),
        QueueError::TimedOut => {
            new_error(py, "DeadlineExceededError", format!("ClosureQueue: {err}"))
        }
        QueueError::Interrupted => interrupt.unwrap_or_else(|| {
            PyKeyboardInterrupt::new_err("ClosureQueue: interrupted while waiting")
        }),
    }
}

/// Converts a Python timeout in seconds to a deadline; `None` or `inf` mean no deadline.
fn deadline_after(timeout: Option<f64>, operation: &str) -> PyResult<Option<Instant>> {
    let Some(seconds) = timeout else {
        return Ok(None);
    };
    if seconds.is_nan() || seconds < 0.0 {
        // Spelled as Python prints it ("nan", not Rust's "NaN").
        let seen = if seconds.is_nan() {
            "nan".to_owned()
        } else {
            seconds.to_string()
        };
        return Err(PyValueError::new_err(format!(
            "ClosureQueue.{operation}(): timeout must be None or a non-negative number of \
             seconds, got {seen}"
        )));
    }
    Ok(Duration::try_from_secs_f64(seconds)
        .ok()
        .and_then(|timeout| Instant::now().checked_add(timeout)))
}

/// The last closure type found to have `mark_cancelled()`, so the usual case (every
/// closure of one class) checks a pointer instead of looking the attribute up; that lookup
/// was about a third of `put()`'s cost. The strong reference keeps the cached type alive,
/// so its address cannot be reused by another type while it is cached.
#[derive(Default)]
struct KnownType {
    address: AtomicUsize,
    keep_alive: Mutex<Option<Py<PyType>>>,
}

impl KnownType {
    /// Checks that `closure` can be cancelled, so a bad item fails at `put` rather than as
    /// an unraisable error much later.
    fn require_cancellable(&self, closure: &Bound<'_, PyAny>, operation: &str) -> PyResult<()> {
        let address = closure.get_type_ptr() as usize;
        if address == self.address.load(Ordering::Acquire) {
            return Ok(());
        }
        let name = intern!(closure.py(), "mark_cancelled");
        let ty = closure.get_type();
        if ty.hasattr(name)? {
            let mut slot = self
                .keep_alive
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let previous = slot.replace(ty.unbind());
            self.address.store(address, Ordering::Release);
            drop(slot);
            drop(previous); // may free a type: not under our lock
            return Ok(());
        }
        if closure.hasattr(name)? {
            return Ok(()); // set on the instance: fine, but not cacheable by type
        }
        Err(PyTypeError::new_err(format!(
            "ClosureQueue.{operation}() takes a closure with a mark_cancelled() method \
             (called when the queue cancels it), got {} of type {}",
            short_repr(closure),
            type_name(closure)
        )))
    }
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map_or_else(|_| "<unknown>".to_owned(), |name| name.to_string())
}

/// `repr(obj)`, cut to a readable length.
fn short_repr(obj: &Bound<'_, PyAny>) -> String {
    const LIMIT: usize = 80;
    let text = obj
        .repr()
        .map_or_else(|_| "<unrepresentable>".to_owned(), |repr| repr.to_string());
    if text.chars().count() <= LIMIT {
        text
    } else {
        let cut: String = text.chars().take(LIMIT).collect();
        format!("{cut}...")
    }
}
