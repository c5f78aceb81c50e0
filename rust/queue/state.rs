//! The state behind the queue's one lock, and the condition variables that signal it.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar};

use super::Tag;

/// Everything the queue knows, guarded by one mutex.
///
/// Invariants (hold whenever the lock is free):
/// - an item is in at most one place: `queue`, a `tagged` queue, or the hands of a caller;
/// - while `error` is set, `queue` is empty except inside the critical section that pushes
///   and immediately drains it (a put that observes the error cancels everything queued);
/// - `epoch` changes exactly when a pending error is cleared, so a caller that captured it
///   can tell whether "its" error was already raised and cleared by another caller.
pub(super) struct State<T, E> {
    /// The global FIFO of untagged closures.
    pub queue: VecDeque<T>,
    /// Per-worker FIFOs of tagged closures; never counted as inflight, never waited for.
    pub tagged: HashMap<Tag, VecDeque<T>>,
    /// The first error since the last one was raised.
    pub error: Option<Arc<E>>,
    /// Bumped each time a pending error is cleared.
    pub epoch: u64,
    /// Set once by `stop`; getters return nothing and puts cancel their closure from then on.
    pub stopped: bool,
    /// `wait` calls in progress; while non-zero no new untagged put starts.
    pub waits: usize,
    /// Untagged puts past the wait gate that are blocked on a full queue; `wait` counts them
    /// as outstanding work, as TF's put-then-wait lock ordering does.
    pub blocked_putters: usize,
    /// How many threads sleep on each condition variable.
    pub sleepers: Sleepers,
}

/// Sleeping-thread counts, one per condition variable. A notify on a futex condvar is a
/// system call even when nobody sleeps; counting sleepers under the lock lets the fast
/// path skip it.
#[derive(Debug, Default)]
pub(super) struct Sleepers {
    pub getters: usize,
    /// Getters awaiting in [`ClosureQueue::get_async`](super::ClosureQueue::get_async): they
    /// wait on a `tokio` `Notify` rather than the condvar.
    pub async_getters: usize,
    pub putters_full: usize,
    pub putters_gate: usize,
    pub idle: usize,
}

impl<T, E> State<T, E> {
    pub fn new() -> Self {
        Self {
            queue: VecDeque::new(),
            tagged: HashMap::new(),
            error: None,
            epoch: 0,
            stopped: false,
            waits: 0,
            blocked_putters: 0,
            sleepers: Sleepers::default(),
        }
    }

    /// Whether the global queue holds `max_size` closures or more (`max_size == 0`:
    /// unbounded). `put_back` may overshoot the bound; see its documentation.
    pub fn is_full(&self, max_size: usize) -> bool {
        max_size != 0 && self.queue.len() >= max_size
    }
}

/// Keeps a hot atomic on its own cache line (128 bytes: adjacent-line prefetch pairs
/// lines on x86).
#[derive(Debug, Default)]
#[repr(align(128))]
pub(super) struct Padded<T>(pub T);

/// Which condition variable a blocked thread sleeps on; selects both the condvar and its
/// sleeper count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Signal {
    /// Something was queued, or the queue stopped.
    NotEmpty,
    /// A slot freed up, an error became pending, or the queue stopped.
    NotFull,
    /// The last `wait` in progress ended, or the queue stopped.
    GateOpen,
    /// Inflight reached zero, an error became pending or was cleared, or the queue stopped.
    Idle,
}

/// The four condition variables, all paired with the state mutex, and the `Notify` async
/// getters wait on for [`Signal::NotEmpty`].
#[derive(Debug, Default)]
pub(super) struct Signals {
    not_empty: Condvar,
    not_full: Condvar,
    gate_open: Condvar,
    idle: Condvar,
    not_empty_async: tokio::sync::Notify,
}

impl Signals {
    pub fn condvar(&self, signal: Signal) -> &Condvar {
        match signal {
            Signal::NotEmpty => &self.not_empty,
            Signal::NotFull => &self.not_full,
            Signal::GateOpen => &self.gate_open,
            Signal::Idle => &self.idle,
        }
    }

    /// What async getters wait on.
    pub fn not_empty_async(&self) -> &tokio::sync::Notify {
        &self.not_empty_async
    }

    /// Whether `signal` has sleepers (async getters included); read under the lock, to
    /// notify after releasing it.
    pub fn has_sleepers<T, E>(state: &State<T, E>, signal: Signal) -> bool {
        *sleepers(&state.sleepers, signal) > 0
            || (signal == Signal::NotEmpty && state.sleepers.async_getters > 0)
    }

    /// Wakes one sleeper of `signal`, if any sleeps: a thread on the condvar first, else an
    /// async getter. Call with the lock held.
    pub fn notify_one<T, E>(&self, state: &State<T, E>, signal: Signal) {
        if *sleepers(&state.sleepers, signal) > 0 {
            self.condvar(signal).notify_one();
        } else if signal == Signal::NotEmpty && state.sleepers.async_getters > 0 {
            self.not_empty_async.notify_one();
        }
    }

    /// Wakes every sleeper of `signal`, if any sleeps. Call with the lock held.
    pub fn notify_all<T, E>(&self, state: &State<T, E>, signal: Signal) {
        if *sleepers(&state.sleepers, signal) > 0 {
            self.condvar(signal).notify_all();
        }
        if signal == Signal::NotEmpty && state.sleepers.async_getters > 0 {
            self.not_empty_async.notify_waiters();
        }
    }
}

fn sleepers(counts: &Sleepers, signal: Signal) -> &usize {
    match signal {
        Signal::NotEmpty => &counts.getters,
        Signal::NotFull => &counts.putters_full,
        Signal::GateOpen => &counts.putters_gate,
        Signal::Idle => &counts.idle,
    }
}

/// The sleeper count of `signal`, for the blocking thread to adjust.
pub(super) fn sleepers_mut(counts: &mut Sleepers, signal: Signal) -> &mut usize {
    match signal {
        Signal::NotEmpty => &mut counts.getters,
        Signal::NotFull => &mut counts.putters_full,
        Signal::GateOpen => &mut counts.putters_gate,
        Signal::Idle => &mut counts.idle,
    }
}
