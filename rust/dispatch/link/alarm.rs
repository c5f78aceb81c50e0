//! A link's one timer for its waits for answers ([`Alarm`]): the earliest of the closure
//! timeout, the worker's silence, the next ping and the preemption deadline, kept
//! registered with the runtime across waits and moved rather than made anew.
//!
//! Why one kept timer: a tokio timer registered earlier than the time driver's next wake-up
//! makes the runtime wake its parked driver thread (an `eventfd` write and an `epoll_wait`
//! round) to shorten its sleep. A link used to make two fresh timers (ping, silence) for
//! every wait for answers, and an idle runtime had none registered, so each serial round
//! trip woke a runtime thread for nothing: `perf trace` counted about 0.9 `eventfd`
//! writes, 0.5 `epoll_wait`s and 0.6 futex calls per round trip on the coordinator's
//! runtime threads for these timers alone. A kept timer whose deadline only moves later
//! is extended in place (no driver wake-up, tokio's `extend_expiration`); while the link is
//! idle it stays registered and fires at most once (the task is polled, finds nothing due
//! and waits on), so idle CPU stays ~0.

use std::pin::Pin;
use std::time::Instant;

use tokio::time::Sleep;

/// One reusable timer; see the module documentation.
#[derive(Debug, Default)]
pub(super) struct Alarm {
    sleep: Option<Pin<Box<Sleep>>>,
}

impl Alarm {
    /// Resolves at `at`, or never without one. Moves the kept timer to `at` (registering
    /// it the first time) instead of making a new one.
    pub(super) async fn until(&mut self, at: Option<Instant>) {
        let Some(at) = at else {
            return std::future::pending().await;
        };
        let at = tokio::time::Instant::from_std(at);
        let sleep = match &mut self.sleep {
            Some(sleep) => {
                if sleep.deadline() != at {
                    sleep.as_mut().reset(at);
                }
                sleep
            }
            None => self.sleep.insert(Box::pin(tokio::time::sleep_until(at))),
        };
        sleep.as_mut().await;
    }
}

/// The earliest of `deadlines` (`None` if none is set).
pub(super) fn earliest(deadlines: &[Option<Instant>]) -> Option<Instant> {
    deadlines.iter().flatten().min().copied()
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{earliest, Alarm};

    #[test]
    fn the_earliest_set_deadline_counts() {
        let now = Instant::now();
        let later = now + Duration::from_secs(1);
        assert_eq!(earliest(&[None, Some(later), Some(now), None]), Some(now));
        assert_eq!(earliest(&[None, None]), None);
    }

    #[test]
    fn a_kept_timer_fires_at_each_new_deadline_earlier_or_later() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut alarm = Alarm::default();
            // Moved later, earlier, and after it fired: each wait ends at its own deadline.
            for millis in [30, 10, 20, 5] {
                let started = Instant::now();
                let at = started + Duration::from_millis(millis);
                alarm.until(Some(at)).await;
                assert!(Instant::now() >= at, "fired early for {millis} ms");
            }
            // A deadline moved later than a pending one is not fired at the old one.
            let soon = Instant::now() + Duration::from_millis(5);
            let waited = tokio::time::timeout(Duration::from_millis(20), alarm.until(Some(soon)));
            assert!(waited.await.is_ok());
            let far = Instant::now() + Duration::from_secs(60);
            let waited = tokio::time::timeout(Duration::from_millis(30), alarm.until(Some(far)));
            assert!(waited.await.is_err(), "a timer a minute away fired");
            let never = tokio::time::timeout(Duration::from_millis(10), alarm.until(None));
            assert!(never.await.is_err(), "no deadline fired");
        });
    }
}
