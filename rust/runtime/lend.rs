//! A runtime of one thread lends its work to the thread that waits for it, so a serial
//! round trip crosses no thread boundary inside a process.
//!
//! On a worker the executor waits for its next closure, and on a coordinator the thread in
//! `fetch()` waits for its answer; in both, the runtime thread read the socket and then
//! woke the waiter, and the waiter's answer was written by the runtime thread woken again.
//! Each of those hand-offs is a wake-up, tens of microseconds on a virtual machine, and
//! spinning on both sides of each (`crate::spin`, `awake.rs`) needed four spinning threads
//! for two cores, so the spin sites' trials kept half of them parked. Here the waiter does
//! the runtime's work itself while it spins: the runtime is tokio's current-thread flavour,
//! whose `block_on` lets whichever thread holds its one core run the tasks and poll the
//! I/O driver. A serial loop's p50 on the 2-core machine fell from 44–72 µs to 34–36 µs, at
//! Ray Compiled Graphs' 33–35 (`docs/benchmarks.md`).
//!
//! **Who drives.** The driver thread (`jaxcluster-rt`) holds the core whenever no waiter
//! does. A waiter that spins ([`drive_until`]) asks for the core; the driver lets go of it
//! and stays out for [`GRACE`] after the last waiter returned it, because in a serial loop
//! the next wait follows within a round trip and taking the core back would cost the very
//! wake-up saved. A waiter that returns without its answer (it will park) hands the core
//! back at once ([`nudge`]); so does anything that waits without spinning, or polls, on
//! work the runtime does. So in the worst case the runtime's work waits [`GRACE`]: a
//! closure scheduled by a thread that then computes instead of fetching, or a heartbeat
//! due while an executor runs a closure it took from its queue.
//!
//! **When.** Only a runtime of one thread lends (the default below 3 cores), and only where
//! spinning is on: without a spinning waiter nobody would borrow the core.
//! `JAXCLUSTER_RUNTIME_LEND=0` keeps the multi-threaded flavour with one thread, as before,
//! and its own thread's spin (`awake.rs`), which a lending runtime does without.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::thread::Thread;
use std::time::{Duration, Instant};

use tokio::runtime::Runtime;
use tokio::sync::Notify;

use crate::setting::{Read, Setting};

/// How long the driver thread stays out after the last waiter returned the core with its
/// answer: longer than a serial loop's gap between two waits (the caller's own code), and
/// short enough that work nobody waits for is not late by more than a timer's slack.
pub const GRACE: Duration = Duration::from_millis(1);

/// Turns of a waiter's spin on the runtime between two yields of its core to the operating
/// system. Each turn polls the I/O driver (a system call); yielding the core on every turn
/// as well made a turn twice as long, and the answer was seen later: p50 33–34 µs against
/// 34–35 in alternating runs. Yielding now and then still lets another thread of the round
/// trip run where the cores are all taken.
const TURNS_PER_OS_YIELD: u32 = 16;

/// The environment variable that turns lending off (`0`) or on (`1`, the default where the
/// runtime has one thread and spinning is on).
pub const LEND_ENV: &str = "JAXCLUSTER_RUNTIME_LEND";

/// Whether [`LEND_ENV`] (its value `set`, if any) lets a runtime lend.
fn allowed_by(set: Option<&str>) -> Read<bool> {
    Read::parse(
        LEND_ENV,
        set,
        |text| match text {
            "0" => Some(false),
            "1" => Some(true),
            _ => None,
        },
        "0 or 1",
        || true,
    )
}

/// Whether [`LEND_ENV`] lets this process's runtime lend, read once.
pub(super) fn allowed() -> bool {
    static ALLOWED: Setting<bool> = Setting::new();
    *ALLOWED.get(|| allowed_by(std::env::var(LEND_ENV).ok().as_deref()))
}

/// The state shared by the driver thread and the waiters that borrow the runtime.
#[derive(Debug)]
pub struct Lend {
    runtime: &'static Runtime,
    /// Waiters inside [`Self::drive_until`].
    borrowers: AtomicU32,
    /// The driver thread is out of the runtime: a waiter may take the core.
    released: AtomicBool,
    /// A waiter asks the driver to let go of the core.
    requested: Notify,
    /// Someone wants the driver back at once (a waiter that will park, a poll).
    nudged: AtomicBool,
    /// Nanoseconds after `epoch` when a waiter last returned the core.
    returned_at: AtomicU64,
    epoch: Instant,
    driver: OnceLock<Thread>,
    /// Times the driver let go of the core, and times it took it back (tests, metrics).
    releases: AtomicU64,
}

static LEND: OnceLock<Lend> = OnceLock::new();

/// Starts the driver thread of `runtime`, a current-thread runtime, and lends it from then
/// on; a second call does nothing.
pub(super) fn start(runtime: &'static Runtime) -> std::io::Result<()> {
    let mut first = false;
    let lend = LEND.get_or_init(|| {
        first = true;
        Lend::new(runtime)
    });
    if first {
        lend.spawn_driver()?;
    }
    Ok(())
}

/// Spins until `ready()` or `stop`, doing the runtime's work meanwhile where this process's
/// runtime lends it; returns whether `ready()` held. `None` where it does not lend, or the
/// caller is on the runtime already: the caller spins as usual.
pub fn drive_until(stop: Instant, ready: &mut dyn FnMut() -> bool) -> Option<bool> {
    let lend = LEND.get()?;
    if tokio::runtime::Handle::try_current().is_ok() {
        return None;
    }
    Some(lend.drive_until(stop, ready))
}

/// The caller is about to wait without spinning, or polls, for work the runtime does: the
/// driver thread takes the core back now rather than after [`GRACE`].
pub fn nudge() {
    if let Some(lend) = LEND.get() {
        lend.nudge();
    }
}

/// What a dashboard shows of lending in this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LendSnapshot {
    /// Whether this process's runtime lends its work to the threads that wait.
    pub lending: bool,
    /// Times its driver thread let a waiter take the runtime.
    pub lends: u64,
}

/// This process's lending, for metrics.
pub fn snapshot() -> LendSnapshot {
    LEND.get().map_or(
        LendSnapshot {
            lending: false,
            lends: 0,
        },
        |lend| LendSnapshot {
            lending: true,
            lends: lend.releases(),
        },
    )
}

impl Lend {
    /// The state for `runtime`; the driver thread is not running yet.
    pub fn new(runtime: &'static Runtime) -> Self {
        Self {
            runtime,
            borrowers: AtomicU32::new(0),
            released: AtomicBool::new(false),
            requested: Notify::new(),
            nudged: AtomicBool::new(false),
            returned_at: AtomicU64::new(0),
            epoch: Instant::now(),
            driver: OnceLock::new(),
            releases: AtomicU64::new(0),
        }
    }

    /// Runs the driver on a thread of its own (`jaxcluster-rt`).
    pub fn spawn_driver(&'static self) -> std::io::Result<()> {
        let handle = std::thread::Builder::new()
            .name("jaxcluster-rt".into())
            .spawn(move || self.drive())?;
        let _ = self.driver.set(handle.thread().clone());
        Ok(())
    }

    fn now_ns(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// The driver thread: holds the core until a waiter asks for it, then stays out while
    /// waiters borrow it and for [`GRACE`] after the last returned it.
    fn drive(&'static self) {
        let grace = u64::try_from(GRACE.as_nanos()).unwrap_or(u64::MAX);
        loop {
            self.runtime.block_on(self.requested.notified());
            self.released.store(true, Ordering::SeqCst);
            self.releases.fetch_add(1, Ordering::Relaxed);
            loop {
                if self.borrowers.load(Ordering::SeqCst) == 0 {
                    let since = self
                        .now_ns()
                        .saturating_sub(self.returned_at.load(Ordering::SeqCst));
                    if self.nudged.swap(false, Ordering::SeqCst) || since >= grace {
                        // SeqCst with a waiter's increment of `borrowers` and its look at
                        // `released`: either the waiter sees the core taken back (and asks
                        // for it), or this sees the waiter and stays out.
                        self.released.store(false, Ordering::SeqCst);
                        if self.borrowers.load(Ordering::SeqCst) == 0 {
                            break;
                        }
                        self.released.store(true, Ordering::SeqCst);
                        continue;
                    }
                    std::thread::park_timeout(Duration::from_nanos(grace - since));
                } else {
                    std::thread::park_timeout(GRACE);
                }
            }
        }
    }

    /// See [`drive_until`].
    pub fn drive_until(&self, stop: Instant, ready: &mut dyn FnMut() -> bool) -> bool {
        self.borrowers.fetch_add(1, Ordering::SeqCst);
        if !self.released.load(Ordering::SeqCst) {
            self.requested.notify_one();
        }
        let mut rounds = 0u32;
        let seen = loop {
            if ready() {
                break true;
            }
            if Instant::now() >= stop {
                break false;
            }
            if self.released.load(Ordering::SeqCst) {
                let mut turns = 0u32;
                break self.runtime.block_on(async {
                    loop {
                        if ready() {
                            return true;
                        }
                        if Instant::now() >= stop {
                            return false;
                        }
                        // Lets tokio run what is queued and poll its I/O driver (a zero
                        // timeout), and now and then lets the operating system run another
                        // thread: on two cores the other end of the round trip needs one.
                        tokio::task::yield_now().await;
                        turns += 1;
                        if turns % TURNS_PER_OS_YIELD == 0 {
                            std::thread::yield_now();
                        }
                    }
                });
            }
            // The driver is letting go: the wait for it is a spin like any other.
            rounds += 1;
            if rounds % 64 == 0 {
                std::thread::yield_now();
            }
            std::hint::spin_loop();
        };
        self.returned_at.store(self.now_ns(), Ordering::SeqCst);
        self.borrowers.fetch_sub(1, Ordering::SeqCst);
        if !seen {
            // This waiter parks next: the driver takes the core back for the answer.
            self.nudge();
        }
        seen
    }

    /// See [`nudge`].
    pub fn nudge(&self) {
        if !self.released.load(Ordering::SeqCst) || self.nudged.swap(true, Ordering::SeqCst) {
            return;
        }
        if let Some(driver) = self.driver.get() {
            driver.unpark();
        }
    }

    /// Whether the driver thread is out of the runtime now (tests).
    pub fn is_released(&self) -> bool {
        self.released.load(Ordering::SeqCst)
    }

    /// Times the driver let the core go (tests, metrics).
    pub fn releases(&self) -> u64 {
        self.releases.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests;
