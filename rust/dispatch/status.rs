//! What each link reports about its worker: state, since when, the last error, the last
//! `GetStatus` answer (and how old it is), what identifies the worker's process, and
//! per-worker counters.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::rpc::pb;

/// What tells one worker process from the next: its random `incarnation`, or, for a
/// worker too old to report one (0), its `pid`. A pid alone cannot: in a container every
/// worker's main process is pid 1, so a restarted pod would look unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Incarnation {
    /// `GetStatusResponse.incarnation`, random per worker server.
    Random(u64),
    /// The pid of a worker that reports no incarnation.
    Pid(u64),
}

impl Incarnation {
    /// The incarnation a `GetStatus` answer reports.
    pub fn of(status: &pb::GetStatusResponse) -> Self {
        if status.incarnation == 0 {
            Self::Pid(status.pid)
        } else {
            Self::Random(status.incarnation)
        }
    }
}

/// Per-worker counters since the dispatcher was made, written by the worker's link
/// without locks. Aligned to its own cache lines: each link bumps its own per closure.
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct LinkCounters {
    /// Closures settled with a value by this worker.
    pub completed: AtomicU64,
    /// Closures settled with an error on this worker.
    pub failed: AtomicU64,
    /// Executions on this worker put back to run again.
    pub retried: AtomicU64,
    /// Times this worker was found failed.
    pub failures: AtomicU64,
    /// Closures sent to this worker (or taken for it) and not answered yet, as the link
    /// last published it: dataflow places a consumer on its producer's worker only while
    /// this is 0.
    pub outstanding: AtomicU64,
}

/// A worker's state as its link sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkState {
    /// Serving closures.
    Up,
    /// Not answering (or not yet answered); probed with backoff.
    Recovering,
    /// Did not answer within the recovery bound; no longer used.
    GivenUp,
    /// Taken out of the cluster by `remove_workers` (or a resolver refresh): drained and
    /// no longer used. Its index is never reused.
    Removed,
}

impl LinkState {
    /// `"up"`, `"recovering"`, `"given_up"` or `"removed"`.
    pub fn label(self) -> &'static str {
        match self {
            Self::Up => "up",
            Self::Recovering => "recovering",
            Self::GivenUp => "given_up",
            Self::Removed => "removed",
        }
    }

    /// Whether the worker takes no closures for good (given up or removed).
    pub fn is_out_of_service(self) -> bool {
        matches!(self, Self::GivenUp | Self::Removed)
    }
}

/// One worker's status at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerSnapshot {
    /// The worker's index (its position in the addresses given).
    pub index: usize,
    /// The worker's address, as given.
    pub address: String,
    /// Its state.
    pub state: LinkState,
    /// How long it has been in that state.
    pub in_state_for: Duration,
    /// The last failure seen talking to it, if any since it was last up.
    pub last_error: Option<String>,
    /// The worker's last `GetStatus` answer (platform, versions, counters), when known.
    pub status: Option<pb::GetStatusResponse>,
    /// How long ago that answer came.
    pub status_age: Option<Duration>,
    /// Closures that ended with a value on this worker.
    pub completed: u64,
    /// Closures that ended with an error on this worker.
    pub failed: u64,
    /// Executions on this worker put back to run again.
    pub retried: u64,
    /// Times this worker was found failed.
    pub failures: u64,
    /// The worker process's preemption notice, once it announced one; cleared when a new
    /// process answers on its address.
    pub preemption: Option<pb::PreemptionNotice>,
}

struct Info {
    state: LinkState,
    since: Instant,
    last_error: Option<String>,
    status: Option<(pb::GetStatusResponse, Instant)>,
    preemption: Option<pb::PreemptionNotice>,
}

/// The shared, lockable status of one link (written by the link, read by anyone).
pub(crate) struct LinkStatus {
    index: usize,
    address: String,
    /// How many hosts the slice this worker is rank 0 of must have (1: a worker of its
    /// own); fixed when the worker joins, so workers added later can be slices too.
    slice_size: u32,
    info: Mutex<Info>,
    /// Per-worker counters.
    pub counters: LinkCounters,
    /// `remove_workers` asked this link to drain and leave; a watch, so a link sleeping
    /// between reconnection attempts wakes at once.
    retiring: watch::Sender<bool>,
    /// Mirrors `retiring` for the hot path (read once per loop of the link).
    retiring_flag: AtomicBool,
}

impl LinkStatus {
    /// A link that has not reached its worker yet (`recovering`, as TF counts a worker
    /// that has not answered as failed).
    pub fn new(index: usize, address: String, slice_size: u32) -> Self {
        Self {
            index,
            address,
            slice_size: slice_size.max(1),
            info: Mutex::new(Info {
                state: LinkState::Recovering,
                since: Instant::now(),
                last_error: None,
                status: None,
                preemption: None,
            }),
            counters: LinkCounters::default(),
            retiring: watch::Sender::new(false),
            retiring_flag: AtomicBool::new(false),
        }
    }

    /// The worker's index.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The worker's address, as given.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Hosts of the slice this worker must be rank 0 of (1: a worker of its own).
    pub fn slice_size(&self) -> u32 {
        self.slice_size
    }

    /// Asks the link to drain and leave; `false` if it was asked before.
    pub fn begin_retiring(&self) -> bool {
        let first = !self.retiring_flag.swap(true, Ordering::AcqRel);
        self.retiring.send_replace(true);
        first
    }

    /// Whether the link was asked to leave.
    pub fn is_retiring(&self) -> bool {
        self.retiring_flag.load(Ordering::Acquire)
    }

    /// A receiver that turns `true` when the link is asked to leave.
    pub fn retiring_signal(&self) -> watch::Receiver<bool> {
        self.retiring.subscribe()
    }

    fn lock(&self) -> MutexGuard<'_, Info> {
        self.info.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn state(&self) -> LinkState {
        self.lock().state
    }

    /// Moves to `state` with `error` as the latest failure (`None` clears it).
    pub fn set(&self, state: LinkState, error: Option<String>) {
        let mut info = self.lock();
        if info.state != state {
            info.state = state;
            info.since = Instant::now();
        }
        info.last_error = error;
    }

    pub fn note_error(&self, error: String) {
        self.lock().last_error = Some(error);
    }

    pub fn last_error(&self) -> Option<String> {
        self.lock().last_error.clone()
    }

    pub fn record_status(&self, status: pb::GetStatusResponse) {
        self.lock().status = Some((status, Instant::now()));
    }

    /// Records the worker's preemption notice (`None`: a new worker process, none).
    pub fn set_preemption(&self, notice: Option<pb::PreemptionNotice>) {
        self.lock().preemption = notice;
    }

    /// How long ago the last `GetStatus` answer was recorded; `None` if never.
    pub fn status_age(&self) -> Option<Duration> {
        self.lock().status.as_ref().map(|(_, at)| at.elapsed())
    }

    pub fn snapshot(&self) -> WorkerSnapshot {
        let info = self.lock();
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        WorkerSnapshot {
            index: self.index,
            address: self.address.clone(),
            state: info.state,
            in_state_for: info.since.elapsed(),
            last_error: info.last_error.clone(),
            status: info.status.as_ref().map(|(status, _)| status.clone()),
            status_age: info.status.as_ref().map(|(_, at)| at.elapsed()),
            completed: load(&self.counters.completed),
            failed: load(&self.counters.failed),
            retried: load(&self.counters.retried),
            failures: load(&self.counters.failures),
            preemption: info.preemption.clone(),
        }
    }
}
