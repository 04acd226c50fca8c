//! Admission of one request to a model group: take free capacity on the
//! best candidate (the least loaded, or with an affinity key its
//! rendezvous target within the load bound, [`super::affinity`]), else
//! queue on every candidate until a lease is granted, the queue timeout
//! passes, or no candidate is left.

use std::{
    rc::Rc,
    sync::{
        atomic::{AtomicU32, Ordering},
        Arc,
    },
};

use iop_core::{config::ModelGroup, config::ModelTarget, rt::oneshot::oneshot};

use super::{
    affinity::{self, AffinityKey, Choice},
    Candidate, Lease, LeaseClass, LeastLoaded, PoolView, ResourceKey, SelectionPolicy, Waiter, WaiterState,
};
use crate::{
    ctx::Ctx,
    mesh::{owner_of, post, CoreMsg},
};

/// A request that holds capacity on one target.
#[derive(Debug)]
pub struct Admitted {
    /// The capacity; dropping it releases it.
    pub lease: Lease,
    /// Where to run.
    pub target: ModelTarget,
    /// How the affinity key (if any) chose the target.
    pub affinity: Choice,
}

/// Why a request was not admitted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdmitError {
    /// No candidate can serve the request now (none ready, or none has
    /// capacity of the requested class at all).
    #[error("{0}")]
    Unavailable(String),
    /// The model's queue is full.
    #[error("too many requests are waiting for model `{0}`")]
    QueueFull(String),
    /// Waited `queue_timeout` without a lease.
    #[error("no capacity for model `{0}` became free within the queue timeout")]
    Timeout(String),
}

/// The candidates of one request, best first, and how its affinity key
/// (if any) ordered them.
#[derive(Debug)]
pub struct Plan {
    /// Every target that could ever serve the class, best first.
    pub cands: Vec<Candidate>,
    /// With an affinity key: its preferred target's index, if any.
    preferred: Option<Option<usize>>,
}

impl Plan {
    /// How the affinity key chose target `index`.
    pub fn choice(&self, index: usize) -> Choice {
        match self.preferred {
            None => Choice::None,
            Some(p) if p == Some(index) => Choice::Preferred,
            Some(_) => Choice::Fallback,
        }
    }
}

/// Orders `group`'s targets for a request of `class` on `view`'s loads;
/// with `key`, its rendezvous target first while within `max_imbalance`.
/// Fails when no target can serve the request now.
pub fn plan(
    view: &PoolView,
    group: &ModelGroup,
    class: LeaseClass,
    key: Option<AffinityKey>,
    max_imbalance: f64,
) -> Result<Plan, AdmitError> {
    let mut cands: Vec<Candidate> = group
        .targets
        .iter()
        .enumerate()
        .filter_map(|(index, t)| {
            let key = ResourceKey::of(t);
            let load = view.resources.get(&key)?.clone();
            Some(Candidate { index, key, load, rank: 0 })
        })
        // Only candidates that could ever serve this class.
        .filter(|c| match class {
            LeaseClass::Normal => c.load.configured_normal.load(Ordering::Relaxed) > 0,
            LeaseClass::Long => c.load.configured_long.load(Ordering::Relaxed) > 0,
        })
        .collect();
    if cands.is_empty() {
        let what = if class == LeaseClass::Long { "long-context " } else { "" };
        return Err(AdmitError::Unavailable(format!("model `{}` has no provider with {what}capacity", group.name)));
    }
    if !cands.iter().any(|c| c.load.online.load(Ordering::Acquire)) {
        return Err(AdmitError::Unavailable(format!("no ready node serves model `{}`", group.name)));
    }
    if !cands.iter().any(|c| c.load.live()) {
        return Err(AdmitError::Unavailable(format!(
            "every provider of model `{}` is unavailable (its health probe failed)",
            group.name
        )));
    }
    // With one candidate there is nothing to choose (and nothing to hash).
    let preferred = match key {
        Some(k) if cands.len() > 1 => Some(affinity::order(k.hash, class, &mut cands, max_imbalance)),
        _ => {
            LeastLoaded.order(class, &mut cands);
            None
        }
    };
    Ok(Plan { cands, preferred })
}

/// Admits a request of `class` to `group`; with `key`, its rendezvous
/// target is preferred while within `[affinity] max_imbalance`.
pub async fn admit(
    worker: &Rc<Ctx>,
    group: &ModelGroup,
    class: LeaseClass,
    key: Option<AffinityKey>,
) -> Result<Admitted, AdmitError> {
    let view = worker.pool.borrow().clone();
    let max_imbalance = worker.config.borrow().affinity.max_imbalance;
    let plan = plan(&view, group, class, key, max_imbalance)?;
    let cands = &plan.cands;

    // Free capacity first, unless someone already queues there (FIFO fairness).
    for c in cands {
        if c.has_room(class) {
            if let Some(lease) = try_acquire(worker, c, class).await {
                return Ok(Admitted { target: target(group, c.index), lease, affinity: plan.choice(c.index) });
            }
        }
    }

    let counter = view.waiters.get(&group.name).cloned().unwrap_or_default();
    if counter.fetch_add(1, Ordering::AcqRel) >= group.max_waiters {
        counter.fetch_sub(1, Ordering::AcqRel);
        return Err(AdmitError::QueueFull(group.name.clone()));
    }
    let waiter = Arc::new(Waiter::new(class, worker.next_waiter_seq(), cands.len()));
    let guard =
        WaitGuard { worker, waiter: waiter.clone(), keys: cands.iter().map(|c| c.key.clone()).collect(), counter };
    for c in cands {
        let owner = owner_of(&c.key, worker.shared.workers);
        if owner == worker.index {
            worker.shard.borrow_mut().wait(&c.key, waiter.clone());
        } else {
            let msg = CoreMsg::Wait { key: c.key.clone(), waiter: waiter.clone() };
            let _ = worker.shared.inboxes[owner].send(msg).await;
        }
    }
    let outcome = iop_core::rt::time::timeout(group.queue_timeout, waiter.outcome()).await;
    drop(guard);
    match outcome {
        Ok(Ok(lease)) => {
            let index = cands.iter().find(|c| &c.key == lease.key()).map(|c| c.index).unwrap_or(0);
            Ok(Admitted { target: target(group, index), lease, affinity: plan.choice(index) })
        }
        Ok(Err(WaiterState::Unavailable)) | Ok(Err(_)) => {
            Err(AdmitError::Unavailable(format!("every node serving model `{}` went away", group.name)))
        }
        Err(_) => Err(AdmitError::Timeout(group.name.clone())),
    }
}

fn target(group: &ModelGroup, index: usize) -> ModelTarget {
    group.targets.get(index).cloned().unwrap_or_else(|| group.targets[0].clone())
}

/// Asks `key`'s owner for a lease.
async fn try_acquire(worker: &Rc<Ctx>, c: &Candidate, class: LeaseClass) -> Option<Lease> {
    let key = &c.key;
    let owner = owner_of(key, worker.shared.workers);
    if owner == worker.index {
        return worker.shard.borrow_mut().try_acquire(key, class);
    }
    // The count is shared; the owner keeps only the queues. So with nobody
    // queued, and this core already routing to the generation the owner saw
    // ready (the lease then carries the route the owner would give it), the
    // lease is taken here: no round trip to the owner's core.
    let load = &c.load;
    let generation = load.generation.load(Ordering::Acquire);
    let route =
        worker.routes.borrow().get(&*key.node).filter(|r| generation != 0 && r.generation == generation).cloned();
    if let Some(route) = route {
        if load.waiters.load(Ordering::SeqCst) != 0 || !load.try_take(class, load.capacity(class)) {
            return None;
        }
        return Some(Lease::new(key.clone(), class, load.clone(), worker.shared.inboxes[owner].clone(), Some(route)));
    }
    let (reply, rx) = oneshot();
    let msg = CoreMsg::Acquire { key: key.clone(), class, reply };
    worker.shared.inboxes[owner].send(msg).await.ok()?;
    rx.await.flatten()
}

/// Leaves the queues however the wait ends (grant, timeout, client gone).
struct WaitGuard<'a> {
    worker: &'a Rc<Ctx>,
    waiter: Arc<Waiter>,
    keys: Vec<ResourceKey>,
    counter: Arc<AtomicU32>,
}

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        self.counter.fetch_sub(1, Ordering::AcqRel);
        // Releases a lease granted after we stopped waiting.
        self.waiter.abandon();
        // Let every owner drop the finished entry now (keeps waiter gauges exact).
        for key in self.keys.drain(..) {
            let owner = owner_of(&key, self.worker.shared.workers);
            if owner == self.worker.index {
                self.worker.shard.borrow_mut().compact(&key);
            } else {
                post(&self.worker.shared.inboxes[owner], CoreMsg::Compact { key });
            }
        }
    }
}
