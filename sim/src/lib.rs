//! A deterministic simulation of capacity shares (issue 28): many nodes,
//! several edges, skewed demand, edges and nodes joining, leaving and
//! flapping, in virtual time from one seed.
//!
//! What is real and what is modelled:
//! - **Real, the node**: its share table and rebalancing
//!   ([`iop_node::share::Shares`]) and its gates ([`iop_node::run::Gates`]:
//!   the per-class, per-edge slot counts).
//! - **Real, the edge**: each edge is one core's [`Shard`] (the owner
//!   core's queues, grants, generation fences) over a [`PoolView`] built
//!   from a generated [`EdgeConfig`] (one model group per `group` nodes);
//!   candidates ordered by [`iop_edge::pool::plan`]; [`Waiter`]s queued on
//!   every candidate and polled when their waker fires; [`Lease`] guards
//!   whose drop gives the slot back and posts the release to the owner's
//!   inbox, which the simulation delivers to the shard; announcements
//!   applied and demand read by [`iop_edge::pool::shares`], reported on its
//!   period ([`REPORT_EVERY`], [`REPORT_ANYWAY`]).
//! - **Modelled**: the wire (a fixed one-way delay), the clock (virtual;
//!   the queue timeout is an event), which nodes' demand is looked at on a
//!   tick (those whose counts changed, and every node every
//!   [`REPORT_ANYWAY`], which reports the same as looking at all), run
//!   durations (exponential) and arrivals (Poisson per edge, skewed). The
//!   loop of `pool::admit` (free capacity first, else queue on every
//!   candidate, abandon and compact when the wait ends) is followed step
//!   for step on one core, without its cross-core messages.
//!
//! Invariants checked on every event that touches a node: its gate never
//! runs more than the capacity; what each edge may act on (its applied
//! share, or its in-use count when above it) never adds up past the
//! capacity; the gate's and the edges' counts match the runs the
//! simulation holds (no slot lost, none released twice). At the end every
//! slot is back, every lease guard dropped and every queue empty. A waiter
//! that times out while its group had idle capacity it could have been
//! given is counted as starved (the report must show none).

use std::{
    cmp::Reverse,
    collections::{BinaryHeap, HashMap},
    fmt::Write as _,
    sync::{atomic::Ordering, Arc, Mutex, PoisonError},
    task::{Context, Poll, Wake, Waker},
};

use iop_core::{
    config::{ConfigError, EdgeConfig},
    rt::mailbox,
    wire::pb,
};
use iop_edge::{
    mesh::CoreMsg,
    pool::{
        self,
        shares::{self as edge_shares, REPORT_ANYWAY, REPORT_EVERY},
        Lease, LeaseClass, PoolView, ResourceKey, Shard, Waiter,
    },
};
use iop_node::{
    run::{Class, Gate, Gates},
    share::{Membership, Shares},
};

/// What to simulate.
#[derive(Debug, Clone)]
pub struct Params {
    pub seed: u64,
    pub nodes: usize,
    pub edges: usize,
    /// Nodes per model group (a request may run on any node of its group).
    pub group: usize,
    /// Slots per node (one provider, normal class).
    pub capacity: u32,
    /// Simulated time, seconds.
    pub seconds: f64,
    /// Requests per simulated minute, all edges together.
    pub requests_per_minute: f64,
    /// Mean run duration, seconds.
    pub mean_run_s: f64,
    pub queue_timeout_s: f64,
    /// Edge `i` gets weight `skew^i` of the arrivals (1: even).
    pub skew: f64,
    /// Edges and nodes join, leave and flap.
    pub churn: bool,
    /// One-way wire delay, milliseconds.
    pub wire_ms: f64,
    /// Utilisation is measured after this much simulated time, seconds.
    pub warmup_s: f64,
}

impl Params {
    /// The size: 10 000 nodes, 8 edges, 1 000 000 requests a minute.
    pub fn full() -> Self {
        Self {
            seed: 1,
            nodes: 10_000,
            edges: 8,
            group: 8,
            capacity: 4,
            seconds: 60.0,
            requests_per_minute: 1_000_000.0,
            // 40 000 slots; 16 667 requests/s of 3.6 s each want 60 000: saturated
            // (still with the busiest edge down).
            mean_run_s: 3.6,
            queue_timeout_s: 10.0,
            skew: 0.7,
            churn: true,
            wire_ms: 1.0,
            warmup_s: 10.0,
        }
    }

    /// A form that runs in seconds (CI).
    pub fn reduced() -> Self {
        Self { nodes: 200, edges: 4, seconds: 40.0, requests_per_minute: 20_000.0, warmup_s: 8.0, ..Self::full() }
    }
}

/// What a run measured.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub requests: u64,
    pub served: u64,
    pub timed_out: u64,
    /// Timed out while their group had capacity they could have had.
    pub starved: u64,
    /// Lost with an edge or node that went away (queued or running).
    pub lost: u64,
    /// Runs a node's gate refused (the edge's share said yes).
    pub gate_refusals: u64,
    /// Refused at admission (no candidate online, or the queue full).
    pub refused: u64,
    /// Mean fraction of live capacity in use after the warm-up.
    pub utilisation: f64,
    /// After an edge left: until the others held 95% of what all held
    /// before (its share moved to them), ms (worst).
    pub rebalance_after_leave_ms: f64,
    /// After an edge joined: until, node by node, its shares covered what
    /// it asks for (in use and queued) up to its fair part, 90% of it over
    /// all nodes, ms (worst).
    /// Under saturation a share grows only as other edges' runs end (no
    /// slot in use is taken back).
    pub rebalance_after_join_ms: f64,
    /// Joins and leaves whose rebalance was not done by the end (counted
    /// in the times above as lasting to the end).
    pub rebalances_unfinished: u64,
    pub events: u64,
    pub invariant_checks: u64,
    pub simulated_s: f64,
}

type Time = u64; // microseconds

fn us(s: f64) -> Time {
    (s * 1e6) as Time
}

#[derive(Debug)]
enum Ev {
    Arrival {
        edge: usize,
    },
    /// The run reaches the node.
    Dispatch {
        run: u64,
    },
    Complete {
        run: u64,
    },
    /// The queue timeout of waiting request `req`.
    Timeout {
        req: u64,
    },
    /// A node's announcement reaches an edge.
    Apply {
        edge: usize,
        node: usize,
        conn: u64,
        shares: pb::CapacityShares,
    },
    /// An edge's demand report reaches a node.
    Report {
        edge: usize,
        node: usize,
        conn: u64,
        demand: pb::ShareDemand,
    },
    ReportTick {
        edge: usize,
    },
    EdgeDown {
        edge: usize,
        back_after: Option<f64>,
    },
    EdgeUp {
        edge: usize,
    },
    NodeDown {
        node: usize,
        back_after: f64,
    },
    NodeUp {
        node: usize,
    },
    Sample,
}

struct Run {
    edge: usize,
    node: usize,
    group: usize,
    conn: u64,
    at_node: bool,
    /// The edge's lease guard; dropped when the run ends.
    lease: Lease,
}

struct NodeSim {
    up: bool,
    gate: Arc<Gate>,
    shares: Arc<Shares>,
    /// Per edge: the membership of its link and where announcements land.
    links: Vec<Option<(Membership, mailbox::Receiver<pb::CapacityShares>)>>,
    /// Runs held at this node's gate, per edge (the simulation's own count).
    held: Vec<u32>,
    /// Idle slot-seconds so far, as of `idle_at`.
    idle: f64,
    idle_at: Time,
}

/// One edge process with one core: the real pool and owner shard.
struct EdgeSim {
    up: bool,
    weight: f64,
    view: Arc<PoolView>,
    shard: Shard,
    /// The core's inbox: lease guards post their releases here.
    inbox: mailbox::Receiver<CoreMsg>,
    /// Per node: the connection generation ready here (0: none).
    conn: Vec<u64>,
    last_report: Vec<Option<(pb::ShareDemand, Time)>>,
    /// Leases the simulation's runs hold per node (its own count).
    leased: Vec<u32>,
    /// Nodes whose demand may have changed since the last tick (a lease,
    /// a queue of their group); the others are looked at every
    /// [`REPORT_ANYWAY`].
    dirty: Vec<bool>,
    dirty_list: Vec<usize>,
    /// When every node was last looked at.
    full_scan_at: Time,
}

impl EdgeSim {
    /// A freshly started edge process (nothing ready, nothing queued).
    fn start(config: &EdgeConfig, weight: f64, nodes: usize) -> Self {
        let view = Arc::new(PoolView::build(config, None));
        let (tx, inbox) = mailbox::mailbox(INBOX);
        let mut shard = Shard::new(0, 1, tx);
        shard.apply_config(config, &view);
        Self {
            up: true,
            weight,
            view,
            shard,
            inbox,
            conn: vec![0; nodes],
            last_report: vec![None; nodes],
            leased: vec![0; nodes],
            dirty: vec![false; nodes],
            dirty_list: Vec::new(),
            full_scan_at: 0,
        }
    }

    /// The load of `key` (every node of the generated config has one).
    fn load(&self, key: &ResourceKey) -> &pool::ResourceLoad {
        &self.view.resources[key]
    }
}

/// A waiting request: its waiter, queued on every candidate of its group.
struct Wait {
    edge: usize,
    group: usize,
    waiter: Arc<Waiter>,
    waker: Waker,
    keys: Vec<ResourceKey>,
    /// Its group's idle slot-seconds when it queued.
    idle_at_enqueue: f64,
}

/// Wakes a waiting request: notes its id for the simulation to poll.
struct WakeReq {
    req: u64,
    woken: Arc<Mutex<Vec<u64>>>,
}

impl Wake for WakeReq {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.lock().unwrap_or_else(PoisonError::into_inner).push(self.req);
    }
}

/// The simulation.
pub struct Sim {
    p: Params,
    now: Time,
    seq: u64,
    rng: u64,
    queue: BinaryHeap<Reverse<(Time, u64, usize)>>,
    events: HashMap<usize, Ev>,
    next_event: usize,
    config: Arc<EdgeConfig>,
    /// Node `n`'s resource.
    keys: Vec<ResourceKey>,
    node_index: HashMap<Arc<str>, usize>,
    nodes: Vec<NodeSim>,
    edges: Vec<EdgeSim>,
    runs: HashMap<u64, Run>,
    waiting: HashMap<u64, Wait>,
    woken: Arc<Mutex<Vec<u64>>>,
    next_id: u64,
    next_conn: u64,
    report: Report,
    busy_integral: f64,
    cap_integral: f64,
    last_sample: Time,
    /// Pending rebalance measurements: (a join, edge, since, what every
    /// edge held before a leave).
    pending: Vec<(bool, usize, Time, u64)>,
}

impl Sim {
    /// A simulation of `p`; fails only if the generated edge config does
    /// not validate.
    pub fn new(p: Params) -> Result<Self, ConfigError> {
        let config = Arc::new(edge_config(&p)?);
        let total_weight: f64 = (0..p.edges).map(|i| p.skew.powi(i as i32)).sum();
        let edges =
            (0..p.edges).map(|i| EdgeSim::start(&config, p.skew.powi(i as i32) / total_weight, p.nodes)).collect();
        let keys: Vec<ResourceKey> = (0..p.nodes).map(|n| ResourceKey::new(&node_id(n), PROVIDER)).collect();
        let node_index = keys.iter().enumerate().map(|(n, k)| (k.node.clone(), n)).collect();
        let mut sim = Sim {
            rng: p.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1,
            p: p.clone(),
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            events: HashMap::new(),
            next_event: 0,
            config,
            keys,
            node_index,
            nodes: Vec::new(),
            edges,
            runs: HashMap::new(),
            waiting: HashMap::new(),
            woken: Arc::default(),
            next_id: 0,
            next_conn: 0,
            report: Report::default(),
            busy_integral: 0.0,
            cap_integral: 0.0,
            last_sample: 0,
            pending: Vec::new(),
        };
        for n in 0..p.nodes {
            sim.nodes.push(new_node(&p));
            for e in 0..p.edges {
                sim.link(e, n);
            }
        }
        for e in 0..p.edges {
            sim.at(0, Ev::Arrival { edge: e });
            sim.at(us(0.2), Ev::ReportTick { edge: e });
        }
        sim.at(us(0.1), Ev::Sample);
        if p.churn {
            sim.plan_churn();
        }
        Ok(sim)
    }

    fn rand(&mut self) -> f64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        (self.rng >> 11) as f64 / (1u64 << 53) as f64
    }

    fn below(&mut self, n: usize) -> usize {
        ((self.rand() * n as f64) as usize).min(n.saturating_sub(1))
    }

    fn exp(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.rand()).ln()
    }

    fn at(&mut self, t: Time, ev: Ev) {
        self.seq += 1;
        let id = self.next_event;
        self.next_event += 1;
        self.events.insert(id, ev);
        self.queue.push(Reverse((t, self.seq, id)));
    }

    fn after_wire(&mut self, ev: Ev) {
        let t = self.now + us(self.p.wire_ms / 1000.0);
        self.at(t, ev);
    }

    fn plan_churn(&mut self) {
        let s = self.p.seconds;
        // An edge leaves for good, another restarts, a third flaps.
        if self.p.edges >= 3 {
            self.at(us(s * 0.3), Ev::EdgeDown { edge: 1, back_after: Some(s * 0.25) });
            self.at(us(s * 0.45), Ev::EdgeDown { edge: 2, back_after: Some(0.5) });
            self.at(us(s * 0.47), Ev::EdgeDown { edge: 2, back_after: Some(0.3) });
        }
        // A few percent of the nodes restart at random times; some flap.
        let restarts = (self.p.nodes / 50).max(2);
        for _ in 0..restarts {
            let n = self.below(self.p.nodes);
            let t = self.p.warmup_s + self.rand() * (s - self.p.warmup_s);
            let back = if self.rand() < 0.3 { 0.2 } else { 2.0 + self.rand() * 5.0 };
            self.at(us(t), Ev::NodeDown { node: n, back_after: back });
        }
    }

    /// Runs the simulation to its end, then lets every run finish and
    /// checks that every slot came back.
    pub fn run(mut self) -> Report {
        let end = us(self.p.seconds);
        while let Some(Reverse((t, _, id))) = self.queue.pop() {
            let Some(ev) = self.events.remove(&id) else { continue };
            self.now = t;
            self.report.events += 1;
            let draining = t >= end;
            match ev {
                Ev::Arrival { edge } if !draining => self.arrival(edge),
                Ev::Arrival { .. } => {}
                Ev::Dispatch { run } => self.dispatch(run),
                Ev::Complete { run } => self.complete(run),
                Ev::Timeout { req } => self.timeout(req),
                Ev::Apply { edge, node, conn, shares } => self.apply(edge, node, conn, &shares),
                Ev::Report { edge, node, conn, demand } => self.node_report(edge, node, conn, &demand),
                Ev::ReportTick { edge } => self.report_tick(edge, draining),
                Ev::EdgeDown { edge, back_after } if !draining => self.edge_down(edge, back_after),
                Ev::EdgeUp { edge } if !draining => self.edge_up(edge),
                Ev::NodeDown { node, back_after } if !draining => self.node_down(node, back_after),
                Ev::NodeUp { node } if !draining => self.node_up(node),
                Ev::Sample if !draining => self.sample(),
                _ => {}
            }
        }
        // A rebalance that never got there counts as lasting to the end.
        for (join, _, since, _) in std::mem::take(&mut self.pending) {
            let ms = end.saturating_sub(since) as f64 / 1000.0;
            let slot =
                if join { &mut self.report.rebalance_after_join_ms } else { &mut self.report.rebalance_after_leave_ms };
            *slot = slot.max(ms);
            self.report.rebalances_unfinished += 1;
        }
        self.report.simulated_s = self.p.seconds;
        self.report.utilisation = if self.cap_integral > 0.0 { self.busy_integral / self.cap_integral } else { 0.0 };
        self.check_quiescent();
        self.report
    }

    // ---- requests (the steps of `pool::admit`, on one core) ---------------

    fn arrival(&mut self, edge: usize) {
        let rate = self.p.requests_per_minute / 60.0 * self.edges[edge].weight;
        let next = self.now + us(self.exp(1.0 / rate));
        self.at(next, Ev::Arrival { edge });
        if !self.edges[edge].up {
            return;
        }
        self.report.requests += 1;
        let groups = self.config.models.len();
        let group = self.below(groups);
        let req = self.next_id;
        self.next_id += 1;
        self.admit(edge, group, req);
    }

    /// Admits request `req` to `group` at `edge`: a lease on the best
    /// candidate with room and nobody queued, else a waiter queued on every
    /// candidate until it is granted, times out, or none is left.
    fn admit(&mut self, edge: usize, group: usize, req: u64) {
        let model = self.config.models[group].clone();
        let e = &mut self.edges[edge];
        let plan = match pool::plan(&e.view, &model, LeaseClass::Normal, None, 0.0) {
            Ok(plan) => plan,
            Err(_) => {
                self.report.refused += 1;
                return;
            }
        };
        let granted = plan
            .cands
            .iter()
            .filter(|c| c.has_room(LeaseClass::Normal))
            .find_map(|c| e.shard.try_acquire(&c.key, LeaseClass::Normal));
        if let Some(lease) = granted {
            self.start_run(edge, group, req, lease);
            return;
        }
        let counter = e.view.waiters.get(&model.name).cloned().unwrap_or_default();
        if counter.fetch_add(1, Ordering::AcqRel) >= model.max_waiters {
            counter.fetch_sub(1, Ordering::AcqRel);
            self.report.refused += 1;
            return;
        }
        let waiter = Arc::new(Waiter::new(LeaseClass::Normal, req, plan.cands.len()));
        let keys: Vec<ResourceKey> = plan.cands.iter().map(|c| c.key.clone()).collect();
        for key in &keys {
            e.shard.wait(key, waiter.clone());
        }
        let waker = Waker::from(Arc::new(WakeReq { req, woken: self.woken.clone() }));
        let idle_at_enqueue = self.group_idle(group);
        self.waiting.insert(req, Wait { edge, group, waiter, waker, keys, idle_at_enqueue });
        let t = self.now + us(self.p.queue_timeout_s);
        self.at(t, Ev::Timeout { req });
        self.touch_group(edge, group);
        // The client's first poll: granted already, or registers its waker.
        self.poll_waiter(req);
        self.settle(edge);
    }

    /// Polls waiting request `req` as its client task would when woken.
    fn poll_waiter(&mut self, req: u64) {
        let Some(w) = self.waiting.get(&req) else { return };
        let outcome = w.waiter.poll_outcome(&mut Context::from_waker(&w.waker));
        match outcome {
            Poll::Pending => {}
            Poll::Ready(Ok(lease)) => {
                if let Some(w) = self.end_wait(req) {
                    self.start_run(w.edge, w.group, req, lease);
                }
            }
            Poll::Ready(Err(_)) => {
                // Every candidate went away.
                self.end_wait(req);
                self.report.refused += 1;
            }
        }
    }

    /// What `admit`'s wait guard does however the wait ends: leaves the
    /// count of waiters, abandons the waiter (releasing a lease granted
    /// meanwhile) and has each candidate's queue compacted.
    fn end_wait(&mut self, req: u64) -> Option<Wait> {
        let w = self.waiting.remove(&req)?;
        let e = &mut self.edges[w.edge];
        let model = &self.config.models[w.group];
        if let Some(c) = e.view.waiters.get(&model.name) {
            c.fetch_sub(1, Ordering::AcqRel);
        }
        w.waiter.abandon();
        for key in &w.keys {
            e.shard.compact(key);
        }
        self.touch_group(w.edge, w.group);
        Some(w)
    }

    /// Delivers `edge`'s inbox to its shard and polls the woken waiters,
    /// until neither has anything (a grant can end a wait, whose end can
    /// release a lease).
    fn settle(&mut self, edge: usize) {
        loop {
            let mut any = false;
            while let Some(msg) = self.edges[edge].inbox.try_recv() {
                any = true;
                let shard = &mut self.edges[edge].shard;
                match msg {
                    CoreMsg::Release { key, class, load } => shard.release(&key, class, &load),
                    CoreMsg::Pump { key } => shard.pump(&key),
                    CoreMsg::Compact { key } => shard.compact(&key),
                    CoreMsg::DropLease(lease) => drop(lease),
                    _ => {}
                }
            }
            let woken = std::mem::take(&mut *self.woken.lock().unwrap_or_else(PoisonError::into_inner));
            for req in woken {
                any = true;
                self.poll_waiter(req);
            }
            if !any {
                return;
            }
        }
    }

    fn start_run(&mut self, edge: usize, group: usize, req: u64, lease: Lease) {
        let n = self.node_index[&lease.key().node];
        let conn = self.edges[edge].conn[n];
        assert!(
            conn != 0,
            "t={} edge {edge} (up {}) granted a lease on node {n} (up {}) with no connection",
            self.now,
            self.edges[edge].up,
            self.nodes[n].up
        );
        self.edges[edge].leased[n] += 1;
        self.touch(edge, n);
        self.runs.insert(req, Run { edge, node: n, group, conn, at_node: false, lease });
        self.after_wire(Ev::Dispatch { run: req });
    }

    fn dispatch(&mut self, run: u64) {
        let Some(r) = self.runs.get(&run) else { return };
        let (edge, n, conn, group) = (r.edge, r.node, r.conn, r.group);
        if !self.linked(edge, n, conn) {
            // The link went away while the run was on the wire.
            self.drop_run(run, true);
            return;
        }
        self.account_idle(n);
        if !self.nodes[n].gate.try_take(Class::Normal, edge) {
            self.report.gate_refusals += 1;
            // Refused before the first byte: the edge gives the lease back
            // and admits the request again.
            self.drop_run(run, false);
            self.admit(edge, group, run);
            return;
        }
        self.nodes[n].held[edge] += 1;
        if let Some(r) = self.runs.get_mut(&run) {
            r.at_node = true;
        }
        let d = us(self.exp(self.p.mean_run_s));
        self.at(self.now + d, Ev::Complete { run });
        self.check_node(n);
    }

    fn complete(&mut self, run: u64) {
        if !self.runs.contains_key(&run) {
            return;
        }
        self.report.served += 1;
        self.drop_run(run, false);
    }

    /// Ends run `run` at the node (if it got there) and at its edge (its
    /// lease dropped: the slot back, the owner told when someone waits).
    fn drop_run(&mut self, run: u64, lost: bool) {
        let Some(r) = self.runs.remove(&run) else { return };
        if lost {
            self.report.lost += 1;
        }
        if r.at_node && self.nodes[r.node].up {
            self.account_idle(r.node);
            self.nodes[r.node].gate.give(Class::Normal, r.edge);
            self.nodes[r.node].held[r.edge] -= 1;
            if self.nodes[r.node].links[r.edge].is_none() {
                self.nodes[r.node].shares.drained(r.edge);
                self.announce(r.node);
            }
            self.check_node(r.node);
        }
        self.edges[r.edge].leased[r.node] -= 1;
        self.touch(r.edge, r.node);
        drop(r.lease);
        self.settle(r.edge);
    }

    /// Node `n`'s demand at `edge` may have changed.
    fn touch(&mut self, edge: usize, n: usize) {
        let e = &mut self.edges[edge];
        if !e.dirty[n] {
            e.dirty[n] = true;
            e.dirty_list.push(n);
        }
    }

    /// The demand of every node of `group` at `edge` may have changed (its queues did).
    fn touch_group(&mut self, edge: usize, group: usize) {
        let lo = group * self.p.group;
        for n in lo..(lo + self.p.group).min(self.p.nodes) {
            self.touch(edge, n);
        }
    }

    fn timeout(&mut self, req: u64) {
        let Some(w) = self.end_wait(req) else { return };
        self.report.timed_out += 1;
        // Starved: over its wait, its group's nodes had on average half a
        // slot or more idle (what a share on the wire or a run that just
        // ended leaves for a moment is far less).
        let idle_slot_s = self.group_idle(w.group) - w.idle_at_enqueue;
        if idle_slot_s >= 0.5 * self.p.queue_timeout_s {
            self.report.starved += 1;
        }
        self.settle(w.edge);
    }

    // ---- shares ----------------------------------------------------------

    fn linked(&self, edge: usize, n: usize, conn: u64) -> bool {
        self.edges[edge].up
            && self.nodes[n].up
            && self.nodes[n].links[edge].is_some()
            && self.edges[edge].conn[n] == conn
    }

    /// Edge `edge` and node `n` connect: the node joins it to its table;
    /// the ready carries the shares, applied before the node is ready on
    /// the edge's cores (as `transport::session` does).
    fn link(&mut self, edge: usize, n: usize) {
        self.next_conn += 1;
        let conn = self.next_conn;
        let (tx, rx) = mailbox::mailbox(64);
        let (m, mine) = self.nodes[n].shares.join(edge, tx);
        self.nodes[n].links[edge] = Some((m, rx));
        let e = &mut self.edges[edge];
        e.conn[n] = conn;
        e.last_report[n] = None;
        let node = self.keys[n].node.clone();
        let EdgeSim { view, shard, .. } = e;
        edge_shares::apply(view, &node, conn, &mine, |key| shard.pump(&key));
        shard.node_ready(&node, conn);
        self.settle(edge);
        self.announce(n);
        self.send_report(edge, n);
    }

    /// Delivers node `n`'s pending announcements over the wire.
    fn announce(&mut self, n: usize) {
        let mut out = Vec::new();
        for (edge, l) in self.nodes[n].links.iter().enumerate() {
            if let Some((_, rx)) = l {
                while let Some(s) = rx.try_recv() {
                    out.push((edge, s));
                }
            }
        }
        for (edge, shares) in out {
            let conn = self.edges[edge].conn[n];
            self.after_wire(Ev::Apply { edge, node: n, conn, shares });
        }
    }

    fn apply(&mut self, edge: usize, n: usize, conn: u64, s: &pb::CapacityShares) {
        if !self.linked(edge, n, conn) {
            return;
        }
        let node = self.keys[n].node.clone();
        let EdgeSim { view, shard, .. } = &mut self.edges[edge];
        if edge_shares::apply(view, &node, conn, s, |key| shard.pump(&key)) {
            self.settle(edge);
            self.touch(edge, n);
            self.send_report(edge, n);
            self.check_node(n);
        }
    }

    fn send_report(&mut self, edge: usize, n: usize) {
        let e = &mut self.edges[edge];
        let conn = e.conn[n];
        let demand = edge_shares::demand(&e.view, &self.keys[n].node, conn);
        e.last_report[n] = Some((demand.clone(), self.now));
        self.after_wire(Ev::Report { edge, node: n, conn, demand });
    }

    fn node_report(&mut self, edge: usize, n: usize, conn: u64, d: &pb::ShareDemand) {
        if !self.linked(edge, n, conn) {
            return;
        }
        self.nodes[n].shares.report(edge, d);
        self.announce(n);
    }

    /// `keep_reporting` of every link of `edge`: a demand that changed, or
    /// one unchanged for [`REPORT_ANYWAY`], is reported.
    fn report_tick(&mut self, edge: usize, draining: bool) {
        let every = us(REPORT_EVERY.as_secs_f64());
        let anyway = us(REPORT_ANYWAY.as_secs_f64());
        if !draining || !self.runs.is_empty() {
            self.at(self.now + every, Ev::ReportTick { edge });
        }
        if !self.edges[edge].up {
            return;
        }
        // What changed since the last tick; every node every REPORT_ANYWAY.
        let full = self.now - self.edges[edge].full_scan_at >= anyway;
        let nodes: Vec<usize> = if full {
            self.edges[edge].full_scan_at = self.now;
            self.edges[edge].dirty_list.clear();
            (0..self.p.nodes).collect()
        } else {
            std::mem::take(&mut self.edges[edge].dirty_list)
        };
        for n in nodes {
            self.edges[edge].dirty[n] = false;
            if !self.nodes[n].up || self.nodes[n].links[edge].is_none() {
                continue;
            }
            let e = &self.edges[edge];
            let d = edge_shares::demand(&e.view, &self.keys[n].node, e.conn[n]);
            // As the link: nothing to report before an announcement applied.
            if d.applied_epoch == 0 {
                continue;
            }
            let due = e.last_report[n].as_ref().is_none_or(|(prev, at)| *prev != d || self.now - at >= anyway);
            if due {
                self.send_report(edge, n);
            }
        }
        // Once a tick, by the first live edge.
        if !self.pending.is_empty()
            && self.edges.iter().position(|e| e.up) == Some(edge)
            && (self.now / every).is_multiple_of(5)
        {
            self.measure_rebalance();
        }
    }

    // ---- churn -------------------------------------------------------------

    fn edge_down(&mut self, edge: usize, back_after: Option<f64>) {
        if !self.edges[edge].up {
            return;
        }
        self.edges[edge].up = false;
        // Its queued clients are lost with the process.
        let mut gone: Vec<u64> = self.waiting.iter().filter(|(_, w)| w.edge == edge).map(|(r, _)| *r).collect();
        gone.sort_unstable();
        for req in gone {
            if let Some(w) = self.waiting.remove(&req) {
                // Nothing is granted to them while the process goes down.
                w.waiter.abandon();
            }
            self.report.lost += 1;
        }
        // Its runs are cancelled at the nodes.
        let mut runs: Vec<u64> = self.runs.iter().filter(|(_, r)| r.edge == edge).map(|(id, _)| *id).collect();
        // In id order: the run is the same from the same seed.
        runs.sort_unstable();
        for n in 0..self.p.nodes {
            if self.nodes[n].up {
                self.nodes[n].links[edge] = None;
            }
        }
        for run in runs {
            self.drop_run(run, true);
        }
        for n in 0..self.p.nodes {
            if self.nodes[n].up {
                self.announce(n);
            }
        }
        // What every other edge held before: the survivors are to hold that again.
        let up: Vec<usize> = (0..self.p.nodes).filter(|&n| self.nodes[n].up).collect();
        let before: u64 = self
            .edges
            .iter()
            .map(|e| up.iter().map(|&n| u64::from(e.load(&self.keys[n]).capacity(LeaseClass::Normal))).sum::<u64>())
            .sum();
        // A restart starts from nothing: a fresh pool and shard.
        let weight = self.edges[edge].weight;
        self.edges[edge] = EdgeSim::start(&self.config, weight, self.p.nodes);
        self.edges[edge].up = false;
        self.pending.push((false, edge, self.now, before));
        if let Some(after) = back_after {
            self.at(self.now + us(after), Ev::EdgeUp { edge });
        }
    }

    fn edge_up(&mut self, edge: usize) {
        if self.edges[edge].up {
            return;
        }
        self.edges[edge].up = true;
        // Back before its share had moved: that leave is not measured.
        self.pending.retain(|&(join, e, _, _)| join || e != edge);
        for n in 0..self.p.nodes {
            if self.nodes[n].up {
                self.link(edge, n);
            }
        }
        self.pending.push((true, edge, self.now, 0));
    }

    fn node_down(&mut self, n: usize, back_after: f64) {
        if !self.nodes[n].up {
            return;
        }
        let mut runs: Vec<u64> = self.runs.iter().filter(|(_, r)| r.node == n).map(|(id, _)| *id).collect();
        runs.sort_unstable();
        // The process is gone with its gate: its runs fail at the edges.
        self.account_idle(n);
        self.nodes[n].up = false;
        // The fence first (the node offline on every edge), then the runs'
        // leases: what their release grants must not be the dead node.
        let node = self.keys[n].node.clone();
        for e in 0..self.p.edges {
            let conn = std::mem::take(&mut self.edges[e].conn[n]);
            if conn != 0 {
                self.edges[e].shard.node_gone(&node, conn);
                self.touch(e, n);
            }
        }
        for run in runs {
            self.drop_run(run, true);
        }
        for e in 0..self.p.edges {
            self.settle(e);
        }
        self.at(self.now + us(back_after), Ev::NodeUp { node: n });
    }

    fn node_up(&mut self, n: usize) {
        if self.nodes[n].up {
            return;
        }
        let idle = self.nodes[n].idle;
        self.nodes[n] = new_node(&self.p);
        self.nodes[n].idle = idle;
        self.nodes[n].idle_at = self.now;
        for e in 0..self.p.edges {
            if self.edges[e].up {
                self.link(e, n);
            }
        }
    }

    // ---- measurement and invariants -------------------------------------------

    fn sample(&mut self) {
        let dt = (self.now - self.last_sample) as f64 / 1e6;
        self.last_sample = self.now;
        if self.now >= us(self.p.warmup_s) {
            let (busy, cap) = self
                .nodes
                .iter()
                .filter(|n| n.up)
                .fold((0u64, 0u64), |(b, c), n| (b + u64::from(n.gate.in_flight()), c + u64::from(n.gate.limit())));
            self.busy_integral += busy as f64 * dt;
            self.cap_integral += cap as f64 * dt;
        }
        self.at(self.now + us(0.1), Ev::Sample);
    }

    fn measure_rebalance(&mut self) {
        let now = self.now;
        let up: Vec<usize> = (0..self.p.nodes).filter(|&n| self.nodes[n].up).collect();
        let mut done = Vec::new();
        for (i, &(join, edge, since, before)) in self.pending.iter().enumerate() {
            let ok = if join {
                // Node by node, it holds what it asks for (in use and
                // queued) up to its fair part; 90% of that over all nodes.
                let e = &self.edges[edge];
                // Fractional: with fewer slots than edges a fair part is
                // below one slot per node.
                let live = self.edges.iter().filter(|e| e.up).count().max(1) as f64;
                let fair = f64::from(self.p.capacity) / live;
                let (mut held, mut wanted) = (0.0, 0.0);
                for &n in &up {
                    let l = e.load(&self.keys[n]);
                    let need = l.in_use(LeaseClass::Normal) + l.waiters.load(Ordering::Relaxed);
                    held += f64::from(l.capacity(LeaseClass::Normal).min(need));
                    wanted += fair.min(f64::from(need));
                }
                wanted > 0.0 && held >= 0.9 * wanted
            } else {
                let held: u64 = self
                    .edges
                    .iter()
                    .filter(|e| e.up)
                    .map(|e| {
                        up.iter().map(|&n| u64::from(e.load(&self.keys[n]).capacity(LeaseClass::Normal))).sum::<u64>()
                    })
                    .sum();
                held * 100 >= before * 95
            };
            if ok {
                let ms = (now - since) as f64 / 1000.0;
                let slot = if join {
                    &mut self.report.rebalance_after_join_ms
                } else {
                    &mut self.report.rebalance_after_leave_ms
                };
                *slot = slot.max(ms);
                done.push(i);
            }
        }
        for i in done.into_iter().rev() {
            self.pending.remove(i);
        }
    }

    /// Brings node `n`'s idle slot-seconds up to now (before its count changes).
    fn account_idle(&mut self, n: usize) {
        let now = self.now;
        let node = &mut self.nodes[n];
        if node.up {
            let free = node.gate.limit().saturating_sub(node.gate.in_flight());
            node.idle += f64::from(free) * (now - node.idle_at) as f64 / 1e6;
        }
        node.idle_at = now;
    }

    /// The idle slot-seconds of `group`'s nodes so far.
    fn group_idle(&mut self, group: usize) -> f64 {
        let lo = group * self.p.group;
        let hi = (lo + self.p.group).min(self.p.nodes);
        (lo..hi)
            .map(|n| {
                self.account_idle(n);
                self.nodes[n].idle
            })
            .sum()
    }

    /// Node `n`: its gate within the capacity and matching the runs held;
    /// what the edges may act on within the capacity; the edges' counts
    /// matching the leases held.
    fn check_node(&mut self, n: usize) {
        self.report.invariant_checks += 1;
        let node = &self.nodes[n];
        if !node.up {
            return;
        }
        let cap = node.gate.limit();
        let in_flight = node.gate.in_flight();
        assert!(in_flight <= cap, "node {n}: {in_flight} running, capacity {cap}");
        let held: u32 = node.held.iter().sum();
        assert_eq!(in_flight, held, "node {n}: the gate counts {in_flight}, the runs held {held}");
        for (e, h) in node.held.iter().enumerate() {
            assert_eq!(node.gate.of_edge(e)[0], *h, "node {n} edge {e}: per-edge count");
        }
        let mut acting = 0u32;
        for (e, edge) in self.edges.iter().enumerate() {
            if edge.conn[n] == 0 {
                continue;
            }
            let l = edge.load(&self.keys[n]);
            let in_use = l.in_use(LeaseClass::Normal);
            assert_eq!(in_use, edge.leased[n], "edge {e} node {n}: in use {in_use}, leases held {}", edge.leased[n]);
            acting += l.capacity(LeaseClass::Normal).max(in_use);
        }
        // A gone edge's runs still hold slots here until cancelled.
        let gone: u32 = (0..self.p.edges).filter(|&e| self.edges[e].conn[n] == 0).map(|e| node.held[e]).sum();
        assert!(acting + gone <= cap, "node {n}: edges may act on {acting} (+{gone} draining), capacity {cap}");
    }

    fn check_quiescent(&self) {
        assert!(self.runs.is_empty(), "{} runs never ended", self.runs.len());
        assert!(self.waiting.is_empty(), "{} requests still wait", self.waiting.len());
        for (n, node) in self.nodes.iter().enumerate() {
            if node.up {
                assert_eq!(node.gate.in_flight(), 0, "node {n}: slots never given back");
            }
        }
        for (e, edge) in self.edges.iter().enumerate() {
            for (n, key) in self.keys.iter().enumerate() {
                let l = edge.load(key);
                assert_eq!(
                    (l.in_use(LeaseClass::Normal), l.live_guards.load(Ordering::Acquire)),
                    (0, 0),
                    "edge {e} node {n}: leases never given back (edge up {}, node up {}, leased {})",
                    edge.up,
                    self.nodes[n].up,
                    edge.leased[n]
                );
                assert_eq!(l.waiters.load(Ordering::Acquire), 0, "edge {e} node {n}: a queue never emptied");
            }
            assert_eq!(edge.shard.stray_releases, 0, "edge {e}: releases of resources it does not know");
        }
    }
}

const PROVIDER: &str = "p";

/// Room for every release a burst of ends posts before the simulation
/// delivers them (a lease's release must never find the inbox full: the
/// edge would then send it from a task, and there is no runtime here).
const INBOX: usize = 1 << 24;

/// Most requests a model group queues (higher than any run asks for).
const MAX_WAITERS: u32 = 1_000_000;

fn node_id(n: usize) -> String {
    format!("n{n}")
}

/// The config every edge runs: node `n{i}` with one provider of
/// `capacity` slots; model `g{k}` served by the nodes of group `k`.
fn edge_config(p: &Params) -> Result<EdgeConfig, ConfigError> {
    let mut t = String::from("[http]\nlisten = \"127.0.0.1:0\"\n[node_listener]\nlisten = \"127.0.0.1:0\"\n");
    for n in 0..p.nodes {
        let _ = write!(
            t,
            "[[nodes]]\nid = \"{}\"\ntoken = \"token-{n}\"\n[[nodes.providers]]\nid = \"{PROVIDER}\"\nkind = \"mock\"\ncapacity = {}\n",
            node_id(n),
            p.capacity
        );
    }
    let queue_ms = (p.queue_timeout_s * 1000.0).round() as u64;
    for g in 0..p.nodes.div_ceil(p.group) {
        let _ = write!(t, "[[models]]\nname = \"g{g}\"\nmax_waiters = {MAX_WAITERS}\nqueue_timeout_ms = {queue_ms}\n");
        for n in g * p.group..((g + 1) * p.group).min(p.nodes) {
            let _ = write!(t, "[[models.targets]]\nnode = \"{}\"\nprovider = \"{PROVIDER}\"\n", node_id(n));
        }
    }
    EdgeConfig::from_toml(&t, &|_| None)
}

fn new_node(p: &Params) -> NodeSim {
    let gates = Gates::new();
    let gate = gates.configure(PROVIDER, p.capacity);
    NodeSim {
        up: true,
        shares: Shares::new(p.edges, gates),
        gate,
        links: (0..p.edges).map(|_| None).collect(),
        held: vec![0; p.edges],
        idle: 0.0,
        idle_at: 0,
    }
}

/// The same demand through one edge that holds all the capacity (no share
/// to split; node churn kept): what the shares are measured against.
pub fn baseline(p: &Params) -> Params {
    Params { edges: 1, skew: 1.0, ..p.clone() }
}

impl Report {
    /// One line of JSON.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "requests": self.requests, "served": self.served, "timed_out": self.timed_out,
            "starved": self.starved, "lost": self.lost, "gate_refusals": self.gate_refusals,
            "refused": self.refused,
            "utilisation": self.utilisation,
            "rebalance_after_leave_ms": self.rebalance_after_leave_ms,
            "rebalance_after_join_ms": self.rebalance_after_join_ms,
            "rebalances_unfinished": self.rebalances_unfinished,
            "events": self.events, "invariant_checks": self.invariant_checks,
            "simulated_s": self.simulated_s,
        })
    }
}
