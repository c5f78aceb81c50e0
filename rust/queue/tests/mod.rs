//! Unit tests of the closure queue, climbing crossbeam's ladder: smoke and length, single
//! and many producers/consumers, drop counting, the TF semantics one by one, then a seeded
//! stress test. Every blocking call has a deadline, and every spawned thread is joined under
//! one, so a deadlock fails the test instead of hanging it.

mod asynchronous;
mod drops;
mod errors;
mod lifecycle;
mod smoke;
mod stress;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use super::{Cancel, ClosureQueue};

/// Generous bound for anything that should happen "promptly"; only reached on a bug.
pub(super) const PROMPTLY: Duration = Duration::from_secs(20);

/// Per-item counters: how each item ended, and how often it was dropped.
pub(super) struct Ledger {
    pub finished: Vec<AtomicU32>,
    pub failed: Vec<AtomicU32>,
    pub cancelled: Vec<AtomicU32>,
    pub dropped: Vec<AtomicU32>,
}

impl Ledger {
    pub fn new(items: usize) -> Arc<Self> {
        let counters = || (0..items).map(|_| AtomicU32::new(0)).collect();
        Arc::new(Self {
            finished: counters(),
            failed: counters(),
            cancelled: counters(),
            dropped: counters(),
        })
    }

    pub fn item(self: &Arc<Self>, id: usize) -> Item {
        Item {
            id,
            ledger: Arc::clone(self),
        }
    }

    pub fn count(counters: &[AtomicU32]) -> u32 {
        counters.iter().map(|c| c.load(Ordering::SeqCst)).sum()
    }

    pub fn cancelled_ids(&self) -> Vec<usize> {
        ids_where(&self.cancelled)
    }

    /// Panics unless every item ended exactly once and was dropped exactly once.
    pub fn assert_each_settled_once(&self) {
        for id in 0..self.dropped.len() {
            let ends = [&self.finished, &self.failed, &self.cancelled]
                .map(|counters| counters[id].load(Ordering::SeqCst));
            assert_eq!(
                ends.iter().sum::<u32>(),
                1,
                "item {id} must end exactly once (finished, failed, cancelled) = {ends:?}"
            );
            assert_eq!(
                self.dropped[id].load(Ordering::SeqCst),
                1,
                "item {id} must be dropped exactly once"
            );
        }
    }
}

fn ids_where(counters: &[AtomicU32]) -> Vec<usize> {
    (0..counters.len())
        .filter(|&id| counters[id].load(Ordering::SeqCst) > 0)
        .collect()
}

/// A test closure that records its fate in a [`Ledger`].
#[derive(Debug)]
pub(super) struct Item {
    pub id: usize,
    ledger: Arc<Ledger>,
}

impl Item {
    pub fn finish(self) {
        self.ledger.finished[self.id].fetch_add(1, Ordering::SeqCst);
    }

    pub fn fail(self) {
        self.ledger.failed[self.id].fetch_add(1, Ordering::SeqCst);
    }
}

impl Cancel for Item {
    fn cancel(self) {
        self.ledger.cancelled[self.id].fetch_add(1, Ordering::SeqCst);
    }
}

impl Drop for Item {
    fn drop(&mut self) {
        self.ledger.dropped[self.id].fetch_add(1, Ordering::SeqCst);
    }
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ledger")
            .field("items", &self.dropped.len())
            .finish_non_exhaustive()
    }
}

pub(super) type Queue = ClosureQueue<Item, String>;

/// Runs `f` on its own thread and returns its result, failing the test if it takes longer
/// than [`PROMPTLY`] (a deadlock).
pub(super) fn within<R: Send + 'static>(what: &str, f: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = mpsc::channel();
    let handle = thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(PROMPTLY) {
        Ok(result) => {
            handle.join().expect("thread panicked after sending");
            result
        }
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("{what}: no result within {PROMPTLY:?}"),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            let panic = handle.join().expect_err("thread ended without a result");
            std::panic::resume_unwind(panic)
        }
    }
}

/// Spawns `f`; the returned receiver yields its result (see [`within`] to bound waiting).
pub(super) fn spawn<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> Pending<R> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(f());
    });
    Pending(rx)
}

/// The result of a spawned thread, collected with a deadline.
pub(super) struct Pending<R>(mpsc::Receiver<R>);

impl<R> Pending<R> {
    /// The result, or a test failure if it does not arrive within [`PROMPTLY`].
    pub fn join(self, what: &str) -> R {
        self.0
            .recv_timeout(PROMPTLY)
            .unwrap_or_else(|err| panic!("{what}: no result within {PROMPTLY:?} ({err})"))
    }

    /// `Some(result)` if it has already arrived.
    pub fn try_join(&self) -> Option<R> {
        self.0.try_recv().ok()
    }
}

/// Waits until `condition` holds on the queue's internal state (e.g. "one getter asleep"),
/// failing the test if it does not within [`PROMPTLY`].
pub(super) fn await_state<T: Cancel, E>(
    queue: &ClosureQueue<T, E>,
    what: &str,
    condition: impl Fn(&super::state::State<T, E>) -> bool,
) {
    let deadline = Instant::now() + PROMPTLY;
    while !condition(&queue.lock()) {
        assert!(
            Instant::now() < deadline,
            "{what}: not reached within {PROMPTLY:?}"
        );
        thread::yield_now();
    }
}
