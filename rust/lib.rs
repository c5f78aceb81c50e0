//! jaxcluster's native core.
//!
//! The crate is split the way the product is layered: [`queue`] (the TF closure-queue
//! semantics) and [`device`] (TF device-name grammar) are plain Rust with no knowledge of
//! Python, so `cargo test` and criterion exercise them directly. Everything `PyO3` lives in
//! [`py`], compiled only with the `python` feature that maturin enables; `_core` is the
//! module it registers.

pub mod device;
pub mod dispatch;
pub mod histogram;
pub mod log_target;
pub mod ps;
pub mod queue;
pub mod rpc;
pub mod runtime;
pub mod setting;
pub mod spin;
pub mod worker;

#[cfg(feature = "python")]
mod py;

#[cfg(feature = "python")]
use pyo3::prelude::*;

/// The `jaxcluster._core` extension module: registers the bindings, nothing else.
#[cfg(feature = "python")]
#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    py::register(m)
}
