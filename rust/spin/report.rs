//! What the process's spinning sites did, for metrics: the waits each made spinning and
//! parked at once, how often its trials changed the way it keeps, and the way it keeps now.
//!
//! An operator deciding whether spinning pays on a machine (`JAXCLUSTER_SPIN_US`) reads it
//! here rather than inferring it from latency: a site that keeps parking found spinning
//! slower there. Counted per kind of site, not per site: a process has one of each
//! (the thread in `fetch()`, a worker's executor, the runtime thread), and the few sites a
//! test builds beside them share its kind's counts. Atomics only, so counting never takes
//! a lock (a wait ends under the cell's or the job queue's).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::trial::Way;

/// The counts of one kind of site.
#[derive(Debug)]
pub struct Report {
    name: &'static str,
    spun: AtomicU64,
    parked: AtomicU64,
    changes: AtomicU64,
    /// The way kept by the site that last changed it is spinning (sites start spinning).
    spinning: AtomicBool,
}

/// The thread in `fetch()` waiting on its result cell.
pub static FETCH: Report = Report::new("fetch");
/// A worker's executor waiting for its next closure.
pub static EXECUTOR: Report = Report::new("executor");
/// A runtime of one thread waiting for its next event (`crate::runtime::awake`).
pub static RUNTIME: Report = Report::new("runtime");
/// Sites that report nowhere (tests' and benches' own).
pub(super) static UNREPORTED: Report = Report::new("unreported");

/// What one kind of site did so far, at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SiteSnapshot {
    /// `fetch`, `executor` or `runtime`.
    pub site: &'static str,
    /// Whether the site keeps spinning (false: its trials keep parking, or spinning is off).
    pub spinning: bool,
    /// Waits that spun first.
    pub waits_spun: u64,
    /// Waits that parked at once (kept or tried), not counting a site resting or off.
    pub waits_parked: u64,
    /// Times its trials changed the way it keeps.
    pub way_changes: u64,
}

impl Report {
    pub(super) const fn new(name: &'static str) -> Self {
        Self {
            name,
            spun: AtomicU64::new(0),
            parked: AtomicU64::new(0),
            changes: AtomicU64::new(0),
            spinning: AtomicBool::new(true),
        }
    }

    /// A wait that went `way` ended.
    pub(super) fn waited(&self, way: Way) {
        let count = match way {
            Way::Spin => &self.spun,
            Way::Park => &self.parked,
        };
        count.fetch_add(1, Ordering::Relaxed);
    }

    /// A site's trials made it keep `way`.
    pub(super) fn kept(&self, way: Way) {
        self.changes.fetch_add(1, Ordering::Relaxed);
        self.spinning.store(way == Way::Spin, Ordering::Relaxed);
    }

    /// The counts now; `on` says whether spinning is configured at all.
    pub(super) fn snapshot(&self, on: bool) -> SiteSnapshot {
        SiteSnapshot {
            site: self.name,
            spinning: on && self.spinning.load(Ordering::Relaxed),
            waits_spun: self.spun.load(Ordering::Relaxed),
            waits_parked: self.parked.load(Ordering::Relaxed),
            way_changes: self.changes.load(Ordering::Relaxed),
        }
    }
}

/// Every kind of site of this process, in a fixed order; `runtime_spins` says whether its
/// runtime may spin at all (`crate::runtime::awake::spins`: one thread, not lending).
pub fn sites(runtime_spins: bool) -> Vec<SiteSnapshot> {
    let on = !super::configured_budget().is_zero();
    vec![
        FETCH.snapshot(on),
        EXECUTOR.snapshot(on),
        RUNTIME.snapshot(on && runtime_spins),
    ]
}
