//! Client API keys' state: each key's limits in force (the config's, or
//! what the admin API set in their place), its request and token rates as
//! generic-cell-rate limiters on one atomic each (any core checks and
//! charges them by compare-and-swap: no lock, no owner round trip), and
//! its daily and monthly token budgets.
//!
//! These local limiters decide alone without `[cluster]`. With it the
//! shared engine decides ([`crate::cluster`]); the local ones are still
//! charged, at this edge's share of each limit, and decide while the engine
//! is unreachable and the key fails open.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, OnceLock,
    },
    time::{Duration, Instant},
};

use iop_core::config::{ApiKeyEntry, KeyLimits};
use parking_lot::{Mutex, RwLock};

use crate::cluster::{periods, Engine};

const MINUTE_NS: u64 = 60_000_000_000;

/// GCRA at `per_minute` units a minute with a minute's worth of burst:
/// the arrival time `tat` allows `units` at `now` (all in ns) when it stays
/// within a minute of now; `Ok(new tat)`, else how long until it will.
pub fn gcra_take(tat: u64, now: u64, per_minute: u64, units: u64) -> Result<u64, Duration> {
    let interval = (MINUTE_NS / per_minute.max(1)).max(1);
    let tolerance = MINUTE_NS.saturating_sub(interval);
    let base = tat.max(now);
    let next = base.saturating_add(interval.saturating_mul(units));
    let ahead = next - now;
    if ahead > tolerance.saturating_add(interval) {
        return Err(Duration::from_nanos(ahead - tolerance - interval));
    }
    Ok(next)
}

/// Whether one more unit would be allowed at `now` (nothing taken): the
/// check of a rate charged after the fact (tokens).
pub fn gcra_allows(tat: u64, now: u64, per_minute: u64) -> Result<(), Duration> {
    let interval = (MINUTE_NS / per_minute.max(1)).max(1);
    let tolerance = MINUTE_NS.saturating_sub(interval);
    let ahead = tat.saturating_sub(now);
    if ahead > tolerance {
        return Err(Duration::from_nanos(ahead - tolerance));
    }
    Ok(())
}

/// The arrival time after charging `units` already spent, allowed or not.
pub fn gcra_charge(tat: u64, now: u64, per_minute: u64, units: u64) -> u64 {
    let interval = (MINUTE_NS / per_minute.max(1)).max(1);
    tat.max(now).saturating_add(interval.saturating_mul(units))
}

/// Nanoseconds since the process's epoch.
fn now_ns() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(Instant::now);
    u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// A rate's state: the theoretical arrival time of the next unit, in ns
/// since the process's epoch. The rate itself is passed at each call (it
/// may change at run time, and fail-open divides it).
#[derive(Debug, Default)]
pub struct Rate {
    tat: AtomicU64,
}

impl Rate {
    /// Takes `units` at `per_minute` if allowed now; else how long until it will be.
    pub fn take(&self, per_minute: u64, units: u64) -> Result<(), Duration> {
        let now = now_ns();
        let mut cur = self.tat.load(Ordering::Acquire);
        loop {
            let next = gcra_take(cur, now, per_minute, units)?;
            match self.tat.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Ok(()),
                Err(seen) => cur = seen,
            }
        }
    }

    /// Whether one unit would be allowed now (nothing taken).
    pub fn allows(&self, per_minute: u64) -> Result<(), Duration> {
        gcra_allows(self.tat.load(Ordering::Acquire), now_ns(), per_minute)
    }

    /// Charges `units` already spent, allowed or not: later requests wait them off.
    pub fn charge(&self, per_minute: u64, units: u64) {
        let now = now_ns();
        let _ = self
            .tat
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| Some(gcra_charge(t, now, per_minute, units)));
    }
}

/// Tokens spent in the current UTC day or month (a small lock: taken
/// once per check and once per charge, only for keys with a budget).
#[derive(Debug, Default)]
pub struct Budget {
    /// (period index, tokens spent in it).
    spent: Mutex<(u64, u64)>,
}

impl Budget {
    /// Tokens spent in period `index`.
    pub fn spent(&self, index: u64) -> u64 {
        let s = self.spent.lock();
        if s.0 == index {
            s.1
        } else {
            0
        }
    }

    /// Adds `units` to period `index` (a new period starts from 0).
    pub fn charge(&self, index: u64, units: u64) {
        let mut s = self.spent.lock();
        if s.0 != index {
            *s = (index, 0);
        }
        s.1 = s.1.saturating_add(units);
    }
}

/// Why a key may not start a request now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Over {
    /// Over `requests_per_minute`; retry after.
    Requests(Duration),
    /// Over `tokens_per_minute`; retry after.
    Tokens(Duration),
    /// `tokens_per_day` spent; the day ends after.
    Day(Duration),
    /// `tokens_per_month` spent; the month ends after.
    Month(Duration),
    /// The shared engine is unreachable and the key fails closed.
    EngineDown,
}

/// `limit` divided among `share` edges, at least 1.
pub fn share_of(limit: u64, share: u64) -> u64 {
    (limit / share.max(1)).max(1)
}

/// One configured key: its entry, its limits in force and their state.
#[derive(Debug)]
pub struct KeyState {
    /// The key's entry (its name, models and configured limits).
    pub entry: ApiKeyEntry,
    /// Its name, shared with the checks sent to the engine.
    pub name: Arc<str>,
    /// The limits in force, as [`KeyLimits::values`] (0: none).
    limits: [AtomicU64; 4],
    /// The [`LimitTable`] version those limits were read at (0: never).
    seen: AtomicU64,
    requests: Rate,
    tokens: Rate,
    day: Budget,
    month: Budget,
    /// The shared engine (set by the first check: a key is checked before
    /// anything is charged to it).
    engine: OnceLock<Arc<Engine>>,
}

impl KeyState {
    /// The state of `entry`, fresh (its configured limits in force until
    /// the first [`KeyState::sync`]).
    pub fn new(entry: ApiKeyEntry) -> Self {
        let k = Self {
            limits: Default::default(),
            seen: AtomicU64::new(0),
            requests: Rate::default(),
            tokens: Rate::default(),
            day: Budget::default(),
            month: Budget::default(),
            engine: OnceLock::new(),
            name: Arc::from(entry.name.as_str()),
            entry,
        };
        k.set_limits(k.entry.limits);
        k
    }

    /// Whether the key may use public model `model`.
    pub fn allows_model(&self, model: &str) -> bool {
        self.entry.models.iter().any(|m| m == model)
    }

    /// The limits in force.
    pub fn limits(&self) -> KeyLimits {
        let v = |i: usize| Some(self.limits[i].load(Ordering::Relaxed)).filter(|&n| n > 0);
        KeyLimits::from_values([v(0), v(1), v(2), v(3)])
    }

    fn set_limits(&self, l: KeyLimits) {
        for (slot, v) in self.limits.iter().zip(l.values()) {
            slot.store(v.unwrap_or(0), Ordering::Relaxed);
        }
    }

    /// Reads the limits in force again when `table` changed since: its
    /// entry for this key, else the config's (one atomic load otherwise).
    pub fn sync(&self, table: &LimitTable) {
        let version = table.version();
        if self.seen.load(Ordering::Acquire) == version {
            return;
        }
        self.set_limits(table.get(&self.entry.name).unwrap_or(self.entry.limits));
        self.seen.store(version, Ordering::Release);
    }

    /// Ties the key to the shared engine (its charges go there too).
    pub fn attach(&self, engine: &Arc<Engine>) {
        if self.engine.get().is_none() {
            let _ = self.engine.set(engine.clone());
        }
    }

    /// This edge's share of each limit: the live edges while an engine is
    /// attached, else 1.
    fn share(&self) -> u64 {
        self.engine.get().map_or(1, |e| e.live_edges())
    }

    /// Checks the key's limits locally, each divided among `share` edges,
    /// taking one request when they allow it.
    pub fn check_local(&self, share: u64) -> Result<(), Over> {
        let l = self.limits();
        if let Some(tpm) = l.tokens_per_minute {
            self.tokens.allows(share_of(tpm, share)).map_err(Over::Tokens)?;
        }
        self.check_budgets(&l, share)?;
        if let Some(rpm) = l.requests_per_minute {
            self.requests.take(share_of(rpm, share), 1).map_err(Over::Requests)?;
        }
        Ok(())
    }

    fn check_budgets(&self, l: &KeyLimits, share: u64) -> Result<(), Over> {
        let now = periods::unix_now();
        if let Some(tpd) = l.tokens_per_day {
            let p = periods::day(now);
            if self.day.spent(p.index) >= share_of(tpd, share) {
                return Err(Over::Day(Duration::from_secs(p.left)));
            }
        }
        if let Some(tpm) = l.tokens_per_month {
            let p = periods::month(now);
            if self.month.spent(p.index) >= share_of(tpm, share) {
                return Err(Over::Month(Duration::from_secs(p.left)));
            }
        }
        Ok(())
    }

    /// The engine admitted a request: the local rate counts it too (at this
    /// edge's share), so a fall back to local limits starts from the truth.
    pub fn note_admitted(&self) {
        if let Some(rpm) = self.limits().requests_per_minute {
            self.requests.charge(share_of(rpm, self.share()), 1);
        }
    }

    /// Charges `tokens` a finished request reported: the local rate and
    /// budgets, and the engine's when attached (later requests wait them off).
    pub fn charge_tokens(&self, tokens: u64) {
        let l = self.limits();
        if tokens == 0 || !(l.tokens_per_minute.is_some() || l.tokens_per_day.is_some() || l.tokens_per_month.is_some())
        {
            return;
        }
        let share = self.share();
        if let Some(tpm) = l.tokens_per_minute {
            self.tokens.charge(share_of(tpm, share), tokens);
        }
        let now = periods::unix_now();
        if l.tokens_per_day.is_some() {
            self.day.charge(periods::day(now).index, tokens);
        }
        if l.tokens_per_month.is_some() {
            self.month.charge(periods::month(now).index, tokens);
        }
        if let Some(engine) = self.engine.get() {
            engine.charge(&self.entry.name, l, tokens);
        }
    }

    /// Tokens spent through this edge today and this month (UTC).
    pub fn local_spent(&self) -> (u64, u64) {
        let now = periods::unix_now();
        (self.day.spent(periods::day(now).index), self.month.spent(periods::month(now).index))
    }
}

/// The limits the admin API set in place of the config's, by key name;
/// process-wide. A version counts the changes: a key reads its limits again
/// only when it moved.
#[derive(Debug)]
pub struct LimitTable {
    version: AtomicU64,
    set: RwLock<HashMap<String, KeyLimits>>,
}

impl Default for LimitTable {
    fn default() -> Self {
        Self { version: AtomicU64::new(1), set: RwLock::new(HashMap::new()) }
    }
}

impl LimitTable {
    /// The current version (starts at 1).
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// The limits set for `name`, if any.
    pub fn get(&self, name: &str) -> Option<KeyLimits> {
        self.set.read().get(name).copied()
    }

    /// Sets (`Some`) or clears the limits of `name`; whether that changed anything.
    pub fn put(&self, name: &str, limits: Option<KeyLimits>) -> bool {
        let mut set = self.set.write();
        let changed = match limits {
            Some(l) => set.insert(name.to_owned(), l) != Some(l),
            None => set.remove(name).is_some(),
        };
        if changed {
            self.version.fetch_add(1, Ordering::AcqRel);
        }
        changed
    }

    /// Replaces every entry (the engine's copy); the names that changed.
    pub fn replace(&self, all: HashMap<String, KeyLimits>) -> Vec<String> {
        let mut set = self.set.write();
        let mut changed: Vec<String> =
            set.iter().filter(|(k, v)| all.get(*k) != Some(*v)).map(|(k, _)| k.clone()).collect();
        changed.extend(all.iter().filter(|(k, _)| !set.contains_key(*k)).map(|(k, _)| k.clone()));
        if !changed.is_empty() {
            *set = all;
            self.version.fetch_add(1, Ordering::AcqRel);
        }
        changed
    }
}

/// The keys of a config, by hash; a reload keeps the state of keys whose
/// entry stays the same.
pub fn build(entries: &[ApiKeyEntry], prev: &[Arc<KeyState>]) -> Vec<Arc<KeyState>> {
    entries
        .iter()
        .map(|e| match prev.iter().find(|p| p.entry == *e) {
            Some(p) => p.clone(),
            None => Arc::new(KeyState::new(e.clone())),
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn gcra_on_a_fake_clock() {
        // 3 a minute: a minute's worth at once, then one every 20 s.
        let mut tat = 0;
        let t0 = 1000 * S;
        for _ in 0..3 {
            tat = gcra_take(tat, t0, 3, 1).unwrap();
        }
        assert_eq!(gcra_take(tat, t0, 3, 1).unwrap_err(), Duration::from_secs(20));
        assert_eq!(gcra_take(tat, t0 + 19 * S, 3, 1).unwrap_err(), Duration::from_secs(1));
        tat = gcra_take(tat, t0 + 20 * S, 3, 1).unwrap();
        assert!(gcra_take(tat, t0 + 20 * S, 3, 1).is_err());
        // A long pause refills to a minute's worth, no more.
        let mut n = 0;
        let later = t0 + 3600 * S;
        while let Ok(t) = gcra_take(tat, later, 3, 1) {
            tat = t;
            n += 1;
        }
        assert_eq!(n, 3);
        // Tokens: checked before, charged after (a request may overshoot).
        let tat = gcra_charge(0, t0, 100, 150);
        // 90 s of tokens against a 59.4 s burst: 30.6 s to wait.
        assert_eq!(gcra_allows(tat, t0, 100).unwrap_err(), Duration::from_millis(30_600));
        assert!(gcra_allows(tat, t0 + 31 * S, 100).is_ok());
        assert!(gcra_allows(gcra_charge(0, t0, 100, 99), t0, 100).is_ok());
    }

    #[test]
    fn fail_open_divides_each_limit_among_the_live_edges() {
        assert_eq!(share_of(10, 1), 10);
        assert_eq!(share_of(10, 3), 3);
        assert_eq!(share_of(2, 5), 1, "never below one");
        assert_eq!(share_of(10, 0), 10, "no edge seen: this one");
        let entry = ApiKeyEntry {
            name: "k".into(),
            sha256: [0; 32],
            models: vec!["m".into()],
            limits: KeyLimits { requests_per_minute: Some(6), tokens_per_day: Some(100), ..Default::default() },
            on_engine_down: Default::default(),
        };
        let k = KeyState::new(entry);
        // A third of 6 a minute: two at once.
        assert!(k.check_local(3).is_ok() && k.check_local(3).is_ok());
        assert!(matches!(k.check_local(3), Err(Over::Requests(_))));
        // A third of the day's 100 tokens is spent at 33.
        let k2 = KeyState::new(k.entry.clone());
        k2.charge_tokens(33);
        assert!(matches!(k2.check_local(3), Err(Over::Day(d)) if d <= Duration::from_secs(86_400)));
        assert!(k2.check_local(1).is_ok(), "alone, 67 left");
    }

    #[test]
    fn runtime_limits_win_over_the_config_until_cleared() {
        let entry = ApiKeyEntry {
            name: "k".into(),
            sha256: [0; 32],
            models: vec![],
            limits: KeyLimits { requests_per_minute: Some(1), ..Default::default() },
            on_engine_down: Default::default(),
        };
        let table = LimitTable::default();
        let k = KeyState::new(entry);
        k.sync(&table);
        assert_eq!(k.limits().requests_per_minute, Some(1));
        let set = KeyLimits { requests_per_minute: Some(5), tokens_per_month: Some(9), ..Default::default() };
        assert!(table.put("k", Some(set)));
        assert!(!table.put("k", Some(set)), "the same again changes nothing");
        k.sync(&table);
        assert_eq!(k.limits(), set);
        assert_eq!(table.replace(HashMap::new()), vec!["k".to_owned()]);
        k.sync(&table);
        assert_eq!(k.limits().requests_per_minute, Some(1));
        assert!(table.replace(HashMap::new()).is_empty());
    }
}
