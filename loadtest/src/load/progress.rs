//! The progress line of a run on a terminal: the workers count into shared
//! atomics ([`Live`]; a few relaxed adds per request, never a lock), and the
//! main thread, which only waits for the workers anyway, reads them about
//! once a second and rewrites one line of stderr with `\r`.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use super::args::Bounds;

/// How often the line is rewritten.
pub const TICK: Duration = Duration::from_secs(1);
/// Exact buckets below this many µs; above, [`SUB_BUCKETS`] per power of two.
const LINEAR: u64 = 16;
/// Buckets per power of two above [`LINEAR`] (12.5 % wide at most).
const SUB_BUCKETS: u64 = 8;
/// Powers of two covered: up to 2^42 µs (about 51 days).
const TOP_BIT: u64 = 42;
/// Latency buckets of [`Live`].
const BUCKETS: usize = (LINEAR + (TOP_BIT - 3) * SUB_BUCKETS) as usize;

/// Counters the workers share with the progress line.
#[derive(Debug)]
pub struct Live {
    completed: AtomicU64,
    errors: AtomicU64,
    /// Latency (TTFT for streams, the whole request otherwise) in log buckets of µs.
    latency: Box<[AtomicU64]>,
}

impl Default for Live {
    fn default() -> Self {
        Self::new()
    }
}

/// The bucket of `us` µs.
fn bucket(us: u64) -> usize {
    if us < LINEAR {
        return us as usize;
    }
    let bit = u64::from(63 - us.leading_zeros()).min(TOP_BIT);
    let sub = if bit >= TOP_BIT { SUB_BUCKETS - 1 } else { (us >> (bit - 3)) & (SUB_BUCKETS - 1) };
    ((LINEAR + (bit - 4) * SUB_BUCKETS + sub) as usize).min(BUCKETS - 1)
}

/// The middle of bucket `i`, µs.
fn bucket_value(i: usize) -> u64 {
    let i = i as u64;
    if i < LINEAR {
        return i;
    }
    let (bit, sub) = (4 + (i - LINEAR) / SUB_BUCKETS, (i - LINEAR) % SUB_BUCKETS);
    let low = (SUB_BUCKETS + sub) << (bit - 3);
    low + (1 << (bit - 3)) / 2
}

impl Live {
    /// All zero.
    pub fn new() -> Self {
        Self {
            completed: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            latency: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Counts a valid response whose latency (TTFT or total) took `latency`.
    pub fn ok(&self, latency: Duration) {
        self.completed.fetch_add(1, Ordering::Relaxed);
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        if let Some(b) = self.latency.get(bucket(us)) {
            b.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts a failed request.
    pub fn error(&self) {
        self.errors.fetch_add(1, Ordering::Relaxed);
    }

    fn snapshot(&self) -> Snapshot {
        Snapshot {
            completed: self.completed.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            latency: self.latency.iter().map(|b| b.load(Ordering::Relaxed)).collect(),
        }
    }
}

/// The counters at one instant.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Snapshot {
    completed: u64,
    errors: u64,
    latency: Vec<u64>,
}

/// The median of the latencies counted between `before` and `now`, µs.
fn median_between(before: &[u64], now: &[u64]) -> Option<u64> {
    let delta: Vec<u64> =
        now.iter().enumerate().map(|(i, n)| n - before.get(i).copied().unwrap_or(0).min(*n)).collect();
    let total: u64 = delta.iter().sum();
    if total == 0 {
        return None;
    }
    let mut seen = 0;
    for (i, n) in delta.iter().enumerate() {
        seen += n;
        if seen * 2 >= total {
            return Some(bucket_value(i));
        }
    }
    None
}

/// What one line shows.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    /// Since the start.
    pub elapsed: Duration,
    /// The run's bounds.
    pub bounds: Bounds,
    /// Requests completed so far.
    pub completed: u64,
    /// Requests failed so far.
    pub errors: u64,
    /// Completions per second over the last interval.
    pub rate: f64,
    /// Median latency over the last interval, µs.
    pub median_us: Option<u64>,
    /// `ttft` (streams) or `latency`.
    pub what: &'static str,
}

impl Line {
    /// `  12s/60s  1234 ok  0 errors  512.3 req/s  ttft p50 12.3 ms`.
    pub fn render(&self) -> String {
        let secs = self.elapsed.as_secs();
        let time = match self.bounds.duration {
            Some(d) => format!("{secs}s/{}s", d.as_secs()),
            None => format!("{secs}s"),
        };
        let done = match self.bounds.requests {
            Some(n) => format!("{}/{n} ok", self.completed),
            None => format!("{} ok", self.completed),
        };
        let median = match self.median_us {
            Some(us) => format!("{:.1} ms", us as f64 / 1000.0),
            None => "-".to_owned(),
        };
        format!("{time}  {done}  {} errors  {:.1} req/s  {} p50 {median}", self.errors, self.rate, self.what)
    }
}

/// Rewrites the progress line on `out` every [`TICK`] until `done` is
/// disconnected (every worker has returned), then erases it.
pub fn show(live: &Live, done: &Receiver<()>, start: Instant, bounds: Bounds, what: &'static str, out: &mut dyn Write) {
    let mut last = (start, live.snapshot());
    let mut next = start + TICK;
    loop {
        match done.recv_timeout(next.saturating_duration_since(Instant::now())) {
            Err(RecvTimeoutError::Disconnected) => break,
            Ok(()) => continue,
            Err(RecvTimeoutError::Timeout) => {}
        }
        let now = Instant::now();
        let snap = live.snapshot();
        let secs = now.duration_since(last.0).as_secs_f64();
        let line = Line {
            elapsed: now.duration_since(start),
            bounds,
            completed: snap.completed,
            errors: snap.errors,
            rate: if secs > 0.0 { snap.completed.saturating_sub(last.1.completed) as f64 / secs } else { 0.0 },
            median_us: median_between(&last.1.latency, &snap.latency),
            what,
        };
        // `\r` back to the start, `ESC[K` clears what a longer line left.
        let _ = write!(out, "\r{}\x1b[K", line.render());
        let _ = out.flush();
        last = (now, snap);
        next += TICK;
        if next < now {
            next = now + TICK;
        }
    }
    let _ = write!(out, "\r\x1b[K");
    let _ = out.flush();
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_ordered_and_close() {
        let mut prev = 0;
        for us in (0..100_000u64).chain([1 << 30, 1 << 41, u64::MAX]) {
            let b = bucket(us);
            assert!(b >= prev && b < BUCKETS, "{us} -> {b}");
            prev = b;
            if (1..1 << 41).contains(&us) {
                let mid = bucket_value(b) as f64;
                assert!((mid - us as f64).abs() / us as f64 <= 0.07, "{us} -> {b} ({mid})");
            }
        }
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn median_of_the_interval_only() {
        let live = Live::new();
        for ms in [1, 2, 3] {
            live.ok(Duration::from_millis(ms));
        }
        live.error();
        let before = live.snapshot();
        assert_eq!(before.completed, 3);
        let m = median_between(&[], &before.latency).unwrap();
        assert!((1900..=2100).contains(&m), "{m}");
        for _ in 0..5 {
            live.ok(Duration::from_millis(40));
        }
        let m = median_between(&before.latency, &live.snapshot().latency).unwrap();
        assert!((38_000..=42_000).contains(&m), "{m}");
        assert_eq!(median_between(&before.latency, &before.latency), None);
    }

    #[test]
    fn renders_and_clears() {
        let line = Line {
            elapsed: Duration::from_millis(12_400),
            bounds: Bounds { requests: None, duration: Some(Duration::from_secs(60)) },
            completed: 1234,
            errors: 0,
            rate: 512.34,
            median_us: Some(12_345),
            what: "ttft",
        };
        assert_eq!(line.render(), "12s/60s  1234 ok  0 errors  512.3 req/s  ttft p50 12.3 ms");
        let line = Line { bounds: Bounds { requests: Some(2000), duration: None }, median_us: None, ..line };
        assert_eq!(line.render(), "12s  1234/2000 ok  0 errors  512.3 req/s  ttft p50 -");

        // Every worker gone before the first tick: only the erasure.
        let (tx, rx) = std::sync::mpsc::sync_channel::<()>(1);
        drop(tx);
        let mut out = Vec::new();
        show(&Live::new(), &rx, Instant::now(), line.bounds, "ttft", &mut out);
        assert_eq!(out, b"\r\x1b[K");
    }
}
