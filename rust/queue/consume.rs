//! The consumer side: `get`, and a worker's verdict on the closure it took
//! (`mark_finished`, `mark_failed`, `put_back`).

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use super::closure_queue::ClosureQueue;
use super::error::{QueueError, TryGetError};
use super::state::{Signal, Signals, State};
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
        let (item, wake) = self.take(&mut state, tag);
        drop(state);
        self.wake_one(wake);
        item.ok_or(TryGetError::Empty)
    }

    /// Removes and returns everything queued under `tag`, in order, without touching the
    /// global queue (a worker that leaves hands back its sub-queue).
    pub fn take_tagged(&self, tag: Tag) -> Vec<T> {
        self.lock()
            .tagged
            .remove(&tag)
            .map(Vec::from)
            .unwrap_or_default()
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

    /// [`get`](Self::get) for async callers: awaits instead of blocking a thread (a
    /// dispatcher's links are tasks on the runtime). `None` on timeout or once stopped.
    /// Cancel-safe: dropping the future takes nothing from the queue.
    pub async fn get_async(&self, tag: Option<Tag>, timeout: Option<Duration>) -> Option<T> {
        /// Counts an async getter as sleeping while it waits, and uncounts it however the
        /// wait ends (woken, timed out, or the future dropped).
        struct Sleeping<'q, T, E>(&'q ClosureQueue<T, E>);
        impl<T, E> Drop for Sleeping<'_, T, E> {
            fn drop(&mut self) {
                let mut state = self.0.state.lock().unwrap_or_else(PoisonError::into_inner);
                state.sleepers.async_getters -= 1;
            }
        }
        let deadline = timeout.map(|timeout| tokio::time::Instant::now() + timeout);
        loop {
            let notified = self.signals.not_empty_async().notified();
            tokio::pin!(notified);
            let sleeping = {
                let mut state = self.lock();
                if state.stopped {
                    return None;
                }
                let (item, wake) = self.take(&mut state, tag);
                if item.is_some() {
                    drop(state);
                    self.wake_one(wake);
                    return item;
                }
                // Registered before the lock is released, so a put after this look
                // cannot be missed.
                notified.as_mut().enable();
                state.sleepers.async_getters += 1;
                Sleeping(self)
            };
            let woken = match deadline {
                None => {
                    notified.await;
                    true
                }
                Some(deadline) => tokio::time::timeout_at(deadline, notified).await.is_ok(),
            };
            drop(sleeping);
            if !woken {
                let mut state = self.lock();
                if state.stopped {
                    return None;
                }
                let (item, wake) = self.take(&mut state, tag);
                drop(state);
                self.wake_one(wake);
                return item;
            }
        }
    }

    /// [`get`](Self::get) with a deadline and interrupt check; fails only with
    /// [`QueueError::Interrupted`].
    pub fn get_with(
        &self,
        tag: Option<Tag>,
        policy: &mut WaitPolicy<'_>,
    ) -> Result<Option<T>, QueueError<E>> {
        let mut state = self.lock();
        let mut cut = None;
        loop {
            if state.stopped {
                return Ok(None);
            }
            let (item, wake) = self.take(&mut state, tag);
            if item.is_some() {
                drop(state);
                self.wake_one(wake);
                return Ok(item);
            }
            if let Some(cut) = cut {
                // Nothing to take, but a put may have woken this getter just before it gave
                // up; let another getter have that wake-up.
                self.pass_wakeup(&state, Signal::NotEmpty);
                return match cut {
                    Cut::TimedOut => Ok(None),
                    Cut::Interrupted => Err(QueueError::Interrupted),
                };
            }
            (state, cut) = self.block(state, Signal::NotEmpty, policy);
        }
    }

    /// Records that the inflight closure finished successfully. Lock-free unless this was
    /// the last inflight closure and someone waits for that.
    pub fn mark_finished(&self) -> Result<(), QueueError<E>> {
        let remaining = self.leave_inflight("mark_finished")?;
        if remaining == 0 && self.counters.0.idle_sleepers.load(Ordering::SeqCst) > 0 {
            let state = self.lock();
            if Self::idle_wake_useful(&state) {
                self.signals.notify_all(&state, Signal::Idle);
            }
        }
        Ok(())
    }

    /// Records that the inflight closure failed with `error`. The first error since the last
    /// one was raised is kept (later ones are dropped) and raised by the next `put`, `wait` or
    /// `done`; a `wait` in progress returns it at once.
    pub fn mark_failed(&self, error: E) -> Result<(), QueueError<E>> {
        let mut state = self.lock();
        self.leave_inflight("mark_failed")?;
        let later_error = if state.error.is_none() {
            state.error = Some(Arc::new(error));
            None
        } else {
            Some(error)
        };
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
        if self.inflight() == 0 {
            drop(state);
            drop(item);
            return Err(QueueError::NotInflight {
                operation: "put_back",
            });
        }
        if state.error.is_some() || state.stopped {
            // Cancelled while still counted inflight (and with the lock released, as every
            // cancellation is): a wait() or join() that returns, or an error raise that
            // waits for inflight closures, then finds this closure already cancelled.
            drop(state);
            item.cancel();
            state = self.lock();
        } else {
            // Queued before inflight drops, so nobody sees "nothing queued, nothing inflight"
            // in between.
            state.queue.push_back(item);
            self.signals.notify_one(&state, Signal::NotEmpty);
        }
        // Cannot fail: inflight was positive under the lock, and only this lock-free path
        // (mark_finished) decrements it concurrently, each for a closure of its own.
        if self.leave_inflight("put_back").unwrap_or(1) == 0 && Self::idle_wake_useful(&state) {
            self.signals.notify_all(&state, Signal::Idle);
        }
        Ok(())
    }

    /// Pops from `tag`'s sub-queue, else from the global queue (counting it inflight).
    /// Also returns the putter to wake once the lock is released, if a slot freed up.
    fn take(&self, state: &mut State<T, E>, tag: Option<Tag>) -> (Option<T>, Option<Signal>) {
        if let Some(tag) = tag {
            if let Some(item) = state.tagged.get_mut(&tag).and_then(VecDeque::pop_front) {
                return (Some(item), None);
            }
        }
        let Some(item) = state.queue.pop_front() else {
            return (None, None);
        };
        self.counters.0.inflight.fetch_add(1, Ordering::SeqCst);
        let wake = (Signals::has_sleepers(state, Signal::NotFull) && !state.is_full(self.max_size))
            .then_some(Signal::NotFull);
        (Some(item), wake)
    }
}
