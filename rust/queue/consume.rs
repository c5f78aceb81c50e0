//! The consumer side: `get`, and a worker's verdict on the closure it took
//! (`mark_finished`, `mark_failed`, `put_back`).

use std::collections::VecDeque;
use std::sync::{Arc, MutexGuard};
use std::time::Duration;

use super::closure_queue::ClosureQueue;
use super::error::{QueueError, TryGetError};
use super::state::{Signal, State};
use super::wait::{Cut, WaitPolicy};
use super::{Cancel, Tag};

impl<T: Cancel, E> ClosureQueue<T, E> {
    /// Takes the next closure without blocking: from `tag`'s sub-queue first, then from the
    /// global queue (which counts it inflight).
    pub fn try_get(&self, tag: Option<Tag>) -> Result<T, TryGetError> {
        let mut state = self.lock();
        if state.stopped {
            return Err(TryGetError::Stopped);
        }
        self.take(&mut state, tag).ok_or(TryGetError::Empty)
    }

    /// Takes the next closure, waiting up to `timeout` (`None`: as long as it takes) for one.
    /// Returns `None` on timeout or once the queue is stopped.
    ///
    /// A getter with a `tag` is served from that tag's sub-queue before the global queue.
    /// Only untagged closures count as inflight; each must be followed by exactly one of
    /// [`mark_finished`](Self::mark_finished), [`mark_failed`](Self::mark_failed) or
    /// [`put_back`](Self::put_back).
    pub fn get(&self, tag: Option<Tag>, timeout: Option<Duration>) -> Option<T> {
        // Without an interrupt check, get_with cannot fail.
        self.get_with(tag, &mut WaitPolicy::timeout(timeout))
            .ok()
            .flatten()
    }

    /// [`get`](Self::get) with a deadline and interrupt check; fails only with
    /// [`QueueError::Interrupted`].
    pub fn get_with(
        &self,
        tag: Option<Tag>,
        policy: &mut WaitPolicy<'_>,
    ) -> Result<Option<T>, QueueError<E>> {
        let mut state = self.lock();
        loop {
            if state.stopped {
                return Ok(None);
            }
            if let Some(item) = self.take(&mut state, tag) {
                return Ok(Some(item));
            }
            let (guard, cut) = self.block(state, Signal::NotEmpty, policy);
            state = guard;
            if let Some(cut) = cut {
                if state.stopped {
                    return Ok(None);
                }
                if let Some(item) = self.take(&mut state, tag) {
                    return Ok(Some(item));
                }
                // Nothing to take now, but a put may have woken this getter just before it
                // gave up; let another getter have that wake-up.
                self.pass_wakeup(&state, Signal::NotEmpty);
                return match cut {
                    Cut::TimedOut => Ok(None),
                    Cut::Interrupted => Err(QueueError::Interrupted),
                };
            }
        }
    }

    /// Records that the inflight closure finished successfully.
    pub fn mark_finished(&self) -> Result<(), QueueError<E>> {
        let mut state = self.lock();
        Self::leave_inflight(&mut state, "mark_finished")?;
        self.after_inflight_left(&state);
        Ok(())
    }

    /// Records that the inflight closure failed with `error`. The first error since the last
    /// one was raised is kept (later ones are dropped) and raised by the next `put`, `wait` or
    /// `done`; a `wait` in progress returns it at once.
    pub fn mark_failed(&self, error: E) -> Result<(), QueueError<E>> {
        let mut state = self.lock();
        Self::leave_inflight(&mut state, "mark_failed")?;
        let later_error = if state.error.is_none() {
            state.error = Some(Arc::new(error));
            None
        } else {
            Some(error)
        };
        self.after_inflight_left(&state);
        // Waiters raise it now; puts blocked on a full queue stop waiting for a slot.
        self.signals.notify_all(&state, Signal::Idle);
        self.signals.notify_all(&state, Signal::NotFull);
        drop(state);
        drop(later_error); // dropped with the lock released: E may run arbitrary code on drop
        Ok(())
    }

    /// Returns an inflight closure that could not run (e.g. its worker went away) to the
    /// tail of the global queue, or cancels it if an error is pending or the queue stopped.
    ///
    /// Unlike TF this never blocks on a full queue: every put-back item was taken by an
    /// earlier `get`, so the overshoot is bounded by the inflight count, and a worker putting
    /// back can never deadlock against producers waiting for the slot it would need.
    pub fn put_back(&self, item: T) -> Result<(), QueueError<E>> {
        let mut state = self.lock();
        if let Err(err) = Self::leave_inflight(&mut state, "put_back") {
            drop(state);
            drop(item);
            return Err(err);
        }
        let cancel = if state.error.is_some() || state.stopped {
            Some(item)
        } else {
            state.queue.push_back(item);
            self.signals.notify_one(&state, Signal::NotEmpty);
            None
        };
        self.after_inflight_left(&state);
        drop(state);
        if let Some(item) = cancel {
            item.cancel();
        }
        Ok(())
    }

    /// Pops from `tag`'s sub-queue, else from the global queue (counting it inflight and
    /// handing its slot to a blocked putter).
    fn take(&self, state: &mut MutexGuard<'_, State<T, E>>, tag: Option<Tag>) -> Option<T> {
        if let Some(tag) = tag {
            if let Some(item) = state.tagged.get_mut(&tag).and_then(VecDeque::pop_front) {
                return Some(item);
            }
        }
        let item = state.queue.pop_front()?;
        state.inflight += 1;
        if !state.is_full(self.max_size) {
            self.signals.notify_one(state, Signal::NotFull);
        }
        Some(item)
    }

    fn leave_inflight(
        state: &mut State<T, E>,
        operation: &'static str,
    ) -> Result<(), QueueError<E>> {
        if state.inflight == 0 {
            return Err(QueueError::NotInflight { operation });
        }
        state.inflight -= 1;
        Ok(())
    }

    /// Wakes `wait`/raisers when the last inflight closure left.
    fn after_inflight_left(&self, state: &State<T, E>) {
        if state.inflight == 0 {
            self.signals.notify_all(state, Signal::Idle);
        }
    }
}
