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
//!
//! A trial costs what its waits lose, and on a busy machine a wait spun costs a time slice
//! (milliseconds, where parking takes tens of microseconds). So a trial ends as soon as its
//! waits add up to more than the kept way's would (it can no longer win), and each trial
//! the kept way wins doubles the waits until the next, up to [`MAX_PERIOD`]: with a busy
//! process beside a serial loop on 2 cores, untried spinning there took 2.4 times as long
//! per round trip as parking (`docs/benchmarks.md`).

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

/// Waits between the end of one trial and the start of the next, after a trial that
/// changed the way kept.
pub const PERIOD: u32 = 2048;

/// The most waits between trials: each trial the kept way wins doubles the period up to
/// this, so a way that keeps losing is tried seldom (a trial of spinning on a busy machine
/// costs its waits a time slice each).
pub const MAX_PERIOD: u32 = 32 * PERIOD;

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

    fn sum(&self) -> u128 {
        self.ns[..self.len].iter().map(|&ns| u128::from(ns)).sum()
    }
}

/// A trial of the other way: its waits, and the sum they must stay below to win.
#[derive(Debug, Clone, Copy)]
struct Trial {
    samples: Samples,
    /// [`SAMPLES`] waits at the kept way's mean, less the margin: once the tried waits add
    /// up to more, the trial is lost whatever its remaining waits take.
    to_beat: u128,
}

/// One site's state: the way it keeps, and the trial of the other way when one is on.
#[derive(Debug)]
pub struct Trials {
    kept: Way,
    /// The kept way's last waits.
    kept_samples: Samples,
    /// The trial of the other way, if one is on.
    tried: Option<Trial>,
    /// Waits since the last trial ended, or in the trial on.
    waits: u32,
    /// Waits from the end of one trial to the next: [`PERIOD`], doubled by each trial
    /// the kept way wins, up to [`MAX_PERIOD`].
    period: u32,
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
            period: PERIOD,
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

    /// A wait that went `way` is over after `waited_ns` (capped by the caller). Returns the
    /// way the site keeps from now when this wait ended a trial that changed it.
    pub fn record(&mut self, way: Way, waited_ns: u64) -> Option<Way> {
        self.waits = self.waits.saturating_add(1);
        let Some(trial) = &mut self.tried else {
            if way == self.kept {
                self.kept_samples.push(waited_ns);
            }
            if self.waits >= self.period && self.kept_samples.full() {
                let to_beat = self.kept_samples.sum() * u128::from(MARGIN_PERCENT) / 100;
                self.tried = Some(Trial {
                    samples: Samples::EMPTY,
                    to_beat,
                });
                self.waits = 0;
            }
            return None;
        };
        if way != self.kept {
            trial.samples.push(waited_ns);
        }
        if trial.samples.sum() >= trial.to_beat {
            // Lost already (at once, where one wait the other way took a time slice).
            self.period = self.period.saturating_mul(2).min(MAX_PERIOD);
            self.end_trial();
        } else if trial.samples.full() {
            // Won: the tried way's mean is below the kept way's by the margin.
            self.kept = self.kept.other();
            self.kept_samples = trial.samples;
            self.changes += 1;
            self.period = PERIOD;
            self.end_trial();
            return Some(self.kept);
        } else if self.waits >= TRIAL_WAITS {
            self.end_trial();
        }
        None
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
    fn a_losing_trial_ends_once_it_cannot_win_and_the_next_comes_later() {
        let mut trials = Trials::keeping(Way::Park);
        run(&mut trials, SAMPLES as u32, |_| 60_000);
        // A period later a trial of spinning starts; each of its waits meets a time slice.
        let mut spun = 0;
        run(&mut trials, PERIOD, |way| {
            if way == Way::Spin {
                spun += 1;
                4_000_000
            } else {
                60_000
            }
        });
        assert_eq!(trials.kept(), Way::Park);
        // 64 waits at 60 us, less the margin, are beaten by one wait of 4 ms.
        assert_eq!(spun, 1, "the trial ended at its first wait");
        assert_eq!(trials.period, 2 * PERIOD);
        // Losing again and again, trials come ever more seldom, up to the longest period.
        let mut trials_run = 0;
        run(&mut trials, 200 * PERIOD, |way| {
            if way == Way::Spin {
                trials_run += 1;
                4_000_000
            } else {
                60_000
            }
        });
        assert_eq!(trials.period, MAX_PERIOD);
        assert!(trials_run < 12, "{trials_run} trials in 200 periods");
        // A trial won resets the period.
        while trials.way() != Way::Spin {
            trials.record(Way::Park, 60_000);
        }
        run(&mut trials, SAMPLES as u32, |_| 20_000);
        assert_eq!(trials.kept(), Way::Spin);
        assert_eq!(trials.period, PERIOD);
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
