//! Joining: `wait`, `done`, and raising the pending error.

use std::sync::{Arc, MutexGuard};
use std::time::Duration;

use super::closure_queue::{cancel_all, ClosureQueue};
use super::error::QueueError;
use super::state::{Signal, State};
use super::wait::{Cut, WaitPolicy};
use super::Cancel;

impl<T: Cancel, E> ClosureQueue<T, E> {
    /// Waits until no untagged closure is queued or inflight. Returns `Ok(true)` then,
    /// `Ok(false)` if `timeout` passed first, or the pending error (see
    /// [`QueueError::Failed`]) if one is pending or a closure fails meanwhile.
    ///
    /// No `put` starts while a wait is in progress (puts already blocked on a full queue
    /// are waited for), so the queue cannot be refilled under a waiter's feet.
    pub fn wait(&self, timeout: Option<Duration>) -> Result<bool, QueueError<E>> {
        self.wait_with(&mut WaitPolicy::timeout(timeout))
    }

    /// [`wait`](Self::wait) with a deadline and interrupt check. A deadline that passes while
    /// the pending error is being raised returns `Ok(false)` and leaves the error pending.
    pub fn wait_with(&self, policy: &mut WaitPolicy<'_>) -> Result<bool, QueueError<E>> {
        let mut state = self.lock();
        state.waits += 1;
        let outcome = loop {
            if let Some(error) = state.error.clone() {
                let (guard, err) = self.raise_pending(state, error, policy);
                state = guard;
                break match err {
                    QueueError::TimedOut => Ok(false),
                    err => Err(err),
                };
            }
            if state.is_idle() {
                break Ok(true);
            }
            let (guard, cut) = self.block(state, Signal::Idle, policy);
            state = guard;
            match cut {
                Some(_) if state.error.is_none() && state.is_idle() => break Ok(true),
                Some(Cut::TimedOut) if state.error.is_none() => break Ok(false),
                Some(Cut::Interrupted) => break Err(QueueError::Interrupted),
                _ => {}
            }
        };
        state.waits -= 1;
        if state.waits == 0 {
            self.signals.notify_all(&state, Signal::GateOpen);
        }
        outcome
    }

    /// Whether no untagged closure is queued or inflight; raises the pending error instead
    /// if there is one (which blocks until the inflight closures are done, see
    /// [`QueueError::Failed`]).
    pub fn done(&self) -> Result<bool, QueueError<E>> {
        self.done_with(&mut WaitPolicy::forever())
    }

    /// [`done`](Self::done) with a deadline and interrupt check, which only matter while a
    /// pending error is being raised; cut short, the error stays pending.
    pub fn done_with(&self, policy: &mut WaitPolicy<'_>) -> Result<bool, QueueError<E>> {
        let state = self.lock();
        let Some(error) = state.error.clone() else {
            return Ok(state.queue.is_empty() && state.inflight == 0);
        };
        let (state, err) = self.raise_pending(state, error, policy);
        drop(state);
        Err(err)
    }

    /// Raises the pending `error` (the caller saw it in `state`): cancels every queued untagged
    /// closure, waits until nothing is inflight, clears the error and returns it, all with
    /// the guard re-acquired. Cancellation runs with the lock released.
    ///
    /// Several callers may raise the same error at once (a put and a done, say); each gets
    /// it, and the first to see inflight reach zero clears it. `epoch` tells the others it
    /// was cleared, so none of them mistakes a later error for this one.
    pub(super) fn raise_pending<'q>(
        &'q self,
        mut state: MutexGuard<'q, State<T, E>>,
        error: Arc<E>,
        policy: &mut WaitPolicy<'_>,
    ) -> (MutexGuard<'q, State<T, E>>, QueueError<E>) {
        let epoch = state.epoch;
        let drained = std::mem::take(&mut state.queue);
        self.signals.notify_all(&state, Signal::NotFull);
        drop(state);
        cancel_all(drained);
        state = self.lock();
        while state.inflight > 0 && state.epoch == epoch {
            let (guard, cut) = self.block(state, Signal::Idle, policy);
            state = guard;
            if let Some(cut) = cut {
                if state.inflight > 0 && state.epoch == epoch {
                    return (state, cut.into());
                }
            }
        }
        if state.epoch == epoch {
            let cleared = state.error.take();
            state.epoch += 1;
            self.signals.notify_all(&state, Signal::Idle);
            drop(state);
            drop(cleared); // E may run arbitrary code on drop: never under the lock
            state = self.lock();
        }
        (state, QueueError::Failed(error))
    }
}
