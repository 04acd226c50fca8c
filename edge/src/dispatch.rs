//! Submits an admitted run or tunnel to its node's session and streams its
//! items back to the client's task.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use iop_core::{
    exec::{codes, ExecEvent, FailureSource, RunFailure, Usage},
    flow,
    rt::mailbox::{self, SendError},
    tunnel::TunnelItem,
    wire::pb,
};

use crate::{
    ctx::Ctx,
    link::SessionCmd,
    pool::Admitted,
    run_item::RunItem,
    stream::{channel, Failing, StreamRx},
};

/// How long after a stream's deadline the edge gives up on it itself: the
/// node enforces the same deadline and its typed error should arrive first.
pub const DEADLINE_GRACE: Duration = Duration::from_secs(1);
/// A stream's deadline when its provider is no longer in the config.
const DEFAULT_RUN_TIMEOUT: Duration = Duration::from_secs(600);

/// Why a run or tunnel could not be submitted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DispatchError {
    /// The admitted node is not (or no longer) ready.
    #[error("node `{0}` is not ready")]
    NoReadyNode(String),
    /// The node's session is saturated with commands.
    #[error("node `{0}` is busy")]
    NodeBusy(String),
}

/// What a terminal item says about how the stream ended.
pub trait Outcome: Failing {
    /// `(outcome, failure code, usage)` for the `run_terminal` event.
    fn outcome(&self) -> (&'static str, Option<&'static str>, Option<Usage>);

    /// `normalized` or `tunnel`.
    const PATH: &'static str;
}

impl Outcome for RunItem {
    fn outcome(&self) -> (&'static str, Option<&'static str>, Option<Usage>) {
        match self {
            RunItem::Event(ExecEvent::Complete { usage, .. }) => ("complete", None, *usage),
            RunItem::Event(ExecEvent::Error(f)) => ("error", Some(f.code), None),
            _ => ("cancelled", None, None),
        }
    }
    const PATH: &'static str = "normalized";
}

impl Outcome for TunnelItem {
    fn outcome(&self) -> (&'static str, Option<&'static str>, Option<Usage>) {
        match self {
            TunnelItem::End { usage } => ("complete", None, *usage),
            TunnelItem::Whole(w) => ("complete", None, w.usage),
            TunnelItem::Error(f) => ("error", Some(f.code), None),
            _ => ("cancelled", None, None),
        }
    }
    const PATH: &'static str = "tunnel";
}

/// The items of a submitted run or tunnel. Dropping it before the terminal
/// cancels it on the node. (The lease lives in the node session, which
/// releases it when the stream ends there.)
pub struct Stream<T: Outcome> {
    shared: std::sync::Arc<crate::shared::Shared>,
    model: String,
    rx: StreamRx<T>,
    session: mailbox::Sender<SessionCmd>,
    id: String,
    node_id: std::sync::Arc<str>,
    done: bool,
    /// Cost taken from the channel and not yet written to the client.
    unwritten: u64,
    /// Cost written (or, without `credit_on_write`, taken) and not yet
    /// granted back to the node.
    taken: u64,
    /// Grant credit only for what was written to the client (streaming
    /// writers), not for what was taken from the queue.
    credit_on_write: bool,
    /// Where the model's usage is added up.
    usage: Option<std::sync::Arc<crate::pool::ModelUsage>>,
    /// The stream's deadline (its provider's `request_timeout_sec` from
    /// dispatch) plus [`DEADLINE_GRACE`].
    deadline: iop_core::rt::time::Sleep,
    timeout: Duration,
    /// The request's record, told how the stream ended.
    finish: Option<std::rc::Rc<std::cell::RefCell<crate::server::Finish>>>,
    /// The client's session id ("" when none), for the terminal event.
    session_id: String,
}

pub use crate::run_stream::RunStream;
/// The items of a provider tunnel.
pub type TunnelStream = Stream<TunnelItem>;

impl<T: Outcome> Stream<T> {
    /// Next item; after a terminal (or if the session vanished, which
    /// yields a synthesised error terminal) returns `None`. Past the
    /// deadline the stream is cancelled on the node and ends with
    /// `deadline_exceeded` (504).
    pub async fn next(&mut self) -> Option<T> {
        if self.done {
            return None;
        }
        let Self { rx, deadline, .. } = self;
        let item = monoio::select! {
            item = rx.recv_costed() => item.unwrap_or_else(|| {
                let f = RunFailure::new(codes::NODE_DISCONNECTED, 502, FailureSource::Edge, "node session ended");
                (T::failed(f.retryable()), 0)
            }),
            _ = &mut *deadline => (self.expire(), 0),
        };
        let (item, cost) = item;
        self.took(&item, cost);
        Some(item)
    }

    /// Gives back the memory of the stream's empty queue, before a long wait.
    pub fn shrink(&mut self) {
        self.rx.shrink();
    }

    /// Items queued and not yet taken (a hint: the node may add more).
    pub fn pending(&mut self) -> usize {
        if self.done {
            0
        } else {
            self.rx.pending()
        }
    }

    /// The next item already queued, without waiting.
    pub fn try_next(&mut self) -> Option<T> {
        if self.done {
            return None;
        }
        let (item, cost) = self.rx.try_recv_costed()?;
        self.took(&item, cost);
        Some(item)
    }

    /// Accounts for an item handed to the client's task: a terminal ends
    /// the stream; anything else is credit to return once written.
    fn took(&mut self, item: &T, cost: usize) {
        if item.is_terminal() {
            self.finish(item);
            return;
        }
        self.unwritten += cost as u64;
        if !self.credit_on_write {
            self.written();
        }
    }

    /// From now on, credit goes back to the node only for what the caller
    /// says it wrote ([`Self::written`]): a client that does not read then
    /// holds at most the window, queued and in its pending write together.
    pub fn credit_on_write(&mut self) {
        self.credit_on_write = true;
    }

    /// What was taken so far reached the client: returns credit to the node
    /// in batches, and whatever is owed once the queue is empty (a node may
    /// be waiting to send an item larger than its credit left; see
    /// [`flow::may_send`]).
    pub fn written(&mut self) {
        // Off the session's count before the node gets the credit.
        self.rx.settle();
        self.taken += std::mem::take(&mut self.unwritten);
        let drained = self.taken >= flow::IDLE_GRANT && self.rx.queued_bytes() == 0;
        if self.taken >= flow::CREDIT_BATCH || drained {
            let cmd = SessionCmd::Credit { id: self.id.clone(), bytes: std::mem::take(&mut self.taken) };
            self.command(cmd);
        }
    }

    /// Ends the stream here with `f` (the node broke the protocol): the
    /// run is cancelled on the node, and `f`'s terminal is what to hand out.
    pub fn fail_here(&mut self, f: RunFailure) -> T {
        self.cancel_on_node("protocol_violation");
        let item = T::failed(f);
        self.took(&item, 0);
        item
    }

    /// The deadline passed: cancel on the node (which drops the lease
    /// there, once) and end with a typed error.
    fn expire(&mut self) -> T {
        tracing::warn!(run = %self.id, node = %self.node_id, timeout_ms = self.timeout.as_millis() as u64, "run deadline passed; cancelling it");
        self.cancel_on_node("deadline_exceeded");
        T::failed(RunFailure::new(
            codes::DEADLINE_EXCEEDED,
            504,
            FailureSource::Node,
            format!("the run did not finish within {} s", self.timeout.as_secs()),
        ))
    }

    fn cancel_on_node(&self, reason: &'static str) {
        self.command(SessionCmd::Cancel { run_id: self.id.clone(), reason });
    }

    fn command(&self, cmd: SessionCmd) {
        match self.session.try_send(cmd) {
            Ok(()) | Err(SendError::Closed(_)) => {}
            Err(SendError::Full(cmd)) => {
                // Never lose a cancel or credit: wait for room off the caller's path.
                let session = self.session.clone();
                monoio::spawn(async move {
                    let _ = session.send(cmd).await;
                });
            }
        }
    }

    /// Records the terminal `item`: publishes the stream's outcome.
    fn finish(&mut self, item: &T) {
        let (outcome, code, usage) = item.outcome();
        if outcome == "complete" {
            if let Some(totals) = &self.usage {
                totals.add(usage.as_ref());
            }
        }
        self.publish(outcome, code, usage);
    }

    fn publish(&mut self, outcome: &'static str, code: Option<&'static str>, usage: Option<Usage>) {
        if self.done {
            return;
        }
        self.done = true;
        if let Some(f) = &self.finish {
            let mut f = f.borrow_mut();
            (f.outcome, f.code, f.usage) = (outcome, code, usage);
        }
        self.shared.events.publish_with(|| crate::events::EdgeEvent::RunTerminal {
            run_id: self.id.clone(),
            node: self.node_id.to_string(),
            model: self.model.clone(),
            outcome,
            code,
            path: T::PATH,
            usage,
            session_id: self.session_id.clone(),
        });
    }
}

impl<T: Outcome> Stream<T> {
    /// Run or tunnel id.
    pub fn run_id(&self) -> &str {
        &self.id
    }

    /// Node the stream was dispatched to.
    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// Tells the request's record where this stream runs (`key`: its
    /// lease's resource) and, when it ends, how.
    pub fn report_to(
        &mut self,
        finish: &std::rc::Rc<std::cell::RefCell<crate::server::Finish>>,
        key: &crate::pool::ResourceKey,
    ) {
        {
            let mut f = finish.borrow_mut();
            f.id.clear();
            f.id.push_str(&self.id);
            f.node = Some(key.node.clone());
            f.provider = Some(key.provider.clone());
            f.attempts += 1;
        }
        self.finish = Some(finish.clone());
    }
}

impl<T: Outcome> Drop for Stream<T> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        self.publish("cancelled", None, None);
        self.cancel_on_node("client_disconnected");
    }
}

/// Where an admitted stream goes: the sessions of its node's links in the
/// order to try them, its id and deadline.
struct Route {
    sessions: Vec<mailbox::Sender<SessionCmd>>,
    id: String,
    node_id: std::sync::Arc<str>,
    timeout: Duration,
    /// The selected provider's `response_stall_timeout_ms` (0: the wire's default).
    stall_timeout_ms: u64,
}

/// `f` of the node route `admitted` runs on: the one its lease carries,
/// else this core's route to the node; `None` when there is neither.
fn on_route<R>(worker: &Ctx, admitted: &Admitted, f: impl FnOnce(&crate::link::NodeRoute) -> R) -> Option<R> {
    match admitted.lease.route() {
        Some(route) => Some(f(route)),
        None => worker.routes.borrow().get(&*admitted.target.node).map(f),
    }
}

/// Whether a link of the node `admitted` is for still takes runs. A grant
/// can outlive its route: the capacity a dying link's runs freed may be
/// granted through the node's last link just before that one goes too.
pub fn reachable(worker: &Ctx, admitted: &Admitted) -> bool {
    on_route(worker, admitted, |r| r.links.iter().any(|l| !l.session.is_closed())).unwrap_or(false)
}

/// Capacity on `group` for a request of `class` (with its affinity `key`,
/// if any), queueing if need be, on a node this core can still reach. The
/// caller watches its client meanwhile (dropping this leaves the queue).
pub async fn admit_reachable(
    worker: &std::rc::Rc<Ctx>,
    group: &iop_core::config::ModelGroup,
    class: crate::pool::LeaseClass,
    key: Option<crate::pool::AffinityKey>,
) -> Result<Admitted, crate::pool::AdmitError> {
    let mut regrants = 0;
    loop {
        let admitted = crate::pool::admit(worker, group, class, key).await?;
        // Granted through links that closed meanwhile (the node is going
        // away): the lease goes back and the request asks again, so a
        // queued client is not failed by a node it never reached. The
        // node's fence is on its way to every core; a few turns suffice.
        if regrants < MAX_REGRANTS && !reachable(worker, &admitted) {
            regrants += 1;
            drop(admitted);
            iop_core::rt::yield_now().await;
            continue;
        }
        return Ok(admitted);
    }
}

/// Grants taken again, at most, when one came through links already closed.
const MAX_REGRANTS: u32 = 8;

/// The node connection generation `admitted` runs on (0: none ready).
pub fn generation_of(worker: &Ctx, admitted: &Admitted) -> crate::registry::Generation {
    on_route(worker, admitted, |r| r.generation).unwrap_or(0)
}

fn route(worker: &Ctx, admitted: &Admitted) -> Result<Route, DispatchError> {
    let node_id = admitted.target.node.clone();
    let turn = worker.next_link_turn();
    let order = |r: &crate::link::NodeRoute| -> Vec<mailbox::Sender<SessionCmd>> {
        r.order(worker.index, turn).into_iter().map(|l| l.session.clone()).collect()
    };
    let sessions = on_route(worker, admitted, order).unwrap_or_default();
    if sessions.is_empty() {
        return Err(DispatchError::NoReadyNode(node_id.to_string()));
    }
    let (timeout, stall_timeout_ms) =
        worker.config.borrow().provider(&node_id, &admitted.target.provider).map_or((DEFAULT_RUN_TIMEOUT, 0), |p| {
            (p.request_timeout, u64::try_from(p.response_stall_timeout.as_millis()).unwrap_or(0))
        });
    Ok(Route { sessions, id: worker.next_run_id(), node_id, timeout, stall_timeout_ms })
}

impl Route {
    /// Sends `cmd` to the first link that takes it (a link that just went
    /// away, or whose queue is full, passes it to the next); returns the
    /// session that took it.
    fn send(&mut self, mut cmd: SessionCmd) -> Result<mailbox::Sender<SessionCmd>, DispatchError> {
        let mut full = false;
        for session in std::mem::take(&mut self.sessions) {
            match session.try_send(cmd) {
                Ok(()) => return Ok(session),
                Err(SendError::Full(c)) => {
                    full = true;
                    cmd = c;
                }
                Err(SendError::Closed(c)) => cmd = c,
            }
        }
        // Dropping `cmd` drops its lease and its events' sender.
        drop(cmd);
        let node = self.node_id.to_string();
        Err(if full { DispatchError::NodeBusy(node) } else { DispatchError::NoReadyNode(node) })
    }

    fn stream<T: Outcome>(
        self,
        worker: &Ctx,
        model: &str,
        rx: StreamRx<T>,
        session: mailbox::Sender<SessionCmd>,
        session_id: String,
    ) -> Stream<T> {
        Stream {
            shared: worker.shared.clone(),
            model: model.to_owned(),
            rx,
            session,
            id: self.id,
            node_id: self.node_id,
            done: false,
            unwritten: 0,
            taken: 0,
            credit_on_write: false,
            usage: worker.pool.borrow().usage.get(model).cloned(),
            deadline: iop_core::rt::time::sleep(self.timeout + DEADLINE_GRACE),
            timeout: self.timeout,
            finish: None,
            session_id,
        }
    }

    fn deadline_ms(&self) -> u64 {
        unix_ms(SystemTime::now() + self.timeout)
    }
}

/// Submits `req` (run_id, adapter, target and deadline are filled in here)
/// to the node the lease in `admitted` is for.
pub fn submit(
    worker: &Ctx,
    model: &str,
    admitted: Admitted,
    mut req: pb::RunRequest,
) -> Result<RunStream, DispatchError> {
    let mut route = route(worker, &admitted)?;
    let Admitted { lease, target, .. } = admitted;
    req.run_id = route.id.clone();
    req.adapter = target.provider.to_string();
    req.target = target.upstream_model.to_string();
    req.deadline_ms = route.deadline_ms();
    req.window_bytes = flow::WINDOW_BYTES;
    req.response_stall_timeout_ms = route.stall_timeout_ms;
    let session_id = req.session_id.clone();
    let (tx, rx) = channel();
    let session = route.send(SessionCmd::Run { req: Box::new(req), events: tx, lease })?;
    Ok(RunStream::new(route.stream(worker, model, rx, session, session_id)))
}

/// Submits a provider tunnel request (tunnel_id, adapter, target, deadline
/// and the `headers` made for the tunnel id are filled in here) to the node
/// the lease in `admitted` is for.
pub fn submit_tunnel(
    worker: &Ctx,
    model: &str,
    admitted: Admitted,
    mut req: pb::ProviderTunnelRequest,
    headers: impl FnOnce(&str) -> Vec<pb::Header>,
) -> Result<TunnelStream, DispatchError> {
    let mut route = route(worker, &admitted)?;
    let Admitted { lease, target, .. } = admitted;
    req.headers = headers(&route.id);
    req.tunnel_id = route.id.clone();
    req.adapter = target.provider.to_string();
    req.target = target.upstream_model.to_string();
    req.deadline_ms = route.deadline_ms();
    req.window_bytes = flow::WINDOW_BYTES;
    req.response_stall_timeout_ms = route.stall_timeout_ms;
    let session_id = req.session_id.clone();
    let (tx, rx) = channel();
    let session = route.send(SessionCmd::Tunnel { req: Box::new(req), events: tx, lease })?;
    Ok(route.stream(worker, model, rx, session, session_id))
}

/// Milliseconds since the Unix epoch (the wire's `deadline_ms`).
fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
