//! The node's concurrency gate per provider, shared by every worker thread
//! of the process: each worker has its own link and run manager, and a
//! provider still never runs more than its limit whichever links its runs
//! and tunnels came in on (the adapter-local capacity guard).

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicU32, Ordering},
        Arc, Mutex, PoisonError,
    },
};

/// One provider's gate.
#[derive(Debug, Default)]
pub struct Gate {
    limit: AtomicU32,
    in_flight: AtomicU32,
}

impl Gate {
    /// Takes a slot unless the limit is reached.
    pub fn try_take(&self) -> bool {
        let limit = self.limit.load(Ordering::Acquire);
        self.in_flight.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < limit).then_some(n + 1)).is_ok()
    }

    /// Gives a slot back.
    pub fn give(&self) {
        let _ = self.in_flight.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| Some(n.saturating_sub(1)));
    }

    /// Slots taken now (all workers).
    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Acquire)
    }

    /// The limit.
    pub fn limit(&self) -> u32 {
        self.limit.load(Ordering::Acquire)
    }
}

/// Every provider's gate, by provider id (cold path: touched when a
/// worker applies a provider config).
#[derive(Debug, Default)]
pub struct Gates {
    by_id: Mutex<HashMap<String, Arc<Gate>>>,
}

impl Gates {
    /// No gates yet.
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// The gate of provider `id` with limit `limit` (created, or its limit
    /// updated: every worker applies the same config).
    pub fn configure(&self, id: &str, limit: u32) -> Arc<Gate> {
        let mut map = self.by_id.lock().unwrap_or_else(PoisonError::into_inner);
        let gate = map.entry(id.to_owned()).or_default().clone();
        gate.limit.store(limit, Ordering::Release);
        gate
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn workers_share_one_limit_per_provider() {
        let gates = Gates::new();
        let a = gates.configure("p", 2);
        let b = gates.configure("p", 2);
        assert!(a.try_take() && b.try_take());
        assert!(!a.try_take() && !b.try_take(), "two slots in all, whichever worker asks");
        b.give();
        assert!(a.try_take());
        assert_eq!(a.in_flight(), 2);
        // A new limit applies to the slots already out.
        gates.configure("p", 1);
        a.give();
        assert!(!b.try_take());
        a.give();
        assert!(b.try_take());
        assert_eq!(gates.configure("q", 5).in_flight(), 0);
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let g = gates.configure("r", 100);
                std::thread::spawn(move || (0..1000).filter(|_| g.try_take()).count())
            })
            .collect();
        assert_eq!(threads.into_iter().map(|t| t.join().unwrap()).sum::<usize>(), 100);
    }
}
