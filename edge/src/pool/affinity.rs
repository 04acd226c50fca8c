//! Cache affinity without coordination: a request with a key prefers the
//! target of highest rendezvous weight (highest random weight hashing of
//! the key with the target's node and provider ids), so every edge picks
//! the same one without talking to the others, and a target that leaves
//! moves only its own keys. Load wins past a bound: the preferred target
//! keeps the request while its utilisation is at most `max_imbalance`
//! above the least busy candidate's; else the next target in rendezvous
//! order within the bound takes it (stable across edges too), never simply
//! the least loaded.
//!
//! The hash is this file's own (fixed constants, little-endian words), not
//! std's `DefaultHasher`, whose output may change between Rust releases:
//! edges of different builds must still agree.

use super::{Candidate, LeaseClass, ResourceKey};

/// Seed of session keys (header, `prompt_cache_key`, `user`,
/// `metadata.user_id`): one value names one session whichever field
/// carries it.
pub const SESSION_SEED: u64 = 0x5e55_1011_a7f1_0001;
/// Seed of prompt-prefix keys.
pub const PREFIX_SEED: u64 = 0x9e3f_1a7e_c0de_0002;
/// Seed of target ids.
const TARGET_SEED: u64 = 0x7a26_e7b1_d0e5_0003;

const K1: u64 = 0x9e37_79b9_7f4a_7c15;
const K2: u64 = 0xc2b2_ae3d_27d4_eb4f;

/// Murmur3's 64-bit finaliser: every input bit moves every output bit.
fn mix(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// Running hash of byte strings, eight bytes a step.
#[derive(Debug, Clone, Copy)]
pub struct Hasher(u64);

impl Hasher {
    /// A hash seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// Adds `bytes` (their length too, so `ab`+`c` differs from `a`+`bc`).
    pub fn write(&mut self, bytes: &[u8]) {
        let mut h = self.0 ^ (bytes.len() as u64).wrapping_mul(K1);
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            let mut b = [0u8; 8];
            b.copy_from_slice(w);
            h = (h ^ u64::from_le_bytes(b).wrapping_mul(K2)).rotate_left(31).wrapping_mul(K1);
        }
        let tail = words.remainder();
        if !tail.is_empty() {
            let mut b = [0u8; 8];
            b[..tail.len()].copy_from_slice(tail);
            h = (h ^ u64::from_le_bytes(b).wrapping_mul(K2)).rotate_left(31).wrapping_mul(K1);
        }
        self.0 = h;
    }

    /// The hash.
    pub fn finish(&self) -> u64 {
        mix(self.0)
    }
}

/// The hash of `bytes` seeded with `seed`.
pub fn hash(seed: u64, bytes: &[u8]) -> u64 {
    let mut h = Hasher::new(seed);
    h.write(bytes);
    h.finish()
}

/// Where a request's affinity key came from (the access log's
/// `affinity_from`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeySource {
    /// `[affinity] header`.
    Header,
    /// OpenAI `prompt_cache_key`.
    PromptCacheKey,
    /// OpenAI `user`.
    User,
    /// Anthropic `metadata.user_id`.
    MetadataUserId,
    /// The hash of the prompt's first bytes.
    Prefix,
}

impl KeySource {
    /// As the access log writes it.
    pub fn label(self) -> &'static str {
        match self {
            Self::Header => "header",
            Self::PromptCacheKey => "prompt_cache_key",
            Self::User => "user",
            Self::MetadataUserId => "metadata.user_id",
            Self::Prefix => "prefix",
        }
    }
}

/// A request's affinity key: a hash of a client value, never the value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AffinityKey {
    /// The hash.
    pub hash: u64,
    /// What it was taken from.
    pub source: KeySource,
}

impl AffinityKey {
    /// The short form logged (the hash's top 32 bits).
    pub fn short(self) -> u32 {
        (self.hash >> 32) as u32
    }
}

/// How admission used the key (the access log's `affinity`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Choice {
    /// No key (or affinity off): least loaded first.
    #[default]
    None,
    /// Landed on the key's rendezvous target.
    Preferred,
    /// Landed elsewhere: the preferred target was too busy (past the
    /// imbalance bound, full, or granted later than another).
    Fallback,
}

impl Choice {
    /// As the access log writes it.
    pub fn label(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Preferred => "preferred",
            Self::Fallback => "fallback",
        }
    }
}

/// The hash of a target's ids (node, then provider).
pub fn target_hash(target: &ResourceKey) -> u64 {
    let mut h = Hasher::new(TARGET_SEED);
    h.write(target.node.as_bytes());
    h.write(target.provider.as_bytes());
    h.finish()
}

/// The rendezvous weight of `target` for `key`: the target of highest
/// weight is the key's preferred one.
pub fn weight(key: u64, target: &ResourceKey) -> u64 {
    mix(key ^ target_hash(target).wrapping_mul(K1))
}

/// Orders `cands` for a request of `class` with `key`: within the bound
/// (utilisation at most `max_imbalance` above the least busy candidate's)
/// in rendezvous order, then the rest of the candidates that have capacity
/// in rendezvous order, then those that have none. Returns the preferred
/// target's `index` (highest weight among those with capacity), if any.
pub fn order(key: u64, class: LeaseClass, cands: &mut [Candidate], max_imbalance: f64) -> Option<usize> {
    // One reading of each load: the sort below must see fixed keys.
    let mut least = f64::INFINITY;
    for c in cands.iter_mut() {
        let u = c.load.utilisation(class);
        least = least.min(u);
        c.rank = u.to_bits();
    }
    let mut preferred: Option<(u64, usize)> = None;
    for c in cands.iter_mut() {
        let u = f64::from_bits(c.rank);
        let w = weight(key, &c.key);
        let tier: u64 = if !u.is_finite() {
            2
        } else {
            if preferred.is_none_or(|(best, _)| w > best) {
                preferred = Some((w, c.index));
            }
            u64::from(u > least + max_imbalance)
        };
        // Tier first, then the highest weight.
        c.rank = (tier << 62) | ((u64::MAX - w) >> 2);
    }
    cands.sort_unstable_by_key(|c| (c.rank, c.index));
    preferred.map(|(_, index)| index)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use std::{
        collections::HashMap,
        sync::{atomic::Ordering, Arc},
    };

    use super::*;
    use crate::pool::ResourceLoad;

    fn cand(node: &str, cap: u32, used: u32) -> Candidate {
        let load = Arc::new(ResourceLoad::new(cap, 0));
        load.in_use_normal.store(used, Ordering::Relaxed);
        load.online.store(true, Ordering::Relaxed);
        let index = node.trim_start_matches('n').parse().unwrap();
        Candidate { index, key: ResourceKey::new(node, "p"), load, rank: 0 }
    }

    fn top(key: u64, nodes: &[&str]) -> String {
        nodes.iter().max_by_key(|n| weight(key, &ResourceKey::new(n, "p"))).unwrap().to_string()
    }

    fn order_of(key: u64, cands: &mut [Candidate], max_imbalance: f64) -> (Vec<usize>, Option<usize>) {
        let preferred = order(key, LeaseClass::Normal, cands, max_imbalance);
        (cands.iter().map(|c| c.index).collect(), preferred)
    }

    #[test]
    fn the_hash_is_fixed() {
        // Edges of different builds must agree: these values never change.
        assert_eq!(hash(SESSION_SEED, b""), hash(SESSION_SEED, b""));
        assert_ne!(hash(SESSION_SEED, b"a"), hash(PREFIX_SEED, b"a"));
        assert_ne!(hash(SESSION_SEED, b"session-1"), hash(SESSION_SEED, b"session-2"));
        let mut split = Hasher::new(1);
        split.write(b"ab");
        split.write(b"c");
        let mut other = Hasher::new(1);
        other.write(b"a");
        other.write(b"bc");
        assert_ne!(split.finish(), other.finish(), "lengths are part of the hash");
        assert_eq!(hash(SESSION_SEED, b"session-1"), 0xbf0a_9c94_ae79_7de9, "{:#x}", hash(SESSION_SEED, b"session-1"));
        assert_eq!(
            weight(hash(SESSION_SEED, b"session-1"), &ResourceKey::new("n1", "p")),
            0xdd4e_2bcb_7c65_4566,
            "{:#x}",
            weight(hash(SESSION_SEED, b"session-1"), &ResourceKey::new("n1", "p"))
        );
    }

    #[test]
    fn keys_spread_evenly_over_targets() {
        let nodes = ["n1", "n2", "n3"];
        let mut count: HashMap<String, u32> = HashMap::new();
        let n = 30_000;
        for i in 0..n {
            *count.entry(top(hash(SESSION_SEED, format!("s{i}").as_bytes()), &nodes)).or_default() += 1;
        }
        for node in nodes {
            let share = f64::from(count[node]) / f64::from(n);
            assert!((share - 1.0 / 3.0).abs() < 0.02, "{node}: {share} ({count:?})");
        }
    }

    #[test]
    fn a_target_that_leaves_moves_only_its_own_keys() {
        let all = ["n1", "n2", "n3", "n4"];
        let left = ["n1", "n2", "n4"];
        let (mut moved, mut lost) = (0, 0);
        for i in 0..10_000 {
            let key = hash(SESSION_SEED, format!("s{i}").as_bytes());
            let (before, after) = (top(key, &all), top(key, &left));
            if before == "n3" {
                lost += 1;
            } else if before != after {
                moved += 1;
            }
        }
        assert_eq!(moved, 0, "keys of the targets that stayed never move");
        assert!((2000..3000).contains(&lost), "n3 held about a quarter: {lost}");
        // And a target that comes back takes back exactly its keys.
    }

    #[test]
    fn the_preferred_target_first_then_rendezvous_order() {
        let key = hash(SESSION_SEED, b"k");
        let mut rendezvous: Vec<usize> = vec![1, 2, 3];
        rendezvous.sort_by_key(|i| std::cmp::Reverse(weight(key, &ResourceKey::new(&format!("n{i}"), "p"))));
        let mut cands = vec![cand("n1", 4, 0), cand("n2", 4, 0), cand("n3", 4, 0)];
        assert_eq!(order_of(key, &mut cands, 0.25), (rendezvous.clone(), Some(rendezvous[0])));
        // The same whatever the candidates' order.
        let mut cands = vec![cand("n3", 4, 0), cand("n1", 4, 0), cand("n2", 4, 0)];
        assert_eq!(order_of(key, &mut cands, 0.25).0, rendezvous);
    }

    #[test]
    fn load_wins_past_the_bound_and_the_fallback_is_the_next_in_rendezvous_order() {
        let key = hash(SESSION_SEED, b"k");
        let mut r: Vec<usize> = vec![1, 2, 3];
        r.sort_by_key(|i| std::cmp::Reverse(weight(key, &ResourceKey::new(&format!("n{i}"), "p"))));
        let with = |used: [u32; 3]| {
            let mut c: Vec<_> = r.iter().zip(used).map(|(i, u)| cand(&format!("n{i}"), 4, u)).collect();
            c.reverse();
            c
        };
        // [preferred, second, third] by in-use leases of 4.
        // One more on the preferred: a quarter, within the bound.
        assert_eq!(order_of(key, &mut with([1, 0, 0]), 0.25), (vec![r[0], r[1], r[2]], Some(r[0])));
        // Half busier than the least: the second takes it, then the third,
        // then the preferred (over the bound).
        assert_eq!(order_of(key, &mut with([2, 0, 0]), 0.25), (vec![r[1], r[2], r[0]], Some(r[0])));
        // The second is past the bound too: the third, though the
        // preferred is less busy than the second.
        assert_eq!(order_of(key, &mut with([2, 3, 0]), 0.25), (vec![r[2], r[0], r[1]], Some(r[0])));
        // Relative to the least busy: all equally busy keeps the preferred.
        assert_eq!(order_of(key, &mut with([3, 3, 3]), 0.25).0, vec![r[0], r[1], r[2]]);
        // A bound of 1: only fullness moves a request (the free-capacity pass skips a full one).
        assert_eq!(order_of(key, &mut with([4, 0, 0]), 1.0).0, vec![r[0], r[1], r[2]]);
        // A bound of 0: the least busy, ties in rendezvous order.
        assert_eq!(order_of(key, &mut with([1, 1, 0]), 0.0).0, vec![r[2], r[0], r[1]]);
    }

    #[test]
    fn a_target_without_capacity_is_never_preferred() {
        let key = hash(SESSION_SEED, b"k");
        let mut r: Vec<usize> = vec![1, 2, 3];
        r.sort_by_key(|i| std::cmp::Reverse(weight(key, &ResourceKey::new(&format!("n{i}"), "p"))));
        let mut cands: Vec<_> = r.iter().map(|i| cand(&format!("n{i}"), 4, 0)).collect();
        cands[0].load.online.store(false, Ordering::Relaxed);
        // The next in rendezvous order is preferred: the session moves
        // there on every edge alike.
        assert_eq!(order_of(key, &mut cands, 0.25), (vec![r[1], r[2], r[0]], Some(r[1])));
        let mut none: Vec<_> = r.iter().map(|i| cand(&format!("n{i}"), 4, 0)).collect();
        for c in &none {
            c.load.online.store(false, Ordering::Relaxed);
        }
        assert_eq!(order_of(key, &mut none, 0.25).1, None);
    }
}
