//! The node listener's handshake slots. A connection takes a slot at accept
//! and holds it until it is ready; until its token is accepted it is
//! *unproven* and counts against its address too. Proven handshakes (a
//! valid token: at most one per link of a configured node) only count
//! against the total and are never closed here.
//!
//! Admission never refuses a newcomer while an unproven handshake could
//! make room. An address at its cap (`max_handshakes_per_address`) closes
//! its own oldest. Otherwise a free slot is taken, except the last
//! `handshake_reserve` ones, which only an address holding none may take;
//! without a slot to take, room is made: the oldest *silent* handshake (no
//! byte received yet) of anyone is closed, else the oldest that spoke but
//! is still unproven (the newcomer's own address's when it holds some, so
//! it never grows into the reserve). A node sends its first frame (or its
//! TLS ClientHello) at once and is proven about a round trip after accept:
//! its links are the newest entries, so squatters are what gets closed.
//!
//! Handshakes run on whichever core accepted them and are closed from
//! whichever core admits the newcomer: each entry has a [`SharedCancel`]
//! its task awaits beside the handshake, raised across cores.

use std::{
    collections::{BTreeSet, HashMap},
    net::IpAddr,
    sync::Arc,
};

use iop_core::{
    config::HandshakeSettings,
    limits::{SlotGuard, Slots},
    rt::signal::SharedCancel,
};
use parking_lot::Mutex;

use super::AddrKey;

/// The limits admission applies (from `[node_listener]`, read at accept).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandshakeLimits {
    /// Handshakes in progress at once (`max_handshakes`).
    pub max: usize,
    /// Unproven handshakes of one address (`max_handshakes_per_address`).
    pub per_address: usize,
    /// Slots only an address holding none may take (`handshake_reserve`).
    pub reserve: usize,
}

impl From<&HandshakeSettings> for HandshakeLimits {
    fn from(s: &HandshakeSettings) -> Self {
        Self { max: s.max_pending, per_address: s.per_address, reserve: s.reserve }
    }
}

/// Whose handshake was closed to admit a newcomer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Eviction {
    /// One of the newcomer's own address (at its cap, or making room
    /// rather than entering the reserve).
    SameAddress,
    /// Another address's: no slot was free for the newcomer.
    Pressure,
}

impl Eviction {
    /// Metric label.
    pub fn label(self) -> &'static str {
        match self {
            Eviction::SameAddress => "evicted_same_address",
            Eviction::Pressure => "evicted_under_pressure",
        }
    }
}

/// Every slot is held by a proven handshake: the newcomer is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("every node handshake slot is held by a registered connection")]
pub struct Full;

/// A newcomer's slot, and the handshake it closed to get it (if any).
#[derive(Debug)]
pub struct Admitted {
    /// The slot.
    pub slot: HandshakeSlot,
    /// Whom it closed.
    pub evicted: Option<Eviction>,
}

#[derive(Debug)]
struct Entry {
    key: AddrKey,
    close: SharedCancel,
}

/// Unproven handshakes; ids grow with accept order, so the smallest is the oldest.
#[derive(Debug, Default)]
struct Inner {
    entries: HashMap<u64, Entry>,
    silent: BTreeSet<u64>,
    spoke: BTreeSet<u64>,
    /// Ids of each address's entries, oldest first.
    by_addr: HashMap<AddrKey, Vec<u64>>,
    next: u64,
}

impl Inner {
    /// The oldest of `key`'s entries, a silent one first.
    fn oldest_of(&self, key: AddrKey) -> Option<u64> {
        let ids = self.by_addr.get(&key)?;
        ids.iter().copied().find(|id| self.silent.contains(id)).or_else(|| ids.first().copied())
    }

    /// The oldest entry of anyone, a silent one first.
    fn oldest(&self) -> Option<u64> {
        self.silent.first().or_else(|| self.spoke.first()).copied()
    }

    fn remove(&mut self, id: u64) -> Option<Entry> {
        let entry = self.entries.remove(&id)?;
        self.silent.remove(&id);
        self.spoke.remove(&id);
        if let Some(ids) = self.by_addr.get_mut(&entry.key) {
            ids.retain(|i| *i != id);
            if ids.is_empty() {
                self.by_addr.remove(&entry.key);
            }
        }
        Some(entry)
    }
}

/// The handshakes in progress on the edge, shared by every core.
#[derive(Debug, Default)]
pub struct HandshakeTable {
    inner: Mutex<Inner>,
    /// Proven handshakes (registered, not yet ready).
    proven: Slots,
}

impl HandshakeTable {
    /// An empty table.
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// Handshakes in progress (unproven and proven).
    pub fn in_progress(&self) -> usize {
        self.inner.lock().entries.len() + self.proven.held()
    }

    /// Unproven handshakes of `peer`'s address.
    pub fn of_address(&self, peer: IpAddr) -> usize {
        self.inner.lock().by_addr.get(&AddrKey::of(peer)).map_or(0, Vec::len)
    }

    /// A slot for a connection accepted from `peer`, closing another
    /// handshake when that is what makes room (see the module's rules).
    pub fn admit(self: &Arc<Self>, peer: IpAddr, limits: HandshakeLimits) -> Result<Admitted, Full> {
        let key = AddrKey::of(peer);
        let mut inner = self.inner.lock();
        let total = inner.entries.len() + self.proven.held();
        let own = inner.by_addr.get(&key).map_or(0, Vec::len);
        let victim = if own >= limits.per_address.max(1) {
            inner.oldest_of(key)
        } else if total < limits.max.saturating_sub(limits.reserve) || (own == 0 && total < limits.max) {
            None
        } else {
            // Room is made, not taken: the oldest silent handshake of anyone
            // goes (a newcomer's links are the newest); with none silent, an
            // address that holds some gives up its own oldest (it may not
            // grow into the reserve), one that holds none the oldest anywhere.
            let fallback = if own > 0 { inner.oldest_of(key) } else { inner.oldest() };
            match inner.silent.first().copied().or(fallback) {
                Some(id) => Some(id),
                None => return Err(Full),
            }
        };
        let closed = victim.and_then(|id| inner.remove(id)).map(|e| {
            let why = if e.key == key { Eviction::SameAddress } else { Eviction::Pressure };
            (e.close, why)
        });
        let id = inner.next;
        inner.next += 1;
        let close = SharedCancel::new();
        inner.entries.insert(id, Entry { key, close: close.clone() });
        inner.silent.insert(id);
        inner.by_addr.entry(key).or_default().push(id);
        drop(inner);
        // Woken outside the lock: the victim may be on another core.
        let evicted = closed.map(|(close, why)| {
            close.cancel();
            why
        });
        Ok(Admitted { slot: HandshakeSlot { table: self.clone(), id, close }, evicted })
    }
}

/// An accepted node connection's place in the [`HandshakeTable`]; dropping
/// it frees the place.
#[derive(Debug)]
pub struct HandshakeSlot {
    table: Arc<HandshakeTable>,
    id: u64,
    close: SharedCancel,
}

impl HandshakeSlot {
    /// The first bytes arrived: no longer silent.
    pub fn spoke(&self) {
        let mut inner = self.table.inner.lock();
        if inner.silent.remove(&self.id) {
            inner.spoke.insert(self.id);
        }
    }

    /// Raised when the table closed this handshake for a newcomer.
    pub fn closed(&self) -> &SharedCancel {
        &self.close
    }

    /// The connection presented a valid token: it leaves its address's
    /// count and is never closed for a newcomer; the guard holds its place
    /// in the total until it is ready. None when it was closed meanwhile.
    pub fn proven(self) -> Option<SlotGuard> {
        let mut inner = self.table.inner.lock();
        // Counted as proven before it stops counting as unproven, under the
        // lock, so a concurrent admission never sees it in neither.
        let guard = inner.entries.contains_key(&self.id).then(|| self.table.proven.acquire());
        inner.remove(self.id);
        guard
    }
}

impl Drop for HandshakeSlot {
    fn drop(&mut self) {
        self.table.inner.lock().remove(self.id);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    const LIMITS: HandshakeLimits = HandshakeLimits { max: 8, per_address: 3, reserve: 2 };

    fn admit(t: &Arc<HandshakeTable>, peer: &str) -> (HandshakeSlot, Option<Eviction>) {
        let a = t.admit(ip(peer), LIMITS).unwrap();
        (a.slot, a.evicted)
    }

    #[test]
    fn an_address_at_its_cap_closes_its_own_oldest_silent_handshake() {
        let t = HandshakeTable::new();
        let (a1, _) = admit(&t, "10.0.0.1");
        let (a2, _) = admit(&t, "10.0.0.1");
        let (a3, _) = admit(&t, "10.0.0.1");
        a1.spoke();
        let (a4, why) = admit(&t, "10.0.0.1");
        assert_eq!(why, Some(Eviction::SameAddress));
        // a1 spoke, so the oldest silent one (a2) went.
        assert!(!a1.closed().is_cancelled() && a2.closed().is_cancelled() && !a3.closed().is_cancelled());
        assert_eq!((t.of_address(ip("10.0.0.1")), t.in_progress()), (3, 3));
        // With none silent left, the oldest that spoke goes.
        a3.spoke();
        a4.spoke();
        let (_a5, why) = admit(&t, "10.0.0.1");
        assert_eq!(why, Some(Eviction::SameAddress));
        assert!(a1.closed().is_cancelled());
        // Another address is untouched by all this.
        let (b, why) = admit(&t, "10.0.0.2");
        assert_eq!(why, None);
        assert!(!b.closed().is_cancelled());
        // Closed slots dropping late change nothing.
        drop((a1, a2));
        assert_eq!(t.in_progress(), 4);
    }

    #[test]
    fn the_reserve_is_only_for_addresses_holding_none() {
        let t = HandshakeTable::new();
        let limits = HandshakeLimits { max: 4, per_address: 4, reserve: 2 };
        let a: Vec<_> = (0..2).map(|_| t.admit(ip("10.0.0.1"), limits).unwrap()).collect();
        assert!(a.iter().all(|x| x.evicted.is_none()));
        // A third from the same address would enter the reserve: it closes its own.
        let a3 = t.admit(ip("10.0.0.1"), limits).unwrap();
        assert_eq!(a3.evicted, Some(Eviction::SameAddress));
        assert!(a[0].slot.closed().is_cancelled());
        // Addresses holding none take the reserve.
        let b = t.admit(ip("10.0.0.2"), limits).unwrap();
        let c = t.admit(ip("10.0.0.3"), limits).unwrap();
        assert_eq!((b.evicted, c.evicted, t.in_progress()), (None, None, 4));
        // Full: a newcomer address closes the oldest silent handshake of anyone.
        a[1].slot.spoke();
        let d = t.admit(ip("10.0.0.4"), limits).unwrap();
        assert_eq!(d.evicted, Some(Eviction::Pressure));
        assert!(a3.slot.closed().is_cancelled() && !a[1].slot.closed().is_cancelled());
        assert_eq!(t.in_progress(), 4);
    }

    #[test]
    fn a_nodes_second_link_closes_a_squatter_not_its_first_link() {
        // Every slot held by silent squatters from as many addresses.
        let t = HandshakeTable::new();
        let limits = HandshakeLimits { max: 4, per_address: 8, reserve: 1 };
        let squat: Vec<_> = (1..=4).map(|i| t.admit(ip(&format!("10.0.1.{i}")), limits).unwrap().slot).collect();
        // A node's two links arrive together; the first is still silent
        // (its task has not run yet) when the second is admitted.
        let link0 = t.admit(ip("10.0.0.1"), limits).unwrap();
        let link1 = t.admit(ip("10.0.0.1"), limits).unwrap();
        assert_eq!((link0.evicted, link1.evicted), (Some(Eviction::Pressure), Some(Eviction::Pressure)));
        assert!(!link0.slot.closed().is_cancelled() && !link1.slot.closed().is_cancelled());
        assert!(squat[0].closed().is_cancelled() && squat[1].closed().is_cancelled());
        assert_eq!(t.in_progress(), 4);
    }

    #[test]
    fn proven_handshakes_are_never_closed() {
        let t = HandshakeTable::new();
        let limits = HandshakeLimits { max: 2, per_address: 1, reserve: 0 };
        let a = t.admit(ip("10.0.0.1"), limits).unwrap().slot;
        let b = t.admit(ip("10.0.0.2"), limits).unwrap().slot;
        let (ga, gb) = (a.proven().unwrap(), b.proven().unwrap());
        assert_eq!((t.in_progress(), t.of_address(ip("10.0.0.1"))), (2, 0));
        assert_eq!(t.admit(ip("10.0.0.3"), limits).unwrap_err(), Full);
        // The same address may start another once its first is proven,
        // within the total.
        drop(ga);
        let a2 = t.admit(ip("10.0.0.1"), limits).unwrap();
        assert_eq!(a2.evicted, None);
        drop(gb);
        assert_eq!(t.in_progress(), 1);
    }

    #[test]
    fn a_closed_handshake_cannot_be_proven() {
        let t = HandshakeTable::new();
        let limits = HandshakeLimits { max: 1, per_address: 1, reserve: 0 };
        let a = t.admit(ip("10.0.0.1"), limits).unwrap().slot;
        let b = t.admit(ip("10.0.0.2"), limits).unwrap();
        assert_eq!(b.evicted, Some(Eviction::Pressure));
        assert!(a.closed().is_cancelled());
        assert!(a.proven().is_none());
        assert_eq!(t.in_progress(), 1);
        drop(b);
        assert_eq!(t.in_progress(), 0);
    }

    #[test]
    fn a_handshake_is_closed_from_another_thread() {
        let t = HandshakeTable::new();
        let limits = HandshakeLimits { max: 1, per_address: 1, reserve: 0 };
        let a = t.admit(ip("10.0.0.1"), limits).unwrap().slot;
        let other = t.clone();
        iop_core::rt::block_on_current(async move {
            let newcomer = std::thread::spawn(move || other.admit(ip("10.0.0.2"), limits).map(|a| a.evicted));
            a.closed().cancelled().await;
            assert_eq!(newcomer.join().unwrap(), Ok(Some(Eviction::Pressure)));
        })
        .unwrap();
    }

    #[test]
    fn counts_stay_bounded_under_churn() {
        let t = HandshakeTable::new();
        let limits = HandshakeLimits { max: 16, per_address: 4, reserve: 4 };
        let mut held = Vec::new();
        for i in 0..2000u32 {
            let peer = format!("10.0.{}.{}", i % 7, i % 5);
            let a = t.admit(ip(&peer), limits).unwrap();
            if i % 3 == 0 {
                a.slot.spoke();
            }
            held.push(a.slot);
            held.retain(|s| !s.closed().is_cancelled());
            assert!(t.in_progress() <= 16, "{}", t.in_progress());
            assert!(t.of_address(ip(&peer)) <= 4);
            assert_eq!(held.len(), t.in_progress());
        }
    }
}
