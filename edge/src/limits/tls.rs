//! Per-address limits on TLS handshakes, one table per listener: each
//! handshake costs the edge about a millisecond of CPU before the peer has
//! shown anything, so an address may start `handshakes_per_sec_per_address`
//! a second (in bursts of as many) and hold `max_handshakes_per_address` at
//! once. A connection over either limit is closed at accept, before any
//! TLS work. The table is bounded: an address with a handshake in progress
//! is never forgotten; when every entry has one, newcomers are refused.

use std::{collections::HashMap, net::IpAddr, sync::Arc, time::Instant};

use iop_core::config::TlsHandshakeLimits;
use parking_lot::Mutex;

use super::AddrKey;

/// Addresses tracked at once per listener.
pub const CAPACITY: usize = 16_384;

/// Why a TLS handshake was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsRefusal {
    /// The address started too many handshakes lately.
    Rate,
    /// The address has too many handshakes in progress.
    Concurrency,
    /// Every tracked address has a handshake in progress.
    TableFull,
}

impl TlsRefusal {
    /// Metric label.
    pub fn label(self) -> &'static str {
        match self {
            TlsRefusal::Rate => "tls_rate",
            TlsRefusal::Concurrency => "tls_concurrency",
            TlsRefusal::TableFull => "tls_table_full",
        }
    }

    /// The config key of the limit (for the log line).
    pub fn key(self) -> &'static str {
        match self {
            TlsRefusal::Rate => "handshakes_per_sec_per_address",
            TlsRefusal::Concurrency | TlsRefusal::TableFull => "max_handshakes_per_address",
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    tokens: f64,
    updated: Instant,
    live: u32,
}

impl Entry {
    fn refilled(&self, now: Instant, rate: f64) -> f64 {
        (self.tokens + now.saturating_duration_since(self.updated).as_secs_f64() * rate).min(rate)
    }
}

/// One listener's table; shared by every core (a lock taken at accept).
#[derive(Debug)]
pub struct TlsLimiter {
    table: Mutex<HashMap<AddrKey, Entry>>,
    capacity: usize,
}

impl Default for TlsLimiter {
    fn default() -> Self {
        Self { table: Mutex::default(), capacity: CAPACITY }
    }
}

impl TlsLimiter {
    /// An empty table tracking at most `capacity` addresses.
    pub fn with_capacity(capacity: usize) -> Arc<Self> {
        Arc::new(Self { table: Mutex::default(), capacity: capacity.max(1) })
    }

    /// A ticket for one handshake from `peer`, held until it is done.
    pub fn admit(self: &Arc<Self>, peer: IpAddr, limits: TlsHandshakeLimits) -> Result<TlsTicket, TlsRefusal> {
        self.admit_at(peer, limits, Instant::now())
    }

    /// Addresses tracked now.
    pub fn tracked(&self) -> usize {
        self.table.lock().len()
    }

    fn admit_at(
        self: &Arc<Self>,
        peer: IpAddr,
        limits: TlsHandshakeLimits,
        now: Instant,
    ) -> Result<TlsTicket, TlsRefusal> {
        let key = AddrKey::of(peer);
        // The bucket holds one second's worth.
        let rate = f64::from(limits.per_sec.max(1));
        let mut table = self.table.lock();
        if !table.contains_key(&key) {
            if table.len() >= self.capacity && !self.make_room(&mut table, rate, now) {
                return Err(TlsRefusal::TableFull);
            }
            table.insert(key, Entry { tokens: rate, updated: now, live: 0 });
        }
        let Some(entry) = table.get_mut(&key) else { return Err(TlsRefusal::TableFull) };
        // A refused attempt spends nothing.
        if entry.live >= limits.concurrent.max(1) {
            return Err(TlsRefusal::Concurrency);
        }
        let tokens = entry.refilled(now, rate);
        if tokens < 1.0 {
            return Err(TlsRefusal::Rate);
        }
        *entry = Entry { tokens: tokens - 1.0, updated: now, live: entry.live + 1 };
        Ok(TlsTicket { limiter: self.clone(), key })
    }

    /// Frees entries: idle ones that earned everything back, and if that is
    /// not an eighth of the table, the idle ones with the most handshakes
    /// left until it is (so a stream of new addresses pays one scan per
    /// eighth of the table, not one per address). Never one with a
    /// handshake in progress (its ticket would give back what a newcomer
    /// counts). False when nothing could be freed.
    fn make_room(&self, table: &mut HashMap<AddrKey, Entry>, rate: f64, now: Instant) -> bool {
        table.retain(|_, e| e.live > 0 || e.refilled(now, rate) < rate);
        let target = self.capacity - (self.capacity / 8).max(1);
        if table.len() > target {
            let mut idle: Vec<(f64, AddrKey)> =
                table.iter().filter(|(_, e)| e.live == 0).map(|(k, e)| (e.refilled(now, rate), *k)).collect();
            let n = (table.len() - target).min(idle.len());
            if n > 0 && n < idle.len() {
                // The n with the most tokens left first.
                idle.select_nth_unstable_by(n - 1, |a, b| b.0.total_cmp(&a.0));
            }
            for (_, k) in idle.iter().take(n) {
                table.remove(k);
            }
        }
        table.len() < self.capacity
    }
}

/// One TLS handshake in progress; dropping it ends it.
#[derive(Debug)]
pub struct TlsTicket {
    limiter: Arc<TlsLimiter>,
    key: AddrKey,
}

impl Drop for TlsTicket {
    fn drop(&mut self) {
        if let Some(e) = self.limiter.table.lock().get_mut(&self.key) {
            e.live = e.live.saturating_sub(1);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn rate_per_address_with_a_burst_of_one_second() {
        let l = TlsLimiter::with_capacity(16);
        let limits = TlsHandshakeLimits { concurrent: 100, per_sec: 4 };
        let t0 = Instant::now();
        let tickets: Vec<_> = (0..4).map(|_| l.admit_at(ip("10.0.0.1"), limits, t0).unwrap()).collect();
        assert_eq!(l.admit_at(ip("10.0.0.1"), limits, t0).unwrap_err(), TlsRefusal::Rate);
        assert!(l.admit_at(ip("10.0.0.2"), limits, t0).is_ok(), "another address");
        drop(tickets);
        // Finished handshakes give back no rate; time does.
        assert_eq!(l.admit_at(ip("10.0.0.1"), limits, t0).unwrap_err(), TlsRefusal::Rate);
        let later = t0 + Duration::from_millis(260);
        assert!(l.admit_at(ip("10.0.0.1"), limits, later).is_ok());
        assert_eq!(l.admit_at(ip("10.0.0.1"), limits, later).unwrap_err(), TlsRefusal::Rate);
    }

    #[test]
    fn concurrency_per_address_and_refusals_spend_nothing() {
        let l = TlsLimiter::with_capacity(16);
        let limits = TlsHandshakeLimits { concurrent: 2, per_sec: 3 };
        let t0 = Instant::now();
        let a = l.admit_at(ip("10.0.0.1"), limits, t0).unwrap();
        let _b = l.admit_at(ip("10.0.0.1"), limits, t0).unwrap();
        for _ in 0..10 {
            assert_eq!(l.admit_at(ip("10.0.0.1"), limits, t0).unwrap_err(), TlsRefusal::Concurrency);
        }
        drop(a);
        // The concurrency refusals above spent none of the third token.
        assert!(l.admit_at(ip("10.0.0.1"), limits, t0).is_ok());
    }

    #[test]
    fn the_table_is_bounded_and_keeps_addresses_in_a_handshake() {
        let l = TlsLimiter::with_capacity(4);
        let limits = TlsHandshakeLimits { concurrent: 1, per_sec: 1 };
        let t0 = Instant::now();
        let live: Vec<_> = (1..=3).map(|i| l.admit_at(ip(&format!("10.0.0.{i}")), limits, t0).unwrap()).collect();
        for i in 10..100 {
            drop(l.admit_at(ip(&format!("10.0.1.{i}")), limits, t0).unwrap());
            assert!(l.tracked() <= 4);
        }
        // The addresses with a handshake in progress were never forgotten.
        for i in 1..=3 {
            assert_eq!(l.admit_at(ip(&format!("10.0.0.{i}")), limits, t0).unwrap_err(), TlsRefusal::Concurrency);
        }
        let fourth = l.admit_at(ip("10.0.2.1"), limits, t0).unwrap();
        assert_eq!(l.admit_at(ip("10.0.2.2"), limits, t0).unwrap_err(), TlsRefusal::TableFull);
        drop((live, fourth));
        assert!(l.admit_at(ip("10.0.2.2"), limits, t0).is_ok());
    }
}
