//! jaxcluster's native core.
//!
//! The crate is split the way the product is layered: [`queue`] (the TF closure-queue
//! semantics) and [`device`] (TF device-name grammar) are plain Rust with no knowledge of
//! Python, so `cargo test` and criterion exercise them directly. Everything `PyO3` lives in
//! [`py`], compiled only with the `python` feature that maturin enables; `_core` is the
//! module it registers.

pub mod device;
pub mod dispatch;
pub mod ps;
pub mod queue;
pub mod rpc;
pub mod runtime;
pub mod worker;

#[cfg(feature = "python")]
mod py;

#[cfg(feature = "python")]
use pyo3::prelude::*;

/// The `jaxcluster._core` extension module: registers the bindings, and routes the core's
/// log events to Python's `logging` (a `tracing` target such as `jaxcluster.dispatch` is
/// the logger's name; levels are read from Python and cached by pyo3-log).
#[cfg(feature = "python")]
#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // Fails only if a logger is already installed (the module imported twice in one
    // process, e.g. by a sub-interpreter): events then go to that one.
    let _ = pyo3_log::try_init();
    py::register(m)
}
