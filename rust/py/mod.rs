//! Thin `PyO3` wrappers over the core modules, one file each, plus the error boundary.

use pyo3::prelude::*;

mod answer_once;
mod blocking;
mod buffer;
mod cell_watch;
mod client;
mod convert;
mod device;
mod dispatch;
mod dispatch_convert;
mod enums;
mod errors;
mod log;
mod metrics;
mod outcome;
mod ps;
mod queue;
mod record;
mod result_cell;
mod status;
mod value_reads;
mod worker;
mod worker_job;

/// Registers every binding on the `_core` module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    log::install();
    m.add_function(wrap_pyfunction!(log::refresh_log_levels, m)?)?;
    m.add_class::<worker::PyWorkerServer>()?;
    m.add_class::<ps::optim::PyOptimizerSpec>()?;
    m.add_class::<worker_job::PyWorkerJob>()?;
    m.add_class::<value_reads::PyValueRead>()?;
    m.add_class::<client::PyWorkerClient>()?;
    device::register(m)?;
    m.add_class::<queue::PyClosureQueue>()?;
    m.add_class::<dispatch::PyDispatcher>()?;
    m.add_class::<result_cell::PyResultCell>()?;
    m.add_class::<cell_watch::PyCellWatch>()?;
    m.add_class::<dispatch::PyPerWorkerResource>()?;
    m.add_class::<buffer::PyBuffer>()?;
    m.add_class::<outcome::PyEncodedValue>()?;
    m.add_class::<outcome::PyClosureError>()?;
    m.add_class::<ps::PyPsServer>()?;
    m.add_class::<ps::PyPsClient>()?;
    enums::register(m)?;
    m.add_class::<status::WorkerReport>()?;
    m.add_class::<status::SessionHeld>()?;
    m.add_class::<status::WorkerStatus>()?;
    m.add_class::<status::PsStatus>()?;
    m.add_class::<metrics::Metrics>()?;
    m.add_class::<metrics::WorkerMetrics>()?;
    m.add_class::<metrics::LatencyHistogram>()?;
    m.add_class::<metrics::SpinSite>()?;
    m.add_function(wrap_pyfunction!(metrics::spin_sites, m)?)?;
    m.add_class::<metrics::RuntimeLending>()?;
    m.add_function(wrap_pyfunction!(metrics::runtime_lending, m)?)?;
    m.add_function(wrap_pyfunction!(
        dispatch_convert::set_exception_builder,
        m
    )?)?;
    Ok(())
}
