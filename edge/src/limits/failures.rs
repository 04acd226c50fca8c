//! A per-address limit on failed credential checks (node tokens at
//! registration, the admin token), so secrets cannot be guessed at line
//! rate. Each address has a token bucket of failures; while it is empty,
//! every attempt from that address is refused before any credential is
//! compared. The table is bounded: when full, the address idle longest is
//! forgotten. Only credential checks touch it (a cold path), never
//! registered nodes or `/v1` traffic with a valid key (an API key is
//! checked against it only once it failed).

use std::{
    collections::HashMap,
    net::IpAddr,
    time::{Duration, Instant},
};

use parking_lot::Mutex;

/// Failures an address may make in a burst.
pub const BURST: f64 = 10.0;
/// Failures an address earns back per second.
pub const REFILL_PER_SEC: f64 = 0.2;
/// Addresses tracked at once.
pub const CAPACITY: usize = 4096;

/// IPv4 addresses count alone; IPv6 ones by /64, the usual allocation to one
/// host or site (an attacker owns the whole prefix).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Key {
    V4(u32),
    V6Prefix(u64),
}

impl From<IpAddr> for Key {
    fn from(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => Key::V4(u32::from(v4)),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Key::V4(u32::from(v4)),
                None => Key::V6Prefix((u128::from(v6) >> 64) as u64),
            },
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    updated: Instant,
}

impl Bucket {
    fn refilled(self, now: Instant, rate: f64, burst: f64) -> f64 {
        (self.tokens + now.saturating_duration_since(self.updated).as_secs_f64() * rate).min(burst)
    }
}

/// The limiter; shared by every core (a cold-path lock).
#[derive(Debug)]
pub struct FailureLimiter {
    table: Mutex<HashMap<Key, Bucket>>,
    burst: f64,
    rate: f64,
    capacity: usize,
}

impl Default for FailureLimiter {
    fn default() -> Self {
        Self::new(BURST, REFILL_PER_SEC, CAPACITY)
    }
}

impl FailureLimiter {
    /// `burst` failures at once, `rate` per second after that, at most
    /// `capacity` addresses tracked.
    pub fn new(burst: f64, rate: f64, capacity: usize) -> Self {
        Self {
            table: Mutex::new(HashMap::new()),
            burst: burst.max(1.0),
            rate: rate.max(1e-6),
            capacity: capacity.max(1),
        }
    }

    /// `Err(retry_after)` while `peer` has no failures left.
    pub fn check(&self, peer: IpAddr) -> Result<(), Duration> {
        self.check_at(peer, Instant::now())
    }

    /// Counts one failed credential check from `peer`.
    pub fn record_failure(&self, peer: IpAddr) {
        self.record_failure_at(peer, Instant::now());
    }

    /// Addresses tracked now.
    pub fn tracked(&self) -> usize {
        self.table.lock().len()
    }

    fn check_at(&self, peer: IpAddr, now: Instant) -> Result<(), Duration> {
        let table = self.table.lock();
        let Some(bucket) = table.get(&Key::from(peer)) else { return Ok(()) };
        let tokens = bucket.refilled(now, self.rate, self.burst);
        if tokens >= 1.0 {
            Ok(())
        } else {
            Err(Duration::from_secs_f64(((1.0 - tokens) / self.rate).max(0.001)))
        }
    }

    fn record_failure_at(&self, peer: IpAddr, now: Instant) {
        let key = Key::from(peer);
        let mut table = self.table.lock();
        if !table.contains_key(&key) && table.len() >= self.capacity {
            // Forget addresses that have earned everything back, then, if
            // still full, the one idle longest.
            let (rate, burst) = (self.rate, self.burst);
            table.retain(|_, b| b.refilled(now, rate, burst) < burst);
            if table.len() >= self.capacity {
                if let Some(oldest) = table.iter().min_by_key(|(_, b)| b.updated).map(|(k, _)| *k) {
                    table.remove(&oldest);
                }
            }
        }
        let bucket = table.entry(key).or_insert(Bucket { tokens: self.burst, updated: now });
        let tokens = bucket.refilled(now, self.rate, self.burst);
        *bucket = Bucket { tokens: (tokens - 1.0).max(0.0), updated: now };
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn burst_then_refused_then_refilled() {
        let l = FailureLimiter::new(3.0, 1.0, 16);
        let t0 = Instant::now();
        for _ in 0..3 {
            assert!(l.check_at(ip("10.0.0.1"), t0).is_ok());
            l.record_failure_at(ip("10.0.0.1"), t0);
        }
        let wait = l.check_at(ip("10.0.0.1"), t0).unwrap_err();
        assert!(wait > Duration::from_millis(900) && wait <= Duration::from_secs(1), "{wait:?}");
        // Another address is not affected.
        assert!(l.check_at(ip("10.0.0.2"), t0).is_ok());
        // One failure earned back per second.
        assert!(l.check_at(ip("10.0.0.1"), t0 + Duration::from_millis(1001)).is_ok());
        l.record_failure_at(ip("10.0.0.1"), t0 + Duration::from_millis(1001));
        assert!(l.check_at(ip("10.0.0.1"), t0 + Duration::from_millis(1002)).is_err());
    }

    #[test]
    fn ipv6_counts_by_prefix_and_mapped_v4_as_v4() {
        let l = FailureLimiter::new(1.0, 0.001, 16);
        let t0 = Instant::now();
        l.record_failure_at(ip("2001:db8:1:2::1"), t0);
        assert!(l.check_at(ip("2001:db8:1:2::ffff"), t0).is_err(), "same /64");
        assert!(l.check_at(ip("2001:db8:1:3::1"), t0).is_ok(), "other /64");
        l.record_failure_at(ip("::ffff:192.0.2.7"), t0);
        assert!(l.check_at(ip("192.0.2.7"), t0).is_err());
    }

    #[test]
    fn table_is_bounded() {
        let l = FailureLimiter::new(2.0, 0.001, 8);
        let t0 = Instant::now();
        for i in 0..1000u32 {
            let peer = IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i));
            l.record_failure_at(peer, t0 + Duration::from_millis(u64::from(i)));
            assert!(l.tracked() <= 8);
        }
        // The most recent offenders are still tracked.
        l.record_failure_at(IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + 999)), t0 + Duration::from_secs(2));
        assert!(l
            .check_at(IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + 999)), t0 + Duration::from_secs(2))
            .is_err());
    }
}
