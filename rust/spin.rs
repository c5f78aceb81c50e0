//! Bounded, adaptive spinning before a thread parks.
//!
//! A serial round trip wakes a parked thread at each hand-off, and on a busy or virtual
//! machine a futex wake-up costs tens of microseconds before the woken thread runs. Two of
//! those hand-offs end in a thread that expects its answer soon: the coordinator's thread
//! in `fetch()` right after `schedule()`, and a worker's executor right after it answered
//! (the next closure of a serial loop follows one round trip later). Those threads watch a
//! flag for a short, bounded while before they park, as glibc's adaptive mutexes and Go's
//! scheduler do. A runtime thread spins through a site of its own too, as an async task
//! that yields ([`Spin::begin`], [`Spin::end`]; `crate::runtime::awake`).
//!
//! The bound adapts, per site: a spin that saw its flag keeps the full budget; one that
//! gave up halves it, and at the floor the site stops spinning for [`REST_CALLS`] waits
//! before it tries again; a wait that ended within the full budget after all restores it.
//! So a waiter whose answers take milliseconds (a real closure, an idle worker's poll)
//! soon parks at once, and the CPU a spin can cost is bounded by the budget times the rate
//! of waits.
//!
//! Spinning pays only where a core is free for the spinner, which no cheap reading tells
//! from inside the process; so each site also tries parking at once now and then and keeps
//! whichever way its waits took less time on average (`trial.rs`). On the 2-core machine a
//! serial loop's p50 fell from 127 to 85 µs with the spin on a quiet machine, and the
//! trials keep it parked where a busy process beside it made the spin slower
//! (`docs/benchmarks.md`). So spinning is on by default wherever the process may use at
//! least [`MIN_CORES_TO_SPIN`] cores; `JAXCLUSTER_SPIN_US` sets the budget in microseconds
//! either way (`0` turns spinning off).

pub mod report;
mod trial;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use report::{Report, UNREPORTED};
use trial::{Trials, Way};

use crate::setting::{Read, Setting};

/// The default spin budget, in microseconds, where spinning is on: above a loopback round
/// trip of a trivial closure, so a serial loop's answers are caught spinning.
pub const DEFAULT_BUDGET_US: u64 = 500;

/// The fewest cores (`available_parallelism`: affinity and cgroup quota included) with which
/// spinning is on by default: on one core a spinner only delays the thread it waits for.
pub const MIN_CORES_TO_SPIN: usize = 2;

/// The environment variable that sets the budget in microseconds (`0`: never spin).
pub const BUDGET_ENV: &str = "JAXCLUSTER_SPIN_US";

/// The most a wait counts for in the trials of spinning against parking, in full budgets:
/// a stall counts, but one does not outweigh a trial.
const TRIAL_CAP: u64 = 8;

/// How many waits a site that gave up at its floor parks at once before it spins again.
pub const REST_CALLS: u32 = 64;

/// Spins of `spin_loop` between two looks at the clock and, after the first rounds, a
/// `yield_now`: on a machine with fewer cores than runnable threads the yield lets the
/// thread that sets the flag run.
const SPINS_PER_ROUND: u32 = 64;

/// Rounds of pure spinning before each round also yields the core.
const ROUNDS_BEFORE_YIELD: u32 = 4;

/// The budget from [`BUDGET_ENV`], else by the cores this process may use; read once per
/// process.
pub fn configured_budget() -> Duration {
    static BUDGET: Setting<Duration> = Setting::new();
    *BUDGET.get(|| {
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        budget_for(std::env::var(BUDGET_ENV).ok().as_deref(), cores)
    })
}

/// The budget [`BUDGET_ENV`]'s value `set` (if any) gives on a machine of `cores`. A value
/// that is not a whole number of microseconds is refused (the caller warns), as unset.
fn budget_for(set: Option<&str>, cores: usize) -> Read<Duration> {
    Read::parse(
        BUDGET_ENV,
        set,
        |text| {
            text.parse::<u64>()
                .ok()
                .map(|micros| Duration::from_micros(micros.min(MAX_BUDGET_US)))
        },
        "a whole number of microseconds",
        || {
            if cores >= MIN_CORES_TO_SPIN {
                Duration::from_micros(DEFAULT_BUDGET_US)
            } else {
                Duration::ZERO
            }
        },
    )
}

/// The longest budget [`BUDGET_ENV`] may set: 10 ms.
const MAX_BUDGET_US: u64 = 10_000;

/// One place that spins before it parks, with its own adaptive budget.
#[derive(Debug)]
pub struct Spin {
    /// The full budget, in nanoseconds; `u64::MAX` until first used (then the configured
    /// budget), so a `static` site can be built in a `const`.
    full_ns: AtomicU64,
    /// The current budget, in nanoseconds (`0`: resting).
    budget_ns: AtomicU64,
    /// Waits left to park at once while resting.
    rest: AtomicU32,
    /// Whether spinning pays here: the way kept, and the trial of the other (a leaf lock,
    /// taken under the callers' locks and taking none).
    trials: Mutex<Trials>,
    /// Where its waits are counted, for metrics.
    report: &'static Report,
    /// Whether its waiter does the runtime's work while it spins, where the runtime lends
    /// it (`crate::runtime::lend`): a waiter for something the runtime brings.
    drives: bool,
}

/// What [`Spin::until`] saw, kept by the waiter until its wait is over
/// ([`Spin::wait_ended`]).
#[must_use = "a wait that spun in vain reports its end with `Spin::wait_ended`"]
#[derive(Debug, Clone, Copy)]
pub struct Spun {
    seen: bool,
    /// When a spin that did not see the flag began (`None`: seen, or the site is off).
    in_vain_since: Option<Instant>,
    /// When a wait the site's trials count began (`None`: the site is off or resting),
    /// and which way it went.
    began: Option<(Instant, Way)>,
}

impl Spun {
    const SEEN: Self = Self {
        seen: true,
        in_vain_since: None,
        began: None,
    };

    /// Whether `ready()` held: the caller need not park.
    pub fn seen(self) -> bool {
        self.seen
    }
}

/// A wait [`Spin::begin`] began: how it spins, if at all.
#[derive(Debug, Clone, Copy)]
pub enum Begun {
    /// The site is off or resting: look once, then park.
    Resting,
    /// The trials park this wait at once (the way kept, or the other one tried).
    Park {
        /// When the wait began.
        start: Instant,
    },
    /// Spin until `stop`.
    Spin {
        /// When the wait began.
        start: Instant,
        /// When the spin gives up.
        stop: Instant,
        /// The caller's deadline, not the budget, set `stop`: giving up there says
        /// nothing of the budget.
        cut_short: bool,
    },
}

impl Begun {
    /// Until when the waiter spins; `None`: it looks once and parks.
    pub fn spin_until(&self) -> Option<Instant> {
        match *self {
            Self::Spin { stop, .. } => Some(stop),
            Self::Resting | Self::Park { .. } => None,
        }
    }
}

/// How many nanoseconds "not read yet" is stored as.
const UNSET: u64 = u64::MAX;

impl Spin {
    /// A site using [`configured_budget`], read on first use: its first wait must not be
    /// under a lock (see [`Self::with_budget`]).
    pub const fn configured() -> Self {
        Self {
            full_ns: AtomicU64::new(UNSET),
            budget_ns: AtomicU64::new(UNSET),
            rest: AtomicU32::new(0),
            trials: Mutex::new(Trials::new()),
            report: &UNREPORTED,
            drives: false,
        }
    }

    /// The same site, its waits counted in `report` (`report::sites` reads them).
    #[must_use]
    pub const fn reporting(mut self, report: &'static Report) -> Self {
        self.report = report;
        self
    }

    /// The same site, whose waiter runs the runtime while it spins where the runtime lends
    /// its work (`crate::runtime::lend`): the thread in `fetch()` and a worker's executor,
    /// which wait for what the runtime reads off a socket.
    #[must_use]
    pub const fn driving(mut self) -> Self {
        self.drives = true;
        self
    }

    /// A site with budget `full`: tests and benches, and a site whose first wait is under
    /// a lock (the job queue's), which reads [`configured_budget`] when it is built, since
    /// reading it may log a refused setting and logging takes the GIL.
    pub fn with_budget(full: Duration) -> Self {
        let ns = nanos(full);
        Self {
            full_ns: AtomicU64::new(ns),
            budget_ns: AtomicU64::new(ns),
            rest: AtomicU32::new(0),
            trials: Mutex::new(Trials::new()),
            report: &UNREPORTED,
            drives: false,
        }
    }

    /// Spins until `ready()` holds or the current budget is spent, never past `deadline`.
    /// The caller parks as usual unless [`Spun::seen`], and once its wait is over (its flag
    /// set) hands the answer back to [`Self::wait_ended`], which tells the site what budget
    /// the wait would have needed. A spin the deadline cut short says nothing of the budget
    /// (a poll with a zero timeout is not a wait that outlasted it).
    pub fn until(&self, deadline: Option<Instant>, mut ready: impl FnMut() -> bool) -> Spun {
        let begun = self.begin(deadline);
        let Some(stop) = begun.spin_until() else {
            return self.end(&begun, ready());
        };
        // Where the runtime lends its work, this thread does it while it spins.
        if self.drives {
            if let Some(seen) = crate::runtime::lend::drive_until(stop, &mut ready) {
                return self.end(&begun, seen);
            }
        }
        let mut rounds = 0u32;
        loop {
            for _ in 0..SPINS_PER_ROUND {
                if ready() {
                    return self.end(&begun, true);
                }
                std::hint::spin_loop();
            }
            if Instant::now() >= stop {
                return self.end(&begun, ready());
            }
            rounds += 1;
            if rounds > ROUNDS_BEFORE_YIELD {
                std::thread::yield_now();
            }
        }
    }

    /// Begins a wait that spins (until [`Begun::spin_until`]) or parks at once, for a waiter
    /// that cannot spin inside [`Self::until`] (an async task, which spins by yielding to its
    /// runtime); [`Self::end`] says what it saw.
    pub fn begin(&self, deadline: Option<Instant>) -> Begun {
        let budget = self.budget();
        if budget == 0 {
            return Begun::Resting;
        }
        let way = self.trials().way();
        let start = Instant::now();
        if way == Way::Park {
            // Kept or tried: parking at once, the budget left as it is.
            return Begun::Park { start };
        }
        let own_stop = start + Duration::from_nanos(budget);
        let (stop, cut_short) = match deadline {
            Some(deadline) if deadline < own_stop => (deadline, true),
            _ => (own_stop, false),
        };
        Begun::Spin {
            start,
            stop,
            cut_short,
        }
    }

    /// Ends the spinning part of the wait `begun`: `seen` says whether its flag held. The
    /// caller parks unless it was seen, and reports the wait's end to [`Self::wait_ended`].
    pub fn end(&self, begun: &Begun, seen: bool) -> Spun {
        match *begun {
            Begun::Resting if seen => Spun::SEEN,
            // Resting, or off: a wait within the full budget still ends the rest.
            Begun::Resting => Spun {
                seen: false,
                in_vain_since: (!self.is_off()).then(Instant::now),
                began: None,
            },
            Begun::Park { start } => Spun {
                seen,
                in_vain_since: None,
                began: Some((start, Way::Park)),
            },
            Begun::Spin { start, .. } if seen => {
                self.saw_it();
                Spun {
                    began: Some((start, Way::Spin)),
                    ..Spun::SEEN
                }
            }
            Begun::Spin {
                start, cut_short, ..
            } => {
                if !cut_short {
                    self.gave_up();
                }
                Spun {
                    seen: false,
                    in_vain_since: Some(start),
                    began: Some((start, Way::Spin)),
                }
            }
        }
    }

    /// Whether this site never spins: its configured budget is zero (by default, below
    /// [`MIN_CORES_TO_SPIN`] cores). A caller that must drop a lock to spin skips that.
    pub fn is_off(&self) -> bool {
        let full = self.full_ns.load(Ordering::Relaxed);
        full == 0 || (full == UNSET && configured_budget().is_zero())
    }

    /// The wait that `spun` began is over: its flag was set. A wait that spun in vain and
    /// ended within the full budget after all restores the full budget (see
    /// [`Self::ended_after`]); one that was seen spinning was counted already.
    pub fn wait_ended(&self, spun: Spun) {
        if let Some(began) = spun.in_vain_since {
            self.ended_after(began.elapsed());
        }
        if let Some((began, way)) = spun.began {
            let cap = self
                .full_ns
                .load(Ordering::Relaxed)
                .saturating_mul(TRIAL_CAP);
            let kept = self.trials().record(way, nanos(began.elapsed()).min(cap));
            self.report.waited(way);
            if let Some(kept) = kept {
                self.report.kept(kept);
            }
        }
    }

    /// The way this site keeps between trials.
    #[cfg(test)]
    fn kept_way(&self) -> Way {
        self.trials().kept()
    }

    fn trials(&self) -> MutexGuard<'_, Trials> {
        self.trials.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The budget for this wait in nanoseconds (0: park at once), counting down a rest.
    fn budget(&self) -> u64 {
        let mut full = self.full_ns.load(Ordering::Relaxed);
        if full == UNSET {
            full = nanos(configured_budget());
            self.full_ns.store(full, Ordering::Relaxed);
            let _ =
                self.budget_ns
                    .compare_exchange(UNSET, full, Ordering::Relaxed, Ordering::Relaxed);
        }
        if full == 0 {
            return 0;
        }
        let budget = self.budget_ns.load(Ordering::Relaxed);
        if budget != 0 {
            return budget;
        }
        // Resting: park at once, until the rest is over; then try again at the floor.
        let left = self.rest.load(Ordering::Relaxed);
        if left > 0 {
            self.rest.store(left - 1, Ordering::Relaxed);
            return 0;
        }
        floor(full)
    }

    fn saw_it(&self) {
        let full = self.full_ns.load(Ordering::Relaxed);
        self.budget_ns.store(full, Ordering::Relaxed);
        self.rest.store(0, Ordering::Relaxed);
    }

    fn gave_up(&self) {
        let full = self.full_ns.load(Ordering::Relaxed);
        let halved = self.budget_ns.load(Ordering::Relaxed).min(full) / 2;
        if halved < floor(full) {
            self.budget_ns.store(0, Ordering::Relaxed);
            self.rest.store(REST_CALLS, Ordering::Relaxed);
        } else {
            self.budget_ns.store(halved, Ordering::Relaxed);
        }
    }

    /// The wait that spun in vain ended, `waited` after the spin began: had the budget
    /// been full, a spin would have seen it when `waited` is within it, so the site gets
    /// its full budget back (a spin that gave up only says its budget was short, not that
    /// the waits are long).
    fn ended_after(&self, waited: Duration) {
        let full = self.full_ns.load(Ordering::Relaxed);
        if full != UNSET && nanos(waited) <= full {
            self.saw_it();
        }
    }

    /// The current budget (tests, metrics): zero while resting.
    pub fn current_budget(&self) -> Duration {
        match self.budget_ns.load(Ordering::Relaxed) {
            UNSET => configured_budget(),
            ns => Duration::from_nanos(ns),
        }
    }
}

/// The smallest budget a site spins with: an eighth of the full one.
fn floor(full: u64) -> u64 {
    (full / 8).max(1)
}

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX - 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    #[test]
    fn a_flag_set_while_spinning_is_seen_and_keeps_the_full_budget() {
        let spin = Spin::with_budget(Duration::from_millis(200));
        let flag = Arc::new(AtomicBool::new(false));
        let setter = {
            let flag = Arc::clone(&flag);
            std::thread::spawn(move || flag.store(true, Ordering::Release))
        };
        assert!(spin.until(None, || flag.load(Ordering::Acquire)).seen());
        setter.join().unwrap();
        assert_eq!(spin.current_budget(), Duration::from_millis(200));
    }

    #[test]
    fn giving_up_halves_the_budget_then_rests_then_tries_again() {
        let spin = Spin::with_budget(Duration::from_micros(80));
        let started = Instant::now();
        assert!(!spin.until(None, || false).seen());
        assert!(started.elapsed() >= Duration::from_micros(80));
        assert_eq!(spin.current_budget(), Duration::from_micros(40));
        assert!(!spin.until(None, || false).seen());
        assert_eq!(spin.current_budget(), Duration::from_micros(20));
        assert!(!spin.until(None, || false).seen());
        assert_eq!(spin.current_budget(), Duration::from_micros(10));
        assert!(!spin.until(None, || false).seen());
        // Under the floor (an eighth): resting, each wait parks at once without spinning.
        assert_eq!(spin.current_budget(), Duration::ZERO);
        let mut looks = 0;
        for _ in 0..REST_CALLS {
            assert!(!spin
                .until(None, || {
                    looks += 1;
                    false
                })
                .seen());
        }
        assert_eq!(looks, REST_CALLS, "a resting site looks once and parks");
        // Rested: it spins again at the floor, and a success restores the full budget.
        let mut looks = 0;
        assert!(spin
            .until(None, || {
                looks += 1;
                looks > 3
            })
            .seen());
        assert_eq!(spin.current_budget(), Duration::from_micros(80));
    }

    #[test]
    fn a_wait_that_ended_within_the_full_budget_restores_it_and_a_longer_one_does_not() {
        let spin = Spin::with_budget(Duration::from_micros(80));
        for _ in 0..4 {
            assert!(!spin.until(None, || false).seen());
        }
        assert_eq!(spin.current_budget(), Duration::ZERO, "resting");
        let long_ago = Spun {
            seen: false,
            in_vain_since: Instant::now().checked_sub(Duration::from_micros(500)),
            began: None,
        };
        spin.wait_ended(long_ago);
        assert_eq!(
            spin.current_budget(),
            Duration::ZERO,
            "a long wait: still resting"
        );
        let resting = spin.until(None, || false);
        assert!(!resting.seen());
        spin.wait_ended(resting); // at once: well within the full budget
        assert_eq!(spin.current_budget(), Duration::from_micros(80));
        let mut looks = 0;
        assert!(spin
            .until(None, || {
                looks += 1;
                looks > 1
            })
            .seen());
        assert!(looks > 1, "it spins again at once, with no rest left");
    }

    #[test]
    fn a_spin_never_passes_the_deadline() {
        let spin = Spin::with_budget(Duration::from_secs(10));
        let started = Instant::now();
        assert!(!spin
            .until(Some(started + Duration::from_millis(5)), || false)
            .seen());
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "spun past the deadline"
        );
    }

    #[test]
    fn the_budget_is_on_by_default_only_with_two_cores_or_more_and_the_variable_wins() {
        let budget = |set, cores| budget_for(set, cores).value;
        assert_eq!(budget(None, 1), Duration::ZERO);
        assert_eq!(
            budget(None, MIN_CORES_TO_SPIN),
            Duration::from_micros(DEFAULT_BUDGET_US)
        );
        assert_eq!(budget(Some("120"), 2), Duration::from_micros(120));
        assert_eq!(budget(Some(" 0 "), 64), Duration::ZERO);
        let refused = budget_for(Some("1e9"), 64);
        assert_eq!(refused.value, Duration::from_micros(DEFAULT_BUDGET_US));
        let said = refused.refused.unwrap();
        assert!(
            said.contains(BUDGET_ENV) && said.contains("microseconds"),
            "{said}"
        );
        assert_eq!(
            budget(Some("99999999"), 2),
            Duration::from_micros(MAX_BUDGET_US)
        );
    }

    #[test]
    fn a_site_is_off_only_with_a_zero_full_budget() {
        assert!(Spin::with_budget(Duration::ZERO).is_off());
        let spin = Spin::with_budget(Duration::from_micros(80));
        for _ in 0..4 {
            assert!(!spin.until(None, || false).seen());
        }
        assert_eq!(spin.current_budget(), Duration::ZERO, "resting");
        assert!(!spin.is_off(), "a resting site is not off");
    }

    #[test]
    fn a_site_that_keeps_parking_looks_once_and_leaves_its_budget_alone() {
        let spin = Spin::with_budget(Duration::from_millis(200));
        *spin.trials() = Trials::keeping(Way::Park);
        for _ in 0..3 {
            let mut looks = 0;
            let outcome = spin.until(None, || {
                looks += 1;
                false
            });
            assert!(!outcome.seen());
            assert_eq!(looks, 1, "a parking site looks once");
            spin.wait_ended(outcome);
        }
        assert_eq!(spin.current_budget(), Duration::from_millis(200));
        assert_eq!(spin.kept_way(), Way::Park);
    }

    #[test]
    fn a_site_that_parks_where_spinning_is_slower_and_spins_where_it_is_faster() {
        // Real waits, timed by the site: a flag that comes 1 ms after a wait began when it
        // spins and 50 us after when it parks (a spinner delaying what it waits for)...
        let spin = Spin::with_budget(Duration::from_millis(2));
        let wait = |site: &Spin, spinning: Duration, parking: Duration| {
            let due = if site.trials().way() == Way::Spin {
                spinning
            } else {
                parking
            };
            let began = Instant::now();
            let outcome = site.until(None, || began.elapsed() >= due);
            while began.elapsed() < due {
                std::hint::spin_loop(); // parked until the flag comes
            }
            site.wait_ended(outcome);
        };
        for _ in 0..3 * trial::SAMPLES {
            wait(&spin, Duration::from_millis(1), Duration::from_micros(50));
        }
        assert_eq!(spin.kept_way(), Way::Park);
        // ...and once spinning would be faster, the next trial brings it back.
        for _ in 0..trial::PERIOD as usize + 2 * trial::SAMPLES {
            wait(&spin, Duration::from_micros(20), Duration::from_millis(1));
        }
        assert_eq!(spin.kept_way(), Way::Spin);
    }

    #[test]
    fn many_threads_share_a_site_while_its_trials_come_and_go() {
        let spin = Arc::new(Spin::with_budget(Duration::from_micros(300)));
        let threads: Vec<_> = (0..8u64)
            .map(|seed| {
                let spin = Arc::clone(&spin);
                std::thread::spawn(move || {
                    let mut state = seed.wrapping_mul(6_364_136_223_846_793_005) | 1;
                    for _ in 0..3_000 {
                        state ^= state << 13;
                        state ^= state >> 7;
                        state ^= state << 17;
                        let looks_needed = state % 400;
                        let mut looks = 0;
                        let outcome = spin.until(None, || {
                            looks += 1;
                            looks > looks_needed
                        });
                        spin.wait_ended(outcome);
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert!(spin.current_budget() <= Duration::from_micros(300));
    }

    #[test]
    fn a_site_counts_its_waits_by_the_way_they_went_in_its_report() {
        static REPORT: Report = Report::new("test");
        let site = Spin::with_budget(Duration::from_millis(1)).reporting(&REPORT);
        for _ in 0..400 {
            let spun = site.until(None, || true);
            site.wait_ended(spun);
        }
        let counted = REPORT.snapshot(true);
        assert_eq!(counted.waits_spun + counted.waits_parked, 400);
        // The trial of parking after 128 waits made some waits park at once.
        assert!(counted.waits_parked >= 1, "{counted:?}");
        assert!(counted.waits_spun >= 128, "{counted:?}");
        assert_eq!(counted.spinning, counted.way_changes % 2 == 0);
        assert!(!REPORT.snapshot(false).spinning, "off: never spinning");
    }

    #[test]
    fn a_zero_budget_never_spins() {
        let spin = Spin::with_budget(Duration::ZERO);
        let mut looks = 0;
        for _ in 0..10 {
            assert!(!spin
                .until(None, || {
                    looks += 1;
                    false
                })
                .seen());
        }
        assert_eq!(looks, 10);
    }
}
