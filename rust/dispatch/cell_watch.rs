//! [`CellWatch`]: one waiter told when any of many result cells settles.
//!
//! Dataflow (a closure whose arguments are other closures' results) needs to know when
//! each producer ends without a thread per producer and without polling: the coordinator's
//! dependency tracker registers a watch on every producer cell it waits for
//! ([`ResultCell::watch`](super::ResultCell::watch)) and sleeps on the watch, which hands
//! back the ids of the cells that settled since it last looked. A settle notifies its
//! watches after the cell's own lock is released, so a watch's lock is never taken under a
//! cell's.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use super::result_cell::Interrupted;

#[derive(Default)]
struct WatchState {
    /// Closure ids settled and not handed out yet, in settle order.
    settled: Vec<u64>,
    /// `wake()` was called: the next wait returns at once.
    woken: bool,
}

/// A set of settled closure ids that one thread drains.
///
/// ```
/// use std::sync::Arc;
/// use _core::dispatch::{CellWatch, ResultCell};
///
/// let watch = Arc::new(CellWatch::default());
/// let cell = ResultCell::new(9);
/// cell.watch(&watch);
/// let mut never = || false;
/// // Nothing settled it: the wait times out empty.
/// let ids = watch.wait_interruptible(Some(std::time::Instant::now()), std::time::Duration::MAX, &mut never);
/// assert_eq!(ids, Ok(vec![]));
/// ```
#[derive(Default)]
pub struct CellWatch {
    state: Mutex<WatchState>,
    changed: Condvar,
}

impl CellWatch {
    /// Records that closure `id` settled and wakes the waiter.
    pub fn notify(&self, id: u64) {
        self.lock().settled.push(id);
        self.changed.notify_all();
    }

    /// Wakes the waiter with nothing settled (new work to look at, or shutting down).
    pub fn wake(&self) {
        self.lock().woken = true;
        self.changed.notify_all();
    }

    /// Waits until some watched cell settled, [`wake`](Self::wake) was called or
    /// `deadline` passed, calling `check` every `every` with no lock held (`true` stops
    /// the wait with [`Interrupted`]); returns the settled ids (empty when woken or timed
    /// out).
    pub fn wait_interruptible(
        &self,
        deadline: Option<Instant>,
        every: Duration,
        check: &mut dyn FnMut() -> bool,
    ) -> Result<Vec<u64>, Interrupted> {
        // This wait does not spin: the runtime's driver thread settles the cells.
        crate::runtime::lend::nudge();
        let mut state = self.lock();
        loop {
            if !state.settled.is_empty() || state.woken {
                state.woken = false;
                return Ok(std::mem::take(&mut state.settled));
            }
            let now = Instant::now();
            if deadline.is_some_and(|deadline| now >= deadline) {
                return Ok(Vec::new());
            }
            let slice = deadline.map_or(every, |deadline| (deadline - now).min(every));
            let (guard, timeout) = self
                .changed
                .wait_timeout(state, slice)
                .unwrap_or_else(PoisonError::into_inner);
            state = guard;
            if timeout.timed_out() && slice == every && state.settled.is_empty() && !state.woken {
                drop(state);
                if check() {
                    return Err(Interrupted);
                }
                state = self.lock();
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, WatchState> {
        // Every critical section is a push, a flag or a take.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The watches to wake on some event other than a settle (e.g. a worker's preemption
/// notice, `Dispatcher::watch_preemptions`). Held weakly: a watch dropped by its waiter
/// goes from the list at the next wake.
#[derive(Default)]
pub(crate) struct WatchList {
    watches: Mutex<Vec<Weak<CellWatch>>>,
}

impl WatchList {
    /// Adds `watch`; it is woken by every later [`wake_all`](Self::wake_all).
    pub fn add(&self, watch: &Arc<CellWatch>) {
        self.lock().push(Arc::downgrade(watch));
    }

    /// Wakes every watch still alive (their waiters return with nothing settled).
    pub fn wake_all(&self) {
        let alive: Vec<Arc<CellWatch>> = {
            let mut watches = self.lock();
            watches.retain(|watch| watch.strong_count() > 0);
            watches.iter().filter_map(Weak::upgrade).collect()
        };
        for watch in alive {
            watch.wake();
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Weak<CellWatch>>> {
        // Every critical section is a push or a copy.
        self.watches.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl std::fmt::Debug for WatchList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchList").finish_non_exhaustive()
    }
}

impl std::fmt::Debug for CellWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CellWatch").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dispatch::result_cell::{Outcome, ResultCell};

    #[test]
    fn a_settle_reaches_every_watch_once() {
        let watch = Arc::new(CellWatch::default());
        let first = ResultCell::new(1);
        let second = ResultCell::new(2);
        first.watch(&watch);
        second.watch(&watch);
        let waiter = {
            let watch = Arc::clone(&watch);
            std::thread::spawn(move || {
                let mut never = || false;
                let deadline = Some(Instant::now() + Duration::from_secs(30));
                watch.wait_interruptible(deadline, Duration::MAX, &mut never)
            })
        };
        assert!(second.settle(Outcome::Cancelled("test".into())));
        assert_eq!(waiter.join().unwrap(), Ok(vec![2]));
        // A cell settled before it is watched is reported at once.
        first.settle(Outcome::Cancelled("test".into()));
        let late = ResultCell::new(3);
        late.settle(Outcome::Cancelled("test".into()));
        late.watch(&watch);
        let mut never = || false;
        let ids = watch.wait_interruptible(None, Duration::MAX, &mut never);
        assert_eq!(ids, Ok(vec![1, 3]));
    }

    #[test]
    fn wake_returns_an_empty_batch() {
        let watch = CellWatch::default();
        watch.wake();
        let mut never = || false;
        assert_eq!(
            watch.wait_interruptible(None, Duration::MAX, &mut never),
            Ok(vec![])
        );
    }

    #[test]
    fn a_watch_list_wakes_the_live_watches_and_forgets_dropped_ones() {
        let list = WatchList::default();
        let kept = Arc::new(CellWatch::default());
        list.add(&kept);
        list.add(&Arc::new(CellWatch::default())); // dropped at once
        list.wake_all();
        assert_eq!(list.lock().len(), 1);
        let mut never = || false;
        let now = Some(Instant::now());
        assert_eq!(
            kept.wait_interruptible(now, Duration::MAX, &mut never),
            Ok(vec![])
        );
        assert!(!kept.lock().woken); // the wake was taken by that wait
    }
}
