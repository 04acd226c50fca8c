//! Client API keys' state: the request and token rates of each key, as
//! generic-cell-rate limiters on one atomic each (any core checks and
//! charges them by compare-and-swap: no lock, no owner round trip).

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, OnceLock,
    },
    time::{Duration, Instant},
};

use iop_core::config::ApiKeyEntry;

/// A rate of `per_minute`, a minute's worth of burst (GCRA: the
/// theoretical arrival time of the next unit, in ns since the process's
/// epoch, is the whole state).
#[derive(Debug)]
pub struct Rate {
    tat: AtomicU64,
    /// Nanoseconds one unit costs.
    interval: u64,
    /// How far ahead of now the arrival time may run (the burst).
    tolerance: u64,
}

fn now_ns() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(Instant::now);
    u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

impl Rate {
    /// `per_minute` units a minute.
    pub fn per_minute(per_minute: u64) -> Self {
        let minute = 60_000_000_000u64;
        let interval = (minute / per_minute.max(1)).max(1);
        Self { tat: AtomicU64::new(0), interval, tolerance: minute.saturating_sub(interval) }
    }

    /// Takes `units` if the rate allows them now; else how long until it will.
    pub fn take(&self, units: u64) -> Result<(), Duration> {
        let now = now_ns();
        let cost = self.interval.saturating_mul(units);
        let mut cur = self.tat.load(Ordering::Acquire);
        loop {
            let tat = cur.max(now);
            let ahead = tat.saturating_add(cost).saturating_sub(now);
            if ahead > self.tolerance.saturating_add(self.interval) {
                return Err(Duration::from_nanos(ahead - self.tolerance - self.interval));
            }
            match self.tat.compare_exchange_weak(cur, tat.saturating_add(cost), Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Ok(()),
                Err(seen) => cur = seen,
            }
        }
    }

    /// Whether one unit would be allowed now (nothing taken); else how long until then.
    pub fn allows(&self) -> Result<(), Duration> {
        let now = now_ns();
        let ahead = self.tat.load(Ordering::Acquire).saturating_sub(now);
        if ahead > self.tolerance {
            return Err(Duration::from_nanos(ahead - self.tolerance));
        }
        Ok(())
    }

    /// Charges `units` already spent, allowed or not (tokens a finished
    /// request reported): later requests wait them off.
    pub fn charge(&self, units: u64) {
        let now = now_ns();
        let cost = self.interval.saturating_mul(units);
        let _ =
            self.tat.fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| Some(cur.max(now).saturating_add(cost)));
    }
}

/// One configured key and its rates.
#[derive(Debug)]
pub struct KeyState {
    /// The key's entry (its name and models).
    pub entry: ApiKeyEntry,
    /// `requests_per_minute`.
    pub requests: Option<Rate>,
    /// `tokens_per_minute`.
    pub tokens: Option<Rate>,
}

impl KeyState {
    /// The state of `entry`, fresh.
    pub fn new(entry: ApiKeyEntry) -> Self {
        Self {
            requests: entry.requests_per_minute.map(Rate::per_minute),
            tokens: entry.tokens_per_minute.map(Rate::per_minute),
            entry,
        }
    }

    /// Whether the key may use public model `model`.
    pub fn allows_model(&self, model: &str) -> bool {
        self.entry.models.iter().any(|m| m == model)
    }
}

/// The keys of a config, by hash; a reload keeps the state of keys whose
/// name, hash and rates stay the same.
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

    #[test]
    fn a_minute_of_burst_then_the_rate() {
        let r = Rate::per_minute(3);
        assert!(r.take(1).is_ok() && r.take(1).is_ok() && r.take(1).is_ok());
        let wait = r.take(1).unwrap_err();
        assert!(wait > Duration::from_secs(19) && wait <= Duration::from_secs(20), "{wait:?}");
        assert!(r.allows().is_err());
        let t = Rate::per_minute(100);
        assert!(t.allows().is_ok());
        t.charge(150); // a request that reported more than a minute's worth
        let wait = t.allows().unwrap_err();
        // 90 s of tokens against a 59.4 s burst: 30.6 s to wait.
        assert!(wait > Duration::from_secs(30) && wait <= Duration::from_millis(30_600), "{wait:?}");
    }
}
