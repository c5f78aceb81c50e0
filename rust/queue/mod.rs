//! The closure queue: TensorFlow's `_CoordinatedClosureQueue` semantics as a generic,
//! thread-safe, bounded MPMC queue, with no knowledge of Python.
//!
//! # Semantics (SPEC §5)
//!
//! - `put` blocks while the queue is full or a `wait` is in progress, queues the item, and
//!   only then raises a pending error, so the item just put is cancelled with the rest.
//! - `get` hands out an item (counting it *inflight*) or `None` on timeout or after `stop`;
//!   every inflight item is settled by exactly one of `mark_finished`, `mark_failed` (the
//!   first error wins) or `put_back` (re-queued at the tail, or cancelled if an error is
//!   pending). Settling with nothing inflight is [`QueueError::NotInflight`].
//! - `wait` returns `true` when nothing is queued or inflight, `false` on timeout, or
//!   raises the pending error; `done` is its non-waiting twin. Raising cancels every queued
//!   item, waits until nothing is inflight, then clears the error: the queue is reusable.
//! - `stop` wakes every blocked getter and putter, and cancels what is still queued.
//! - Tagged per-worker sub-queues serve a tagged getter before the global queue; tagged
//!   items are never inflight and never waited for.
//!
//! Every item ever given to the queue is handed out by `get` or cancelled exactly once.
//!
//! # Design: one mutex, four condition variables
//!
//! All state (the queues, the inflight count, the pending error, the wait gate) sits
//! behind one [`std::sync::Mutex`], with condition variables for "not empty", "not full",
//! "gate open" and "idle". Most operations touch several of these facts at once (a put reads
//! the gate, the bound and the error and may drain the queue; a `mark_failed` changes the
//! inflight count and the error and must wake waiters), so a lock-free design would need
//! them in one atomic word or a multi-word protocol, and the semantics are where the value
//! is. Under one lock each operation is a short critical section that is easy to check. The
//! costs that matter are kept off the fast path:
//!
//! - notifications are skipped when nobody sleeps (sleepers are counted under the lock), so
//!   an uncontended `put`/`get`/`mark_finished` cycle is three lock round trips and no system call;
//! - blocking waits are on condvars (futexes), so sleeping threads cost nothing.
//!
//! Measured with `cargo bench --bench queue` on the 2-core development machine (numbers in
//! the benchmark's output; see `benches/queue.rs`): well above the targets of 10M
//! single-thread cycles/s and 5M items/s with 4 producers and 4 consumers.
//!
//! # Cancellation never runs under the lock
//!
//! Cancelling an item calls [`Cancel::cancel`], which in the Python binding takes the GIL
//! to call `mark_cancelled()`. Running that with the queue's lock held would deadlock
//! against a thread that holds the GIL and is waiting for the lock. So items to cancel are
//! moved out of the state under the lock and cancelled after it is released; likewise a
//! dropped error value is dropped outside the lock. The binding may therefore take the
//! queue's lock while holding the GIL (the fast path does), because no lock holder ever
//! waits for the GIL.
//!
//! # Blocking and interruption
//!
//! Blocking calls take a [`WaitPolicy`]: a deadline (an [`std::time::Instant`]) and an
//! optional interrupt check run every slice with the lock released, which the Python binding
//! uses to deliver Ctrl-C while the GIL is released.

mod closure_queue;
mod consume;
mod error;
mod join;
mod produce;
mod state;
mod wait;

#[cfg(test)]
mod tests;

pub use closure_queue::ClosureQueue;
pub use error::{QueueError, TryGetError, TryPutError};
pub use wait::WaitPolicy;

/// The key of a per-worker sub-queue (TF tags resource closures with the worker index).
pub type Tag = i64;

/// What the queue does to an item it will never hand out: when a pending error is raised,
/// when the queue is stopped, or when a `put` gives up.
///
/// Called exactly once per cancelled item, always with the queue's lock released, so it may
/// block or call back into the queue.
pub trait Cancel {
    /// Marks the item cancelled, consuming it.
    fn cancel(self);
}
