//! A deterministic simulation of capacity shares (issue 28): many nodes,
//! several edges, skewed demand, edges and nodes joining, leaving and
//! flapping, in virtual time from one seed.
//!
//! What is real and what is modelled:
//! - **Real**: the node's share table and rebalancing ([`iop_node::share::Shares`]),
//!   its gates ([`iop_node::run::Gates`]: the per-class, per-edge slot
//!   counts), and the edge's admission counts ([`iop_edge::pool::ResourceLoad`]:
//!   the capacity within the share, `try_take`/`give_back`, `Share::apply`).
//! - **Modelled**: the wire (a fixed one-way delay), the edge's queue per
//!   model group (FIFO, served on every release and share change, a queue
//!   timeout), the demand reports' timer (every 200 ms while changed, every
//!   5 s anyway, as `edge/src/transport/shares.rs` does), run durations
//!   (exponential) and arrivals (Poisson per edge, skewed).
//!
//! Invariants checked on every event that touches a node: its gate never
//! runs more than the capacity; what each edge may act on (its applied
//! share, or its in-use count when above it) never adds up past the
//! capacity; the gate's and the edges' counts match the runs the
//! simulation holds (no slot lost, none released twice). A waiter that
//! times out while its group had idle capacity it could have been given is
//! counted as starved (the report must show none).

use std::{
    cmp::Reverse,
    collections::{BinaryHeap, HashMap, VecDeque},
    sync::{atomic::Ordering, Arc},
};

use iop_core::{rt::mailbox, wire::pb};
use iop_edge::pool::{LeaseClass, ResourceLoad};
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
    /// Mean fraction of live capacity in use after the warm-up.
    pub utilisation: f64,
    /// After an edge left: until the others held 95% of what all held
    /// before (its share moved to them), ms (worst).
    pub rebalance_after_leave_ms: f64,
    /// After an edge joined: until its shares added up to 90% of its fair
    /// part of the capacity (or of its demand, when smaller), ms (worst).
    /// Under saturation a share grows only as other edges' runs end (no
    /// slot in use is taken back).
    pub rebalance_after_join_ms: f64,
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
    Timeout {
        edge: usize,
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
    conn: u64,
    req: u64,
    at_node: bool,
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

struct EdgeNode {
    load: Arc<ResourceLoad>,
    /// The connection (0: none) the load belongs to.
    conn: u64,
    last_report: Option<(pb::ShareDemand, Time)>,
}

struct EdgeSim {
    up: bool,
    weight: f64,
    nodes: Vec<EdgeNode>,
    /// Waiting request ids per group, FIFO.
    queues: Vec<VecDeque<u64>>,
    /// Leases the simulation holds per node (its own count).
    leased: Vec<u32>,
    /// Nodes whose demand may have changed since the last tick (a lease,
    /// a queue of their group); the others are looked at every 5 s.
    dirty: Vec<bool>,
    dirty_list: Vec<usize>,
    /// When every node was last looked at.
    full_scan_at: Time,
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
    nodes: Vec<NodeSim>,
    edges: Vec<EdgeSim>,
    runs: HashMap<u64, Run>,
    /// Waiting requests: id → (edge, group).
    waiting: HashMap<u64, (usize, usize)>,
    /// Each waiting request's group's idle slot-seconds when it queued.
    idle_at_enqueue: HashMap<u64, f64>,
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
    pub fn new(p: Params) -> Self {
        let total_weight: f64 = (0..p.edges).map(|i| p.skew.powi(i as i32)).sum();
        let edges = (0..p.edges)
            .map(|i| EdgeSim {
                up: true,
                weight: p.skew.powi(i as i32) / total_weight,
                nodes: Vec::new(),
                queues: vec![VecDeque::new(); p.nodes.div_ceil(p.group)],
                leased: vec![0; p.nodes],
                dirty: vec![false; p.nodes],
                dirty_list: Vec::new(),
                full_scan_at: 0,
            })
            .collect();
        let mut sim = Sim {
            rng: p.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1,
            p: p.clone(),
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            events: HashMap::new(),
            next_event: 0,
            nodes: Vec::new(),
            edges,
            runs: HashMap::new(),
            waiting: HashMap::new(),
            idle_at_enqueue: HashMap::new(),
            next_id: 0,
            next_conn: 0,
            report: Report::default(),
            busy_integral: 0.0,
            cap_integral: 0.0,
            last_sample: 0,
            pending: Vec::new(),
        };
        for e in 0..p.edges {
            sim.edges[e].nodes =
                (0..p.nodes).map(|_| EdgeNode { load: fresh_load(), conn: 0, last_report: None }).collect();
        }
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
        sim
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
                Ev::Timeout { edge, req } => self.timeout(edge, req),
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
        self.report.simulated_s = self.p.seconds;
        self.report.utilisation = if self.cap_integral > 0.0 { self.busy_integral / self.cap_integral } else { 0.0 };
        self.check_quiescent();
        self.report
    }

    // ---- requests ------------------------------------------------------

    fn arrival(&mut self, edge: usize) {
        let rate = self.p.requests_per_minute / 60.0 * self.edges[edge].weight;
        let next = self.now + us(self.exp(1.0 / rate));
        self.at(next, Ev::Arrival { edge });
        if !self.edges[edge].up {
            return;
        }
        self.report.requests += 1;
        let groups = self.edges[edge].queues.len();
        let group = self.below(groups);
        let req = self.next_id;
        self.next_id += 1;
        // FIFO fairness, as the edge: a queue that is not empty is joined.
        if self.edges[edge].queues[group].is_empty() && self.try_admit(edge, group, req) {
            return;
        }
        self.edges[edge].queues[group].push_back(req);
        self.touch_group(edge, group);
        self.waiting.insert(req, (edge, group));
        let idle = self.group_idle(group);
        self.idle_at_enqueue.insert(req, idle);
        let t = self.now + us(self.p.queue_timeout_s);
        self.at(t, Ev::Timeout { edge, req });
    }

    /// The group's nodes with room at `edge`, least used first: takes a
    /// lease on the first that has it.
    fn try_admit(&mut self, edge: usize, group: usize, req: u64) -> bool {
        let lo = group * self.p.group;
        let hi = (lo + self.p.group).min(self.p.nodes);
        let mut best: Option<(f64, usize)> = None;
        for n in lo..hi {
            let l = &self.edges[edge].nodes[n].load;
            let cap = l.capacity(LeaseClass::Normal);
            if cap > l.in_use(LeaseClass::Normal) {
                let u = l.utilisation(LeaseClass::Normal);
                if best.is_none_or(|(b, _)| u < b) {
                    best = Some((u, n));
                }
            }
        }
        let Some((_, n)) = best else { return false };
        let en = &self.edges[edge].nodes[n];
        let cap = en.load.capacity(LeaseClass::Normal);
        if !en.load.try_take(LeaseClass::Normal, cap) {
            return false;
        }
        let conn = en.conn;
        assert!(
            conn != 0,
            "t={} edge {edge} (up {}) admitted on node {n} (up {}) with no connection",
            self.now,
            self.edges[edge].up,
            self.nodes[n].up
        );
        self.edges[edge].leased[n] += 1;
        self.touch(edge, n);
        let run = req;
        self.runs.insert(run, Run { edge, node: n, conn, req, at_node: false });
        self.after_wire(Ev::Dispatch { run });
        true
    }

    fn dispatch(&mut self, run: u64) {
        let Some(r) = self.runs.get(&run) else { return };
        let (edge, n, conn) = (r.edge, r.node, r.conn);
        if !self.linked(edge, n, conn) {
            // The link went away while the run was on the wire.
            self.drop_run(run, true);
            return;
        }
        self.account_idle(n);
        if !self.nodes[n].gate.try_take(Class::Normal, edge) {
            self.report.gate_refusals += 1;
            // Refused before the first byte: the edge gives the lease back
            // and the request tries again (front of its queue).
            if let Some(r) = self.runs.remove(&run) {
                self.release_edge(r.edge, r.node, r.conn);
                let group = n / self.p.group;
                self.edges[edge].queues[group].push_front(r.req);
                self.waiting.insert(r.req, (edge, group));
                self.pump(edge, group);
            }
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

    /// Ends run `run` at the node (if it got there) and at its edge.
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
        self.release_edge(r.edge, r.node, r.conn);
        self.pump(r.edge, r.node / self.p.group);
    }

    fn release_edge(&mut self, edge: usize, n: usize, conn: u64) {
        let en = &self.edges[edge].nodes[n];
        // A lease of a connection that ended went with its load.
        if en.conn == conn && conn != 0 {
            en.load.give_back(LeaseClass::Normal);
            self.edges[edge].leased[n] -= 1;
            self.touch(edge, n);
        }
    }

    /// Node `n`'s demand at `edge` may have changed.
    fn touch(&mut self, edge: usize, n: usize) {
        let e = &mut self.edges[edge];
        if !e.dirty[n] {
            e.dirty[n] = true;
            e.dirty_list.push(n);
        }
    }

    /// The demand of every node of `group` at `edge` may have changed (its queue did).
    fn touch_group(&mut self, edge: usize, group: usize) {
        let lo = group * self.p.group;
        for n in lo..(lo + self.p.group).min(self.p.nodes) {
            self.touch(edge, n);
        }
    }

    /// Serves `group`'s queue at `edge` while there is room.
    fn pump(&mut self, edge: usize, group: usize) {
        while let Some(&req) = self.edges[edge].queues[group].front() {
            if !self.try_admit(edge, group, req) {
                return;
            }
            self.edges[edge].queues[group].pop_front();
            self.touch_group(edge, group);
            self.waiting.remove(&req);
            self.idle_at_enqueue.remove(&req);
        }
    }

    fn timeout(&mut self, edge: usize, req: u64) {
        let Some((e, group)) = self.waiting.remove(&req) else { return };
        let since_idle = self.idle_at_enqueue.remove(&req).unwrap_or(0.0);
        debug_assert_eq!(e, edge);
        self.edges[edge].queues[group].retain(|r| *r != req);
        self.touch_group(edge, group);
        self.report.timed_out += 1;
        // Starved: over its wait, its group's nodes that this edge reaches
        // had on average half a slot or more idle (what a share on the wire
        // or a run that just ended leaves for a moment is far less).
        let idle_slot_s = self.group_idle(group) - since_idle;
        let idle = idle_slot_s >= 0.5 * self.p.queue_timeout_s;
        if idle {
            self.report.starved += 1;
        }
    }

    // ---- shares ----------------------------------------------------------

    fn linked(&self, edge: usize, n: usize, conn: u64) -> bool {
        self.edges[edge].up
            && self.nodes[n].up
            && self.nodes[n].links[edge].is_some()
            && self.edges[edge].nodes[n].conn == conn
    }

    /// Edge `edge` and node `n` connect: the node joins it to its table and
    /// the ready carries the shares (applied before any admission).
    fn link(&mut self, edge: usize, n: usize) {
        self.next_conn += 1;
        let conn = self.next_conn;
        let (tx, rx) = mailbox::mailbox(64);
        let (m, mine) = self.nodes[n].shares.join(edge, tx);
        self.nodes[n].links[edge] = Some((m, rx));
        let en = &mut self.edges[edge].nodes[n];
        en.load = fresh_load();
        en.conn = conn;
        en.last_report = None;
        en.load.generation.store(conn, Ordering::Release);
        en.load.online.store(true, Ordering::Release);
        en.load.share.apply(conn, mine.epoch, share_of(&mine).0, share_of(&mine).1);
        self.edges[edge].leased[n] = 0;
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
            let conn = self.edges[edge].nodes[n].conn;
            self.after_wire(Ev::Apply { edge, node: n, conn, shares });
        }
    }

    fn apply(&mut self, edge: usize, n: usize, conn: u64, s: &pb::CapacityShares) {
        if !self.linked(edge, n, conn) {
            return;
        }
        let (normal, long) = share_of(s);
        if self.edges[edge].nodes[n].load.share.apply(conn, s.epoch, normal, long) {
            self.send_report(edge, n);
            self.pump(edge, n / self.p.group);
            self.check_node(n);
        }
    }

    fn demand(&self, edge: usize, n: usize) -> pb::ShareDemand {
        let en = &self.edges[edge].nodes[n];
        let l = &en.load;
        pb::ShareDemand {
            applied_epoch: l.share.epoch(en.conn),
            providers: vec![pb::ProviderDemand {
                provider: PROVIDER.into(),
                in_use_normal: l.in_use(LeaseClass::Normal),
                in_use_long: 0,
                waiting: self.edges[edge].queues[n / self.p.group].len() as u32,
            }],
        }
    }

    fn send_report(&mut self, edge: usize, n: usize) {
        let demand = self.demand(edge, n);
        let conn = self.edges[edge].nodes[n].conn;
        self.edges[edge].nodes[n].last_report = Some((demand.clone(), self.now));
        self.after_wire(Ev::Report { edge, node: n, conn, demand });
    }

    fn node_report(&mut self, edge: usize, n: usize, conn: u64, d: &pb::ShareDemand) {
        if !self.linked(edge, n, conn) {
            return;
        }
        self.nodes[n].shares.report(edge, d);
        self.announce(n);
    }

    fn report_tick(&mut self, edge: usize, draining: bool) {
        if !draining || !self.runs.is_empty() {
            self.at(self.now + us(REPORT_EVERY_S), Ev::ReportTick { edge });
        }
        if !self.edges[edge].up {
            return;
        }
        // What changed since the last tick; every node every 5 s.
        let full = self.now - self.edges[edge].full_scan_at >= us(5.0);
        let nodes: Vec<usize> = if full {
            self.edges[edge].full_scan_at = self.now;
            (0..self.p.nodes).collect()
        } else {
            std::mem::take(&mut self.edges[edge].dirty_list)
        };
        if full {
            self.edges[edge].dirty_list.clear();
        }
        for n in nodes {
            self.edges[edge].dirty[n] = false;
            if !self.nodes[n].up || self.nodes[n].links[edge].is_none() {
                continue;
            }
            let d = self.demand(edge, n);
            let due = self.edges[edge].nodes[n]
                .last_report
                .as_ref()
                .is_none_or(|(prev, at)| *prev != d || self.now - at >= us(5.0));
            if due {
                self.send_report(edge, n);
            }
        }
        // Once a tick, by the first live edge.
        if !self.pending.is_empty()
            && self.edges.iter().position(|e| e.up) == Some(edge)
            && (self.now / us(REPORT_EVERY_S)).is_multiple_of(5)
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
        // Its queued clients are lost; its runs are cancelled at the nodes.
        for q in &mut self.edges[edge].queues {
            for req in q.drain(..) {
                self.waiting.remove(&req);
                self.report.lost += 1;
            }
        }
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
            self.edges[edge].nodes[n].conn = 0;
            self.edges[edge].leased[n] = 0;
            if self.nodes[n].up {
                self.announce(n);
            }
        }
        // What every edge held before: the survivors are to hold that again.
        let up: Vec<usize> = (0..self.p.nodes).filter(|&n| self.nodes[n].up).collect();
        let before: u64 = self
            .edges
            .iter()
            .map(|e| up.iter().map(|&n| u64::from(e.nodes[n].load.capacity(LeaseClass::Normal))).sum::<u64>())
            .sum();
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
        // Offline first: the queues its runs' ends serve must not pick it.
        for e in 0..self.p.edges {
            self.edges[e].nodes[n].load.online.store(false, Ordering::Release);
        }
        for run in runs {
            self.drop_run(run, true);
        }
        for e in 0..self.p.edges {
            self.edges[e].nodes[n].conn = 0;
            self.edges[e].leased[n] = 0;
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
        let mut done = Vec::new();
        for (i, &(join, edge, since, before)) in self.pending.iter().enumerate() {
            let up: Vec<usize> = (0..self.p.nodes).filter(|&n| self.nodes[n].up).collect();
            let ok = if join {
                // Its shares add up to 90% of its fair part of the live
                // capacity, or of its demand when that is smaller (a share
                // follows demand).
                let e = &self.edges[edge];
                let held: u64 = up.iter().map(|&n| u64::from(e.nodes[n].load.capacity(LeaseClass::Normal))).sum();
                let demand: u64 = up
                    .iter()
                    .map(|&n| {
                        u64::from(e.nodes[n].load.in_use(LeaseClass::Normal)) + e.queues[n / self.p.group].len() as u64
                    })
                    .sum();
                let live = self.edges.iter().filter(|e| e.up).count().max(1) as u64;
                let fair = (up.len() as u64 * u64::from(self.p.capacity) / live).min(demand);
                fair > 0 && held * 10 >= fair * 9
            } else {
                let held: u64 = up
                    .iter()
                    .map(|&n| {
                        self.edges
                            .iter()
                            .filter(|e| e.up)
                            .map(|e| u64::from(e.nodes[n].load.capacity(LeaseClass::Normal)))
                            .sum::<u64>()
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

    /// Node `n`: its gate within the capacity and matching the runs held;
    /// what the edges may act on within the capacity; the edges' counts
    /// matching the leases held.
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

    fn check_node(&mut self, n: usize) {
        self.report.invariant_checks += 1;
        let node = &self.nodes[n];
        if !node.up {
            return;
        }
        let cap = node.gate.limit();
        let in_flight = node.gate.in_flight();
        assert!(in_flight <= cap, "node {n}: {in_flight} running, capacity {cap}");
        let node = &self.nodes[n];
        let held: u32 = node.held.iter().sum();
        assert_eq!(in_flight, held, "node {n}: the gate counts {in_flight}, the runs held {held}");
        for (e, h) in node.held.iter().enumerate() {
            assert_eq!(node.gate.of_edge(e)[0], *h, "node {n} edge {e}: per-edge count");
        }
        let mut acting = 0u32;
        for (e, edge) in self.edges.iter().enumerate() {
            let en = &edge.nodes[n];
            if en.conn == 0 {
                continue;
            }
            let in_use = en.load.in_use(LeaseClass::Normal);
            assert_eq!(in_use, edge.leased[n], "edge {e} node {n}: in use {in_use}, leases held {}", edge.leased[n]);
            acting += en.load.capacity(LeaseClass::Normal).max(in_use);
        }
        // A gone edge's runs still hold slots here until cancelled.
        let gone: u32 = (0..self.p.edges).filter(|&e| self.edges[e].nodes[n].conn == 0).map(|e| node.held[e]).sum();
        assert!(acting + gone <= cap, "node {n}: edges may act on {acting} (+{gone} draining), capacity {cap}");
    }

    fn check_quiescent(&self) {
        assert!(self.runs.is_empty(), "{} runs never ended", self.runs.len());
        for (n, node) in self.nodes.iter().enumerate() {
            if node.up {
                assert_eq!(node.gate.in_flight(), 0, "node {n}: slots never given back");
            }
        }
        for (e, edge) in self.edges.iter().enumerate() {
            for (n, en) in edge.nodes.iter().enumerate() {
                assert_eq!(
                    en.load.in_use(LeaseClass::Normal),
                    0,
                    "edge {e} node {n}: leases never given back (edge up {}, node up {}, conn {}, leased {})",
                    edge.up,
                    self.nodes[n].up,
                    en.conn,
                    edge.leased[n]
                );
            }
        }
    }
}

const PROVIDER: &str = "p";

/// The edge's demand report period (`edge/src/transport/shares.rs`).
const REPORT_EVERY_S: f64 = 0.05;

fn fresh_load() -> Arc<ResourceLoad> {
    Arc::new(ResourceLoad::new(u32::MAX, 0))
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

fn share_of(s: &pb::CapacityShares) -> (u32, u32) {
    s.shares.iter().find(|x| x.provider == PROVIDER).map_or((0, 0), |x| (x.normal, x.long))
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
            "utilisation": self.utilisation,
            "rebalance_after_leave_ms": self.rebalance_after_leave_ms,
            "rebalance_after_join_ms": self.rebalance_after_join_ms,
            "events": self.events, "invariant_checks": self.invariant_checks,
            "simulated_s": self.simulated_s,
        })
    }
}
