//! Submits an admitted run to its node's session and streams its events.

use iop_core::{
    exec::{codes, ExecEvent, FailureSource, RunFailure},
    rt::mailbox::{self, SendError},
    wire::pb,
};

use crate::{
    pool::Admitted,
    transport::{SessionCmd, RUN_EVENT_CAPACITY},
    worker::Worker,
};

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
    rx: mailbox::Receiver<ExecEvent>,
    session: mailbox::Sender<SessionCmd>,
    run_id: String,
    node_id: String,
    done: bool,
}

impl RunStream {
    /// Next event; after a terminal event (or if the session vanished,
    /// which yields a synthesised error terminal) returns `None`.
    pub async fn next(&mut self) -> Option<ExecEvent> {
        if self.done {
            return None;
        }
        let ev = self.rx.recv().await.unwrap_or_else(|| {
            ExecEvent::Error(
                RunFailure::new(codes::NODE_DISCONNECTED, 502, FailureSource::Edge, "node session ended").retryable(),
            )
        });
        if ev.is_terminal() {
            self.finish(&ev);
        }
        Some(ev)
    }

    /// A receiver for polling alongside other futures.
    pub fn receiver(&self) -> &mailbox::Receiver<ExecEvent> {
        &self.rx
    }

    /// Records the terminal `ev` taken from `receiver()`: releases the
    /// lease and publishes the run's outcome.
    pub fn finish(&mut self, ev: &ExecEvent) {
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
        let cmd = SessionCmd::Cancel { run_id: std::mem::take(&mut self.run_id), reason: "client_disconnected" };
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
    req.run_id = run_id.clone();
    req.adapter = target.provider;
    req.target = target.upstream_model;
    let (tx, rx) = mailbox::mailbox(RUN_EVENT_CAPACITY);
    match session.try_send(SessionCmd::Run { req: Box::new(req), events: tx, lease }) {
        Ok(()) => Ok(RunStream {
            shared: worker.shared.clone(),
            model: model.to_owned(),
            rx,
            session,
            run_id,
            node_id,
            done: false,
        }),
        Err(SendError::Full(_)) => Err(DispatchError::NodeBusy(node_id)),
        Err(SendError::Closed(_)) => Err(DispatchError::NoReadyNode(node_id)),
    }
}
