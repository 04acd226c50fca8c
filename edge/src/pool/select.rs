//! Selection policy: the order in which candidates with free capacity are tried.

use std::sync::Arc;

use super::{LeaseClass, ResourceKey, ResourceLoad};

/// One candidate of a model group.
#[derive(Debug, Clone)]
pub struct Candidate {
    /// Position in the model's target list (the deterministic tie-break).
    pub index: usize,
    /// The resource.
    pub key: ResourceKey,
    /// Its published load.
    pub load: Arc<ResourceLoad>,
    /// Scratch of a policy's ordering (its sort key, read once per request).
    pub rank: u64,
}

impl Candidate {
    /// Has free capacity of `class` and nobody queued (FIFO fairness: a
    /// request never overtakes a waiter).
    pub fn has_room(&self, class: LeaseClass) -> bool {
        let l = &self.load;
        l.in_use(class) < l.capacity(class) && l.waiters.load(std::sync::atomic::Ordering::Relaxed) == 0
    }
}

/// Orders candidates for one request.
pub trait SelectionPolicy {
    /// Sorts `candidates` best first for a request of `class`.
    fn order(&self, class: LeaseClass, candidates: &mut [Candidate]);
}

/// Least loaded (in use / capacity) first; ties go to the earlier target.
#[derive(Debug, Clone, Copy, Default)]
pub struct LeastLoaded;

impl SelectionPolicy for LeastLoaded {
    fn order(&self, class: LeaseClass, candidates: &mut [Candidate]) {
        candidates.sort_by(|a, b| {
            a.load.utilisation(class).total_cmp(&b.load.utilisation(class)).then(a.index.cmp(&b.index))
        });
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;

    fn cand(index: usize, cap: u32, used: u32, online: bool) -> Candidate {
        let load = Arc::new(ResourceLoad::new(cap, 0));
        load.in_use_normal.store(used, Ordering::Relaxed);
        load.online.store(online, Ordering::Relaxed);
        Candidate { index, key: ResourceKey::new(&format!("n{index}"), "p"), load, rank: 0 }
    }

    #[test]
    fn least_loaded_with_deterministic_tie_break() {
        let mut c = vec![cand(0, 4, 2, true), cand(1, 4, 1, true), cand(2, 8, 2, true), cand(3, 4, 0, false)];
        LeastLoaded.order(LeaseClass::Normal, &mut c);
        let order: Vec<_> = c.iter().map(|c| c.index).collect();
        // 1 and 2 are both at 25 %: the earlier target wins; offline is last.
        assert_eq!(order, vec![1, 2, 0, 3]);
    }
}
