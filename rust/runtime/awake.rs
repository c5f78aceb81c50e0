//! The runtime thread keeps polling, for a bounded while, when its next event is due
//! within a round trip, rather than sleeping in `epoll_wait` until it comes.
//!
//! A serial round trip hands a closure from thread to thread, and every hand-off to a
//! sleeping thread is a wake-up: on the coordinator, `schedule()` waking the link task and
//! the worker's answer arriving on its socket; on a worker, the closure arriving on its
//! socket and the executor handing its answer to the reply stream. The threads in
//! `fetch()` and the worker's executor spin before they park (`crate::spin`); this does
//! the same for the runtime thread itself. After an event that announces another within a
//! round trip ([`expect`]: a link sent closures or settled an answer; a worker queued a
//! closure or sent an answer), one task on the runtime yields in a loop: tokio runs the
//! other tasks and polls its I/O driver with a zero timeout between its turns, so an
//! answer on the socket is read at once, and a task woken from another thread is queued
//! without waking anyone (the runtime thread is not parked, and tokio notifies a parked one
//! only). The task also yields the core to the operating system each turn, or on two cores
//! it would take the core of the executor it waits for (a serial round trip took 1 ms
//! rather than 60 µs without that).
//!
//! It is one [`Spin`] site per process, with the same adaptive budget and trials as the
//! others: a wait runs from one event to the next, so a process whose events are far apart
//! (a long closure, an idle loop) soon stops spinning, and one where spinning made the next
//! event later (a busy machine) keeps parking. Only a runtime of one thread spins (the
//! default below 3 cores, `runtime.rs`): with more, the I/O driver is held by another
//! thread asleep in `epoll_wait`, and a remote wake-up wakes a sleeping thread anyway, so
//! spinning would cost a core and save nothing. Nor does a runtime that lends its work to
//! the thread that waits (`lend.rs`, the default where spinning is on): that thread spins
//! on the runtime itself, and this task's turns on its thread only delayed it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use crate::spin::{Spin, Spun};

/// The process's runtime spinner.
static AWAKE: Awake = Awake::new(Spin::configured().reporting(&crate::spin::report::RUNTIME));

/// An event happened on the runtime and the next is expected within a round trip: keep the
/// runtime thread polling until it comes or the site's budget is spent. Call it from a task
/// on the runtime; it does nothing where the runtime has more than one thread or spinning
/// is off.
pub fn expect() {
    if spins() {
        AWAKE.expect();
    }
}

/// Whether this process's runtime may spin: it has one thread and does not lend its work
/// (`lend.rs`: there the thread that waits runs the runtime while it spins, and a second
/// spinner on its thread only took turns from it: p50 33–34 µs against 35–41 with both).
pub fn spins() -> bool {
    super::configured_threads() == 1 && !super::will_lend()
}

/// A runtime's spinner: the site, and the state of its one spinning task.
#[derive(Debug)]
pub struct Awake {
    site: Spin,
    /// Events so far: the spinning task watches it change.
    events: AtomicU64,
    /// A spinning task runs (at most one does).
    spinning: AtomicBool,
    /// The wait that ended without its event seen spinning: the next event ends it.
    open: Mutex<Option<Spun>>,
    /// `open` holds a wait (read without its lock on every event).
    has_open: AtomicBool,
    /// Spinning tasks running now, and the most ever at once (tests).
    #[cfg(test)]
    live: (std::sync::atomic::AtomicU32, std::sync::atomic::AtomicU32),
}

impl Awake {
    /// A spinner over `site`.
    pub const fn new(site: Spin) -> Self {
        Self {
            site,
            events: AtomicU64::new(0),
            spinning: AtomicBool::new(false),
            open: Mutex::new(None),
            has_open: AtomicBool::new(false),
            #[cfg(test)]
            live: (
                std::sync::atomic::AtomicU32::new(0),
                std::sync::atomic::AtomicU32::new(0),
            ),
        }
    }

    /// See [`expect`]; outside a tokio runtime it does nothing.
    pub fn expect(&'static self) {
        if self.site.is_off() {
            return;
        }
        // SeqCst with the spinning task's store of `spinning` and its last look at
        // `events`: either this sees the task gone and starts one, or the task sees this
        // event and goes on.
        self.events.fetch_add(1, Ordering::SeqCst);
        self.close_open_wait();
        // While a task spins (every event of a busy loop) this is all: a load, no
        // read-modify-write and no look for the runtime.
        if self.spinning.load(Ordering::SeqCst) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if !self.spinning.swap(true, Ordering::SeqCst) {
            runtime.spawn(self.spin());
        }
    }

    /// Reports the end of the wait that did not see its event spinning, if one is open.
    fn close_open_wait(&self) {
        if !self.has_open.load(Ordering::Acquire) || !self.has_open.swap(false, Ordering::AcqRel) {
            return;
        }
        let open = self
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(spun) = open {
            self.site.wait_ended(spun);
        }
    }

    /// The spinning task: one wait per event, until a wait parks.
    async fn spin(&'static self) {
        #[cfg(test)]
        {
            let live = self.live.0.fetch_add(1, Ordering::SeqCst) + 1;
            self.live.1.fetch_max(live, Ordering::SeqCst);
        }
        let mut task = Task {
            awake: self,
            ended: false,
        };
        loop {
            let seen_events = self.events.load(Ordering::SeqCst);
            let changed = || self.events.load(Ordering::SeqCst) != seen_events;
            let begun = self.site.begin(None);
            let seen = match begun.spin_until() {
                None => changed(),
                Some(stop) => loop {
                    if changed() {
                        break true;
                    }
                    if Instant::now() >= stop {
                        break changed();
                    }
                    // Lets tokio run what is queued and poll its I/O driver (a zero
                    // timeout), then lets the operating system run another thread.
                    tokio::task::yield_now().await;
                    std::thread::yield_now();
                },
            };
            let spun = self.site.end(&begun, seen);
            if seen {
                self.site.wait_ended(spun);
                continue;
            }
            // Park: the next event ends this wait.
            *self.open.lock().unwrap_or_else(PoisonError::into_inner) = Some(spun);
            self.has_open.store(true, Ordering::Release);
            self.spinning.store(false, Ordering::SeqCst);
            if !changed() || self.spinning.swap(true, Ordering::SeqCst) {
                task.ended = true;
                return;
            }
            // An event came between the last look and the store: it started no task, so
            // this one goes on, and that event ended the wait.
            self.close_open_wait();
        }
    }

    /// Whether the spinning task runs (tests).
    #[cfg(test)]
    fn is_spinning(&self) -> bool {
        self.spinning.load(Ordering::SeqCst)
    }
}

/// The spinning task's end. A task its runtime drops mid-spin (a runtime shut down) ends
/// without clearing `spinning`, and no later event would start another: this clears it.
/// A task that ended by itself has cleared it already, and another may run by now.
struct Task {
    awake: &'static Awake,
    ended: bool,
}

impl Drop for Task {
    fn drop(&mut self) {
        #[cfg(test)]
        self.awake.live.0.fetch_sub(1, Ordering::SeqCst);
        if !self.ended {
            self.awake.spinning.store(false, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn leaked(budget: Duration) -> &'static Awake {
        Box::leak(Box::new(Awake::new(Spin::with_budget(budget))))
    }

    fn one_thread_runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    }

    /// Waits for `done` with a deadline, never sleeping longer than a millisecond.
    fn wait_for(what: &str, deadline: Duration, done: impl Fn() -> bool) {
        let until = Instant::now() + deadline;
        while !done() {
            assert!(
                Instant::now() < until,
                "{what} did not happen within {deadline:?}"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn an_event_starts_one_spinner_which_stops_once_its_budget_is_spent() {
        let awake = leaked(Duration::from_millis(2));
        let runtime = one_thread_runtime();
        runtime.block_on(async { awake.expect() });
        assert!(awake.is_spinning());
        wait_for("the spinner's stop", Duration::from_secs(5), || {
            !awake.is_spinning()
        });
        // It gave up spinning in vain: the site's budget was halved.
        assert!(awake.site.current_budget() < Duration::from_millis(2));
        // The wait it left open ends at the next event.
        assert!(awake.has_open.load(Ordering::Acquire));
        runtime.block_on(async { awake.expect() });
        assert!(!awake.has_open.load(Ordering::Acquire) || awake.is_spinning());
    }

    #[test]
    fn events_within_the_budget_are_seen_spinning_and_keep_the_full_budget() {
        let awake = leaked(Duration::from_millis(200));
        let runtime = one_thread_runtime();
        runtime.block_on(async {
            for _ in 0..50 {
                awake.expect();
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
        });
        assert!(awake.is_spinning(), "events 200 us apart keep it spinning");
        assert_eq!(awake.site.current_budget(), Duration::from_millis(200));
    }

    #[test]
    fn the_spinner_yields_so_the_tasks_it_waits_for_run() {
        // On a one-thread runtime a spinner that did not yield would keep this task from
        // ever running.
        let awake = leaked(Duration::from_millis(500));
        let runtime = one_thread_runtime();
        let ran = runtime.block_on(async {
            awake.expect();
            tokio::spawn(async { 7 }).await.unwrap()
        });
        assert_eq!(ran, 7);
    }

    #[test]
    fn a_spinner_whose_runtime_shut_down_lets_the_next_event_start_another() {
        let awake = leaked(Duration::from_secs(10));
        let runtime = one_thread_runtime();
        runtime.block_on(async { awake.expect() });
        assert!(awake.is_spinning());
        drop(runtime); // drops the spinning task mid-spin
        assert!(!awake.is_spinning());
        let runtime = one_thread_runtime();
        runtime.block_on(async { awake.expect() });
        assert!(awake.is_spinning());
        assert_eq!(awake.live.1.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_site_that_is_off_never_spins() {
        let awake = leaked(Duration::ZERO);
        one_thread_runtime().block_on(async { awake.expect() });
        assert!(!awake.is_spinning());
    }

    #[test]
    fn events_from_many_tasks_leave_at_most_one_spinner_and_none_once_they_stop() {
        let awake = leaked(Duration::from_micros(300));
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let tasks: Vec<_> = (0..16u64)
                .map(|seed| {
                    tokio::spawn(async move {
                        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                        for _ in 0..300 {
                            awake.expect();
                            state ^= state << 13;
                            state ^= state >> 7;
                            state ^= state << 17;
                            let pause = state % 600;
                            if pause < 300 {
                                tokio::task::yield_now().await;
                            } else {
                                tokio::time::sleep(Duration::from_micros(pause)).await;
                            }
                        }
                    })
                })
                .collect();
            for task in tasks {
                task.await.unwrap();
            }
        });
        wait_for("the last spinner's stop", Duration::from_secs(10), || {
            !awake.is_spinning()
        });
        assert_eq!(
            awake.live.1.load(Ordering::SeqCst),
            1,
            "never two spinners at once"
        );
        assert_eq!(awake.live.0.load(Ordering::SeqCst), 0);
        drop(runtime);
    }
}
