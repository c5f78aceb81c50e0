//! A histogram of durations with fixed, doubling buckets, updated without locks: the
//! dispatcher's schedule-to-result latency and a worker's closure execution time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bound of the first latency bucket, in seconds (100 µs).
const FIRST_BOUND: f64 = 1e-4;
/// Buckets double in width: 100 µs, 200 µs, ... up to about 14 minutes, then overflow.
const BOUNDED_BUCKETS: usize = 24;

/// A histogram of durations with fixed, doubling buckets.
#[derive(Debug)]
pub struct Histogram {
    /// `BOUNDED_BUCKETS` bounded buckets, then one for everything larger.
    counts: [AtomicU64; BOUNDED_BUCKETS + 1],
    sum_nanos: AtomicU64,
    max_nanos: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_nanos: AtomicU64::new(0),
            max_nanos: AtomicU64::new(0),
        }
    }
}

impl Histogram {
    /// Records one duration.
    pub fn observe(&self, elapsed: Duration) {
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.counts[bucket_of(elapsed.as_secs_f64())].fetch_add(1, Ordering::Relaxed);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
        self.max_nanos.fetch_max(nanos, Ordering::Relaxed);
    }

    /// A consistent-enough copy for reporting (each field is read once).
    // Nanosecond totals beyond 2^53 (104 days) lose sub-microsecond precision: harmless.
    #[allow(clippy::cast_precision_loss)]
    pub fn snapshot(&self) -> LatencySnapshot {
        let counts: Vec<u64> = self
            .counts
            .iter()
            .map(|count| count.load(Ordering::Relaxed))
            .collect();
        let count = counts.iter().sum();
        let max = self.max_nanos.load(Ordering::Relaxed) as f64 * 1e-9;
        LatencySnapshot {
            bounds: (0..BOUNDED_BUCKETS).map(bucket_bound).collect(),
            counts,
            count,
            sum: self.sum_nanos.load(Ordering::Relaxed) as f64 * 1e-9,
            max,
        }
    }
}

/// The upper bound, in seconds, of bounded bucket `index`.
fn bucket_bound(index: usize) -> f64 {
    FIRST_BOUND * f64::from(1u32 << index)
}

/// The bucket holding `seconds`: the first whose bound is at least it.
fn bucket_of(seconds: f64) -> usize {
    (0..BOUNDED_BUCKETS)
        .find(|&index| seconds <= bucket_bound(index))
        .unwrap_or(BOUNDED_BUCKETS)
}

/// The latency histogram at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct LatencySnapshot {
    /// Upper bounds of the bounded buckets, in seconds, increasing.
    pub bounds: Vec<f64>,
    /// Observations per bucket: one per bound, then the overflow bucket.
    pub counts: Vec<u64>,
    /// Total observations.
    pub count: u64,
    /// Sum of all observations, in seconds.
    pub sum: f64,
    /// The largest observation, in seconds (0 when there is none).
    pub max: f64,
}

impl LatencySnapshot {
    /// An upper estimate of quantile `q` (0..=1): the bound of the bucket where the
    /// cumulative count reaches `q` of the total, capped by the largest observation;
    /// `None` with no observations.
    #[allow(clippy::cast_precision_loss)] // counts beyond 2^53 are not a concern
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if self.count == 0 {
            return None;
        }
        let rank = (q.clamp(0.0, 1.0) * self.count as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (index, count) in self.counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                let bound = self.bounds.get(index).copied().unwrap_or(self.max);
                return Some(bound.min(self.max));
            }
        }
        Some(self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_doubling_buckets() {
        let histogram = Histogram::default();
        for micros in [50, 150, 150, 150, 100_000] {
            histogram.observe(Duration::from_micros(micros));
        }
        histogram.observe(Duration::from_secs(100_000));
        let snapshot = histogram.snapshot();
        assert_eq!(snapshot.count, 6);
        assert_eq!(snapshot.counts[0], 1); // <= 100 us
        assert_eq!(snapshot.counts[1], 3); // <= 200 us
        assert_eq!(*snapshot.counts.last().unwrap(), 1); // overflow
        assert!((snapshot.sum - (100_000.0 + 0.1 + 0.0005)).abs() < 1e-6);
        assert!((snapshot.quantile(0.5).unwrap() - 2e-4).abs() < 1e-12);
        // 100 ms lands in the 102.4 ms bucket.
        assert!((snapshot.quantile(0.8).unwrap() - 0.1024).abs() < 1e-9);
        assert!((snapshot.quantile(1.0).unwrap() - 100_000.0).abs() < 1e-6);
    }

    #[test]
    fn an_empty_histogram_has_no_quantiles() {
        let snapshot = Histogram::default().snapshot();
        assert_eq!(snapshot.quantile(0.99), None);
        assert_eq!(snapshot.bounds.len() + 1, snapshot.counts.len());
    }
}
