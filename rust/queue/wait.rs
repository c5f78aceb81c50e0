//! How a blocking queue call waits: until when, and what it checks between slices.

use std::time::{Duration, Instant};

/// The waiting rules of one blocking call: an optional deadline, and an optional interrupt
/// check that runs every `every` while the call is blocked.
///
/// The interrupt check exists for bindings: the Python wrapper waits with the GIL released
/// and uses it to take the GIL briefly and run pending signal handlers, so Ctrl-C reaches a
/// thread blocked in `get()`. The check always runs with the queue's lock released.
///
/// ```
/// use std::time::Duration;
/// use _core::queue::{Cancel, ClosureQueue, QueueError, WaitPolicy};
///
/// struct Job;
/// impl Cancel for Job {
///     fn cancel(self) {}
/// }
///
/// let queue: ClosureQueue<Job, String> = ClosureQueue::new(0);
/// let mut ctrl_c_pressed = || true; // a binding would poll its signal handlers here
/// let mut policy = WaitPolicy::timeout(Some(Duration::from_secs(60)))
///     .interruptible(Duration::from_millis(5), &mut ctrl_c_pressed);
/// // Nothing is queued, so get() blocks until the first interrupt check stops it.
/// assert!(matches!(queue.get_with(None, &mut policy), Err(QueueError::Interrupted)));
/// ```
pub struct WaitPolicy<'a> {
    deadline: Option<Instant>,
    interrupt: Option<Interrupt<'a>>,
}

struct Interrupt<'a> {
    every: Duration,
    next_check: Option<Instant>,
    check: &'a mut dyn FnMut() -> bool,
}

/// Why a blocked call stopped waiting before its condition held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Cut {
    /// The deadline passed.
    TimedOut,
    /// The interrupt check returned `true`.
    Interrupted,
}

impl<'a> WaitPolicy<'a> {
    /// Waits as long as it takes.
    pub fn forever() -> Self {
        Self {
            deadline: None,
            interrupt: None,
        }
    }

    /// Waits until `deadline` (`None`: as long as it takes).
    pub fn until(deadline: Option<Instant>) -> Self {
        Self {
            deadline,
            interrupt: None,
        }
    }

    /// Waits at most `timeout` from now (`None`: as long as it takes). A timeout too large
    /// to represent as an [`Instant`] means no deadline.
    pub fn timeout(timeout: Option<Duration>) -> Self {
        Self::until(timeout.and_then(|t| Instant::now().checked_add(t)))
    }

    /// Also calls `check` every `every` while blocked; when it returns `true` the call stops
    /// waiting and reports [`QueueError::Interrupted`](super::QueueError::Interrupted).
    #[must_use]
    pub fn interruptible(mut self, every: Duration, check: &'a mut dyn FnMut() -> bool) -> Self {
        self.interrupt = Some(Interrupt {
            every,
            next_check: None,
            check,
        });
        self
    }

    /// The deadline, if any.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// `Some(TimedOut)` when the deadline has passed at `now`.
    pub(super) fn expired(&self, now: Instant) -> Option<Cut> {
        match self.deadline {
            Some(deadline) if now >= deadline => Some(Cut::TimedOut),
            _ => None,
        }
    }

    /// How long the next blocking slice may last (`None`: until notified).
    pub(super) fn slice(&mut self, now: Instant) -> Option<Duration> {
        let check_at = self.interrupt.as_mut().map(|interrupt| {
            *interrupt
                .next_check
                .get_or_insert_with(|| now.checked_add(interrupt.every).unwrap_or(now))
        });
        let wake_at = match (self.deadline, check_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        wake_at.map(|at| at.saturating_duration_since(now))
    }

    /// Whether the interrupt check is due at `now`. Cheap; call with the lock held.
    pub(super) fn check_due(&self, now: Instant) -> bool {
        self.interrupt
            .as_ref()
            .and_then(|interrupt| interrupt.next_check)
            .is_some_and(|at| now >= at)
    }

    /// Runs the interrupt check and schedules the next one. Call with the lock released.
    pub(super) fn run_check(&mut self) -> Option<Cut> {
        let interrupt = self.interrupt.as_mut()?;
        let stop = (interrupt.check)();
        let now = Instant::now();
        interrupt.next_check = Some(now.checked_add(interrupt.every).unwrap_or(now));
        stop.then_some(Cut::Interrupted)
    }
}

impl std::fmt::Debug for WaitPolicy<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WaitPolicy")
            .field("deadline", &self.deadline)
            .field(
                "interrupt_every",
                &self.interrupt.as_ref().map(|interrupt| interrupt.every),
            )
            .finish()
    }
}
