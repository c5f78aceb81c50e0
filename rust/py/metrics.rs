//! Typed metrics records: `Metrics` (`Dispatcher.metrics()`), its per-worker
//! `WorkerMetrics`, the `LatencyHistogram` it and `WorkerServer.execution_seconds()`
//! give, and the process's `SpinSite`s (`spin_sites()`). Frozen, built once from the
//! snapshot they wrap; see `_core.pyi` for the attributes and `super::record` for the
//! dict-style access kept for older callers.

use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::enums::WorkerState;
use super::record::{fields_dict, record};
use crate::dispatch::{LatencySnapshot, MetricsSnapshot, WorkerSnapshot};
use crate::runtime::lend::LendSnapshot;
use crate::spin::report::SiteSnapshot;

/// The coordinator's counters at one moment (`Dispatcher.metrics()`).
#[pyclass(frozen, module = "jaxcluster._core", name = "Metrics")]
#[derive(Debug, Clone)]
pub struct Metrics(MetricsSnapshot);

impl From<&MetricsSnapshot> for Metrics {
    fn from(snapshot: &MetricsSnapshot) -> Self {
        Self(snapshot.clone())
    }
}

impl Metrics {
    fn dict_of<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyDict>> {
        fields_dict(slf.as_any(), Self::FIELDS)
    }
}

record! {
    Metrics as "Metrics" (self) {
        queued: usize = self.0.queued,
        inflight: usize = self.0.inflight,
        completed: u64 = self.0.completed,
        failed: u64 = self.0.failed,
        cancelled: u64 = self.0.cancelled,
        retried: u64 = self.0.retried,
        worker_failures: u64 = self.0.worker_failures,
        ps_failures: u64 = self.0.ps_failures,
        functions_registered: u64 = self.0.functions_registered,
        preemptions: std::collections::BTreeMap<String, u64> = self.0.preemptions.clone(),
        kept_values_fetched: u64 = self.0.kept_values_fetched,
        kept_bytes_fetched: u64 = self.0.kept_bytes_fetched,
        workers: Vec<WorkerMetrics> = self.0.workers.iter().map(WorkerMetrics::from).collect(),
        latency: LatencyHistogram = LatencyHistogram::from(&self.0.latency),
    }
}

/// One worker's entry in [`Metrics`]: the link's state and this coordinator's counts on
/// it (no RPC; `WorkerStatus` adds the worker's own report).
#[pyclass(frozen, module = "jaxcluster._core", name = "WorkerMetrics")]
#[derive(Debug, Clone)]
pub struct WorkerMetrics {
    index: usize,
    address: String,
    state: WorkerState,
    in_state_seconds: f64,
    completed: u64,
    failed: u64,
    retried: u64,
    failures: u64,
    last_error: Option<String>,
}

impl From<&WorkerSnapshot> for WorkerMetrics {
    fn from(w: &WorkerSnapshot) -> Self {
        Self {
            index: w.index,
            address: w.address.clone(),
            state: WorkerState::of(w),
            in_state_seconds: w.in_state_for.as_secs_f64(),
            completed: w.completed,
            failed: w.failed,
            retried: w.retried,
            failures: w.failures,
            last_error: w.last_error.clone(),
        }
    }
}

impl WorkerMetrics {
    fn dict_of<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyDict>> {
        fields_dict(slf.as_any(), Self::FIELDS)
    }
}

record! {
    WorkerMetrics as "WorkerMetrics" (self) {
        index: usize = self.index,
        address: &str = &self.address,
        state: WorkerState = self.state,
        in_state_seconds: f64 = self.in_state_seconds,
        completed: u64 = self.completed,
        failed: u64 = self.failed,
        retried: u64 = self.retried,
        failures: u64 = self.failures,
        last_error: Option<&str> = self.last_error.as_deref(),
    }
}

/// A latency histogram: `bounds` (seconds), `counts` (one per bound, then the overflow
/// bucket), `count`, `sum`, `max`, and the `p50`/`p99` estimates (`None` while empty).
#[pyclass(frozen, module = "jaxcluster._core", name = "LatencyHistogram")]
#[derive(Debug, Clone)]
pub struct LatencyHistogram(LatencySnapshot);

impl From<&LatencySnapshot> for LatencyHistogram {
    fn from(snapshot: &LatencySnapshot) -> Self {
        Self(snapshot.clone())
    }
}

impl LatencyHistogram {
    fn dict_of<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyDict>> {
        fields_dict(slf.as_any(), Self::FIELDS)
    }
}

record! {
    LatencyHistogram as "LatencyHistogram" (self) {
        bounds: Vec<f64> = self.0.bounds.clone(),
        counts: Vec<u64> = self.0.counts.clone(),
        count: u64 = self.0.count,
        sum: f64 = self.0.sum,
        max: f64 = self.0.max,
        p50: Option<f64> = self.0.quantile(0.5),
        p99: Option<f64> = self.0.quantile(0.99),
    }
}

/// One kind of spinning site of this process (`spin_sites()`): whether it keeps spinning
/// and how its waits went.
#[pyclass(frozen, module = "jaxcluster._core", name = "SpinSite")]
#[derive(Debug, Clone)]
pub struct SpinSite(SiteSnapshot);

impl SpinSite {
    fn dict_of<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyDict>> {
        fields_dict(slf.as_any(), Self::FIELDS)
    }
}

record! {
    SpinSite as "SpinSite" (self) {
        site: &str = self.0.site,
        spinning: bool = self.0.spinning,
        waits_spun: u64 = self.0.waits_spun,
        waits_parked: u64 = self.0.waits_parked,
        way_changes: u64 = self.0.way_changes,
    }
}

/// Whether this process's runtime lends its work to the threads that wait for it
/// (`runtime_lending()`, `rust/runtime/lend.rs`).
#[pyclass(frozen, module = "jaxcluster._core", name = "RuntimeLending")]
#[derive(Debug, Clone)]
pub struct RuntimeLending(LendSnapshot);

impl RuntimeLending {
    fn dict_of<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyDict>> {
        fields_dict(slf.as_any(), Self::FIELDS)
    }
}

record! {
    RuntimeLending as "RuntimeLending" (self) {
        lending: bool = self.0.lending,
        lends: u64 = self.0.lends,
    }
}

/// This process's runtime lending, for metrics.
#[pyfunction]
pub fn runtime_lending() -> RuntimeLending {
    RuntimeLending(crate::runtime::lend::snapshot())
}

/// This process's spinning sites (`fetch`, `executor`, `runtime`), for metrics.
#[pyfunction]
pub fn spin_sites() -> Vec<SpinSite> {
    crate::spin::report::sites(crate::runtime::awake::spins())
        .into_iter()
        .map(SpinSite)
        .collect()
}
