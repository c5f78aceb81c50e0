//! Parameter-server failures reported by closures, and TF's rule for which are transient.
//!
//! A closure that cannot reach a ps task fails on its worker with a `PSUnavailableError`;
//! the worker's executor reports the task's index in `ClosureError.ps_task` (taken from the
//! exception's fields, which the ps client sets from the RPC's status code). The
//! dispatcher does not read error text anywhere on this path.
//!
//! # The rule, as TF's `ClusterCoordinator` applies it
//!
//! Matched to `cluster_coordinator.py` (`Cluster._record_and_ignore_transient_ps_failure`
//! and the worker's failure handler that calls it):
//!
//! - The threshold is `TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES` (default 3); our alias
//!   `JAXCLUSTER_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES` wins when both are set, as for
//!   the other `TF_COORDINATOR_*` variables. A threshold of 0 or less ignores nothing.
//! - One counter per ps task, for the coordinator's lifetime: it is never reset, not by a
//!   success and not when the ps comes back. Each report adds one to its task's counter;
//!   the report is *transient* while the counter stays below the threshold and is
//!   *reported* once it reaches it. With the default, the first two reports about a task
//!   are retried and the third, and every later one, is raised.
//! - A transient report puts the closure back in the queue; it is neither a worker
//!   failure nor the closure's error. The check comes before any worker-failure handling,
//!   as in TF, so an unreachable ps never sends a healthy worker into recovery.
//! - A reported one is the closure's error like any user error: under `cancel_all` the
//!   next `schedule`/`join`/`done` raises it (a `PSUnavailableError` carrying `task_id`)
//!   and cancels what is queued.
//! - Input errors count too: TF unwraps `ClosureInputError` / `ClosureAbortedError`
//!   before deciding, and so does the worker when it fills in `ps_task`.
//!
//! Differences: TF finds the task by parsing `/job:ps/replica:0/task:N` out of the error
//! message and may increment several tasks for one error; here a failure names exactly
//! one task, structurally. TF has no counter of these reports; `metrics()["ps_failures"]`
//! counts every one (transient or not).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use super::failure::ClosureFailure;

/// TF's default for `TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES`.
pub const DEFAULT_TRANSIENT_PS_FAILURES: u32 = 3;

/// One ps-failure report as the rule judged it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PsReport {
    /// The ps task the failure names.
    pub task: i64,
    /// Reports about that task so far, this one included.
    pub count: u32,
    /// The threshold in force (0: none is transient).
    pub threshold: u32,
    /// Whether the closure is put back rather than failed.
    pub transient: bool,
}

/// Counts ps-failure reports per ps task and says which are transient.
#[derive(Debug)]
pub(crate) struct PsFailures {
    threshold: u32,
    counts: Mutex<HashMap<i64, u32>>,
    reports: AtomicU64,
}

impl PsFailures {
    /// A tracker with nothing counted; `threshold` 0 treats every report as lasting.
    pub fn new(threshold: u32) -> Self {
        Self {
            threshold,
            counts: Mutex::new(HashMap::new()),
            reports: AtomicU64::new(0),
        }
    }

    /// Records `failure` if it names a ps task; `true` when it is transient (put the
    /// closure back), `false` when it must settle the closure (or is no ps failure).
    #[cfg(test)]
    pub fn record_and_ignore(&self, failure: &ClosureFailure) -> bool {
        self.record(failure).is_some_and(|report| report.transient)
    }

    /// Records `failure` if it names a ps task, saying what the rule makes of it; `None`
    /// for a failure that is no ps failure.
    pub fn record(&self, failure: &ClosureFailure) -> Option<PsReport> {
        let task = failure.ps_task?;
        self.reports.fetch_add(1, Ordering::Relaxed);
        if self.threshold == 0 {
            return Some(PsReport {
                task,
                count: 1,
                threshold: 0,
                transient: false,
            });
        }
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        let count = counts.entry(task).or_insert(0);
        *count = count.saturating_add(1);
        Some(PsReport {
            task,
            count: *count,
            threshold: self.threshold,
            transient: *count < self.threshold,
        })
    }

    /// Every ps-failure report so far, transient or not.
    pub fn reports(&self) -> u64 {
        self.reports.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ps_failure(task: Option<i64>) -> ClosureFailure {
        ClosureFailure {
            ps_task: task,
            ..ClosureFailure::infra(tonic::Code::Unavailable, "ps down".to_owned(), "w:1")
        }
    }

    #[test]
    fn reports_below_the_threshold_are_transient_per_task_and_never_reset() {
        let tracker = PsFailures::new(3);
        let ps0 = ps_failure(Some(0));
        let verdicts: Vec<bool> = (0..4).map(|_| tracker.record_and_ignore(&ps0)).collect();
        assert_eq!(verdicts, [true, true, false, false]);
        // Task 1 has a budget of its own.
        assert!(tracker.record_and_ignore(&ps_failure(Some(1))));
        assert_eq!(tracker.reports(), 5);
    }

    #[test]
    fn other_failures_are_not_counted_and_zero_ignores_nothing() {
        let tracker = PsFailures::new(3);
        assert!(!tracker.record_and_ignore(&ps_failure(None)));
        assert_eq!(tracker.reports(), 0);
        let strict = PsFailures::new(0);
        assert!(!strict.record_and_ignore(&ps_failure(Some(0))));
        assert_eq!(strict.reports(), 1);
        let once = PsFailures::new(1);
        assert!(!once.record_and_ignore(&ps_failure(Some(2))));
    }
}
