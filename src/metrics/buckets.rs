//! Histogram buckets as Prometheus reads them: for each fixed upper bound,
//! exactly how many recorded values were at most that bound; and the number
//! and sum of all of them.
//!
//! The writers also keep hdrhistograms, for quantiles (`eventctl stats`,
//! the load harness). Those group values into slots whose width grows with
//! the value (at two significant figures 256 and 257 share one), so a
//! bucket counted from them can hold values above its bound. These are
//! counted as each value is recorded, so every bucket is exact.

/// Bucket upper bounds (inclusive) in the unit values are recorded in,
/// increasing, and how many of that unit make one of the exposed unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub upper: &'static [u64],
    pub per_exposed: u64,
}

/// Durations recorded in microseconds, exposed in seconds: 10 µs to 10 s.
pub const SECONDS_FROM_US: Bounds = Bounds {
    upper: &[
        10, 100, 500, 1_000, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000,
        2_500_000, 5_000_000, 10_000_000,
    ],
    per_exposed: 1_000_000,
};

/// Items per commit: powers of four up to the largest MaxBatchSize.
pub const ITEMS: Bounds = Bounds {
    upper: &[1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576],
    per_exposed: 1,
};

#[derive(Debug, Clone)]
pub struct Buckets {
    bounds: Bounds,
    /// `counts[i]`: values above `upper[i - 1]` and at most `upper[i]`;
    /// the last one, values above every bound.
    counts: Vec<u64>,
    /// Of every recorded value, in the recorded unit (saturating).
    sum: u64,
}

impl Buckets {
    pub fn new(bounds: Bounds) -> Self {
        debug_assert!(bounds.upper.windows(2).all(|w| w[0] < w[1]));
        debug_assert!(bounds.per_exposed > 0);
        Buckets {
            bounds,
            counts: vec![0; bounds.upper.len() + 1],
            sum: 0,
        }
    }

    pub fn record(&mut self, value: u64) {
        // At most upper.len(), and counts has one more slot than bounds:
        // always in range.
        let slot = self.bounds.upper.partition_point(|&b| b < value);
        self.counts[slot] += 1;
        self.sum = self.sum.saturating_add(value);
    }

    /// Values recorded.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Their sum, in the exposed unit.
    pub fn sum(&self) -> f64 {
        self.sum as f64 / self.bounds.per_exposed as f64
    }

    /// Each bound in the exposed unit with the number of values at most
    /// that bound, in increasing order.
    pub fn cumulative(&self) -> impl Iterator<Item = (f64, u64)> + '_ {
        // A quotient by the exact power of ten is the double nearest the
        // decimal bound (10 µs prints as 0.00001, where 10 * 1e-6 would not).
        let per = self.bounds.per_exposed as f64;
        self.bounds
            .upper
            .iter()
            .zip(&self.counts)
            .scan(0u64, move |below, (&bound, &n)| {
                *below += n;
                Some((bound as f64 / per, *below))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_bucket_counts_exactly_what_is_at_most_its_bound() {
        let mut items = Buckets::new(ITEMS);
        for n in [1, 2, 255, 256, 256, 257, 1024, 1025, 2_000_000] {
            items.record(n);
        }
        let cumulative: Vec<(f64, u64)> = items.cumulative().collect();
        assert_eq!(cumulative[0], (1.0, 1));
        assert_eq!(cumulative[1], (4.0, 2));
        assert_eq!(cumulative[4], (256.0, 5), "257 is not at most 256");
        assert_eq!(cumulative[5], (1024.0, 7));
        assert_eq!(cumulative[6], (4096.0, 8));
        assert_eq!(cumulative.last(), Some(&(1048576.0, 8)));
        assert_eq!(items.count(), 9, "one above every bound");
        assert_eq!(items.sum(), 2_003_076.0);
    }

    #[test]
    fn seconds_bounds_are_the_decimal_ones() {
        let mut s = Buckets::new(SECONDS_FROM_US);
        s.record(10);
        s.record(11);
        s.record(1_500_000);
        let bounds: Vec<String> = s.cumulative().map(|(b, _)| b.to_string()).collect();
        assert_eq!(bounds[..4], ["0.00001", "0.0001", "0.0005", "0.001"]);
        assert_eq!(bounds.last().map(String::as_str), Some("10"));
        let counts: Vec<u64> = s.cumulative().map(|(_, n)| n).collect();
        assert_eq!(counts[..2], [1, 2]);
        assert_eq!(counts[11..], [2, 3, 3, 3]);
        assert_eq!(s.sum(), 1.500021);
    }
}
