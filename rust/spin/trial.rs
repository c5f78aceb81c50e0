//! Whether spinning pays at a site, decided by trying both ways.
//!
//! A spinner pays only while a core is free for it. Where another runnable thread wants
//! its core (another process's work, or on 2 cores the very threads that produce the
//! answer) the spin slows the wait it means to shorten: on the 2-core machine a serial
//! loop's p50 went from 157 to 78 µs with the spin on a quiet machine, while with two busy
//! processes beside it the mean went from 234 to 883 µs (`docs/benchmarks.md`). Whether a
//! core is free cannot be read cheaply from inside the process: the system's CPU pressure
//! (`/proc/pressure/cpu`) counts the round trip's own threads waiting for each other (24%
//! stalled with no spin at all in that loop). So each site measures the outcome instead:
//! now and then it makes a few waits the other way, and keeps the way whose waits took
//! less time on average.
//!
//! The mean, not the median: where a spinner competes for a core, most waits are as short
//! as before and a share of them very long, and only the mean sees those. Each wait counts
//! for at most the cap its caller gives (a few budgets), so one long stall weighs like a
//! few, and the waits of a site whose answers take milliseconds are not counted at all
//! (its budget's own adaptation in `spin.rs` has it resting, parking at once).

/// How a wait went: spinning first (within the site's adaptive budget), or parking at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Way {
    /// Spin within the site's adaptive budget, then park.
    Spin,
    /// Park at once.
    Park,
}

impl Way {
    fn other(self) -> Self {
        match self {
            Self::Spin => Self::Park,
            Self::Park => Self::Spin,
        }
    }
}

/// Waits compared per way, by their mean.
pub const SAMPLES: usize = 64;

/// Waits between the end of one trial and the start of the next.
pub const PERIOD: u32 = 2048;

/// A trial that has seen this many waits without [`SAMPLES`] of the other way is abandoned
/// (other threads' waits kept the kept way meanwhile).
const TRIAL_WAITS: u32 = 8 * SAMPLES as u32;

/// The other way is kept only when its mean is below this share (in percent) of the kept
/// way's: a margin against noise, so a site does not flip between two equal ways.
const MARGIN_PERCENT: u64 = 90;

/// The last waits of one way, in nanoseconds: a ring.
#[derive(Debug, Clone, Copy)]
struct Samples {
    ns: [u64; SAMPLES],
    len: usize,
    next: usize,
}

impl Samples {
    const EMPTY: Self = Self {
        ns: [0; SAMPLES],
        len: 0,
        next: 0,
    };

    fn push(&mut self, ns: u64) {
        self.ns[self.next] = ns;
        self.next = (self.next + 1) % SAMPLES;
        self.len = (self.len + 1).min(SAMPLES);
    }

    fn full(&self) -> bool {
        self.len == SAMPLES
    }

    fn mean(&self) -> u64 {
        let sum: u128 = self.ns[..self.len].iter().map(|&ns| u128::from(ns)).sum();
        u64::try_from(sum / self.len.max(1) as u128).unwrap_or(u64::MAX)
    }
}

/// One site's state: the way it keeps, and the trial of the other way when one is on.
#[derive(Debug)]
pub struct Trials {
    kept: Way,
    /// The kept way's last waits.
    kept_samples: Samples,
    /// The other way's waits in the trial on, if one is.
    tried: Option<Samples>,
    /// Waits since the last trial ended, or in the trial on.
    waits: u32,
    /// Times the kept way changed (tests, metrics).
    changes: u32,
}

impl Trials {
    /// A site that spins, and tries parking first after `2 * SAMPLES` waits: a machine
    /// busy from the start stops spinning soon.
    pub const fn new() -> Self {
        Self {
            kept: Way::Spin,
            kept_samples: Samples::EMPTY,
            tried: None,
            waits: PERIOD - 2 * SAMPLES as u32,
            changes: 0,
        }
    }

    /// A site that keeps `way`, its first trial a period away (tests).
    #[cfg(test)]
    pub fn keeping(way: Way) -> Self {
        Self {
            kept: way,
            waits: 0,
            ..Self::new()
        }
    }

    /// The way the next wait goes.
    pub fn way(&self) -> Way {
        if self.tried.is_some() {
            self.kept.other()
        } else {
            self.kept
        }
    }

    /// The way the site keeps between trials.
    #[cfg(test)]
    pub fn kept(&self) -> Way {
        self.kept
    }

    /// How many times the kept way changed.
    #[cfg(test)]
    pub fn changes(&self) -> u32 {
        self.changes
    }

    /// A wait that went `way` is over after `waited_ns` (capped by the caller).
    pub fn record(&mut self, way: Way, waited_ns: u64) {
        self.waits = self.waits.saturating_add(1);
        match &mut self.tried {
            None => {
                if way == self.kept {
                    self.kept_samples.push(waited_ns);
                }
                if self.waits >= PERIOD && self.kept_samples.full() {
                    self.tried = Some(Samples::EMPTY);
                    self.waits = 0;
                }
            }
            Some(tried) => {
                if way != self.kept {
                    tried.push(waited_ns);
                }
                if tried.full() {
                    let (tried, kept) = (tried.mean(), self.kept_samples.mean());
                    if tried.saturating_mul(100) < kept.saturating_mul(MARGIN_PERCENT) {
                        self.kept = self.kept.other();
                        self.kept_samples = self.tried.take().unwrap_or(Samples::EMPTY);
                        self.changes += 1;
                    }
                    self.end_trial();
                } else if self.waits >= TRIAL_WAITS {
                    self.end_trial();
                }
            }
        }
    }

    fn end_trial(&mut self) {
        self.tried = None;
        self.waits = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs waits the way the site asks, each taking what `took` says for that way.
    fn run(trials: &mut Trials, waits: u32, mut took: impl FnMut(Way) -> u64) {
        for _ in 0..waits {
            let way = trials.way();
            trials.record(way, took(way));
        }
    }

    #[test]
    fn a_site_keeps_spinning_while_spinning_is_faster() {
        let mut trials = Trials::new();
        run(&mut trials, 20 * PERIOD, |way| match way {
            Way::Spin => 60_000,
            Way::Park => 100_000,
        });
        assert_eq!(trials.kept(), Way::Spin);
        assert_eq!(trials.changes(), 0);
    }

    #[test]
    fn a_site_parks_soon_where_parking_is_faster_and_spins_again_when_that_changes() {
        let mut trials = Trials::new();
        // Busy from the start: the first trial comes after 2 * SAMPLES waits.
        run(&mut trials, 3 * SAMPLES as u32, |way| match way {
            Way::Spin => 129_000,
            Way::Park => 104_000,
        });
        assert_eq!(trials.kept(), Way::Park);
        // Quiet again: the next trial of spinning wins it back.
        run(&mut trials, PERIOD + SAMPLES as u32, |way| match way {
            Way::Spin => 77_000,
            Way::Park => 154_000,
        });
        assert_eq!(trials.kept(), Way::Spin);
        assert_eq!(trials.changes(), 2);
    }

    #[test]
    fn within_the_margin_the_kept_way_stays() {
        let mut trials = Trials::new();
        run(&mut trials, 10 * PERIOD, |way| match way {
            Way::Spin => 100_000,
            Way::Park => 95_000, // 5% better: noise, not a reason
        });
        assert_eq!(trials.kept(), Way::Spin);
    }

    #[test]
    fn a_way_with_a_share_of_long_stalls_loses_though_most_of_its_waits_are_short() {
        let mut trials = Trials::new();
        let mut n = 0u64;
        // A spinner competing for a core: most waits as fast as spinning makes them, one
        // in five stalled to the cap (4 ms); parking is steadier.
        run(&mut trials, 3 * SAMPLES as u32, |way| {
            n += 1;
            match way {
                Way::Spin if n % 5 == 0 => 4_000_000,
                Way::Spin => 90_000,
                Way::Park => 230_000,
            }
        });
        assert_eq!(trials.kept(), Way::Park);
    }

    #[test]
    fn stalls_that_both_ways_meet_do_not_flip_it() {
        let mut trials = Trials::new();
        let mut n = 0u64;
        run(&mut trials, 10 * PERIOD, |way| {
            n += 1;
            match way {
                _ if n % 16 == 0 => 4_000_000,
                Way::Spin => 80_000,
                Way::Park => 120_000,
            }
        });
        assert_eq!(trials.kept(), Way::Spin);
        assert_eq!(trials.changes(), 0);
    }

    #[test]
    fn a_trial_that_sees_no_wait_of_its_way_is_abandoned() {
        let mut trials = Trials::new();
        run(&mut trials, 2 * SAMPLES as u32, |_| 50_000);
        assert_eq!(trials.way(), Way::Park, "a trial is on");
        // Other threads' waits, which began before the trial, keep coming the kept way.
        for _ in 0..TRIAL_WAITS {
            trials.record(Way::Spin, 50_000);
        }
        assert_eq!(trials.way(), Way::Spin, "abandoned");
        assert_eq!(trials.changes(), 0);
    }
}
