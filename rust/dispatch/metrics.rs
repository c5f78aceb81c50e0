//! Counters of the dispatcher, updated without locks; the latency histogram is
//! [`crate::histogram`], shared with the worker's execution-time histogram.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

pub(crate) use crate::histogram::Histogram;
pub use crate::histogram::LatencySnapshot;

use super::cell_watch::WatchList;

/// Monotonic counters since the dispatcher was made.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub completed: AtomicU64,
    pub failed: AtomicU64,
    pub retried: AtomicU64,
    pub worker_failures: AtomicU64,
    pub functions_registered: AtomicU64,
    /// Kept values fetched with `ReadValue`, and their bytes (`Dispatcher::read_value`).
    pub kept_values_fetched: AtomicU64,
    pub kept_bytes_fetched: AtomicU64,
    /// Preemption notices acted on, by source (`"gce"`, `"aws"`, `"signal"`); rare, so a
    /// lock is no cost.
    pub preemptions: Mutex<BTreeMap<String, u64>>,
    /// Woken by each notice counted (`Dispatcher::watch_preemptions`), so a watcher such
    /// as the coordinator's preemption saver sleeps until one arrives instead of polling.
    pub preemption_watches: WatchList,
}

impl Counters {
    pub fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one preemption notice from `source` and wakes the preemption watches (the
    /// link records the notice in its status first, so a woken watcher sees it).
    pub fn count_preemption(&self, source: &str) {
        *self
            .preemptions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(source.to_owned())
            .or_default() += 1;
        self.preemption_watches.wake_all();
    }

    /// Preemption notices so far, by source.
    pub fn preemptions(&self) -> BTreeMap<String, u64> {
        self.preemptions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}
