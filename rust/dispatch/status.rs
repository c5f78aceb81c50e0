//! What each link reports about its worker: state, since when, the last error and the
//! last `GetStatus` answer.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::rpc::pb;

/// A worker's state as its link sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkState {
    /// Serving closures.
    Up,
    /// Not answering (or not yet answered); probed with backoff.
    Recovering,
    /// Did not answer within the recovery bound; no longer used.
    GivenUp,
}

impl LinkState {
    /// `"up"`, `"recovering"` or `"given_up"`.
    pub fn label(self) -> &'static str {
        match self {
            Self::Up => "up",
            Self::Recovering => "recovering",
            Self::GivenUp => "given_up",
        }
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
}

struct Info {
    state: LinkState,
    since: Instant,
    last_error: Option<String>,
    status: Option<pb::GetStatusResponse>,
}

/// The shared, lockable status of one link (written by the link, read by anyone).
pub(crate) struct LinkStatus {
    index: usize,
    address: String,
    info: Mutex<Info>,
}

impl LinkStatus {
    /// A link that has not reached its worker yet (`recovering`, as TF counts a worker
    /// that has not answered as failed).
    pub fn new(index: usize, address: String) -> Self {
        Self {
            index,
            address,
            info: Mutex::new(Info {
                state: LinkState::Recovering,
                since: Instant::now(),
                last_error: None,
                status: None,
            }),
        }
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
        self.lock().status = Some(status);
    }

    pub fn snapshot(&self) -> WorkerSnapshot {
        let info = self.lock();
        WorkerSnapshot {
            index: self.index,
            address: self.address.clone(),
            state: info.state,
            in_state_for: info.since.elapsed(),
            last_error: info.last_error.clone(),
            status: info.status.clone(),
        }
    }
}
