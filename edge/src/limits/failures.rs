//! Limits on failed credential checks per address, one table per kind of
//! credential ([`Credential`]): wrong admin tokens or API keys never count
//! against a node's registrations, nor the other way round. A right
//! credential is compared (in constant time) before any of these tables is
//! consulted and is never refused by them; only a wrong one is, once its
//! address spent its budget. So the tables bound what guessing costs (one
//! comparison and an answer, logs throttled) without ever locking out a
//! peer that holds the secret, and they may fail closed under pressure.
//! They do not make a right guess slower: credentials must be long and
//! random.
//!
//! Each address (an [`AddrKey`]) has a token bucket of failures. The table
//! is bounded and cannot be flushed by spraying addresses: when it is full,
//! entries that earned everything back go first; then the newcomer's
//! network (IPv4 /24, IPv6 /48) is merged into one entry carrying the
//! failures of all its addresses; then unlocked entries with the most
//! failures left to make go (a batch). A locked entry is never evicted: with
//! nothing else to evict, addresses the table does not know are refused
//! too until locked entries earn a failure back.

use std::{
    collections::HashMap,
    net::IpAddr,
    time::{Duration, Instant},
};

use parking_lot::Mutex;

use super::AddrKey;

/// Failures an address may make in a burst.
pub const BURST: f64 = 10.0;
/// Failures an address earns back per second.
pub const REFILL_PER_SEC: f64 = 0.2;
/// Entries (addresses or networks) tracked at once per kind of credential.
pub const CAPACITY: usize = 4096;

/// A kind of credential, each with its own failure table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Credential {
    /// A node token (and, in managed mode, the node's certificate).
    NodeRegistration,
    /// The admin token.
    Admin,
    /// A client API key.
    ApiKey,
}

impl Credential {
    /// Metric label.
    pub fn label(self) -> &'static str {
        match self {
            Credential::NodeRegistration => "node_registration",
            Credential::Admin => "admin",
            Credential::ApiKey => "api_key",
        }
    }
}

/// The failure tables of every kind of credential.
#[derive(Debug, Default)]
pub struct AuthLimits {
    node: FailureLimiter,
    admin: FailureLimiter,
    api_key: FailureLimiter,
}

impl AuthLimits {
    /// The table of `kind`.
    pub fn of(&self, kind: Credential) -> &FailureLimiter {
        match kind {
            Credential::NodeRegistration => &self.node,
            Credential::Admin => &self.admin,
            Credential::ApiKey => &self.api_key,
        }
    }

    /// After a wrong `kind` credential from `peer`: `Err(retry_after)` when
    /// its address is past its budget (nothing counted then), else the
    /// failure is counted. Metrics either way.
    pub fn failed(&self, kind: Credential, peer: IpAddr) -> Result<(), Duration> {
        let limiter = self.of(kind);
        match limiter.check(peer) {
            Err(wait) => {
                crate::metrics::auth_refused(kind.label());
                Err(wait)
            }
            Ok(()) => {
                limiter.record_failure(peer);
                crate::metrics::auth_failure(kind.label());
                Ok(())
            }
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

#[derive(Debug, Default)]
struct Table {
    entries: HashMap<AddrKey, Bucket>,
    /// Full of locked entries: until then, unknown addresses are refused.
    saturated_until: Option<Instant>,
}

/// One kind's table; shared by every core (a cold-path lock).
#[derive(Debug)]
pub struct FailureLimiter {
    table: Mutex<Table>,
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
    /// `capacity` entries tracked.
    pub fn new(burst: f64, rate: f64, capacity: usize) -> Self {
        Self { table: Mutex::default(), burst: burst.max(1.0), rate: rate.max(1e-6), capacity: capacity.max(1) }
    }

    /// `Err(retry_after)` while `peer` has no failures left.
    pub fn check(&self, peer: IpAddr) -> Result<(), Duration> {
        self.check_at(peer, Instant::now())
    }

    /// Counts one failed credential check from `peer`.
    pub fn record_failure(&self, peer: IpAddr) {
        self.record_failure_at(peer, Instant::now());
    }

    /// Entries tracked now.
    pub fn tracked(&self) -> usize {
        self.table.lock().entries.len()
    }

    fn wait_for(&self, tokens: f64) -> Duration {
        Duration::from_secs_f64(((1.0 - tokens) / self.rate).max(0.001))
    }

    fn check_at(&self, peer: IpAddr, now: Instant) -> Result<(), Duration> {
        let table = self.table.lock();
        let key = AddrKey::of(peer);
        let tokens = [Some(key), key.network()]
            .into_iter()
            .flatten()
            .filter_map(|k| table.entries.get(&k))
            .map(|b| b.refilled(now, self.rate, self.burst))
            .reduce(f64::min);
        match tokens {
            Some(t) if t >= 1.0 => Ok(()),
            Some(t) => Err(self.wait_for(t)),
            None => match table.saturated_until {
                Some(until) if until > now => Err(until - now),
                _ => Ok(()),
            },
        }
    }

    fn record_failure_at(&self, peer: IpAddr, now: Instant) {
        let key = AddrKey::of(peer);
        let mut table = self.table.lock();
        let mut charged = false;
        for k in [Some(key), key.network()].into_iter().flatten() {
            if let Some(b) = table.entries.get_mut(&k) {
                *b = self.spend(*b, 1.0, now);
                charged = true;
            }
        }
        if charged {
            return;
        }
        if table.entries.len() >= self.capacity {
            match self.make_room(&mut table, key, now) {
                Room::Address => {}
                Room::Merged(net) => {
                    if let Some(b) = table.entries.get_mut(&net) {
                        *b = self.spend(*b, 1.0, now);
                    }
                    return;
                }
                Room::None => {
                    // Locked entries earn a failure back in 1/rate: then
                    // they can be evicted and newcomers tracked again.
                    table.saturated_until = Some(now + self.wait_for(0.0));
                    return;
                }
            }
        }
        table.saturated_until = None;
        table.entries.insert(key, Bucket { tokens: self.burst - 1.0, updated: now });
    }

    fn spend(&self, b: Bucket, n: f64, now: Instant) -> Bucket {
        Bucket { tokens: (b.refilled(now, self.rate, self.burst) - n).max(0.0), updated: now }
    }

    /// Frees an entry for `key`, a newcomer, in a full table.
    fn make_room(&self, table: &mut Table, key: AddrKey, now: Instant) -> Room {
        let (rate, burst) = (self.rate, self.burst);
        // Entries that earned everything back hold nothing worth keeping.
        table.entries.retain(|_, b| b.refilled(now, rate, burst) < burst);
        if table.entries.len() < self.capacity {
            return Room::Address;
        }
        // The newcomer's network: its addresses become one entry carrying
        // all their failures (so spraying a network locks all of it).
        if let Some(net) = key.network() {
            let members: Vec<AddrKey> = table.entries.keys().filter(|k| k.network() == Some(net)).copied().collect();
            if !members.is_empty() {
                let spent: f64 = members
                    .iter()
                    .filter_map(|k| table.entries.remove(k))
                    .map(|b| burst - b.refilled(now, rate, burst))
                    .sum();
                table.entries.insert(net, Bucket { tokens: (burst - spent).max(0.0), updated: now });
                return Room::Merged(net);
            }
        }
        // Else unlocked entries, those with the most failures left to make
        // (the least suspect) first, a sixteenth of the table at once so a
        // stream of new addresses pays one scan per batch, each merged into
        // its network's entry when it has one so its failures still count.
        // Never a locked one.
        let mut unlocked: Vec<(f64, AddrKey)> = table
            .entries
            .iter()
            .map(|(k, b)| (b.refilled(now, rate, burst), *k))
            .filter(|(tokens, _)| *tokens >= 1.0)
            .collect();
        if unlocked.is_empty() {
            return Room::None;
        }
        let n = (self.capacity / 16).clamp(1, unlocked.len());
        if n < unlocked.len() {
            unlocked.select_nth_unstable_by(n - 1, |a, b| b.0.total_cmp(&a.0));
        }
        for (tokens, victim) in unlocked.into_iter().take(n) {
            table.entries.remove(&victim);
            if let Some(b) = victim.network().and_then(|net| table.entries.get_mut(&net)) {
                *b = self.spend(*b, burst - tokens, now);
            }
        }
        Room::Address
    }
}

/// What [`FailureLimiter::make_room`] made.
enum Room {
    /// Room for the newcomer's own entry.
    Address,
    /// The newcomer's network has an entry now: charge that.
    Merged(AddrKey),
    /// Every entry is locked.
    None,
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn v4(n: u32) -> IpAddr {
        IpAddr::from(Ipv4Addr::from(n))
    }

    fn lock(l: &FailureLimiter, peer: IpAddr, now: Instant) {
        while l.check_at(peer, now).is_ok() {
            l.record_failure_at(peer, now);
        }
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
            l.record_failure_at(v4(0x0a00_0000 + (i << 8)), t0 + Duration::from_millis(u64::from(i)));
            assert!(l.tracked() <= 8);
        }
    }

    #[test]
    fn a_locked_address_survives_a_spray_of_other_addresses() {
        let l = FailureLimiter::new(10.0, 0.2, 64);
        let t0 = Instant::now();
        let locked = ip("192.0.2.1");
        lock(&l, locked, t0);
        // 4 500 addresses across 4 500 networks fail once each (the worst
        // case: no two share a /24, so nothing merges).
        for i in 0..4500u32 {
            let at = t0 + Duration::from_micros(u64::from(i));
            l.record_failure_at(v4(0x0b00_0000 + (i << 8)), at);
            assert!(l.tracked() <= 64);
        }
        assert!(l.check_at(locked, t0 + Duration::from_millis(10)).is_err(), "the spray unlocked it");
        // And spread over few networks (the e2e test's shape): merged.
        let l = FailureLimiter::new(10.0, 0.2, 64);
        lock(&l, locked, t0);
        for i in 0..4500u32 {
            l.record_failure_at(v4(0x7f01_0000 + i), t0 + Duration::from_micros(u64::from(i)));
            assert!(l.tracked() <= 64);
        }
        assert!(l.check_at(locked, t0 + Duration::from_millis(10)).is_err());
    }

    #[test]
    fn under_pressure_a_network_is_merged_into_one_entry() {
        let l = FailureLimiter::new(10.0, 0.2, 8);
        let t0 = Instant::now();
        // Eight addresses of one /24 fill the table; a ninth merges them.
        for i in 1..=9u32 {
            l.record_failure_at(v4(0x0a00_0100 + i), t0);
        }
        assert_eq!(l.tracked(), 1, "one entry for 10.0.1.0/24");
        // Nine failures made: one more locks every address of the /24.
        assert!(l.check_at(ip("10.0.1.200"), t0).is_ok());
        l.record_failure_at(ip("10.0.1.200"), t0);
        assert!(l.check_at(ip("10.0.1.77"), t0).is_err());
        assert!(l.check_at(ip("10.0.2.1"), t0).is_ok(), "another /24");
    }

    #[test]
    fn a_full_table_of_locked_entries_refuses_unknown_addresses_for_a_while() {
        let l = FailureLimiter::new(2.0, 1.0, 4);
        let t0 = Instant::now();
        for i in 0..4u32 {
            lock(&l, v4(0x0a00_0000 + (i << 8)), t0);
        }
        let stranger = ip("10.9.9.9");
        assert!(l.check_at(stranger, t0).is_ok());
        l.record_failure_at(stranger, t0);
        assert_eq!(l.tracked(), 4);
        assert!(l.check_at(stranger, t0).is_err(), "not tracked, so refused while the table is saturated");
        for i in 0..4u32 {
            assert!(l.check_at(v4(0x0a00_0000 + (i << 8)), t0).is_err(), "locked entries stay");
        }
        // Once locked entries earned a failure back, strangers are tracked again.
        let later = t0 + Duration::from_millis(1100);
        assert!(l.check_at(stranger, later).is_ok());
        l.record_failure_at(stranger, later);
        assert!(l.check_at(stranger, later).is_ok(), "tracked with one failure left");
        assert!(l.tracked() <= 4);
    }

    #[test]
    fn kinds_are_counted_apart() {
        let limits = AuthLimits::default();
        let peer = ip("10.0.0.1");
        while limits.failed(Credential::Admin, peer).is_ok() {}
        while limits.failed(Credential::ApiKey, peer).is_ok() {}
        assert!(limits.of(Credential::Admin).check(peer).is_err());
        assert!(limits.of(Credential::ApiKey).check(peer).is_err());
        assert!(limits.of(Credential::NodeRegistration).check(peer).is_ok());
        assert_eq!(limits.of(Credential::NodeRegistration).tracked(), 0);
        // A refused attempt counts nothing more.
        assert!(limits.failed(Credential::Admin, peer).is_err());
    }
}
