//! [`ResultCell`]: where a closure's outcome lands, once, and where callers wait for it.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::cell_watch::CellWatch;
use super::failure::ClosureFailure;
use crate::spin::Spin;

/// A Python value as it crosses the wire: a pickle stream plus its out-of-band buffers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EncodedValue {
    /// The pickle (protocol 5) stream; empty for "no value".
    pub pickle: Bytes,
    /// The out-of-band buffers, in the order the pickler produced them.
    pub buffers: Vec<Bytes>,
}

impl EncodedValue {
    /// Bytes it holds: the pickle and every buffer.
    pub fn byte_len(&self) -> usize {
        self.pickle.len() + self.buffers.iter().map(Bytes::len).sum::<usize>()
    }
}

/// How a closure ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The function returned this value.
    Value(EncodedValue),
    /// The closure failed; the same failure may also be pending in the queue.
    Failed(Arc<ClosureFailure>),
    /// The closure was cancelled before it could finish; the message says why.
    Cancelled(String),
}

/// A cell's status, numbered as the binding reports it (TF's `RemoteValueStatus` order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CellStatus {
    /// No outcome yet.
    NotReady = 0,
    /// Cancelled.
    Aborted = 1,
    /// A value or an error.
    Ready = 2,
}

/// Why an interruptible wait stopped early.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("waiting for the closure's result was interrupted")]
pub struct Interrupted;

struct CellState {
    outcome: Option<Outcome>,
    waiters: usize,
    /// Told when the cell settles (dataflow's dependency tracker).
    watches: Vec<Arc<CellWatch>>,
}

/// [`ResultCell::worker`] before a worker settled the cell.
const NO_WORKER: usize = usize::MAX;

/// The outcome of one closure: not ready, then exactly one of a value, an error or a
/// cancellation. Waitable with a deadline; the dispatcher settles it, callers read it.
///
/// ```
/// use std::time::{Duration, Instant};
/// use _core::dispatch::{CellStatus, ResultCell};
///
/// let cell = ResultCell::new(7);
/// assert_eq!(cell.status(), CellStatus::NotReady);
/// // Nothing settles it here, so the wait times out.
/// assert!(!cell.wait(Some(Instant::now() + Duration::from_millis(1))));
/// ```
pub struct ResultCell {
    id: u64,
    scheduled: Instant,
    state: Mutex<CellState>,
    settled: Condvar,
    /// The index of the worker whose answer settled the cell ([`NO_WORKER`] until then):
    /// where a kept result lives.
    worker: AtomicUsize,
    /// Whether `state.outcome` is set, readable without the lock: what a waiter spins on.
    settled_flag: AtomicBool,
}

/// Where a thread waiting for a closure's outcome (`fetch()`) spins before it parks.
static FETCH_SPIN: Spin = Spin::configured()
    .reporting(&crate::spin::report::FETCH)
    .driving();

impl ResultCell {
    /// A not-ready cell for closure `id`, scheduled now.
    pub fn new(id: u64) -> Self {
        Self {
            id,
            scheduled: Instant::now(),
            state: Mutex::new(CellState {
                outcome: None,
                waiters: 0,
                watches: Vec::new(),
            }),
            settled: Condvar::new(),
            worker: AtomicUsize::new(NO_WORKER),
            settled_flag: AtomicBool::new(false),
        }
    }

    /// The closure's id (also sent to the worker as `closure_id`).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// When the closure was scheduled.
    pub fn scheduled_at(&self) -> Instant {
        self.scheduled
    }

    /// The index of the worker whose answer settled the cell (a kept result lives there),
    /// or `None` when no worker did (not ended, cancelled, or failed before running).
    pub fn worker(&self) -> Option<usize> {
        match self.worker.load(Ordering::Acquire) {
            NO_WORKER => None,
            index => Some(index),
        }
    }

    /// Records the worker answering for the closure, just before it settles the cell.
    pub(crate) fn set_worker(&self, index: usize) {
        self.worker.store(index, Ordering::Release);
    }

    /// Has `watch` told (with this cell's id) when the cell settles; at once if it has.
    pub fn watch(&self, watch: &Arc<CellWatch>) {
        let mut state = self.lock();
        if state.outcome.is_none() {
            state.watches.push(Arc::clone(watch));
            return;
        }
        drop(state);
        watch.notify(self.id);
    }

    /// The current status.
    pub fn status(&self) -> CellStatus {
        match &self.lock().outcome {
            None => {
                // A poll (`RemoteValue.done()`) waits for the runtime's work too.
                crate::runtime::lend::nudge();
                CellStatus::NotReady
            }
            Some(Outcome::Cancelled(_)) => CellStatus::Aborted,
            Some(_) => CellStatus::Ready,
        }
    }

    /// The outcome, if the closure has ended.
    pub fn outcome(&self) -> Option<Outcome> {
        self.lock().outcome.clone()
    }

    /// Waits until the closure has ended or `deadline` passes (`None`: no deadline);
    /// returns whether it has ended.
    pub fn wait(&self, deadline: Option<Instant>) -> bool {
        let mut never = || false;
        self.wait_interruptible(deadline, Duration::MAX, &mut never)
            .unwrap_or(false)
    }

    /// [`wait`](Self::wait), also calling `check` every `every` with no lock held; when it
    /// returns `true` the wait stops with [`Interrupted`]. A binding uses this to let
    /// Ctrl-C through while it waits without the GIL.
    pub fn wait_interruptible(
        &self,
        deadline: Option<Instant>,
        every: Duration,
        check: &mut dyn FnMut() -> bool,
    ) -> Result<bool, Interrupted> {
        self.wait_spinning(&FETCH_SPIN, deadline, every, check)
    }

    /// [`wait_interruptible`](Self::wait_interruptible), spinning at `spin` first: an
    /// answer due within its budget is caught spinning, saving the wake-up.
    fn wait_spinning(
        &self,
        spin: &Spin,
        deadline: Option<Instant>,
        every: Duration,
        check: &mut dyn FnMut() -> bool,
    ) -> Result<bool, Interrupted> {
        let spin_seen = (!self.settled_flag.load(Ordering::Acquire))
            .then(|| spin.until(deadline, || self.settled_flag.load(Ordering::Acquire)));
        let mut state = self.lock();
        loop {
            if state.outcome.is_some() {
                if let Some(seen) = spin_seen {
                    spin.wait_ended(seen);
                }
                return Ok(true);
            }
            let now = Instant::now();
            if deadline.is_some_and(|deadline| now >= deadline) {
                return Ok(false);
            }
            let slice = deadline.map_or(every, |deadline| (deadline - now).min(every));
            // Parking: the runtime's driver thread reads the answer, not a later spinner.
            crate::runtime::lend::nudge();
            state.waiters += 1;
            let (guard, timeout) = self
                .settled
                .wait_timeout(state, slice)
                .unwrap_or_else(PoisonError::into_inner);
            state = guard;
            state.waiters -= 1;
            if timeout.timed_out() && state.outcome.is_none() && slice == every {
                drop(state);
                if check() {
                    return Err(Interrupted);
                }
                state = self.lock();
            }
        }
    }

    /// Records the outcome unless one is already recorded; returns whether this call did.
    pub(crate) fn settle(&self, outcome: Outcome) -> bool {
        let mut state = self.lock();
        if state.outcome.is_some() {
            return false;
        }
        state.outcome = Some(outcome);
        self.settled_flag.store(true, Ordering::Release);
        let wake = state.waiters > 0;
        let watches = std::mem::take(&mut state.watches);
        drop(state);
        if wake {
            self.settled.notify_all();
        }
        for watch in watches {
            watch.notify(self.id);
        }
        true
    }

    fn lock(&self) -> MutexGuard<'_, CellState> {
        // Every critical section is a single assignment or counter change.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl std::fmt::Debug for ResultCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResultCell")
            .field("id", &self.id)
            .field("status", &self.status())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_outcome_wins_and_wakes_waiters() {
        let cell = Arc::new(ResultCell::new(1));
        let waiter = {
            let cell = Arc::clone(&cell);
            std::thread::spawn(move || cell.wait(Some(Instant::now() + Duration::from_secs(30))))
        };
        let value = EncodedValue {
            pickle: Bytes::from_static(b"v"),
            buffers: vec![],
        };
        assert!(cell.settle(Outcome::Value(value.clone())));
        assert!(!cell.settle(Outcome::Cancelled("late".into())));
        assert!(waiter.join().unwrap());
        assert_eq!(cell.status(), CellStatus::Ready);
        assert_eq!(cell.outcome(), Some(Outcome::Value(value)));
    }

    #[test]
    fn a_cancelled_cell_is_aborted() {
        let cell = ResultCell::new(2);
        cell.settle(Outcome::Cancelled("stopped".into()));
        assert_eq!(cell.status(), CellStatus::Aborted);
        assert!(cell.wait(None));
    }

    #[test]
    fn the_interrupt_check_stops_a_wait() {
        let cell = ResultCell::new(3);
        let mut calls = 0;
        let mut check = || {
            calls += 1;
            calls == 2
        };
        let deadline = Some(Instant::now() + Duration::from_secs(30));
        let result = cell.wait_interruptible(deadline, Duration::from_millis(1), &mut check);
        assert_eq!(result, Err(Interrupted));
        assert_eq!(calls, 2);
    }

    /// Cells settled at random moments around the spin budget (caught spinning, after the
    /// waiter parked, between the two): every waiter sees its outcome, none waits for a
    /// poll (the slice is an hour).
    #[test]
    fn a_spinning_waiter_sees_every_outcome_whenever_it_lands() {
        use rand::Rng;
        let spin = Arc::new(Spin::with_budget(Duration::from_micros(200)));
        let waiters: Vec<_> = (0..8)
            .map(|_| {
                let spin = Arc::clone(&spin);
                std::thread::spawn(move || {
                    let mut rng = rand::rng();
                    for id in 0..150 {
                        let cell = Arc::new(ResultCell::new(id));
                        let settler = {
                            let cell = Arc::clone(&cell);
                            let pause = Duration::from_micros(rng.random_range(0..400));
                            std::thread::spawn(move || {
                                std::thread::sleep(pause);
                                cell.settle(Outcome::Cancelled("done".into()));
                            })
                        };
                        let mut never = || false;
                        let deadline = Some(Instant::now() + Duration::from_secs(60));
                        let ended = cell
                            .wait_spinning(&spin, deadline, Duration::from_secs(3600), &mut never)
                            .unwrap();
                        assert!(ended, "cell {id} settled but its waiter timed out");
                        settler.join().unwrap();
                    }
                })
            })
            .collect();
        for waiter in waiters {
            waiter.join().unwrap();
        }
    }
}
