//! Submits an admitted run to its node's session and streams its events.

use std::{
    pin::Pin,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use iop_core::{
    exec::{codes, ExecEvent, FailureSource, RunFailure},
    rt::mailbox::{self, SendError},
    wire::pb,
};

use crate::{
    pool::Admitted,
    transport::{run_events, RunReceiver, SessionCmd},
    worker::Worker,
};

/// How long after a run's deadline the edge gives up on it itself: the node
/// enforces the same deadline and its typed error should arrive first.
pub const DEADLINE_GRACE: Duration = Duration::from_secs(1);
/// A run's deadline when its provider is no longer in the config.
const DEFAULT_RUN_TIMEOUT: Duration = Duration::from_secs(600);

/// Why a run could not be submitted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DispatchError {
    /// The admitted node is not (or no longer) ready.
    #[error("node `{0}` is not ready")]
    NoReadyNode(String),
    /// The node's session is saturated with commands.
    #[error("node `{0}` is busy")]
    NodeBusy(String),
}

/// The events of a submitted run. Dropping it before the terminal event
/// cancels the run on the node. (The run's lease lives in the node session,
/// which releases it when the run ends.)
pub struct RunStream {
    shared: std::sync::Arc<crate::shared::Shared>,
    model: String,
    rx: RunReceiver,
    session: mailbox::Sender<SessionCmd>,
    run_id: String,
    node_id: String,
    done: bool,
    /// The run's deadline (its provider's `request_timeout_sec` from
    /// dispatch) plus [`DEADLINE_GRACE`].
    deadline: Pin<Box<monoio::time::Sleep>>,
    timeout: Duration,
}

impl RunStream {
    /// Next event; after a terminal event (or if the session vanished,
    /// which yields a synthesised error terminal) returns `None`. Past the
    /// deadline the run is cancelled on the node and ends with
    /// `deadline_exceeded` (504).
    pub async fn next(&mut self) -> Option<ExecEvent> {
        if self.done {
            return None;
        }
        let Self { rx, deadline, .. } = self;
        let ev = monoio::select! {
            ev = rx.recv() => ev.unwrap_or_else(|| {
                ExecEvent::Error(
                    RunFailure::new(codes::NODE_DISCONNECTED, 502, FailureSource::Edge, "node session ended")
                        .retryable(),
                )
            }),
            _ = deadline.as_mut() => self.expire(),
        };
        if ev.is_terminal() {
            self.finish(&ev);
        }
        Some(ev)
    }

    /// The next event already queued, without waiting.
    pub fn try_next(&mut self) -> Option<ExecEvent> {
        if self.done {
            return None;
        }
        let ev = self.rx.try_recv()?;
        if ev.is_terminal() {
            self.finish(&ev);
        }
        Some(ev)
    }

    /// The deadline passed: cancel on the node (which drops the lease
    /// there, once) and end with a typed error.
    fn expire(&mut self) -> ExecEvent {
        tracing::warn!(run = %self.run_id, node = %self.node_id, timeout_ms = self.timeout.as_millis() as u64, "run deadline passed; cancelling it");
        self.cancel_on_node("deadline_exceeded");
        ExecEvent::Error(RunFailure::new(
            codes::DEADLINE_EXCEEDED,
            504,
            FailureSource::Node,
            format!("the run did not finish within {} s", self.timeout.as_secs()),
        ))
    }

    fn cancel_on_node(&self, reason: &'static str) {
        let cmd = SessionCmd::Cancel { run_id: self.run_id.clone(), reason };
        match self.session.try_send(cmd) {
            Ok(()) | Err(SendError::Closed(_)) => {}
            Err(SendError::Full(cmd)) => {
                // Never lose a cancel: wait for room off the caller's path.
                let session = self.session.clone();
                monoio::spawn(async move {
                    let _ = session.send(cmd).await;
                });
            }
        }
    }

    /// Records the terminal `ev`: publishes the run's outcome.
    fn finish(&mut self, ev: &ExecEvent) {
        if self.done {
            return;
        }
        self.done = true;
        let (outcome, code) = match ev {
            ExecEvent::Complete { .. } => ("complete", None),
            ExecEvent::Error(f) => ("error", Some(f.code)),
            _ => ("cancelled", None),
        };
        self.shared.events.publish(crate::events::EdgeEvent::RunTerminal {
            run_id: self.run_id.clone(),
            node: self.node_id.clone(),
            model: self.model.clone(),
            outcome,
            code,
        });
    }

    /// Run id.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// Node the run was dispatched to.
    pub fn node_id(&self) -> &str {
        &self.node_id
    }
}

impl Drop for RunStream {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        self.finish(&ExecEvent::Cancelled { reason: "client_disconnected".into() });
        self.cancel_on_node("client_disconnected");
    }
}

/// Submits `req` (run_id, adapter and target are filled in here) to the
/// node the lease in `admitted` is for.
pub fn submit(
    worker: &Worker,
    model: &str,
    admitted: Admitted,
    mut req: pb::RunRequest,
) -> Result<RunStream, DispatchError> {
    let Admitted { lease, target } = admitted;
    let node_id = target.node.clone();
    let session = match lease.route() {
        Some(route) => route.session.clone(),
        None => match worker.routes.borrow().get(&node_id) {
            Some(route) => route.session.clone(),
            None => return Err(DispatchError::NoReadyNode(node_id)),
        },
    };
    let run_id = worker.next_run_id();
    let timeout =
        worker.config.borrow().provider(&node_id, &target.provider).map_or(DEFAULT_RUN_TIMEOUT, |p| p.request_timeout);
    req.run_id = run_id.clone();
    req.adapter = target.provider;
    req.target = target.upstream_model;
    req.deadline_ms = unix_ms(SystemTime::now() + timeout);
    let (tx, rx) = run_events();
    match session.try_send(SessionCmd::Run { req: Box::new(req), events: tx, lease }) {
        Ok(()) => Ok(RunStream {
            shared: worker.shared.clone(),
            model: model.to_owned(),
            rx,
            session,
            run_id,
            node_id,
            done: false,
            deadline: Box::pin(monoio::time::sleep(timeout + DEADLINE_GRACE)),
            timeout,
        }),
        Err(SendError::Full(_)) => Err(DispatchError::NodeBusy(node_id)),
        Err(SendError::Closed(_)) => Err(DispatchError::NoReadyNode(node_id)),
    }
}

/// Milliseconds since the Unix epoch (the wire's `deadline_ms`).
fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
