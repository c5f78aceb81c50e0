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
//! The state (the queues, the pending error, the wait gate, sleeper counts) sits behind
//! one [`std::sync::Mutex`], with condition variables for "not empty", "not full", "gate
//! open" and "idle". Most operations touch several of these facts at once (a put reads the
//! gate, the bound and the error and may drain the queue; a `mark_failed` changes the
//! inflight count and the error and must wake waiters), so a lock-free design would need
//! a multi-word protocol; and it would need `unsafe` (forbidden in this crate) or a new
//! runtime dependency (std's lock-free channels are single-consumer). Under one lock each
//! operation is a short critical section that is easy to check. The costs that matter are
//! kept off the fast path:
//!
//! - a notify on a futex condvar is a system call even with nobody asleep, so sleepers are
//!   counted under the lock and notifications skipped without them; the hot notifications
//!   are sent after unlocking, so the woken thread does not run into the held lock;
//! - `inflight` is an atomic, so `mark_finished` is lock-free unless it brings the count
//!   to zero while someone waits for that (see `Counters`). Taking the lock a third time
//!   per closure cost 5x in throughput with one producer and one consumer on two cores.
//!
//! Tried and rejected: yielding the CPU a few times before sleeping. It doubled or tripled
//! the 4-producer/4-consumer throughput, but made the bounded stress test 20-40x slower
//! while other processes loaded the machine: `sched_yield` hands the core to another
//! process for a whole time slice, and coordinators share machines with busy JAX processes.
//!
//! Measured on the shared 2-core development VM (`cargo bench --bench queue`, load average
//! 3-9 from other work): 9-15M put/get/`mark_finished` cycles per second on one thread, and
//! 1.2-2.7M items/s with 4 producer and 4 consumer threads. There kernel time exceeds user
//! time: with 8 threads on 2 cores most hand-offs find the consumer asleep and cost a futex
//! wake and a context switch (std's lock-free `sync_channel`, 4 producers and 1 consumer,
//! did 6-19M in the same runs). From Python, where the GIL serialises callers, the queue
//! does 3.6-5M cycles/s on one thread and 4.7-6.2M items/s with 4+4 threads, 17-31x a
//! pure-Python queue (`benches/queue_bench.py`).
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
