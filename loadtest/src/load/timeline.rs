//! Completions, errors and tokens per time bucket since the start of the
//! run: the "throughput over time" of the HTML report.
//!
//! Memory is bounded whatever the run's length: buckets start at one second
//! and, once [`MAX_BUCKETS`] would be passed, pairs of them merge (the width
//! doubles), so a run of any length keeps at most that many.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Most buckets kept (17 minutes at one second each).
pub const MAX_BUCKETS: usize = 1024;
/// Widest bucket: beyond it, later events count in the last bucket.
const MAX_BUCKET_SEC: u64 = 1 << 32;

/// Events per bucket of `bucket_sec` seconds, bucket `i` covering
/// `[i × bucket_sec, (i + 1) × bucket_sec)` after the start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timeline {
    /// Width of one bucket in seconds: a power of two.
    pub bucket_sec: u64,
    /// Valid responses completed in each bucket.
    pub completed: Vec<u64>,
    /// Requests failed in each bucket.
    pub errors: Vec<u64>,
    /// Tokens of the responses completed in each bucket.
    pub tokens: Vec<u64>,
}

impl Default for Timeline {
    fn default() -> Self {
        Self::new()
    }
}

/// One bucket as rates, for plotting.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    /// Middle of the bucket (of its measured part, for the last one), seconds.
    pub at_sec: f64,
    /// Completed requests per second.
    pub completed: f64,
    /// Failed requests per second.
    pub errors: f64,
    /// Tokens per second.
    pub tokens: f64,
}

impl Timeline {
    /// Empty, one-second buckets.
    pub fn new() -> Self {
        Self { bucket_sec: 1, completed: Vec::new(), errors: Vec::new(), tokens: Vec::new() }
    }

    /// Counts a valid response of `tokens` tokens completed `at` after the start.
    pub fn ok(&mut self, at: Duration, tokens: u64) {
        let i = self.slot(at);
        self.completed[i] += 1;
        self.tokens[i] += tokens;
    }

    /// Counts a failed request ended `at` after the start.
    pub fn error(&mut self, at: Duration) {
        let i = self.slot(at);
        self.errors[i] += 1;
    }

    /// The bucket of `at`, made to exist (coarsening when needed).
    fn slot(&mut self, at: Duration) -> usize {
        let secs = at.as_secs();
        while secs / self.bucket_sec >= MAX_BUCKETS as u64 && self.bucket_sec < MAX_BUCKET_SEC {
            self.coarsen();
        }
        let i = usize::try_from(secs / self.bucket_sec).map_or(MAX_BUCKETS - 1, |i| i.min(MAX_BUCKETS - 1));
        if self.completed.len() <= i {
            self.completed.resize(i + 1, 0);
            self.errors.resize(i + 1, 0);
            self.tokens.resize(i + 1, 0);
        }
        i
    }

    /// Doubles the bucket width, merging pairs of buckets.
    fn coarsen(&mut self) {
        self.bucket_sec *= 2;
        for v in [&mut self.completed, &mut self.errors, &mut self.tokens] {
            *v = v.chunks(2).map(|pair| pair.iter().sum()).collect();
        }
    }

    /// Adds another timeline (of the same start) to this one; the result has
    /// the wider of the two bucket widths.
    pub fn merge(&mut self, other: &Timeline) {
        let mut other = other.clone();
        while self.bucket_sec < other.bucket_sec {
            self.coarsen();
        }
        while other.bucket_sec < self.bucket_sec {
            other.coarsen();
        }
        let len = self.completed.len().max(other.completed.len());
        for (mine, theirs) in [
            (&mut self.completed, &other.completed),
            (&mut self.errors, &other.errors),
            (&mut self.tokens, &other.tokens),
        ] {
            mine.resize(len, 0);
            for (m, t) in mine.iter_mut().zip(theirs) {
                *m += t;
            }
        }
    }

    /// Checks a timeline read from a file: a power-of-two width, three
    /// series of the same length, at most [`MAX_BUCKETS`] long.
    pub fn validate(&self) -> Result<(), String> {
        if !self.bucket_sec.is_power_of_two() || self.bucket_sec > MAX_BUCKET_SEC {
            return Err(format!("timeline.bucket_sec {} is not a power of two up to 2^32", self.bucket_sec));
        }
        let len = self.completed.len();
        if self.errors.len() != len || self.tokens.len() != len {
            return Err("timeline: completed, errors and tokens differ in length".into());
        }
        if len > MAX_BUCKETS {
            return Err(format!("timeline: {len} buckets, at most {MAX_BUCKETS}"));
        }
        Ok(())
    }

    /// Per-second rates of every bucket, for a run of `elapsed_sec` seconds:
    /// the last bucket's rate is over its measured part only, and it is left
    /// out when that part is under half a bucket (its few events would read as
    /// a spike or a dip).
    pub fn rates(&self, elapsed_sec: f64) -> Vec<Rate> {
        let width = self.bucket_sec as f64;
        let mut out = Vec::with_capacity(self.completed.len());
        for (i, ((&c, &e), &t)) in self.completed.iter().zip(&self.errors).zip(&self.tokens).enumerate() {
            let from = i as f64 * width;
            let measured = (elapsed_sec - from).clamp(0.0, width);
            let last = i + 1 == self.completed.len();
            if measured <= 0.0 || (last && measured < width / 2.0 && i > 0) {
                continue;
            }
            out.push(Rate {
                at_sec: from + measured / 2.0,
                completed: c as f64 / measured,
                errors: e as f64 / measured,
                tokens: t as f64 / measured,
            });
        }
        out
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    #[test]
    fn counts_per_second() {
        let mut t = Timeline::new();
        t.ok(secs(0.2), 5);
        t.ok(secs(0.9), 5);
        t.error(secs(2.5));
        t.ok(secs(2.1), 1);
        assert_eq!(t.completed, [2, 0, 1]);
        assert_eq!(t.errors, [0, 0, 1]);
        assert_eq!(t.tokens, [10, 0, 1]);
        // 2.6 s: the last bucket measured 0.6 s, so its rate is over 0.6 s.
        let r = t.rates(2.6);
        assert_eq!(r.len(), 3);
        assert_eq!((r[0].at_sec, r[0].completed, r[0].tokens), (0.5, 2.0, 10.0));
        assert!((r[2].at_sec - 2.3).abs() < 1e-9 && (r[2].completed - 1.0 / 0.6).abs() < 1e-9, "{r:?}");
        // 2.2 s: the last 0.2 s are too short a bucket to plot.
        assert_eq!(t.rates(2.2).len(), 2);
        // A run shorter than one bucket still has its one point.
        let mut short = Timeline::new();
        short.ok(secs(0.1), 1);
        assert_eq!(short.rates(0.25), [Rate { at_sec: 0.125, completed: 4.0, errors: 0.0, tokens: 4.0 }]);
    }

    #[test]
    fn long_runs_coarsen_instead_of_growing() {
        let mut t = Timeline::new();
        for s in 0..(3 * MAX_BUCKETS as u64) {
            t.ok(Duration::from_secs(s), 1);
        }
        assert_eq!(t.bucket_sec, 4);
        assert!(t.completed.len() <= MAX_BUCKETS);
        assert_eq!(t.completed.iter().sum::<u64>(), 3 * MAX_BUCKETS as u64);
        assert_eq!(t.completed[0], 4);
        t.validate().unwrap();
        // Absurd instants land in the last bucket of the widest width.
        t.ok(Duration::from_secs(u64::MAX), 1);
        assert!(t.completed.len() <= MAX_BUCKETS && t.bucket_sec <= MAX_BUCKET_SEC);
    }

    #[test]
    fn merges_different_widths() {
        let mut a = Timeline::new();
        a.ok(secs(0.5), 1);
        a.ok(secs(1.5), 1);
        let mut b = Timeline::new();
        b.ok(Duration::from_secs(MAX_BUCKETS as u64 + 10), 2);
        b.error(secs(3.0));
        assert_eq!(b.bucket_sec, 2);
        a.merge(&b);
        assert_eq!(a.bucket_sec, 2);
        assert_eq!(&a.completed[..2], [2, 0]);
        assert_eq!(a.errors[1], 1);
        assert_eq!(a.completed.iter().sum::<u64>(), 3);
        assert_eq!(a.tokens.iter().sum::<u64>(), 4);
        a.validate().unwrap();
        let bad = Timeline { bucket_sec: 3, ..Timeline::new() };
        assert!(bad.validate().is_err());
        let bad = Timeline { completed: vec![1], ..Timeline::new() };
        assert!(bad.validate().is_err());
    }
}
