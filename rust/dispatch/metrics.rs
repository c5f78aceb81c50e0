//! Counters of the dispatcher, updated without locks; the latency histogram is
//! [`crate::histogram`], shared with the worker's execution-time histogram.

use std::sync::atomic::{AtomicU64, Ordering};

pub(crate) use crate::histogram::Histogram;
pub use crate::histogram::LatencySnapshot;

/// Monotonic counters since the dispatcher was made.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub completed: AtomicU64,
    pub failed: AtomicU64,
    pub retried: AtomicU64,
    pub worker_failures: AtomicU64,
    pub functions_registered: AtomicU64,
}

impl Counters {
    pub fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}
