//! Errors of the closure queue.
//!
//! Blocking operations report through [`QueueError`]; the non-blocking `try_*` operations
//! hand the rejected item back (as crossbeam's channels do) so the caller can retry with the
//! blocking form without losing it.

use std::sync::Arc;

/// Why a [`ClosureQueue`](super::ClosureQueue) operation did not complete normally.
#[derive(Debug, thiserror::Error)]
pub enum QueueError<E> {
    /// A closure failed (the first error given to `mark_failed` since the last one was
    /// raised). Before this is returned every queued closure has been cancelled and nothing is
    /// inflight any more; the queue has cleared the error and is usable again. Every call
    /// that observed the same pending error receives the same shared value.
    #[error("a closure failed: {0}")]
    Failed(Arc<E>),

    /// `put_back`, `mark_finished` or `mark_failed` was called while no closure was inflight,
    /// i.e. without a matching `get` (tagged closures are never inflight).
    #[error(
        "{operation}() was called with no closure inflight (inflight=0); each call must \
         match an earlier get() that returned an untagged closure not yet marked finished, \
         marked failed or put back"
    )]
    NotInflight {
        /// The misused operation: `"put_back"`, `"mark_finished"` or `"mark_failed"`.
        operation: &'static str,
    },

    /// The queue was stopped; an item given to the failing call has been cancelled.
    #[error("the closure queue was stopped; the closure was cancelled instead of queued")]
    Stopped,

    /// The caller's deadline passed first. An item given to `put` has been cancelled; a
    /// pending error stays pending.
    #[error("the deadline passed before the closure queue operation could complete")]
    TimedOut,

    /// The caller's interrupt check asked to stop waiting (e.g. Ctrl-C in Python). An item
    /// given to `put` has been cancelled; a pending error stays pending.
    #[error("the closure queue operation was interrupted while waiting")]
    Interrupted,
}

/// Why [`ClosureQueue::try_put`](super::ClosureQueue::try_put) refused an item; the item is
/// handed back untouched.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum TryPutError<T> {
    /// The global queue holds `max_size` closures.
    #[error("the closure queue is full")]
    Full(T),
    /// A `wait` is in progress or an error is pending; the blocking `put` handles both.
    #[error("the closure queue is busy (a wait is in progress or an error is pending)")]
    Busy(T),
    /// The queue was stopped.
    #[error("the closure queue was stopped")]
    Stopped(T),
}

impl<T> TryPutError<T> {
    /// Returns the refused item.
    pub fn into_inner(self) -> T {
        match self {
            Self::Full(item) | Self::Busy(item) | Self::Stopped(item) => item,
        }
    }
}

/// Why [`ClosureQueue::try_get`](super::ClosureQueue::try_get) returned no closure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TryGetError {
    /// Nothing is queued for this getter right now.
    #[error("the closure queue is empty")]
    Empty,
    /// The queue was stopped; getters receive nothing any more.
    #[error("the closure queue was stopped")]
    Stopped,
}
