//! Admits runs by adapter concurrency, runs them as tasks, cancels them,
//! and guarantees each ends with exactly one terminal event.

use std::{
    cell::{Cell, RefCell},
    collections::HashMap,
    rc::Rc,
    sync::Arc,
};

use iop_core::{
    exec::{codes, ExecEvent, FailureSource, RunFailure},
    liveness::StallEvidence,
    rt::{
        frames::FrameWriter,
        signal::{LocalCancel, LocalNotify},
    },
    wire::pb,
};

use iop_core::tunnel::TunnelItem;

use super::{
    credit::Credit,
    emitter::Emitter,
    gate::{Class, Gate, Gates},
    record::{Origin, Record},
    spec::{EventSink, RunSpec},
    watchdog::Activity,
};
use crate::{adapter::Adapter, store::Path, tunnel::TunnelSpec};

/// Runs in flight on one edge link.
pub struct RunManager {
    /// Adapters by provider id, each with its process-wide gate.
    adapters: RefCell<GatedAdapters>,
    gates: Arc<Gates>,
    /// Streams holding a slot: id → (adapter, cancel flag, credit window).
    runs: RefCell<HashMap<String, Held>>,
    writer: FrameWriter,
    draining: Cell<bool>,
    idle: LocalNotify,
    /// This link's health observation sequence: connection-scoped (a new
    /// connection has a new manager: it starts at 0), the first stall
    /// observation is 1.
    health_seq: HealthSeq,
    /// Managed mode: what credential leases are checked against.
    leases: RefCell<Option<super::lease::NodeLeases>>,
    /// Where each stream's row goes when it ends (none: `store = false`).
    /// This core's handle: a record takes it without touching a count
    /// the other cores share (an atomic increment and decrement a run).
    store: std::cell::OnceCell<std::rc::Rc<crate::store::Store>>,
    /// Which of the node's edges this link goes to (its streams are counted
    /// as that edge's in the gates), and the process's share table when
    /// the node serves several.
    edge: Cell<usize>,
    shares: std::cell::OnceCell<Arc<crate::share::Shares>>,
    /// The session ended: a stream that ends now shrinks a gone edge's
    /// commitment (see [`crate::share`]).
    detached: Cell<bool>,
    /// The edge takes `RunEvents` frames.
    batches: Cell<bool>,
}

/// A link's health observation sequence, shared by its stall terminals and
/// capabilities probes (unique and increasing on the link's one thread).
#[derive(Debug, Clone, Default)]
struct HealthSeq(Rc<Cell<u64>>);

impl HealthSeq {
    fn next(&self) -> u64 {
        let seq = self.0.get() + 1;
        self.0.set(seq);
        seq
    }
}

/// Adapters by provider id, each with its process-wide gate.
type GatedAdapters = HashMap<String, (Rc<Adapter>, Arc<Gate>)>;

/// The adapters by id, each with its gate in `gates` (limit: its concurrency).
fn gated(gates: &Gates, adapters: Vec<Adapter>) -> GatedAdapters {
    adapters
        .into_iter()
        .map(|a| {
            let gate = gates.configure(a.id(), a.max_concurrency());
            (a.id().to_owned(), (Rc::new(a), gate))
        })
        .collect()
}

/// What an admitted stream gets: its adapter, slot, cancel flag and credit.
type Admission = (Rc<Adapter>, Slot, LocalCancel, Option<Rc<Credit>>);

/// A stream holding a slot: its adapter, gate, cancel flag and credit window.
#[derive(Clone)]
struct Held {
    adapter: String,
    gate: Arc<Gate>,
    class: Class,
    cancel: LocalCancel,
    credit: Option<Rc<Credit>>,
    tunnel: bool,
}

/// A run's admission slot. Freed exactly once: when the terminal event is
/// sent, when the edge cancels the run, or when the task ends — whichever
/// comes first — so the edge, which frees its lease on the terminal, can
/// reuse the capacity at once without this node refusing the next run.
pub(crate) struct Slot {
    manager: Rc<RunManager>,
    run_id: String,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.manager.free(&self.run_id);
    }
}

impl RunManager {
    /// A manager running `adapters` under the process's `gates`, writing
    /// events to `writer`.
    pub fn new(adapters: Vec<Adapter>, gates: Arc<Gates>, writer: FrameWriter) -> Rc<Self> {
        let adapters = gated(&gates, adapters);
        Rc::new(Self {
            adapters: RefCell::new(adapters),
            gates,
            runs: RefCell::new(HashMap::new()),
            writer,
            draining: Cell::new(false),
            idle: LocalNotify::new(),
            health_seq: HealthSeq::default(),
            leases: RefCell::new(None),
            store: std::cell::OnceCell::new(),
            edge: Cell::new(0),
            shares: std::cell::OnceCell::new(),
            detached: Cell::new(false),
            batches: Cell::new(false),
        })
    }

    /// The edge takes several run events in one frame (its registration
    /// answer said so).
    pub fn set_batches(&self, on: bool) {
        self.batches.set(on);
    }

    /// This link goes to edge `edge` of the node's `edges`; `shares`: the
    /// process's share table (a node of several edges).
    pub fn set_edge(&self, edge: usize, shares: Option<Arc<crate::share::Shares>>) {
        self.edge.set(edge);
        if let Some(s) = shares {
            let _ = self.shares.set(s);
        }
    }

    /// The session ended; streams still ending are a gone edge's.
    pub fn detach(&self) {
        self.detached.set(true);
    }

    /// Records every stream from now on in `store`.
    pub fn set_store(&self, store: crate::store::Store) {
        let _ = self.store.set(std::rc::Rc::new(store));
    }

    /// The run store, when on.
    pub fn store(&self) -> Option<&crate::store::Store> {
        self.store.get().map(|s| &**s)
    }

    /// A stream's record, when the store is on.
    fn record<'a>(&self, origin: impl FnOnce() -> Origin<'a>) -> Option<Record> {
        self.store.get().map(|s| Record::new(s.clone(), origin()))
    }

    /// Managed mode: runs must bring credential leases, checked with these.
    pub fn set_leases(&self, leases: super::lease::NodeLeases) {
        *self.leases.borrow_mut() = Some(leases);
    }

    /// A config was applied (leases are bound to its revision and epochs).
    pub fn config_applied(&self, payload: &pb::NodeConfigPayload) {
        if let Some(l) = self.leases.borrow().as_ref() {
            l.applied(payload);
        }
    }

    /// Opens a run's lease (after admission, right before the provider
    /// call); without managed mode there is none to open.
    fn credential(
        &self,
        run: &iop_core::lease::Binding<'_>,
        lease: Option<&pb::SealedLease>,
    ) -> Result<Option<iop_core::config::Secret>, RunFailure> {
        match self.leases.borrow().as_ref() {
            Some(l) => l.open(run, lease),
            None => Ok(None),
        }
    }

    /// Replaces the adapter set; runs in flight keep the adapter they started with.
    pub fn replace_adapters(&self, adapters: Vec<Adapter>) {
        *self.adapters.borrow_mut() = gated(&self.gates, adapters);
    }

    /// Ids of the configured adapters.
    pub fn adapter_ids(&self) -> Vec<String> {
        self.adapters.borrow().keys().cloned().collect()
    }

    /// Runs in flight.
    pub fn active(&self) -> usize {
        self.runs.borrow().len()
    }

    /// The adapter `id`.
    pub fn adapter(&self, id: &str) -> Option<Rc<Adapter>> {
        self.adapters.borrow().get(id).map(|(a, _)| a.clone())
    }

    /// What each provider (or only `only`, when not empty) is and serves,
    /// as JSON for the edge's admin API; `None`: no provider `only`.
    pub fn capabilities(&self, only: &str) -> Option<serde_json::Value> {
        let adapters = self.adapters.borrow();
        let mut ids: Vec<&String> = adapters.keys().filter(|id| only.is_empty() || *id == only).collect();
        if ids.is_empty() && !only.is_empty() {
            return None;
        }
        ids.sort();
        let providers: Vec<serde_json::Value> = ids
            .into_iter()
            .map(|id| {
                let (a, gate) = &adapters[id];
                let (relay, routes) = a.routes();
                let native: Vec<String> = a.native_api_calls().iter().map(|(m, p)| format!("{m} {p}")).collect();
                serde_json::json!({
                    "id": id,
                    "kind": a.kind_name(),
                    "relay": relay,
                    "routes": routes,
                    "native_api": native,
                    "max_concurrency": a.max_concurrency(),
                    "in_flight": gate.in_flight(),
                })
            })
            .collect();
        Some(serde_json::json!({
            "node_version": env!("CARGO_PKG_VERSION"),
            "draining": self.draining.get(),
            "providers": providers,
        }))
    }

    /// The next number of this link's health observation sequence (a stall
    /// terminal's or a capabilities probe's; the first is 1).
    pub fn next_health_seq(&self) -> u64 {
        self.health_seq.next()
    }

    /// The streams in flight on this edge connection, as JSON.
    pub fn transport_status(&self) -> serde_json::Value {
        let runs = self.runs.borrow();
        let tunnels = runs.values().filter(|h| h.tunnel).count();
        let waiting = runs.values().filter(|h| h.credit.as_ref().is_some_and(|c| c.is_waiting())).count();
        let mut per: std::collections::BTreeMap<&str, (u32, u32)> = std::collections::BTreeMap::new();
        for h in runs.values() {
            let e = per.entry(h.adapter.as_str()).or_default();
            if h.tunnel {
                e.1 += 1;
            } else {
                e.0 += 1;
            }
        }
        let providers: Vec<serde_json::Value> = per
            .into_iter()
            .map(|(id, (runs, tunnels))| serde_json::json!({"id": id, "runs": runs, "tunnels": tunnels}))
            .collect();
        serde_json::json!({
            "streams": runs.len(),
            "runs": runs.len() - tunnels,
            "tunnels": tunnels,
            "waiting_for_credit": waiting,
            "queued_to_edge_bytes": self.writer.queued_bytes(),
            "draining": self.draining.get(),
            "providers": providers,
        })
    }

    /// Starts `req`, or answers it at once with an error terminal.
    pub fn start(self: &Rc<Self>, req: pb::RunRequest) {
        let run_id = req.run_id.clone();
        let mut record = self.record(|| Origin {
            run_id: &run_id,
            session_id: &req.session_id,
            adapter: &req.adapter,
            target: &req.target,
            path: Path::Normalized,
            operation: Some(req.operation.into()),
        });
        let refuse = |f: RunFailure, record: Option<Record>| {
            let mut e = Emitter::<ExecEvent>::new(self.writer.clone(), run_id.clone()).with_record(record);
            monoio::spawn(async move {
                let _ = e.send(ExecEvent::Error(f)).await;
            });
        };
        // Refused before anything is taken or called.
        let stall_timeout = match stall_timeout(req.response_stall_timeout_ms) {
            Ok(t) => t,
            Err(f) => return refuse(f, record),
        };
        let deadline = time_left(req.deadline_ms, &run_id);
        let (adapter, slot, cancel, credit) =
            match self.admit(&run_id, &req.adapter, req.window_bytes, false, Class::of_profile(&req.profile)) {
                Ok(a) => a,
                Err(None) => return record.into_iter().for_each(Record::discard),
                Err(Some(f)) => return refuse(f, record),
            };
        let binding = iop_core::lease::Binding {
            provider: &req.adapter,
            target: &req.target,
            route: iop_core::lease::run_route(req.operation),
            slot: &run_id,
            profile: &req.profile,
            principal: &req.principal,
        };
        // Dropping `slot` on a refusal gives the capacity back.
        let credential = match self.credential(&binding, req.credential.as_ref()) {
            Ok(c) => c,
            Err(f) => return refuse(f, record),
        };
        if let Some(r) = record.as_mut() {
            r.started();
        }
        let spec = RunSpec {
            run_id: run_id.clone(),
            target: req.target,
            body: req.body,
            operation: req.operation.into(),
            credential,
        };
        let stall = self.stall(stall_timeout);
        let emitter = Emitter::new(self.writer.clone(), run_id)
            .with_slot(slot)
            .with_credit(credit)
            .with_activity(stall.activity.clone())
            .with_record(record)
            .with_batches(self.batches.get())
            .merging(req.whole);
        monoio::spawn(execute(adapter, spec, emitter, cancel, deadline, stall));
    }

    /// Starts a provider tunnel, or answers it at once with an error. It
    /// takes its slot from the same per-provider gate as runs, so tunnels
    /// and runs together never exceed the provider's concurrency.
    pub fn start_tunnel(self: &Rc<Self>, req: pb::ProviderTunnelRequest) {
        let id = req.tunnel_id.clone();
        let mut record = self.record(|| Origin {
            run_id: &id,
            session_id: &req.session_id,
            adapter: &req.adapter,
            target: &req.target,
            path: Path::Tunnel,
            operation: None,
        });
        let refuse = |f: RunFailure, record: Option<Record>| {
            let mut e = Emitter::<TunnelItem>::new(self.writer.clone(), id.clone()).with_record(record);
            monoio::spawn(async move {
                let _ = e.send(TunnelItem::Error(f)).await;
            });
        };
        let stall_timeout = match stall_timeout(req.response_stall_timeout_ms) {
            Ok(t) => t,
            Err(f) => return refuse(f, record),
        };
        let deadline = time_left(req.deadline_ms, &id);
        let target = req.target.clone();
        let (adapter, slot, cancel, credit) =
            match self.admit(&id, &req.adapter, req.window_bytes, true, Class::of_profile(&req.profile)) {
                Ok(a) => a,
                Err(None) => return record.into_iter().for_each(Record::discard),
                Err(Some(f)) => return refuse(f, record),
            };
        let binding = iop_core::lease::Binding {
            provider: &req.adapter,
            target: &req.target,
            route: &req.path,
            slot: &id,
            profile: &req.profile,
            principal: &req.principal,
        };
        let credential = match self.credential(&binding, req.credential.as_ref()) {
            Ok(c) => c,
            Err(f) => return refuse(f, record),
        };
        let mut spec = match TunnelSpec::from_wire(req, deadline) {
            Ok(spec) => spec,
            Err(f) => return refuse(f, record),
        };
        spec.credential = credential;
        if let Some(r) = record.as_mut() {
            r.started();
        }
        let stall = self.stall(stall_timeout);
        let emitter = Emitter::new(self.writer.clone(), id)
            .with_slot(slot)
            .with_credit(credit)
            .with_activity(stall.activity.clone())
            .with_record(record);
        monoio::spawn(relay(adapter, spec, target, emitter, cancel, stall));
    }

    /// A new stream's stall watch (its clock starts now).
    fn stall(&self, timeout: std::time::Duration) -> StallWatch {
        StallWatch { timeout, activity: Rc::new(Activity::new()), seq: self.health_seq.clone() }
    }

    /// Takes a slot on `adapter` for stream `id` with a credit window of
    /// `window` bytes (0: none). `Err(None)`: ignore the request (empty or
    /// duplicate id); `Err(Some(f))`: answer with `f`.
    fn admit(
        self: &Rc<Self>,
        id: &str,
        adapter_id: &str,
        window: u64,
        tunnel: bool,
        class: Class,
    ) -> Result<Admission, Option<RunFailure>> {
        if id.is_empty() || self.runs.borrow().contains_key(id) {
            tracing::warn!(run = %id, "run request with an empty or duplicate id ignored");
            return Err(None);
        }
        let Some((adapter, gate)) = self.adapters.borrow().get(adapter_id).cloned() else {
            let msg = format!("node has no provider `{adapter_id}`");
            return Err(Some(RunFailure::new(codes::UNKNOWN_ADAPTER, 404, FailureSource::Node, msg)));
        };
        if self.draining.get() {
            let f = RunFailure::new(codes::CAPACITY, 503, FailureSource::Node, "node is shutting down").retryable();
            return Err(Some(f));
        }
        if !gate.try_take(class, self.edge.get()) {
            let msg = format!("provider `{adapter_id}` is at its concurrency limit");
            return Err(Some(RunFailure::new(codes::CAPACITY, 429, FailureSource::Node, msg).retryable()));
        }
        let cancel = LocalCancel::new();
        let credit = (window > 0).then(|| Rc::new(Credit::new(window)));
        let held = Held {
            adapter: adapter_id.to_owned(),
            gate,
            class,
            cancel: cancel.clone(),
            credit: credit.clone(),
            tunnel,
        };
        self.runs.borrow_mut().insert(id.to_owned(), held);
        let slot = Slot { manager: self.clone(), run_id: id.to_owned() };
        Ok((adapter, slot, cancel, credit))
    }

    /// The edge granted `bytes` more to stream `id`.
    pub fn credit(&self, id: &str, bytes: u64) {
        let credit = self.runs.borrow().get(id).and_then(|h| h.credit.clone());
        if let Some(c) = credit {
            c.grant(bytes);
        }
    }

    /// Frees `run_id`'s slot if it still holds one.
    fn free(&self, run_id: &str) {
        let Some(held) = self.runs.borrow_mut().remove(run_id) else { return };
        held.gate.give(held.class, self.edge.get());
        if self.detached.get() {
            if let Some(s) = self.shares.get() {
                s.drained(self.edge.get());
            }
        }
        if self.runs.borrow().is_empty() {
            self.idle.notify();
        }
    }

    /// Cancels a run: its slot is freed now and its adapter future is
    /// dropped (closing the upstream request) at the task's next poll.
    pub fn cancel(&self, run_id: &str) {
        let entry = self.runs.borrow().get(run_id).cloned();
        if let Some(held) = entry {
            held.cancel.cancel();
            self.free(run_id);
        }
    }

    /// Cancels every run (connection lost or drain deadline passed).
    pub fn cancel_all(&self) {
        let all: Vec<_> = self.runs.borrow().keys().cloned().collect();
        for run_id in all {
            self.cancel(&run_id);
        }
    }

    /// Refuses new runs from now on.
    pub fn start_draining(&self) {
        self.draining.set(true);
    }

    /// Resolves when no run is in flight.
    pub async fn wait_idle(&self) {
        while !self.runs.borrow().is_empty() {
            self.idle.notified().await;
        }
    }
}

/// Time until the edge's `deadline_ms` (Unix ms; 0 = none). A deadline
/// already past on arrival means the clocks disagree (the edge sends it at
/// dispatch): the edge still enforces it, so the node adds none.
fn time_left(deadline_ms: u64, run_id: &str) -> Option<std::time::Duration> {
    if deadline_ms == 0 {
        return None;
    }
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).ok()?;
    let left = std::time::Duration::from_millis(deadline_ms).checked_sub(now);
    if left.is_none() {
        tracing::warn!(run = %run_id, "run deadline is already past on arrival: is this node's clock ahead of the edge's?");
    }
    left
}

/// Runs one tunnel until its terminal, a cancel, a stall or the task's
/// end. A function returning a block, not an `async fn`: the block keeps
/// its captures in place, where an `async fn` would hold a second copy of
/// its arguments for as long as the tunnel lasts.
#[allow(clippy::manual_async_fn)]
fn relay(
    adapter: Rc<Adapter>,
    spec: TunnelSpec,
    target: String,
    mut emitter: Emitter<TunnelItem>,
    cancel: LocalCancel,
    stall: StallWatch,
) -> impl std::future::Future<Output = ()> {
    async move {
        // The adapter enforces the tunnel's deadline itself; it is needed
        // here only while a stall's probe runs, after the adapter is gone.
        let deadline = spec.deadline.map(|d| iop_core::rt::clock::now() + d);
        let mut stalled = None;
        monoio::select! {
            biased;
            _ = adapter.tunnel(spec, &mut emitter) => {}
            _ = cancel.cancelled() => {}
            idle = stall.activity.stalled(stall.timeout) => stalled = Some(idle),
        }
        // The provider request is closed (its future dropped) at the claim.
        let failure = match stalled {
            Some(idle) => {
                let expiry = async {
                    match deadline {
                        Some(at) => iop_core::rt::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                };
                // Boxed: rare, and its probe would size every stream's task.
                Box::pin(stall.terminal(&adapter, &target, idle, &cancel, expiry)).await
            }
            None => None,
        };
        if !emitter.terminal_sent() && !cancel.is_cancelled() {
            let f = match (failure, stalled) {
                (Some(f), _) => f,
                // The deadline passed during the stall's probe: it wins.
                (None, Some(_)) => RunFailure::new(
                    codes::DEADLINE_EXCEEDED,
                    504,
                    FailureSource::Node,
                    "the tunnel did not finish within its deadline",
                ),
                (None, None) => RunFailure::new(
                    codes::INTERNAL,
                    502,
                    FailureSource::Node,
                    "provider tunnel ended without a terminal",
                ),
            };
            let _ = emitter.send(TunnelItem::Error(f)).await;
        }
        // Dropping the emitter frees the slot if no terminal did; a cancelled
        // tunnel needs no terminal (the edge already forgot it).
    }
}

/// Runs one normalized run until its terminal, a cancel, its deadline, a
/// stall or the task's end (a block for the reason given at [`relay`]).
#[allow(clippy::manual_async_fn)]
fn execute(
    adapter: Rc<Adapter>,
    spec: RunSpec,
    mut emitter: Emitter,
    cancel: LocalCancel,
    deadline: Option<std::time::Duration>,
    stall: StallWatch,
) -> impl std::future::Future<Output = ()> {
    async move {
        let run_id = spec.run_id.clone();
        let target = spec.target.clone();
        let mut expired = false;
        let mut expiry = std::pin::pin!(async {
            match deadline {
                Some(d) => iop_core::rt::time::sleep(d).await,
                None => std::future::pending().await,
            }
        });
        let mut stalled = None;
        // The deadline and the client's leaving win over a stall at the same instant.
        monoio::select! {
            biased;
            _ = adapter.execute(spec, &mut emitter) => {}
            _ = cancel.cancelled() => {}
            _ = &mut expiry => expired = true,
            idle = stall.activity.stalled(stall.timeout) => stalled = Some(idle),
        }
        let mut failure = None;
        if let Some(idle) = stalled {
            // Boxed: rare, and its probe would size every run's task.
            failure = Box::pin(stall.terminal(&adapter, &target, idle, &cancel, &mut expiry)).await;
            expired = failure.is_none() && !cancel.is_cancelled();
        }
        if !emitter.terminal_sent() {
            let ev = if cancel.is_cancelled() {
                ExecEvent::Cancelled { reason: "cancelled by edge".into() }
            } else if let Some(f) = failure {
                ExecEvent::Error(f)
            } else if expired {
                ExecEvent::Error(RunFailure::new(
                    codes::DEADLINE_EXCEEDED,
                    504,
                    FailureSource::Node,
                    format!(
                        "the run did not finish within its deadline ({} ms)",
                        deadline.unwrap_or_default().as_millis()
                    ),
                ))
            } else {
                tracing::warn!(run = %run_id, adapter = adapter.id(), "adapter ended without a terminal event");
                ExecEvent::Error(RunFailure::new(
                    codes::INTERNAL,
                    502,
                    FailureSource::Node,
                    "provider adapter ended without a terminal event",
                ))
            };
            let _ = emitter.emit(ev).await;
        }
        // Dropping the emitter frees the slot if no terminal did.
    }
}

/// Refuses a raw stall timeout the contract does not allow.
fn stall_timeout(raw_ms: u64) -> Result<std::time::Duration, RunFailure> {
    iop_core::liveness::stall_timeout_from_wire(raw_ms).map_err(|ms| {
        let max = iop_core::liveness::MAX_STALL_TIMEOUT_MS;
        let msg = format!("response_stall_timeout_ms {ms} is above the largest accepted ({max})");
        RunFailure::new(codes::INVALID_REQUEST, 400, FailureSource::Edge, msg)
    })
}

/// One stream's stall watch: its timeout, the progress its emitter reports,
/// and the link's observation sequence.
struct StallWatch {
    timeout: std::time::Duration,
    activity: Rc<Activity>,
    seq: HealthSeq,
}

impl StallWatch {
    /// After a stall was claimed (the provider request already closed):
    /// probes the exact target, numbers the observation, and gives the
    /// terminal. `None` when the edge cancelled or `deadline` passed
    /// meanwhile (those win).
    async fn terminal(
        &self,
        adapter: &Adapter,
        target: &str,
        idle: std::time::Duration,
        cancel: &LocalCancel,
        deadline: impl std::future::Future<Output = ()>,
    ) -> Option<RunFailure> {
        let health = monoio::select! {
            biased;
            _ = cancel.cancelled() => return None,
            _ = deadline => return None,
            h = adapter.probe_health(target) => h,
        };
        let seq = self.seq.next();
        let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let evidence = StallEvidence { timeout_ms: ms(self.timeout), idle_ms: ms(idle), health, seq };
        crate::metrics::stall(health, idle);
        tracing::warn!(
            event = "node_response_stall_observation",
            provider = adapter.id(),
            health = health.as_str(),
            classification = health.classification(),
            timeout_ms = evidence.timeout_ms,
            idle_ms = evidence.idle_ms,
            seq,
            "the provider sent nothing within the response-stall timeout"
        );
        let msg = format!("the provider sent nothing for {} ms", evidence.timeout_ms);
        let mut f = RunFailure::new(codes::RESPONSE_STALLED, 504, FailureSource::Provider, msg);
        // The provider request was closed at the claim (its return is
        // confirmed): trying elsewhere is safe where nothing reached the client.
        f.retryable = true;
        f.stall = Some(Box::new(evidence));
        Some(f)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use std::time::Duration;

    use bytes::{Bytes, BytesMut};
    use iop_core::{
        rt::frames::FrameReader,
        wire::{pb::envelope::Body, DEFAULT_MAX_FRAME_BYTES},
    };
    use monoio::net::{TcpListener, TcpStream};

    use super::*;
    use crate::adapter::{mock::MockSettings, MockAdapter};
    use iop_core::liveness::ProviderHealth;

    /// A node-side frame writer and the edge side's reader of one loopback link.
    async fn link() -> (FrameWriter, FrameReader<TcpStream>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let conn = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (edge_side, _) = listener.accept().await.unwrap();
        let writer = FrameWriter::new(DEFAULT_MAX_FRAME_BYTES, 1 << 20, 1 << 24);
        monoio::spawn(writer.clone().run(conn));
        (writer, FrameReader::new(edge_side, DEFAULT_MAX_FRAME_BYTES, BytesMut::new()))
    }

    /// The first error a stream got, as (stream id, code, status).
    async fn next_error(reader: &mut FrameReader<TcpStream>) -> (String, String, u32) {
        loop {
            let env = reader.next().await.unwrap().unwrap();
            match env.body {
                Some(Body::RunEvent(pb::RunEvent { run_id, kind: Some(pb::run_event::Kind::Error(e)), .. })) => {
                    return (String::from_utf8(run_id.to_vec()).unwrap(), e.code, e.status);
                }
                Some(Body::ProviderTunnelFrame(pb::ProviderTunnelFrame {
                    tunnel_id,
                    kind: Some(pb::provider_tunnel_frame::Kind::Error(e)),
                    ..
                })) => return (String::from_utf8(tunnel_id.to_vec()).unwrap(), e.code, e.status),
                _ => {}
            }
        }
    }

    /// The first error a stream got, whole.
    async fn next_run_error(reader: &mut FrameReader<TcpStream>) -> (String, pb::RunError) {
        loop {
            let env = reader.next().await.unwrap().unwrap();
            if let Some(Body::RunEvent(pb::RunEvent { run_id, kind: Some(pb::run_event::Kind::Error(e)), .. })) =
                env.body
            {
                return (String::from_utf8(run_id.to_vec()).unwrap(), e);
            }
        }
    }

    #[test]
    fn an_open_tunnel_s_task_stays_within_jemalloc_s_2_kib_class() {
        // Every open tunnel holds this task while it waits for tokens; past
        // 2 048 bytes (with monoio's 48-byte header and trailer) it lands in
        // the 2 560-byte class: half a KiB more under every open stream.
        iop_core::rt::block_on_current(async {
            let (writer, _reader) = link().await;
            let adapter = Rc::new(Adapter::Mock(MockAdapter::new("p".into(), 4, MockSettings::default())));
            let manager = RunManager::new(Vec::new(), Gates::new(), writer.clone());
            let req = pb::ProviderTunnelRequest {
                tunnel_id: "t".into(),
                method: "POST".into(),
                path: iop_core::tunnel::PATHS[0].into(),
                ..Default::default()
            };
            let spec = TunnelSpec::from_wire(req, None).unwrap();
            let stall = manager.stall(Duration::from_secs(1));
            let task = relay(adapter, spec, String::new(), Emitter::new(writer, "t".into()), LocalCancel::new(), stall);
            let size = std::mem::size_of_val(&task);
            assert!(size + 48 <= 2048, "the tunnel's task is {size} bytes");
        })
        .unwrap();
    }

    #[test]
    fn a_silent_provider_ends_each_run_with_one_numbered_stall_and_bad_timeouts_are_refused() {
        iop_core::rt::block_on_current(async {
            let (writer, mut reader) = link().await;
            // One token, then an hour of silence.
            let settings = MockSettings { tokens: 5, token_interval: Duration::from_secs(3600), ..Default::default() };
            let adapters = vec![Adapter::Mock(MockAdapter::new("p".into(), 4, settings))];
            let manager = RunManager::new(adapters, Gates::new(), writer);
            let body = Bytes::from_static(br#"{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}"#);
            let run = |id: &str, stall_ms: u64| pb::RunRequest {
                run_id: id.into(),
                adapter: "p".into(),
                target: "m".into(),
                body: body.clone(),
                response_stall_timeout_ms: stall_ms,
                ..Default::default()
            };
            for (id, seq) in [("r1", 1), ("r2", 2)] {
                let started = std::time::Instant::now();
                manager.start(run(id, 60));
                let (got, e) = next_run_error(&mut reader).await;
                assert_eq!((got.as_str(), e.code.as_str(), e.status), (id, codes::RESPONSE_STALLED, 504));
                assert!(started.elapsed() >= Duration::from_millis(60));
                let f = RunFailure::from(e);
                let evidence = f.stall.expect("stall evidence");
                assert_eq!((evidence.health, evidence.seq, evidence.timeout_ms), (ProviderHealth::Available, seq, 60));
                assert!(evidence.idle_ms >= 60);
                assert!(f.retryable, "the provider request was closed at the claim");
            }
            // The slot of each went back with its terminal.
            assert_eq!(manager.active(), 0);
            // Refused before the adapter is called (and before a slot is taken).
            manager.start(run("r3", iop_core::liveness::MAX_STALL_TIMEOUT_MS + 1));
            let (got, e) = next_run_error(&mut reader).await;
            assert_eq!((got.as_str(), e.code.as_str(), e.status), ("r3", codes::INVALID_REQUEST, 400));
            assert!(e.message.contains("response_stall_timeout_ms"), "{}", e.message);
            assert_eq!(manager.active(), 0);
        })
        .unwrap();
    }

    #[test]
    fn on_a_manual_clock_a_stall_fires_at_its_window_and_loses_to_a_cancel_or_the_deadline_at_the_same_instant() {
        iop_core::rt::block_on_current(async {
            let clock = iop_core::rt::clock::ManualClock::install();
            let (writer, mut reader) = link().await;
            // One token, then an hour of silence (on the manual clock).
            let settings = MockSettings { tokens: 5, token_interval: Duration::from_secs(3600), ..Default::default() };
            let adapters = vec![Adapter::Mock(MockAdapter::new("p".into(), 4, settings))];
            let manager = RunManager::new(adapters, Gates::new(), writer);
            let body = Bytes::from_static(br#"{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}"#);
            let run = |id: &str, deadline_ms: u64| pb::RunRequest {
                run_id: id.into(),
                adapter: "p".into(),
                target: "m".into(),
                body: body.clone(),
                response_stall_timeout_ms: 100,
                deadline_ms,
                ..Default::default()
            };
            let settle = || async {
                for _ in 0..8 {
                    iop_core::rt::yield_now().await;
                }
            };
            // A client that leaves at the instant the window closes wins.
            manager.start(run("cancelled", 0));
            settle().await;
            clock.advance(Duration::from_millis(100));
            manager.cancel("cancelled");
            settle().await;
            // The deadline and the stall due at the same instant: the deadline wins.
            let unix_ms =
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
            manager.start(run("deadline", unix_ms + 100));
            settle().await;
            clock.advance(Duration::from_millis(100));
            let (id, code, _) = next_error(&mut reader).await;
            assert_eq!(
                (id.as_str(), code.as_str()),
                ("deadline", codes::DEADLINE_EXCEEDED),
                "the cancelled run sent no stall"
            );
            // Alone, the stall fires exactly at its window, not a moment before.
            manager.start(run("stalled", 0));
            settle().await;
            clock.advance(Duration::from_millis(99));
            settle().await;
            manager.start(run("marker", 0));
            settle().await;
            clock.advance(Duration::from_millis(1));
            let (id, code, _) = next_error(&mut reader).await;
            assert_eq!((id.as_str(), code.as_str()), ("stalled", codes::RESPONSE_STALLED));
            manager.cancel("marker");
            settle().await;
            assert_eq!(manager.active(), 0);
        })
        .unwrap();
    }

    #[test]
    fn tunnels_and_runs_share_one_gate_per_provider() {
        iop_core::rt::block_on_current(async {
            let (writer, mut reader) = link().await;
            // One slot; the mock streams slowly, so its run holds the slot.
            let settings =
                MockSettings { tokens: 1000, token_interval: Duration::from_millis(10), ..Default::default() };
            let gates = Gates::new();
            let adapters = vec![Adapter::Mock(MockAdapter::new("p".into(), 1, settings))];
            let manager = RunManager::new(adapters, gates.clone(), writer.clone());
            // Another worker's manager of the same process shares the gate.
            let other = RunManager::new(vec![Adapter::Mock(MockAdapter::new("p".into(), 1, settings))], gates, writer);
            let body = Bytes::from_static(br#"{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}"#);
            let run = |id: &str| pb::RunRequest {
                run_id: id.into(),
                adapter: "p".into(),
                target: "m".into(),
                body: body.clone(),
                ..Default::default()
            };
            let tunnel = |id: &str| pb::ProviderTunnelRequest {
                tunnel_id: id.into(),
                adapter: "p".into(),
                method: "POST".into(),
                path: "/chat/completions".into(),
                body: body.clone(),
                ..Default::default()
            };
            manager.start(run("r1"));
            // Past the edge's admission (as a buggy or second edge would be):
            // the node's own gate refuses both kinds.
            manager.start_tunnel(tunnel("t1"));
            assert_eq!(next_error(&mut reader).await, ("t1".into(), codes::CAPACITY.into(), 429));
            manager.start(run("r2"));
            assert_eq!(next_error(&mut reader).await, ("r2".into(), codes::CAPACITY.into(), 429));
            other.start(run("r3"));
            assert_eq!(next_error(&mut reader).await, ("r3".into(), codes::CAPACITY.into(), 429));
            assert_eq!(manager.active(), 1);
            // The slot freed, a tunnel is admitted (the mock then refuses
            // it for what it is, a provider without an HTTP API).
            manager.cancel("r1");
            manager.start_tunnel(tunnel("t2"));
            let (id, code, status) = next_error(&mut reader).await;
            assert_eq!((id.as_str(), status), ("t2", 501), "{code}");
        })
        .unwrap();
    }

    /// (text of every delta, number of delta events) of run `id` until its terminal.
    async fn deltas(reader: &mut FrameReader<TcpStream>, id: &str) -> (String, usize) {
        let (mut text, mut n) = (String::new(), 0);
        loop {
            let env = reader.next().await.unwrap().unwrap();
            let Some(Body::RunEvent(ev)) = env.body else { continue };
            if ev.run_id != id {
                continue;
            }
            match ev.kind {
                Some(pb::run_event::Kind::Delta(d)) => {
                    n += 1;
                    text.push_str(&d.text);
                }
                Some(pb::run_event::Kind::Complete(_)) => return (text, n),
                Some(pb::run_event::Kind::Error(e)) => panic!("{e:?}"),
                _ => {}
            }
        }
    }

    #[test]
    fn a_whole_answer_travels_as_merged_text() {
        iop_core::rt::block_on_current(async {
            let (writer, mut reader) = link().await;
            let settings = MockSettings { tokens: 20, token_interval: Duration::ZERO, ..Default::default() };
            let adapters = vec![Adapter::Mock(MockAdapter::new("p".into(), 4, settings))];
            let manager = RunManager::new(adapters, Gates::new(), writer);
            let body = Bytes::from_static(br#"{"model":"m","messages":[{"role":"user","content":"x"}]}"#);
            let run = |id: &str, whole: bool| pb::RunRequest {
                run_id: id.into(),
                adapter: "p".into(),
                target: "m".into(),
                body: body.clone(),
                whole,
                ..Default::default()
            };
            manager.start(run("streamed", false));
            let (streamed, per_token) = deltas(&mut reader, "streamed").await;
            manager.start(run("whole", true));
            let (whole, merged) = deltas(&mut reader, "whole").await;
            assert_eq!(whole, streamed, "the same text in the same order");
            assert_eq!(per_token, 20);
            assert_eq!(merged, 1, "one event for the whole text");
        })
        .unwrap();
    }
}
