//! Tests of the provider pool without sockets or threads: one `Shard` per
//! simulated core, each with its own inbox, and a small simulator that
//! delivers inbox messages to the shards the way `worker::apply` does.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    collections::HashSet,
    future::Future,
    pin::{pin, Pin},
    sync::{atomic::Ordering, Arc},
    task::{Context, Poll, Waker},
    time::Instant,
};

use iop_core::{
    config::EdgeConfig,
    rt::{
        mailbox,
        oneshot::{oneshot, OneshotReceiver},
    },
};

use super::{
    HealthReport, Lease, LeaseClass, Observed, PoolView, ResourceKey, ResourceLoad, Shard, Source, Waiter, WaiterState,
};
use crate::{
    link::NodeRoute,
    mesh::{owner_of, CoreMsg},
    registry::Generation,
};
use iop_core::liveness::ProviderHealth;

use LeaseClass::{Long, Normal};

/// Inbox capacity: large, so `Lease::drop` never needs `monoio::spawn`.
const INBOX: usize = 1 << 16;

/// One provider of a test config: (node, provider, capacity, long_capacity).
type Spec<'a> = (&'a str, &'a str, u32, u32);

/// A valid edge config with `workers` cores, the providers of `specs`, and
/// one model targeting all of them.
fn config(workers: usize, specs: &[Spec<'_>]) -> EdgeConfig {
    let mut text =
        format!("workers = {workers}\n[http]\nlisten = \"127.0.0.1:0\"\n[node_listener]\nlisten = \"127.0.0.1:0\"\n");
    let mut nodes: Vec<&str> = Vec::new();
    for (n, ..) in specs {
        if !nodes.contains(n) {
            nodes.push(n);
        }
    }
    for n in &nodes {
        text += &format!("[[nodes]]\nid = \"{n}\"\ntoken = \"token-{n}\"\n");
        for (_, p, cap, long) in specs.iter().filter(|s| s.0 == *n) {
            text += &format!(
                "[[nodes.providers]]\nid = \"{p}\"\nkind = \"mock\"\ncapacity = {cap}\nlong_capacity = {long}\n"
            );
        }
    }
    text += "[[models]]\nname = \"m\"\n";
    for (n, p, ..) in specs {
        text += &format!("[[models.targets]]\nnode = \"{n}\"\nprovider = \"{p}\"\n");
    }
    EdgeConfig::from_toml(&text, &|_| None).unwrap_or_else(|e| panic!("{e}\n---\n{text}"))
}

fn key(node: &str, provider: &str) -> ResourceKey {
    ResourceKey::new(node, provider)
}

/// A node route of `generation` with one link (its session mailbox is never read).
fn route(generation: Generation) -> NodeRoute {
    let (session, _) = mailbox::mailbox(1);
    let links = vec![crate::link::LinkRoute { index: 0, worker: 0, session, suspicion: Default::default() }].into();
    NodeRoute { generation, version: 0, links }
}

/// Runs a test body on a monoio runtime (as the workers do).
fn run<F: Future>(body: F) -> F::Output {
    iop_core::rt::block_on_current(body).expect("monoio runtime")
}

/// Polls `f` once with a no-op waker.
fn poll_once<F: Future>(f: F) -> Poll<F::Output> {
    let mut f = pin!(f);
    f.as_mut().poll(&mut Context::from_waker(Waker::noop()))
}

fn poll_reply(rx: &mut OneshotReceiver<Option<Lease>>) -> Poll<Option<Option<Lease>>> {
    Pin::new(rx).poll(&mut Context::from_waker(Waker::noop()))
}

/// The lease a granted waiter holds (panics if it has none).
fn take(w: &Waiter) -> Lease {
    match poll_once(w.outcome()) {
        Poll::Ready(Ok(lease)) => lease,
        other => panic!("waiter {} has no lease: {other:?} (state {:?})", w.seq, w.state()),
    }
}

/// The simulated cores: shards, their inboxes, and the pool view.
struct Sim {
    workers: usize,
    view: PoolView,
    shards: Vec<Shard>,
    inboxes: Vec<mailbox::Sender<CoreMsg>>,
    rx: Vec<mailbox::Receiver<CoreMsg>>,
    /// (waiter address, key) of every `Wait` an owner has applied.
    waits_applied: HashSet<(usize, ResourceKey)>,
    seq: u64,
}

impl Sim {
    fn new(cfg: &EdgeConfig) -> Self {
        let workers = cfg.workers;
        let view = PoolView::build(cfg, None);
        let (mut shards, mut inboxes, mut rx) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..workers {
            let (tx, r) = mailbox::mailbox(INBOX);
            let mut shard = Shard::new(i, workers, tx.clone());
            shard.apply_config(cfg, &view);
            shards.push(shard);
            inboxes.push(tx);
            rx.push(r);
        }
        Self { workers, view, shards, inboxes, rx, waits_applied: HashSet::new(), seq: 0 }
    }

    /// A live reload: the new view carries the counters of kept resources.
    fn reload(&mut self, cfg: &EdgeConfig) {
        let view = PoolView::build(cfg, Some(&self.view));
        for s in &mut self.shards {
            s.apply_config(cfg, &view);
        }
        self.view = view;
    }

    fn owner(&self, key: &ResourceKey) -> usize {
        owner_of(key, self.workers)
    }

    fn load(&self, key: &ResourceKey) -> Arc<ResourceLoad> {
        self.view.resources.get(key).cloned().unwrap_or_else(|| panic!("{key} not in the view"))
    }

    fn in_use(&self, key: &ResourceKey) -> (u32, u32) {
        self.shards[self.owner(key)].in_use(key).unwrap_or_else(|| panic!("{key} unknown to its owner"))
    }

    fn guards(&self, key: &ResourceKey) -> i64 {
        self.load(key).live_guards.load(Ordering::Acquire)
    }

    fn gauge_waiters(&self, key: &ResourceKey) -> u32 {
        self.load(key).waiters.load(Ordering::Acquire)
    }

    fn online(&self, key: &ResourceKey) -> bool {
        self.load(key).online.load(Ordering::Acquire)
    }

    /// The owner's `try_acquire`, as when the requesting core owns `key`.
    fn acquire(&mut self, key: &ResourceKey, class: LeaseClass) -> Option<Lease> {
        let owner = self.owner(key);
        self.shards[owner].try_acquire(key, class)
    }

    /// An `Acquire` message to `key`'s owner (as from another core).
    fn acquire_msg(&mut self, key: &ResourceKey, class: LeaseClass) -> OneshotReceiver<Option<Lease>> {
        let (reply, rx) = oneshot();
        self.send(self.owner(key), CoreMsg::Acquire { key: key.clone(), class, reply });
        rx
    }

    /// Like `admit`: one waiter, live count = candidates, `Wait` to each owner.
    fn wait(&mut self, keys: &[ResourceKey], class: LeaseClass) -> Arc<Waiter> {
        self.seq += 1;
        let w = Arc::new(Waiter::new(class, self.seq, keys.len()));
        for k in keys {
            self.send(self.owner(k), CoreMsg::Wait { key: k.clone(), waiter: w.clone() });
        }
        w
    }

    /// Like `WaitGuard::drop`: give up, then let every owner compact.
    fn leave(&mut self, w: &Waiter, keys: &[ResourceKey]) {
        w.abandon();
        for k in keys {
            self.send(self.owner(k), CoreMsg::Compact { key: k.clone() });
        }
    }

    fn send(&self, core: usize, msg: CoreMsg) {
        if self.inboxes[core].try_send(msg).is_err() {
            panic!("inbox of core {core} is full");
        }
    }

    fn broadcast_ready(&self, node: &str, generation: Generation) {
        let route = route(generation);
        for core in 0..self.workers {
            self.send(core, CoreMsg::NodeReady { node_id: node.into(), route: route.clone() });
        }
    }

    fn broadcast_gone(&self, node: &str, generation: Generation) {
        for core in 0..self.workers {
            self.send(core, CoreMsg::NodeGone { node_id: node.into(), generation });
        }
    }

    /// Fence applied on every core at once (as `worker::apply` does a `NodeReady`).
    fn ready(&mut self, node: &str, generation: Generation) {
        let route = route(generation);
        for s in &mut self.shards {
            s.set_route(node, &route);
            s.node_ready(node, generation);
        }
    }

    fn gone(&mut self, node: &str, generation: Generation) {
        for s in &mut self.shards {
            s.node_gone(node, generation);
        }
    }

    /// Applies the next message of core `core`'s inbox like `worker::apply`.
    fn deliver_one(&mut self, core: usize) -> bool {
        let Some(msg) = self.rx[core].try_recv() else { return false };
        let Self { shards, waits_applied, .. } = self;
        let shard = &mut shards[core];
        match msg {
            CoreMsg::Acquire { key, class, reply } => reply.send(shard.try_acquire(&key, class)),
            CoreMsg::Wait { key, waiter } => {
                waits_applied.insert((Arc::as_ptr(&waiter) as usize, key.clone()));
                shard.wait(&key, waiter);
            }
            CoreMsg::Release { key, class, load } => shard.release(&key, class, &load),
            CoreMsg::Compact { key } => shard.compact(&key),
            CoreMsg::NodeReady { node_id, route } => {
                shard.set_route(&node_id, &route);
                shard.node_ready(&node_id, route.generation);
            }
            CoreMsg::NodeGone { node_id, generation } => shard.node_gone(&node_id, generation),
            CoreMsg::LinkSuspicion { node_id } => shard.refresh_suspicion(&node_id),
            CoreMsg::DropLease(lease) => drop(lease),
            _ => {}
        }
        true
    }

    /// Drains core `core`'s inbox; returns the number of messages applied.
    fn deliver(&mut self, core: usize) -> usize {
        let mut n = 0;
        while self.deliver_one(core) {
            n += 1;
        }
        n
    }

    /// Drains every inbox until all are empty.
    fn deliver_all(&mut self) {
        while (0..self.workers).map(|c| self.deliver(c)).sum::<usize>() > 0 {}
    }

    fn queued(&self) -> usize {
        self.inboxes.iter().map(|i| i.len()).sum()
    }

    /// Every counter of `key` back at zero (after a compact on its owner).
    fn assert_idle(&mut self, key: &ResourceKey) {
        let owner = self.owner(key);
        self.shards[owner].compact(key);
        assert_eq!(self.in_use(key), (0, 0), "{key} in use");
        let load = self.load(key);
        assert_eq!(load.in_use_normal.load(Ordering::Acquire), 0, "{key} published in use");
        assert_eq!(load.in_use_long.load(Ordering::Acquire), 0, "{key} published long in use");
        assert_eq!(self.guards(key), 0, "{key} live guards");
        assert_eq!(self.gauge_waiters(key), 0, "{key} waiters");
    }
}

/// Two keys of `keys` with different owners (the first pair found), else the first two.
fn split_pair(sim: &Sim, keys: &[ResourceKey]) -> (ResourceKey, ResourceKey) {
    for a in keys {
        for b in keys {
            if sim.owner(a) != sim.owner(b) {
                return (a.clone(), b.clone());
            }
        }
    }
    (keys[0].clone(), keys[1].clone())
}

const FOUR: [Spec<'static>; 4] = [("n0", "p0", 1, 0), ("n0", "p1", 1, 0), ("n1", "p0", 1, 0), ("n1", "p1", 1, 0)];

/// A node whose every link is suspect offers no capacity, but its waiters
/// keep queueing (they are not told the candidate is gone) and are served
/// the moment a link answers; a node with one answering link is not
/// suspect.
#[test]
fn a_suspect_node_offers_no_capacity_and_keeps_its_queue() {
    run(async {
        let mut sim = Sim::new(&config(2, &[("n0", "p0", 1, 0)]));
        let k = key("n0", "p0");
        let (a, b) = (crate::link::Suspicion::default(), crate::link::Suspicion::default());
        let link = |index, suspicion: &crate::link::Suspicion| crate::link::LinkRoute {
            index,
            worker: 0,
            session: mailbox::mailbox(1).0,
            suspicion: suspicion.clone(),
        };
        let route = NodeRoute { generation: 1, version: 1, links: vec![link(0, &a), link(1, &b)].into() };
        for core in 0..2 {
            sim.send(core, CoreMsg::NodeReady { node_id: "n0".into(), route: route.clone() });
        }
        sim.deliver_all();
        let suspicion = |sim: &mut Sim| {
            for core in 0..2 {
                sim.send(core, CoreMsg::LinkSuspicion { node_id: "n0".into() });
            }
            sim.deliver_all();
        };
        let load = sim.load(&k);
        // One link of two suspect: still offered.
        a.set(true);
        suspicion(&mut sim);
        assert_eq!(load.capacity(Normal), 1);
        // Both: nothing offered, yet live for the queue.
        b.set(true);
        suspicion(&mut sim);
        assert_eq!(load.capacity(Normal), 0);
        assert!(load.live() && load.suspect.load(Ordering::Acquire));
        assert!(sim.acquire(&k, Normal).is_none());
        let w = sim.wait(std::slice::from_ref(&k), Normal);
        sim.deliver_all();
        assert_eq!(w.state(), WaiterState::Waiting, "a suspect candidate is not a lost one");
        // A link answers: the queue is served at once.
        b.set(false);
        suspicion(&mut sim);
        assert!(!load.suspect.load(Ordering::Acquire));
        let lease = take(&w);
        assert_eq!(lease.key(), &k);
        drop(lease);
        sim.deliver_all();
        // A fence clears the suspicion with the route.
        a.set(true);
        b.set(true);
        suspicion(&mut sim);
        assert!(load.suspect.load(Ordering::Acquire));
        sim.broadcast_gone("n0", 1);
        sim.deliver_all();
        assert!(!load.suspect.load(Ordering::Acquire) && !sim.online(&k));
        sim.assert_idle(&k);
    })
}

#[test]
fn acquire_up_to_capacity_then_refused() {
    run(async {
        let mut sim = Sim::new(&config(3, &[("n0", "p0", 2, 0)]));
        let k = key("n0", "p0");
        // Configured but not ready: in the snapshot, capacity 0.
        assert!(sim.acquire(&k, Normal).is_none());
        let load = sim.load(&k);
        assert!(!sim.online(&k));
        assert_eq!(load.configured_normal.load(Ordering::Acquire), 2);
        assert_eq!(load.capacity(Normal), 0);

        sim.ready("n0", 1);
        assert!(sim.online(&k));
        assert_eq!(load.capacity(Normal), 2);
        let a = sim.acquire(&k, Normal).expect("first lease");
        let b = sim.acquire(&k, Normal).expect("second lease");
        assert_eq!(a.key(), &k);
        assert_eq!(b.class(), Normal);
        assert!(sim.acquire(&k, Normal).is_none(), "capacity 2 gave a third lease");
        assert_eq!(sim.in_use(&k), (2, 0));
        assert_eq!(load.in_use(Normal), 2);
        assert_eq!(sim.guards(&k), 2);
        drop((a, b));
        sim.deliver_all();
        sim.assert_idle(&k);
    })
}

#[test]
fn release_frees_capacity_at_once_and_tells_the_owner_only_when_someone_waits() {
    run(async {
        let mut sim = Sim::new(&config(3, &[("n0", "p0", 1, 0)]));
        let k = key("n0", "p0");
        let owner = sim.owner(&k);
        sim.ready("n0", 1);
        let a = sim.acquire(&k, Normal).unwrap();
        drop(a);
        // Nobody waits: the count is back at once and the owner hears nothing.
        assert_eq!(sim.guards(&k), 0);
        assert_eq!(sim.in_use(&k), (0, 0));
        assert_eq!(sim.inboxes[owner].len(), 0, "no message without a waiter");
        let a = sim.acquire(&k, Normal).expect("freed capacity");
        // With a waiter queued at the owner, giving back tells the owner, which grants.
        let w = sim.wait(std::slice::from_ref(&k), Normal);
        sim.deliver_all();
        assert_eq!(w.state(), WaiterState::Waiting);
        drop(a);
        assert_eq!(sim.inboxes[owner].len(), 1, "the release went to the owner's inbox");
        sim.deliver_all();
        assert_eq!(w.state(), WaiterState::Granted);
        drop(take(&w));
        sim.leave(&w, std::slice::from_ref(&k));
        sim.deliver_all();
        let b = sim.acquire(&k, Normal).expect("freed capacity");
        drop(b);
        sim.deliver_all();
        sim.assert_idle(&k);
    })
}

#[test]
fn acquire_through_the_owner_inbox() {
    run(async {
        let mut sim = Sim::new(&config(3, &[("n0", "p0", 1, 0)]));
        let k = key("n0", "p0");
        sim.ready("n0", 1);
        let mut first = sim.acquire_msg(&k, Normal);
        let mut second = sim.acquire_msg(&k, Normal);
        assert!(poll_reply(&mut first).is_pending());
        sim.deliver_all();
        let lease = match poll_reply(&mut first) {
            Poll::Ready(Some(Some(l))) => l,
            other => panic!("first acquire: {other:?}"),
        };
        assert!(matches!(poll_reply(&mut second), Poll::Ready(Some(None))), "second acquire got a lease");
        drop(lease);
        sim.deliver_all();
        sim.assert_idle(&k);
    })
}

#[test]
fn normal_and_long_pools_are_separate() {
    run(async {
        let mut sim = Sim::new(&config(3, &[("n0", "p0", 1, 1), ("n0", "p1", 2, 0)]));
        let (k, k1) = (key("n0", "p0"), key("n0", "p1"));
        sim.ready("n0", 1);
        let n = sim.acquire(&k, Normal).unwrap();
        let l = sim.acquire(&k, Long).expect("long pool is not the normal pool");
        assert_eq!(l.class(), Long);
        assert!(sim.acquire(&k, Normal).is_none());
        assert!(sim.acquire(&k, Long).is_none());
        assert_eq!(sim.in_use(&k), (1, 1));
        assert!(sim.acquire(&k1, Long).is_none(), "long_capacity 0 gave a long lease");

        // A queued long waiter blocks neither the normal pool nor is served by it.
        let wl = sim.wait(std::slice::from_ref(&k), Long);
        sim.deliver_all();
        assert_eq!(wl.state(), WaiterState::Waiting);
        drop(n);
        sim.deliver_all();
        assert_eq!(wl.state(), WaiterState::Waiting, "a normal release served a long waiter");
        let n2 = sim.acquire(&k, Normal).expect("normal pool blocked by a long waiter");
        drop(l);
        sim.deliver_all();
        assert_eq!(wl.state(), WaiterState::Granted);
        let l2 = take(&wl);
        assert_eq!((l2.key(), l2.class()), (&k, Long));
        assert_eq!(sim.in_use(&k), (1, 1));
        drop((n2, l2));
        sim.deliver_all();
        sim.assert_idle(&k);
        sim.assert_idle(&k1);
    })
}

#[test]
fn queued_waiters_are_granted_in_fifo_order_and_arrivals_do_not_barge() {
    run(async {
        let mut sim = Sim::new(&config(3, &[("n0", "p0", 1, 0)]));
        let k = key("n0", "p0");
        let ks = std::slice::from_ref(&k);
        sim.ready("n0", 1);
        let l = sim.acquire(&k, Normal).unwrap();
        let w1 = sim.wait(ks, Normal);
        let w2 = sim.wait(ks, Normal);
        sim.deliver_all();
        assert_eq!((w1.state(), w2.state()), (WaiterState::Waiting, WaiterState::Waiting));
        assert_eq!(sim.gauge_waiters(&k), 2);

        // Capacity frees, and a new request arrives right behind the release.
        drop(l);
        let mut late = sim.acquire_msg(&k, Normal);
        sim.deliver_all();
        assert!(matches!(poll_reply(&mut late), Poll::Ready(Some(None))), "a new arrival barged past the queue");
        assert_eq!(w1.state(), WaiterState::Granted, "oldest waiter first");
        assert_eq!(w2.state(), WaiterState::Waiting);
        assert!(sim.acquire(&k, Normal).is_none());
        let l1 = take(&w1);
        assert_eq!(l1.key(), &k);
        sim.leave(&w1, ks);
        drop(l1);
        sim.deliver_all();
        assert_eq!(w2.state(), WaiterState::Granted);
        let l2 = take(&w2);
        sim.leave(&w2, ks);
        assert!(sim.acquire(&k, Normal).is_none());
        drop(l2);
        sim.deliver_all();
        sim.assert_idle(&k);
    })
}

#[test]
fn waiter_on_two_resources_is_granted_exactly_once() {
    run(async {
        let mut sim = Sim::new(&config(3, &FOUR));
        let keys: Vec<_> = FOUR.iter().map(|s| key(s.0, s.1)).collect();
        let (a, b) = split_pair(&sim, &keys);
        sim.ready("n0", 1);
        sim.ready("n1", 1);
        let la = sim.acquire(&a, Normal).unwrap();
        let lb = sim.acquire(&b, Normal).unwrap();
        let w = sim.wait(&[a.clone(), b.clone()], Normal);
        sim.deliver_all();
        assert_eq!(w.state(), WaiterState::Waiting);

        drop(la);
        sim.deliver_all();
        assert_eq!(w.state(), WaiterState::Granted);
        // b's owner skips (and drops) the entry already served by a.
        drop(lb);
        sim.deliver_all();
        assert_eq!(sim.in_use(&b), (0, 0), "granted twice");
        assert_eq!(sim.gauge_waiters(&b), 0);
        let lb2 = sim.acquire(&b, Normal).expect("b is free");
        let lease = take(&w);
        assert_eq!(lease.key(), &a);
        assert!(poll_once(w.outcome()).is_pending(), "a second lease appeared");
        assert_eq!(sim.in_use(&a), (1, 0));
        sim.leave(&w, &[a.clone(), b.clone()]);
        drop((lease, lb2));
        sim.deliver_all();
        for k in &keys {
            sim.assert_idle(k);
        }
    })
}

#[test]
fn abandon_before_grant_leaks_nothing() {
    run(async {
        let mut sim = Sim::new(&config(3, &[("n0", "p0", 1, 0)]));
        let k = key("n0", "p0");
        let ks = std::slice::from_ref(&k);
        sim.ready("n0", 1);
        let l = sim.acquire(&k, Normal).unwrap();
        let w = sim.wait(ks, Normal);
        sim.deliver_all();
        sim.leave(&w, ks);
        assert_eq!(w.state(), WaiterState::Cancelled);
        assert!(matches!(poll_once(w.outcome()), Poll::Ready(Err(WaiterState::Cancelled))));
        sim.deliver_all();
        assert_eq!(sim.gauge_waiters(&k), 0, "compact left the cancelled entry");
        drop(l);
        sim.deliver_all();
        assert_eq!(w.state(), WaiterState::Cancelled);
        sim.assert_idle(&k);
        // The freed capacity is there for the next request.
        let again = sim.acquire(&k, Normal).expect("capacity leaked to a cancelled waiter");
        drop(again);
        sim.deliver_all();
        sim.assert_idle(&k);
    })
}

#[test]
fn abandon_racing_a_grant_releases_the_lease() {
    run(async {
        let mut sim = Sim::new(&config(3, &[("n0", "p0", 1, 0)]));
        let k = key("n0", "p0");
        let ks = std::slice::from_ref(&k);
        sim.ready("n0", 1);

        // Granted (lease deposited), then the client gives up before taking it.
        let l = sim.acquire(&k, Normal).unwrap();
        let w = sim.wait(ks, Normal);
        sim.deliver_all();
        drop(l);
        sim.deliver_all();
        assert_eq!(w.state(), WaiterState::Granted);
        assert_eq!(sim.guards(&k), 1);
        sim.leave(&w, ks);
        assert_eq!(sim.guards(&k), 0, "abandon kept the deposited lease");
        assert!(poll_once(w.outcome()).is_pending());
        sim.deliver_all();
        sim.assert_idle(&k);

        // Claimed by the owner, abandoned, then deposited: the deposit releases.
        let w = Waiter::new(Normal, 99, 1);
        assert!(w.try_claim());
        w.abandon();
        let lease = sim.acquire(&k, Normal).unwrap();
        w.deposit(lease);
        assert_eq!(sim.guards(&k), 0, "deposit after abandon kept the lease");
        assert!(poll_once(w.outcome()).is_pending());
        sim.deliver_all();
        sim.assert_idle(&k);
    })
}

#[test]
fn current_generation_fence_marks_offline() {
    run(async {
        let mut sim = Sim::new(&config(3, &[("n0", "p0", 2, 1), ("n1", "p0", 1, 0)]));
        let (k, other) = (key("n0", "p0"), key("n1", "p0"));
        sim.ready("n0", 1);
        sim.ready("n1", 1);
        let l = sim.acquire(&k, Normal).unwrap();
        sim.broadcast_gone("n0", 1);
        sim.deliver_all();
        let load = sim.load(&k);
        assert!(!sim.online(&k));
        assert_eq!((load.capacity(Normal), load.capacity(Long)), (0, 0));
        // Still in the snapshot with its configured capacity.
        assert_eq!(load.configured_normal.load(Ordering::Acquire), 2);
        assert_eq!(load.configured_long.load(Ordering::Acquire), 1);
        assert!(sim.acquire(&k, Normal).is_none());
        assert!(sim.acquire(&k, Long).is_none());
        // The lease of the ended generation counts until its run drops it.
        assert_eq!(sim.in_use(&k), (1, 0));
        assert!(sim.online(&other), "another node's fence changed this one");
        drop(l);
        sim.deliver_all();
        sim.assert_idle(&k);
        sim.assert_idle(&other);
    })
}

fn health(key: &ResourceKey, generation: Generation, seq: u64, h: ProviderHealth, source: Source) -> HealthReport {
    HealthReport { key: key.clone(), generation, link: 0, seq, health: h, target: "t".into(), source }
}

#[test]
fn the_overlay_takes_a_provider_out_and_a_newer_available_probe_brings_it_back() {
    run(async {
        let mut sim = Sim::new(&config(3, &[("n0", "p0", 1, 0), ("n1", "p0", 1, 0)]));
        let (k, k1) = (key("n0", "p0"), key("n1", "p0"));
        sim.ready("n0", 1);
        sim.ready("n1", 1);
        let (l, l1) = (sim.acquire(&k, Normal).unwrap(), sim.acquire(&k1, Normal).unwrap());
        let only = sim.wait(std::slice::from_ref(&k), Normal);
        let both = sim.wait(&[k.clone(), k1.clone()], Normal);
        sim.deliver_all();
        let owner = sim.owner(&k);
        // Another generation's evidence changes nothing.
        let stale = health(&k, 2, 1, ProviderHealth::Unavailable, Source::Stall);
        assert_eq!(sim.shards[owner].observe(&stale), Observed::Stale);
        let down = health(&k, 1, 1, ProviderHealth::Unavailable, Source::Stall);
        assert_eq!(sim.shards[owner].observe(&down), Observed::Lowered);
        let load = sim.load(&k);
        assert!(load.online.load(Ordering::Acquire) && !load.live(), "online, but out of traffic");
        assert_eq!(load.capacity(Normal), 0);
        assert_eq!(only.state(), WaiterState::Unavailable, "its only candidate went away");
        assert_eq!(both.state(), WaiterState::Waiting, "another candidate is left");
        assert!(sim.shards[owner].probe_plan(&k, 1).is_some());
        drop(l);
        sim.deliver_all();
        assert!(sim.acquire(&k, Normal).is_none(), "granted while lowered");
        assert_eq!(both.state(), WaiterState::Waiting);

        let up = health(&k, 1, 2, ProviderHealth::Available, Source::Probe);
        assert_eq!(sim.shards[owner].observe(&up), Observed::Recovered);
        assert!(load.live());
        assert_eq!(both.state(), WaiterState::Granted, "served on recovery");
        assert!(sim.shards[owner].probe_plan(&k, 1).is_none());
        drop((take(&both), l1));
        sim.leave(&only, std::slice::from_ref(&k));
        sim.deliver_all();
        sim.assert_idle(&k);
        sim.assert_idle(&k1);

        // A new generation starts healthy.
        assert_eq!(
            sim.shards[owner].observe(&health(&k, 1, 3, ProviderHealth::Unavailable, Source::Stall)),
            Observed::Lowered
        );
        sim.gone("n0", 1);
        sim.ready("n0", 2);
        assert!(load.live());
    })
}

#[test]
fn a_fenced_connections_lease_is_never_granted_to_a_waiter() {
    run(async {
        let mut sim = Sim::new(&config(3, &[("n0", "p0", 1, 0)]));
        let k = key("n0", "p0");
        let ks = std::slice::from_ref(&k);
        sim.ready("n0", 1);
        let l = sim.acquire(&k, Normal).unwrap();
        let w = sim.wait(ks, Normal);
        sim.deliver_all();
        // The session's order on a disconnect: the fence to every core,
        // then its runs' leases through their owners.
        sim.broadcast_gone("n0", 1);
        l.release_after_fence();
        // Until the owner applies both, the capacity is not free to anyone.
        assert!(sim.load(&k).in_use(Normal) == 1 && sim.load(&k).online.load(Ordering::Acquire));
        sim.deliver_all();
        assert_eq!(w.state(), WaiterState::Unavailable, "a waiter was granted a dead connection");
        assert!(sim.acquire(&k, Normal).is_none());
        sim.leave(&w, ks);
        sim.deliver_all();
        sim.assert_idle(&k);
    })
}

#[test]
fn waiter_whose_only_candidate_goes_away_ends_unavailable_at_once() {
    run(async {
        let mut sim = Sim::new(&config(3, &[("n0", "p0", 1, 0), ("n1", "p0", 1, 0)]));
        let (k, k1) = (key("n0", "p0"), key("n1", "p0"));
        let ks = std::slice::from_ref(&k);
        sim.ready("n0", 1);
        sim.ready("n1", 1);
        let l = sim.acquire(&k, Normal).unwrap();
        let l1 = sim.acquire(&k1, Normal).unwrap();
        let w = sim.wait(ks, Normal);
        let w1 = sim.wait(std::slice::from_ref(&k1), Normal);
        sim.deliver_all();
        sim.gone("n0", 1);
        assert_eq!(w.state(), WaiterState::Unavailable);
        assert!(matches!(poll_once(w.outcome()), Poll::Ready(Err(WaiterState::Unavailable))));
        assert_eq!(sim.gauge_waiters(&k), 0);
        assert_eq!(w1.state(), WaiterState::Waiting, "another node's waiter ended");

        // Queued after the fence on a resource that is offline: unavailable on arrival.
        let late = sim.wait(ks, Normal);
        sim.deliver_all();
        assert_eq!(late.state(), WaiterState::Unavailable);

        sim.leave(&w, ks);
        sim.leave(&late, ks);
        sim.leave(&w1, std::slice::from_ref(&k1));
        drop((l, l1));
        sim.deliver_all();
        sim.assert_idle(&k);
        sim.assert_idle(&k1);
    })
}

#[test]
fn reconnect_and_ready_dispatch_waiting_requests_at_once() {
    run(async {
        let mut sim = Sim::new(&config(3, &[("n0", "p0", 1, 0), ("n1", "p0", 1, 0)]));
        let (a, b) = (key("n0", "p0"), key("n1", "p0"));
        let both = [a.clone(), b.clone()];
        sim.ready("n0", 1);
        sim.ready("n1", 1);
        let la = sim.acquire(&a, Normal).unwrap();
        let lb = sim.acquire(&b, Normal).unwrap();
        let w = sim.wait(&both, Normal);
        sim.deliver_all();

        sim.broadcast_gone("n0", 1);
        sim.deliver_all();
        assert_eq!(w.state(), WaiterState::Waiting, "one candidate is left");
        // The fence ended the run holding `la`; its capacity stays offline.
        drop(la);
        sim.deliver_all();
        assert_eq!(w.state(), WaiterState::Waiting);
        assert_eq!(sim.in_use(&a), (0, 0));

        // Reconnect + ready: granted as soon as the owner applies the ready.
        sim.broadcast_ready("n0", 2);
        sim.deliver(sim.owner(&a));
        assert_eq!(w.state(), WaiterState::Granted);
        let lease = take(&w);
        assert_eq!(lease.key(), &a);
        sim.leave(&w, &both);
        sim.deliver_all();

        // Live count across flaps: down, up, other down: still waiting; then none.
        let w2 = sim.wait(&both, Normal);
        sim.deliver_all();
        sim.gone("n0", 2);
        sim.ready("n0", 3);
        sim.gone("n1", 1);
        assert_eq!(w2.state(), WaiterState::Waiting, "a flapped candidate was not counted back");
        sim.gone("n0", 3);
        assert_eq!(w2.state(), WaiterState::Unavailable);
        sim.leave(&w2, &both);
        drop((lease, lb));
        sim.deliver_all();
        sim.assert_idle(&a);
        sim.assert_idle(&b);
    })
}

#[test]
fn a_link_set_arriving_after_its_generations_fence_revives_nothing() {
    run(async {
        let mut sim = Sim::new(&config(2, &[("n0", "p0", 1, 0)]));
        let k = key("n0", "p0");
        sim.ready("n0", 1);
        // Both links of generation 1 end on different cores: one publishes
        // the set without its link, the other fences the generation, and the
        // fence is applied first.
        sim.gone("n0", 1);
        sim.broadcast_ready("n0", 1);
        sim.deliver_all();
        assert!(!sim.online(&k), "a late link set revived a fenced generation");
        assert!(sim.acquire(&k, Normal).is_none());
        for shard in &sim.shards {
            assert!(shard.is_fenced("n0", 1));
            assert!(!shard.has_ready("n0"), "the fenced generation's route came back");
        }
        // The node's next connection is a new generation: it is taken.
        sim.ready("n0", 2);
        assert!(sim.online(&k));
        let l = sim.acquire(&k, Normal).expect("capacity of the new generation");
        drop(l);
        sim.deliver_all();
        sim.assert_idle(&k);
    })
}

#[test]
fn stale_generation_fence_changes_nothing() {
    run(async {
        let mut sim = Sim::new(&config(3, &[("n0", "p0", 1, 0)]));
        let k = key("n0", "p0");
        let ks = std::slice::from_ref(&k);
        sim.ready("n0", 1);
        // Reconnected: the new ready overtook the old connection's gone.
        sim.broadcast_ready("n0", 2);
        sim.deliver_all();
        let l = sim.acquire(&k, Normal).unwrap();
        let w = sim.wait(ks, Normal);
        sim.deliver_all();

        sim.broadcast_gone("n0", 1);
        sim.broadcast_gone("n0", 0);
        sim.broadcast_gone("n0", 7);
        sim.deliver_all();
        assert!(sim.online(&k), "a stale gone marked the node offline");
        assert_eq!(sim.load(&k).capacity(Normal), 1);
        assert_eq!(w.state(), WaiterState::Waiting, "a stale gone ended a waiter");
        assert_eq!(sim.gauge_waiters(&k), 1);
        // A duplicate ready of the current generation changes nothing either.
        sim.ready("n0", 2);
        assert_eq!(w.state(), WaiterState::Waiting);

        // The current generation's gone does.
        sim.gone("n0", 2);
        assert!(!sim.online(&k));
        assert_eq!(w.state(), WaiterState::Unavailable);
        sim.leave(&w, ks);
        drop(l);
        sim.deliver_all();
        sim.assert_idle(&k);
    })
}

#[test]
fn reload_with_raised_capacity_grants_waiters() {
    run(async {
        let mut sim = Sim::new(&config(3, &[("n0", "p0", 1, 0)]));
        let k = key("n0", "p0");
        let ks = std::slice::from_ref(&k);
        let load = sim.load(&k);
        sim.ready("n0", 1);
        let l = sim.acquire(&k, Normal).unwrap();
        let ws: Vec<_> = (0..3).map(|_| sim.wait(ks, Normal)).collect();
        sim.deliver_all();
        assert!(ws.iter().all(|w| w.is_waiting()));

        sim.reload(&config(3, &[("n0", "p0", 3, 0)]));
        assert!(Arc::ptr_eq(&load, &sim.load(&k)), "counters of a kept resource were not carried over");
        assert_eq!(load.configured_normal.load(Ordering::Acquire), 3);
        let states: Vec<_> = ws.iter().map(|w| w.state()).collect();
        assert_eq!(states, [WaiterState::Granted, WaiterState::Granted, WaiterState::Waiting]);
        assert_eq!(sim.in_use(&k), (3, 0));
        let leases: Vec<_> = ws[..2].iter().map(|w| take(w)).collect();
        for w in &ws {
            sim.leave(w, ks);
        }
        drop((l, leases));
        sim.deliver_all();
        sim.assert_idle(&k);
    })
}

#[test]
fn reload_removing_a_resource_ends_its_waiters_candidacy() {
    run(async {
        let mut sim = Sim::new(&config(3, &[("n0", "p0", 1, 0), ("n0", "p1", 1, 0)]));
        let (gone, kept) = (key("n0", "p0"), key("n0", "p1"));
        let old_load = sim.load(&gone);
        sim.ready("n0", 1);
        let lg = sim.acquire(&gone, Normal).unwrap();
        let lk = sim.acquire(&kept, Normal).unwrap();
        let only = sim.wait(std::slice::from_ref(&gone), Normal);
        let both = sim.wait(&[gone.clone(), kept.clone()], Normal);
        sim.deliver_all();

        sim.reload(&config(3, &[("n0", "p1", 1, 0)]));
        assert_eq!(only.state(), WaiterState::Unavailable, "no candidate left after the reload");
        assert_eq!(both.state(), WaiterState::Waiting);
        assert!(!old_load.online.load(Ordering::Acquire));
        assert!(sim.shards[sim.owner(&gone)].in_use(&gone).is_none());

        // A wait that reaches the owner after the removal does not count either.
        let late = sim.wait(std::slice::from_ref(&gone), Normal);
        sim.deliver_all();
        assert_eq!(late.state(), WaiterState::Unavailable);

        drop(lk);
        sim.deliver_all();
        assert_eq!(both.state(), WaiterState::Granted);
        let lease = take(&both);
        assert_eq!(lease.key(), &kept);

        // The removed resource's lease still releases exactly once (as a stray).
        drop(lg);
        sim.deliver_all();
        assert_eq!(sim.shards[sim.owner(&gone)].stray_releases, 1);
        assert_eq!(old_load.live_guards.load(Ordering::Acquire), 0);
        for w in [&only, &both, &late] {
            sim.leave(w, &[gone.clone(), kept.clone()]);
        }
        drop(lease);
        sim.deliver_all();
        sim.assert_idle(&kept);
    })
}

#[test]
fn reload_adding_a_provider_to_a_ready_node_starts_it_online() {
    run(async {
        let mut sim = Sim::new(&config(3, &[("n0", "p0", 1, 0), ("n1", "p0", 1, 0)]));
        sim.ready("n0", 4);
        let specs = [("n0", "p0", 1, 0), ("n0", "p1", 2, 0), ("n1", "p0", 1, 0), ("n1", "p1", 1, 0)];
        sim.reload(&config(3, &specs));
        let (added, down) = (key("n0", "p1"), key("n1", "p1"));
        assert!(sim.online(&added), "new provider of a ready node is offline");
        assert!(!sim.online(&down), "new provider of a node that is not ready is online");
        let l = sim.acquire(&added, Normal).expect("added provider serves");
        assert_eq!(l.route().map(|r| r.generation), Some(4));
        // It belongs to the node's current generation: that generation's gone takes it offline.
        sim.gone("n0", 3);
        assert!(sim.online(&added));
        sim.gone("n0", 4);
        assert!(!sim.online(&added));
        drop(l);
        sim.deliver_all();
        for (n, p, ..) in specs {
            sim.assert_idle(&key(n, p));
        }
    })
}

#[test]
fn leases_carry_the_route_of_the_granting_generation() {
    run(async {
        let mut sim = Sim::new(&config(3, &[("n0", "p0", 1, 0)]));
        let k = key("n0", "p0");
        let ks = std::slice::from_ref(&k);
        sim.ready("n0", 1);
        let l1 = sim.acquire(&k, Normal).unwrap();
        assert_eq!(l1.route().map(|r| r.generation), Some(1));
        let w = sim.wait(ks, Normal);
        sim.deliver_all();
        // Reconnect whose ready overtook the old gone: grants go to the new connection.
        sim.broadcast_ready("n0", 2);
        sim.broadcast_gone("n0", 1);
        sim.deliver_all();
        drop(l1);
        sim.deliver_all();
        let l2 = take(&w);
        assert_eq!(l2.route().map(|r| r.generation), Some(2));
        sim.leave(&w, ks);
        drop(l2);
        sim.deliver_all();
        sim.assert_idle(&k);
    })
}

#[test]
fn lease_outliving_remove_and_readd_does_not_free_new_capacity() {
    run(async {
        let both = [("n0", "p0", 1, 0), ("n0", "p1", 1, 0)];
        let mut sim = Sim::new(&config(3, &both));
        let k = key("n0", "p0");
        sim.ready("n0", 1);
        let old = sim.acquire(&k, Normal).unwrap();
        // Reload 1 removes the provider, reload 2 adds it back (online at once:
        // the node is still ready); the run holding `old` goes on meanwhile.
        sim.reload(&config(3, &[("n0", "p1", 1, 0)]));
        sim.reload(&config(3, &both));
        let new = sim.acquire(&k, Normal).expect("re-added resource serves");
        assert_eq!((sim.in_use(&k), sim.guards(&k)), ((1, 0), 1));
        drop(old);
        sim.deliver_all();
        // The old lease's release must not count against the new incarnation.
        assert_eq!(sim.in_use(&k), (1, 0), "in use dropped below the live guards of the resource");
        let third = sim.acquire(&k, Normal);
        assert!(third.is_none(), "capacity 1 handed out a second concurrent lease");
        drop((new, third));
        sim.deliver_all();
        sim.assert_idle(&k);
    })
}

// ---------------------------------------------------------------------------
// Randomized stress: 3 cores, 2 nodes x 2 providers, small capacities.

/// xorshift64: tiny and deterministic.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

struct Tracked {
    w: Arc<Waiter>,
    keys: Vec<ResourceKey>,
    /// The client side is finished with it (left the queue).
    done: bool,
    /// Its lease was taken out.
    taken: bool,
    /// State at the previous check.
    last: WaiterState,
}

#[derive(Debug, Default)]
struct Stats {
    acquired: u64,
    refused: u64,
    granted: u64,
    unavailable: u64,
    cancelled: u64,
    abandoned_granted: u64,
    fences: u64,
    messages: u64,
    max_backlog: usize,
}

struct Stress {
    seed: u64,
    step: usize,
    rng: Rng,
    sim: Sim,
    keys: Vec<ResourceKey>,
    /// (node, current generation, online) as last broadcast.
    nodes: Vec<(String, Generation, bool)>,
    held: Vec<Lease>,
    pending: Vec<(OneshotReceiver<Option<Lease>>, ResourceKey, LeaseClass)>,
    waiters: Vec<Tracked>,
    stats: Stats,
}

impl Stress {
    fn new(seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        let names = [("n0", "p0"), ("n0", "p1"), ("n1", "p0"), ("n1", "p1")];
        let caps: Vec<(u32, u32)> = names.iter().map(|_| (1 + rng.below(3) as u32, rng.below(2) as u32)).collect();
        let specs: Vec<Spec<'_>> = names.iter().zip(&caps).map(|((n, p), (c, l))| (*n, *p, *c, *l)).collect();
        let sim = Sim::new(&config(3, &specs));
        let keys = names.iter().map(|(n, p)| key(n, p)).collect();
        let nodes = vec![("n0".to_owned(), 0, false), ("n1".to_owned(), 0, false)];
        Self {
            seed,
            step: 0,
            rng,
            sim,
            keys,
            nodes,
            held: Vec::new(),
            pending: Vec::new(),
            waiters: Vec::new(),
            stats: Stats::default(),
        }
    }

    fn ctx(&self) -> String {
        format!("seed {} step {}", self.seed, self.step)
    }

    fn class(&mut self) -> LeaseClass {
        if self.rng.below(4) == 0 {
            Long
        } else {
            Normal
        }
    }

    fn configured(&self, key: &ResourceKey, class: LeaseClass) -> u32 {
        let load = self.sim.load(key);
        match class {
            Normal => load.configured_normal.load(Ordering::Acquire),
            Long => load.configured_long.load(Ordering::Acquire),
        }
    }

    fn step(&mut self) {
        match self.rng.below(100) {
            0..=9 => self.acquire(),
            10..=21 => self.register(),
            22..=25 => self.abandon(),
            26..=39 => self.resolve(),
            40..=59 => self.drop_lease(),
            60..=63 => self.fence(),
            64..=65 => self.stale_gone(),
            _ => self.deliver(),
        }
        self.check();
    }

    fn acquire(&mut self) {
        let key = self.keys[self.rng.below(self.keys.len())].clone();
        let class = self.class();
        let rx = self.sim.acquire_msg(&key, class);
        self.pending.push((rx, key, class));
    }

    fn register(&mut self) {
        if self.waiters.iter().filter(|t| !t.done).count() >= 24 {
            return self.abandon();
        }
        let class = self.class();
        // As `admit`: only candidates that could ever serve this class...
        let mut eligible: Vec<_> = self.keys.iter().filter(|k| self.configured(k, class) > 0).cloned().collect();
        if eligible.is_empty() {
            return;
        }
        for i in (1..eligible.len()).rev() {
            let j = self.rng.below(i + 1);
            eligible.swap(i, j);
        }
        eligible.truncate(1 + self.rng.below(eligible.len().min(4)));
        // ...and only when one of them is published online.
        if !eligible.iter().any(|k| self.sim.online(k)) {
            return;
        }
        let w = self.sim.wait(&eligible, class);
        self.waiters.push(Tracked { w, keys: eligible, done: false, taken: false, last: WaiterState::Waiting });
    }

    fn pick_waiter(&mut self, want: impl Fn(&Tracked) -> bool) -> Option<usize> {
        let idx: Vec<usize> = (0..self.waiters.len()).filter(|&i| want(&self.waiters[i])).collect();
        (!idx.is_empty()).then(|| idx[self.rng.below(idx.len())])
    }

    fn abandon(&mut self) {
        let Some(i) = self.pick_waiter(|t| !t.done) else { return };
        let before = self.waiters[i].w.state();
        let (w, keys) = (self.waiters[i].w.clone(), self.waiters[i].keys.clone());
        self.sim.leave(&w, &keys);
        let after = w.state();
        match before {
            WaiterState::Waiting => {
                assert_eq!(after, WaiterState::Cancelled, "{}", self.ctx());
                self.stats.cancelled += 1;
            }
            WaiterState::Granted => {
                assert_eq!(after, WaiterState::Granted, "{}", self.ctx());
                self.stats.abandoned_granted += 1;
            }
            other => assert_eq!(after, other, "{}", self.ctx()),
        }
        self.waiters[i].done = true;
        self.waiters[i].last = after;
    }

    fn resolve(&mut self) {
        let Some(i) = self.pick_waiter(|t| !t.done && !t.w.is_waiting()) else { return };
        let (w, keys) = (self.waiters[i].w.clone(), self.waiters[i].keys.clone());
        match poll_once(w.outcome()) {
            Poll::Ready(Ok(lease)) => {
                assert!(keys.contains(lease.key()), "{}: lease on a non-candidate {lease:?}", self.ctx());
                assert_eq!(lease.class(), w.class, "{}", self.ctx());
                self.check_route(&lease);
                self.held.push(lease);
                self.waiters[i].taken = true;
            }
            Poll::Ready(Err(WaiterState::Unavailable)) => {}
            other => panic!("{}: waiter in state {:?} resolved to {other:?}", self.ctx(), w.state()),
        }
        // The admission guard leaves the queues however the wait ended.
        self.sim.leave(&w, &keys);
        self.waiters[i].done = true;
    }

    fn drop_lease(&mut self) {
        if !self.held.is_empty() {
            let i = self.rng.below(self.held.len());
            drop(self.held.swap_remove(i));
        }
    }

    fn fence(&mut self) {
        let i = self.rng.below(self.nodes.len());
        let (node, generation, online) = self.nodes[i].clone();
        if online {
            // Nodes stay up about two thirds of the time.
            if self.rng.below(2) == 0 {
                return;
            }
            self.sim.broadcast_gone(&node, generation);
            self.nodes[i].2 = false;
        } else {
            self.sim.broadcast_ready(&node, generation + 1);
            self.nodes[i] = (node, generation + 1, true);
        }
        self.stats.fences += 1;
    }

    /// A gone of an older (or, when offline, the just-ended) generation: ignored.
    fn stale_gone(&mut self) {
        let i = self.rng.below(self.nodes.len());
        let (node, generation, online) = self.nodes[i].clone();
        let stale = if online { self.rng.below(generation as usize) as Generation } else { generation };
        self.sim.broadcast_gone(&node, stale);
    }

    fn deliver(&mut self) {
        let core = self.rng.below(self.sim.workers);
        for _ in 0..1 + self.rng.below(10) {
            if !self.sim.deliver_one(core) {
                break;
            }
            self.stats.messages += 1;
            self.stats.max_backlog = self.stats.max_backlog.max(self.sim.queued());
            self.check();
        }
    }

    /// A lease is granted only while its node is ready, and names that connection.
    fn check_route(&self, lease: &Lease) {
        let node = &self.nodes.iter().find(|n| *n.0 == *lease.key().node).expect("known node");
        let generation = lease.route().map(|r| r.generation);
        assert!(
            generation.is_some_and(|g| (1..=node.1).contains(&g)),
            "{}: lease {lease:?} carries route generation {generation:?}, node at {}",
            self.ctx(),
            node.1
        );
    }

    /// Collects answered acquires, then checks every invariant.
    fn check(&mut self) {
        let mut i = 0;
        while i < self.pending.len() {
            match poll_reply(&mut self.pending[i].0) {
                Poll::Pending => i += 1,
                Poll::Ready(reply) => {
                    let (_, key, class) = self.pending.swap_remove(i);
                    match reply {
                        Some(Some(lease)) => {
                            assert_eq!((lease.key(), lease.class()), (&key, class), "{}", self.ctx());
                            self.check_route(&lease);
                            self.held.push(lease);
                            self.stats.acquired += 1;
                        }
                        Some(None) => self.stats.refused += 1,
                        None => panic!("{}: acquire of {key} dropped unanswered", self.ctx()),
                    }
                }
            }
        }

        // Counters: never above the configured capacity; guards never above in-use.
        let mut guards = 0;
        for k in &self.keys {
            let (n, l) = self.sim.in_use(k);
            let load = self.sim.load(k);
            assert!(n <= self.configured(k, Normal), "{}: {k} normal {n} over capacity", self.ctx());
            assert!(l <= self.configured(k, Long), "{}: {k} long {l} over capacity", self.ctx());
            assert_eq!(load.in_use_normal.load(Ordering::Acquire), n, "{}: {k} published normal", self.ctx());
            assert_eq!(load.in_use_long.load(Ordering::Acquire), l, "{}: {k} published long", self.ctx());
            let g = self.sim.guards(k);
            assert!((0..=i64::from(n + l)).contains(&g), "{}: {k} guards {g}, in use {n}+{l}", self.ctx());
            guards += g;
        }

        // Waiters.
        let mut parked = 0;
        for t in &mut self.waiters {
            let state = t.w.state();
            let (seed, step, seq) = (self.seed, self.step, t.w.seq);
            let ctx = || format!("seed {seed} step {step} waiter {seq}");
            // Ended in this check (checks run after every applied message).
            let fresh = t.last == WaiterState::Waiting && state != WaiterState::Waiting;
            if t.last != WaiterState::Waiting {
                assert_eq!(state, t.last, "{}: an ended waiter changed state", ctx());
            }
            match state {
                WaiterState::Granted if fresh => self.stats.granted += 1,
                WaiterState::Unavailable if fresh => self.stats.unavailable += 1,
                _ => {}
            }
            t.last = state;
            if t.done {
                continue;
            }
            let addr = Arc::as_ptr(&t.w) as usize;
            let applied = |k: &ResourceKey| self.sim.waits_applied.contains(&(addr, k.clone()));
            let all_gone = t.keys.iter().all(|k| applied(k) && !self.sim.online(k));
            match state {
                WaiterState::Granted => parked += 1,
                WaiterState::Unavailable => {
                    assert!(!fresh || all_gone, "{}: unavailable while a candidate is live", ctx())
                }
                WaiterState::Waiting => {
                    assert!(!all_gone, "{}: every candidate went away but it still waits", ctx());
                    // A lease given back reaches the owner as a message while
                    // someone waits: with that still undelivered, the room is
                    // not granted yet.
                    let settled = |k: &ResourceKey| self.sim.inboxes[self.sim.owner(k)].is_empty();
                    for k in t.keys.iter().filter(|k| applied(k) && self.sim.online(k) && settled(k)) {
                        let cap = self.sim.load(k).capacity(t.w.class);
                        let (n, l) = self.sim.in_use(k);
                        let used = if t.w.class == Normal { n } else { l };
                        assert!(used >= cap, "{}: waits while {k} has room ({used}/{cap})", ctx());
                    }
                }
                WaiterState::Cancelled => panic!("{}: cancelled without abandon", ctx()),
            }
        }
        // Every lease alive is held by the test or parked in a granted waiter.
        if guards != (self.held.len() + parked) as i64 {
            for k in &self.keys {
                eprintln!(
                    "{k}: in_use {:?} guards {} online {}",
                    self.sim.in_use(k),
                    self.sim.guards(k),
                    self.sim.online(k)
                );
            }
            eprintln!("held {:?}", self.held);
            for t in &self.waiters {
                eprintln!(
                    "w{} {:?} {:?} keys {:?} done {} taken {} last {:?}",
                    t.w.seq,
                    t.w.class,
                    t.w.state(),
                    t.keys,
                    t.done,
                    t.taken,
                    t.last
                );
            }
        }
        assert_eq!(guards, (self.held.len() + parked) as i64, "{}: lease guards unaccounted", self.ctx());
    }

    fn finish(&mut self) {
        for i in 0..self.waiters.len() {
            if !self.waiters[i].done {
                let (w, keys) = (self.waiters[i].w.clone(), self.waiters[i].keys.clone());
                self.sim.leave(&w, &keys);
                self.waiters[i].done = true;
            }
        }
        self.held.clear();
        loop {
            self.sim.deliver_all();
            self.check();
            self.held.clear();
            if self.sim.queued() == 0 && self.pending.is_empty() {
                break;
            }
        }
        for t in self.waiters.iter().filter(|t| t.taken) {
            assert!(poll_once(t.w.outcome()).is_pending(), "seed {}: waiter {} granted twice", self.seed, t.w.seq);
        }
        for k in self.keys.clone() {
            self.sim.assert_idle(&k);
        }
    }
}

#[test]
fn randomized_stress_keeps_every_counter_exact() {
    run(async {
        let started = Instant::now();
        let mut total = Stats::default();
        for seed in 1..=20 {
            let mut s = Stress::new(seed);
            for step in 0..2000 {
                s.step = step;
                s.step();
            }
            s.finish();
            let st = &s.stats;
            total.acquired += st.acquired;
            total.refused += st.refused;
            total.granted += st.granted;
            total.unavailable += st.unavailable;
            total.cancelled += st.cancelled;
            total.abandoned_granted += st.abandoned_granted;
            total.fences += st.fences;
            total.messages += st.messages;
            total.max_backlog = total.max_backlog.max(st.max_backlog);
        }
        eprintln!("pool stress: {total:?} in {:?}", started.elapsed());
        // The workload reached every interesting path.
        assert!(total.acquired > 0 && total.refused > 0, "{total:?}");
        assert!(total.granted > 0 && total.unavailable > 0 && total.cancelled > 0, "{total:?}");
        assert!(total.abandoned_granted > 0 && total.fences > 0, "{total:?}");
    })
}

/// A node comes back (a new generation) while requests queue for it, with
/// the share it announced on its ready already applied: the queue is
/// granted within that share, not within the configured capacity. (Found
/// by `iop-sim` driving the real shard: the grant read the generation the
/// share is keyed by before the shard had published the new one.)
#[test]
fn a_node_back_with_a_share_grants_its_queue_within_the_share() {
    run(async {
        let mut sim = Sim::new(&config(1, &[("n0", "p0", 4, 0), ("n1", "p0", 1, 0)]));
        let (k, busy) = (key("n0", "p0"), key("n1", "p0"));
        let both = [k.clone(), busy.clone()];
        sim.ready("n0", 1);
        sim.ready("n1", 1);
        sim.gone("n0", 1);
        // The other candidate is full: the requests queue on both.
        let held = sim.acquire(&busy, Normal).unwrap();
        let waiters: Vec<_> = (0..4).map(|_| sim.wait(&both, Normal)).collect();
        sim.deliver_all();
        assert!(waiters.iter().all(|w| w.state() == WaiterState::Waiting));
        // The ready of generation 2 carries a share of 1 (applied first).
        assert!(sim.load(&k).share.apply(2, 1, 1, 0));
        sim.ready("n0", 2);
        sim.deliver_all();
        let granted = waiters.iter().filter(|w| w.state() == WaiterState::Granted).count();
        assert_eq!(granted, 1, "granted past the share of 1");
        assert_eq!(sim.in_use(&k), (1, 0));
        let leases: Vec<Lease> =
            waiters.iter().filter(|w| w.state() == WaiterState::Granted).map(|w| take(w)).collect();
        for w in &waiters {
            sim.leave(w, &both);
        }
        drop((leases, held));
        sim.deliver_all();
        sim.assert_idle(&k);
        sim.assert_idle(&busy);
    })
}
