//! Typed status records: `WorkerReport` (a worker's own `GetStatus` answer),
//! `WorkerStatus` (one worker as the coordinator sees it: its link plus its last report)
//! `PsStatus` (a parameter server's `GetStatus` answer) and `SessionHeld` (one session a
//! worker or ps holds values for). Frozen, built once from the
//! snapshot they wrap; see `_core.pyi` for the attributes and `super::record` for the
//! dict-style access kept for older callers.

use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::enums::{ServingState, WorkerState};
use super::record::{fields_dict, record};
use crate::dispatch::{LinkState, WorkerSnapshot};
use crate::rpc::pb;

/// What a worker reports about itself (`WorkerClient.get_status()`,
/// `WorkerServer.status()`, `WorkerStatus.report`).
#[pyclass(frozen, module = "jaxcluster._core", name = "WorkerReport")]
#[derive(Debug, Clone)]
pub struct WorkerReport(pb::GetStatusResponse);

impl From<&pb::GetStatusResponse> for WorkerReport {
    fn from(status: &pb::GetStatusResponse) -> Self {
        Self(status.clone())
    }
}

impl WorkerReport {
    fn dict_of<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyDict>> {
        fields_dict(slf.as_any(), Self::FIELDS)
    }
}

record! {
    WorkerReport as "WorkerReport" (self) {
        state: ServingState = self.0.state().into(),
        worker_index: i64 = self.0.worker_index,
        jaxcluster_version: &str = &self.0.jaxcluster_version,
        jax_version: &str = &self.0.jax_version,
        python_version: &str = &self.0.python_version,
        platform: &str = &self.0.platform,
        device_count: u32 = self.0.device_count,
        device_kind: &str = &self.0.device_kind,
        closure_bytes_received: u64 = self.0.closure_bytes_received,
        closure_bytes_sent: u64 = self.0.closure_bytes_sent,
        functions_registered: u64 = self.0.functions_registered,
        closures_run: u64 = self.0.closures_run,
        closures_failed: u64 = self.0.closures_failed,
        queued: u32 = self.0.queued,
        inflight: u32 = self.0.inflight,
        resources_created: u64 = self.0.resources_created,
        resources_released: u64 = self.0.resources_released,
        unauthenticated_requests: u64 = self.0.unauthenticated_requests,
        rejected_requests: u64 = self.0.rejected_requests,
        pid: u64 = self.0.pid,
        uptime_seconds: f64 = self.0.uptime_seconds,
        protocol_revision: u32 = self.0.protocol_revision,
        previous_exit: &str = &self.0.previous_exit,
        connections_open: u64 = self.0.connections_open,
        connections_dropped: u64 = self.0.connections_dropped,
        incarnation: u64 = self.0.incarnation,
        last_error: &str = &self.0.last_error,
        slice_index: Option<u32> = self.0.slice.map(|m| m.index),
        slice_rank: Option<u32> = self.0.slice.map(|m| m.rank),
        slice_size: Option<u32> = self.0.slice.map(|m| m.size),
        preemption_source: Option<&str> = self.0.preemption.as_ref().map(|n| n.source.as_str()),
        preemption_deadline: Option<f64> = preemption_deadline(self.0.preemption.as_ref()),
        preemption_detail: Option<&str> = self.0.preemption.as_ref().map(|n| n.detail.as_str()),
        sessions: Vec<SessionHeld> = self.0.sessions.iter().cloned().map(SessionHeld).collect(),
        state_ttl_seconds: f64 = self.0.state_ttl_seconds,
        peer_bytes_sent: u64 = self.0.peer_bytes_sent,
        peer_bytes_received: u64 = self.0.peer_bytes_received,
        peer_reads_served: u64 = self.0.peer_reads_served,
        peer_pulls: u64 = self.0.peer_pulls,
    }
}

/// One session's values a worker or ps holds (`WorkerReport.sessions`, `PsStatus.sessions`).
#[pyclass(frozen, module = "jaxcluster._core", name = "SessionHeld")]
#[derive(Debug, Clone)]
pub struct SessionHeld(pb::SessionHeld);

impl SessionHeld {
    fn dict_of<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyDict>> {
        fields_dict(slf.as_any(), Self::FIELDS)
    }
}

record! {
    SessionHeld as "SessionHeld" (self) {
        id: &str = &self.0.id,
        resources: u64 = self.0.resources,
        bytes: u64 = self.0.bytes,
        connections: u32 = self.0.connections,
        idle_seconds: f64 = self.0.idle_seconds,
        named: bool = self.0.named,
    }
}

/// A notice's deadline in seconds since the Unix epoch; `None` without a notice or when
/// the notice gave none.
fn preemption_deadline(notice: Option<&pb::PreemptionNotice>) -> Option<f64> {
    notice
        .map(|n| n.deadline_unix_seconds)
        .filter(|deadline| *deadline > 0.0)
}

/// One worker as the coordinator sees it (`Dispatcher.worker_statuses()`,
/// `ClusterCoordinator.workers`): the link's state and counts, and the worker's last
/// report when one came.
#[pyclass(frozen, module = "jaxcluster._core", name = "WorkerStatus")]
#[derive(Debug, Clone)]
pub struct WorkerStatus(WorkerSnapshot);

impl From<&WorkerSnapshot> for WorkerStatus {
    fn from(snapshot: &WorkerSnapshot) -> Self {
        Self(snapshot.clone())
    }
}

impl WorkerStatus {
    /// The report's uptime, carried on by the report's age while the worker is up.
    fn live_uptime(&self) -> Option<f64> {
        let status = self.0.status.as_ref()?;
        let age = match (self.0.state, self.0.status_age) {
            (LinkState::Up, Some(age)) => age.as_secs_f64(),
            _ => 0.0,
        };
        Some(status.uptime_seconds + age)
    }

    /// The dict `worker_statuses()` gave before it was typed: the report's fields (its
    /// state as `serving_state`, its last error as `worker_last_error`), then the link's,
    /// which win where both have a key.
    fn dict_of<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyDict>> {
        let py = slf.py();
        let this = slf.get();
        let dict = match &this.0.status {
            Some(status) => {
                let report = Bound::new(py, WorkerReport::from(status))?;
                let dict = WorkerReport::dict_of(&report)?;
                dict.set_item("serving_state", report.get().state().spelling())?;
                if let Some(age) = this.0.status_age {
                    dict.set_item("worker_last_error", &status.last_error)?;
                    dict.set_item("status_age_seconds", age.as_secs_f64())?;
                    dict.set_item("uptime_seconds", this.live_uptime())?;
                }
                dict
            }
            None => PyDict::new(py),
        };
        for (key, value) in fields_dict(slf.as_any(), &Self::FIELDS[..9])?.iter() {
            dict.set_item(key, value)?;
        }
        Ok(dict)
    }
}

record! {
    WorkerStatus as "WorkerStatus" (self) {
        index: usize = self.0.index,
        address: &str = &self.0.address,
        state: WorkerState = WorkerState::of(&self.0),
        in_state_seconds: f64 = self.0.in_state_for.as_secs_f64(),
        last_error: Option<&str> = self.0.last_error.as_deref(),
        completed: u64 = self.0.completed,
        failed: u64 = self.0.failed,
        retried: u64 = self.0.retried,
        failures: u64 = self.0.failures,
        report: Option<WorkerReport> = self.0.status.as_ref().map(WorkerReport::from),
        status_age_seconds: Option<f64> = self.0.status_age.map(|age| age.as_secs_f64()),
        uptime_seconds: Option<f64> = self.live_uptime(),
        preemption_source: Option<&str> = self.0.preemption.as_ref().map(|n| n.source.as_str()),
        preemption_deadline: Option<f64> = preemption_deadline(self.0.preemption.as_ref()),
    }
}

/// What a parameter server reports about itself (`PsClient.get_status()`,
/// `PsServer.status()`).
#[pyclass(frozen, module = "jaxcluster._core", name = "PsStatus")]
#[derive(Debug, Clone)]
pub struct PsStatus(pb::PsStatusResponse);

impl From<&pb::PsStatusResponse> for PsStatus {
    fn from(status: &pb::PsStatusResponse) -> Self {
        Self(status.clone())
    }
}

impl PsStatus {
    fn dict_of<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyDict>> {
        fields_dict(slf.as_any(), Self::FIELDS)
    }
}

record! {
    PsStatus as "PsStatus" (self) {
        ps_index: i64 = self.0.ps_index,
        jaxcluster_version: &str = &self.0.jaxcluster_version,
        protocol_revision: u32 = self.0.protocol_revision,
        incarnation: u64 = self.0.incarnation,
        variables: u64 = self.0.variables,
        variable_bytes: u64 = self.0.variable_bytes,
        reads: u64 = self.0.reads,
        updates: u64 = self.0.updates,
        variables_created: u64 = self.0.variables_created,
        unauthenticated_requests: u64 = self.0.unauthenticated_requests,
        rejected_requests: u64 = self.0.rejected_requests,
        pid: u64 = self.0.pid,
        uptime_seconds: f64 = self.0.uptime_seconds,
        connections_open: u64 = self.0.connections_open,
        connections_dropped: u64 = self.0.connections_dropped,
        bytes_read: u64 = self.0.bytes_read,
        bytes_written: u64 = self.0.bytes_written,
        state_ttl_seconds: f64 = self.0.state_ttl_seconds,
        sessions: Vec<SessionHeld> = self.0.sessions.iter().cloned().map(SessionHeld).collect(),
    }
}
