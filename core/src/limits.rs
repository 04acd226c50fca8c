//! Process-wide limits shared by worker cores: counted slots with RAII
//! guards (open connections, handshakes in progress), a log throttle for
//! conditions that can repeat thousands of times a second, and the
//! open-file limit that sizes the connection cap.

use std::{
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Arc, OnceLock,
    },
    time::{Duration, Instant},
};

/// A count of things held at once, bounded at acquire time. Cheap to clone;
/// every clone shares the count.
#[derive(Debug, Clone, Default)]
pub struct Slots {
    held: Arc<AtomicUsize>,
}

/// One held slot; dropping it frees the slot.
#[derive(Debug)]
pub struct SlotGuard {
    held: Arc<AtomicUsize>,
}

impl Slots {
    /// An empty count.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes a slot unless `limit` are already held.
    pub fn try_acquire(&self, limit: usize) -> Option<SlotGuard> {
        let mut cur = self.held.load(Ordering::Relaxed);
        loop {
            if cur >= limit {
                return None;
            }
            match self.held.compare_exchange_weak(cur, cur + 1, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return Some(SlotGuard { held: self.held.clone() }),
                Err(now) => cur = now,
            }
        }
    }

    /// Takes a slot whatever is held (for something already counted
    /// elsewhere, moving under this count).
    pub fn acquire(&self) -> SlotGuard {
        self.held.fetch_add(1, Ordering::AcqRel);
        SlotGuard { held: self.held.clone() }
    }

    /// Slots held now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        self.held.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Lets one log line through per interval and counts the ones held back,
/// so a flood (accept failures under descriptor exhaustion, a connection
/// limit, refused guesses) costs one line per interval, not one per event.
#[derive(Debug)]
pub struct LogThrottle {
    interval_ms: u64,
    /// Milliseconds since [`epoch`] before which nothing is logged.
    next_ms: AtomicU64,
    suppressed: AtomicU64,
}

impl LogThrottle {
    /// One line per `interval`.
    pub const fn new(interval: Duration) -> Self {
        Self { interval_ms: interval.as_millis() as u64, next_ms: AtomicU64::new(0), suppressed: AtomicU64::new(0) }
    }

    /// `Some(held back since the last line)` when a line may be logged now;
    /// `None` (and the event counted) otherwise.
    pub fn allow(&self) -> Option<u64> {
        let now = epoch().elapsed().as_millis() as u64;
        let next = self.next_ms.load(Ordering::Acquire);
        if now >= next
            && self.next_ms.compare_exchange(next, now + self.interval_ms, Ordering::AcqRel, Ordering::Relaxed).is_ok()
        {
            return Some(self.suppressed.swap(0, Ordering::AcqRel));
        }
        self.suppressed.fetch_add(1, Ordering::Relaxed);
        None
    }
}

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Raises the soft open-file limit to the hard one (as Go's runtime does)
/// and returns the soft limit in force afterwards.
pub fn raise_open_file_limit() -> u64 {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let limit = getrlimit(Resource::Nofile);
    let current = limit.current.unwrap_or(u64::MAX);
    if let Some(max) = limit.maximum.filter(|&max| max > current) {
        if setrlimit(Resource::Nofile, Rlimit { current: Some(max), maximum: Some(max) }).is_ok() {
            return max;
        }
    }
    current
}

/// Default cap on client connections for an open-file limit: 7/8 of it,
/// leaving the rest for node links, upstream connections and files, so the
/// cap is reached before descriptors run out.
pub fn default_max_connections(open_file_limit: u64) -> usize {
    let usable = open_file_limit.saturating_sub(open_file_limit / 8).clamp(1, 10_000_000);
    usize::try_from(usable).unwrap_or(10_000_000)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn slots_bound_and_release() {
        let slots = Slots::new();
        let a = slots.try_acquire(2).unwrap();
        let b = slots.clone().try_acquire(2).unwrap();
        assert!(slots.try_acquire(2).is_none());
        assert_eq!(slots.held(), 2);
        drop(a);
        let c = slots.try_acquire(2).unwrap();
        drop((b, c));
        assert_eq!(slots.held(), 0);
    }

    #[test]
    fn slots_hold_under_contention() {
        let slots = Slots::new();
        let peak = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (slots, peak) = (slots.clone(), peak.clone());
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        if let Some(g) = slots.try_acquire(3) {
                            peak.fetch_max(slots.held(), Ordering::Relaxed);
                            drop(g);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert!(peak.load(Ordering::Relaxed) <= 3);
        assert_eq!(slots.held(), 0);
    }

    #[test]
    fn throttle_lets_one_line_per_interval() {
        let t = LogThrottle::new(Duration::from_secs(3600));
        assert_eq!(t.allow(), Some(0));
        for _ in 0..1000 {
            assert_eq!(t.allow(), None);
        }
        let zero = LogThrottle::new(Duration::ZERO);
        assert_eq!(zero.allow(), Some(0));
        assert_eq!(zero.allow(), Some(0));
    }

    #[test]
    fn default_connection_cap_leaves_headroom() {
        assert_eq!(default_max_connections(1024), 896);
        assert_eq!(default_max_connections(300), 263);
        assert_eq!(default_max_connections(0), 1);
        assert!(raise_open_file_limit() >= 1);
    }
}
