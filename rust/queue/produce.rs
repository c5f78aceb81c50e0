//! The producer side: `put` and `try_put`.

use super::closure_queue::ClosureQueue;
use super::error::{QueueError, TryPutError};
use super::state::{Signal, Signals};
use super::wait::{Cut, WaitPolicy};
use super::{Cancel, Tag};

impl<T: Cancel, E> ClosureQueue<T, E> {
    /// Queues `item` without blocking, or hands it back.
    ///
    /// Refuses with [`TryPutError::Busy`] whenever the blocking [`put`](Self::put) would do
    /// more than append (a `wait` in progress, an error pending), so a binding can try this
    /// first and fall back to the blocking form with the same item. A tagged item is never
    /// refused unless the queue was stopped.
    pub fn try_put(&self, item: T, tag: Option<Tag>) -> Result<(), TryPutError<T>> {
        let mut state = self.lock();
        if state.stopped {
            return Err(TryPutError::Stopped(item));
        }
        if let Some(tag) = tag {
            state.tagged.entry(tag).or_default().push_back(item);
            self.signals.notify_all(&state, Signal::NotEmpty);
            return Ok(());
        }
        if state.waits > 0 || state.error.is_some() {
            return Err(TryPutError::Busy(item));
        }
        if state.is_full(self.max_size) {
            return Err(TryPutError::Full(item));
        }
        state.queue.push_back(item);
        // Decided under the lock, done after it. Only a thread asleep on the condvar is
        // woken through it: notifying a futex condvar is a system call even with nobody
        // asleep, and the coordinator's getters are its links, async tasks that sleep on
        // the `Notify` (one futex call per `schedule()` saved).
        let threads = state.sleepers.getters > 0;
        let wake = Signals::has_sleepers(&state, Signal::NotEmpty);
        drop(state);
        if threads {
            self.signals.condvar(Signal::NotEmpty).notify_one();
        }
        if wake {
            // The link that went idle last: in a serial loop, the one whose worker just
            // answered, still spinning for its next closure, its caches (and compiled
            // functions) warm, while the others' spins run out and they sleep.
            self.signals.not_empty_async().notify_last();
        }
        Ok(())
    }

    /// Queues `item`, blocking while the queue is full or a `wait` is in progress.
    ///
    /// With `tag`, the item goes to that worker's sub-queue instead: never blocks, is not
    /// counted inflight when taken, and no pending error is raised.
    ///
    /// If an error is pending, the item is queued first and the error raised afterwards, so
    /// the item is cancelled together with everything else queued (a put blocked on a full
    /// queue stops waiting for a slot when an error becomes pending). See
    /// [`QueueError::Failed`].
    pub fn put(&self, item: T, tag: Option<Tag>) -> Result<(), QueueError<E>> {
        self.put_with(item, tag, &mut WaitPolicy::forever())
    }

    /// [`put`](Self::put) with a deadline and interrupt check. When waiting is cut short
    /// before the item was queued, the item is cancelled and the reason returned; when it is
    /// cut short while raising the pending error, the error stays pending.
    pub fn put_with(
        &self,
        item: T,
        tag: Option<Tag>,
        policy: &mut WaitPolicy<'_>,
    ) -> Result<(), QueueError<E>> {
        let item = match self.try_put(item, tag) {
            Ok(()) => return Ok(()),
            Err(TryPutError::Stopped(item)) => return Err(cancelled(item, QueueError::Stopped)),
            Err(TryPutError::Busy(item) | TryPutError::Full(item)) => item,
        };
        let mut state = self.lock();
        // TF serialises put and wait on one lock: no put starts while a wait is in progress.
        while state.waits > 0 && !state.stopped {
            let (guard, cut) = self.block(state, Signal::GateOpen, policy);
            state = guard;
            if let Some(cut) = cut {
                drop(state);
                return Err(cancelled(item, cut.into()));
            }
        }
        if state.is_full(self.max_size) && state.error.is_none() && !state.stopped {
            state.blocked_putters += 1;
            let mut cut = None;
            while cut.is_none()
                && state.is_full(self.max_size)
                && state.error.is_none()
                && !state.stopped
            {
                let (guard, why) = self.block(state, Signal::NotFull, policy);
                state = guard;
                cut = why;
            }
            if !state.is_full(self.max_size) || state.error.is_some() {
                cut = None; // the slot (or the error) arrived along with the cut: proceed
            }
            state.blocked_putters -= 1;
            if cut.is_some() || state.stopped {
                // Leaving without queuing: a `wait` may be waiting on this put alone, and a
                // slot this put was woken for belongs to the next blocked putter.
                if self.is_idle(&state) {
                    self.signals.notify_all(&state, Signal::Idle);
                }
                if !state.is_full(self.max_size) {
                    self.pass_wakeup(&state, Signal::NotFull);
                }
                drop(state);
                let err = cut.map_or(QueueError::Stopped, QueueError::from);
                return Err(cancelled(item, err));
            }
        }
        if state.stopped {
            drop(state);
            return Err(cancelled(item, QueueError::Stopped));
        }
        state.queue.push_back(item);
        if let Some(error) = state.error.clone() {
            let (state, err) = self.raise_pending(state, error, policy);
            drop(state);
            return Err(err);
        }
        self.signals.notify_one(&state, Signal::NotEmpty);
        Ok(())
    }
}

/// Cancels `item` (lock released) and returns `err`, for puts that end without queuing.
fn cancelled<T: Cancel, E>(item: T, err: QueueError<E>) -> QueueError<E> {
    item.cancel();
    err
}

impl<E> From<Cut> for QueueError<E> {
    fn from(cut: Cut) -> Self {
        match cut {
            Cut::TimedOut => Self::TimedOut,
            Cut::Interrupted => Self::Interrupted,
        }
    }
}
