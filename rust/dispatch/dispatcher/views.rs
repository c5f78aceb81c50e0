//! What the dispatcher shows of itself: [`MetricsSnapshot`], per-worker statuses, and
//! refreshing those statuses with a `GetStatus` to every stale worker at once (through
//! `direct.rs`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::direct::DirectCalls;
use super::Dispatcher;
use crate::dispatch::metrics::LatencySnapshot;
use crate::dispatch::status::{LinkState, WorkerSnapshot};

/// A snapshot of [`Dispatcher::metrics`].
#[derive(Debug, Clone, PartialEq)]
pub struct MetricsSnapshot {
    /// Closures queued, not yet taken by a worker.
    pub queued: usize,
    /// Closures taken by a worker and not yet settled.
    pub inflight: usize,
    /// Closures that returned a value.
    pub completed: u64,
    /// Closures that ended with an error.
    pub failed: u64,
    /// Closures cancelled (by a raised error under `cancel_all`, or by shutdown).
    pub cancelled: u64,
    /// Executions put back to run again (worker failures, timeouts, worker-side
    /// infrastructure errors, transient parameter-server failures).
    pub retried: u64,
    /// Times a worker was found failed.
    pub worker_failures: u64,
    /// Closure executions that failed because a parameter server was unreachable or had
    /// restarted (each one counted, whether retried as transient or raised).
    pub ps_failures: u64,
    /// Function payloads sent to workers.
    pub functions_registered: u64,
    /// Preemption notices workers announced, by source (`"gce"`, `"aws"`, `"signal"`).
    pub preemptions: std::collections::BTreeMap<String, u64>,
    /// Per-worker address and state.
    pub workers: Vec<WorkerSnapshot>,
    /// Kept values (dataflow) this coordinator fetched with `ReadValue`
    /// ([`Dispatcher::read_value`]), and their encoded bytes.
    pub kept_values_fetched: u64,
    /// Bytes of the kept values fetched (pickle plus buffers).
    pub kept_bytes_fetched: u64,
    /// Schedule-to-result latency of settled closures.
    pub latency: LatencySnapshot,
}

impl Dispatcher {
    /// Waits up to `slice` until some worker (not removed) has reported its status (its
    /// platform and devices, from a `GetStatus`); whether one has. Woken by the report
    /// itself, not by polling. Call from a thread outside the runtime.
    pub fn wait_reported(&self, slice: Duration) -> bool {
        if self.shared.any_reported() {
            return true;
        }
        let Ok(runtime) = crate::runtime::runtime() else {
            return false;
        };
        let shared = Arc::clone(&self.shared);
        let mut reports = self.shared.reports.subscribe();
        runtime.block_on(async move {
            let reported = reports.wait_for(|_| shared.any_reported());
            tokio::time::timeout(slice, reported)
                .await
                .is_ok_and(|waited| waited.is_ok())
        })
    }

    /// Gauges, counters, worker states and the latency histogram, right now.
    pub fn metrics(&self) -> MetricsSnapshot {
        let shared = &self.shared;
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        MetricsSnapshot {
            queued: shared.queue.len(),
            inflight: shared.queue.inflight(),
            completed: load(&shared.counters.completed),
            failed: load(&shared.counters.failed),
            cancelled: load(&shared.cancel.cancelled),
            retried: load(&shared.counters.retried),
            worker_failures: load(&shared.counters.worker_failures),
            ps_failures: shared.ps_failures.reports(),
            functions_registered: load(&shared.counters.functions_registered),
            preemptions: shared.counters.preemptions(),
            kept_values_fetched: load(&shared.counters.kept_values_fetched),
            kept_bytes_fetched: load(&shared.counters.kept_bytes_fetched),
            workers: self.worker_statuses(),
            latency: shared.latency.snapshot(),
        }
    }

    /// Each worker's address, state, last error and last `GetStatus` answer.
    pub fn worker_statuses(&self) -> Vec<WorkerSnapshot> {
        self.shared
            .link_statuses()
            .iter()
            .map(|link| link.snapshot())
            .collect()
    }

    /// Asks every `up` worker whose last `GetStatus` answer is older than `max_age` for a
    /// new one, all at once, each bounded by `timeout`; returns how many answered. Blocks
    /// the calling thread (not a runtime thread) for at most about `timeout`.
    ///
    /// The links record `GetStatus` only when they probe (connecting, recovering,
    /// checking for a restart), so a worker's own counters would otherwise age from the
    /// moment it connected; this is how `coordinator.workers` stays live without a poll
    /// per worker running all the time (at 1,000 workers, that is 1,000 RPCs per period
    /// for a view nobody may read). A failed probe is not a worker failure: the link
    /// finds out by itself when it next uses the worker.
    pub fn refresh_statuses(&self, max_age: Duration, timeout: Duration) -> usize {
        let stale: Vec<usize> = self
            .shared
            .link_statuses()
            .iter()
            .enumerate()
            .filter(|(_, link)| {
                link.state() == LinkState::Up
                    && !matches!(link.status_age(), Some(age) if age <= max_age)
            })
            .map(|(index, _)| index)
            .collect();
        if stale.is_empty() || self.is_shut_down() {
            return 0;
        }
        let Ok(runtime) = crate::runtime::runtime() else {
            return 0;
        };
        let shared = Arc::clone(&self.shared);
        let probes: Vec<(usize, Arc<dyn DirectCalls>)> = {
            let all = self.lock_direct();
            stale
                .into_iter()
                .filter_map(|index| Some((index, Arc::clone(all.get(index)?))))
                .collect()
        };
        runtime.block_on(async move {
            let mut calls = tokio::task::JoinSet::new();
            for (index, probe) in probes {
                calls.spawn(async move { (index, probe.probe(timeout).await) });
            }
            let mut answered = 0;
            while let Some(joined) = calls.join_next().await {
                if let Ok((index, Ok(status))) = joined {
                    if let Some(link) = shared.link(index) {
                        shared.record_status(&link, status);
                    }
                    answered += 1;
                }
            }
            answered
        })
    }
}
