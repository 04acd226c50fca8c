//! Picks the node for a public model and submits a run to its session.

use iop_core::{
    config::ModelRoute,
    exec::{codes, ExecEvent, FailureSource, RunFailure},
    rt::mailbox::{self, SendError},
    wire::pb,
};

use crate::{
    transport::{SessionCmd, RUN_EVENT_CAPACITY},
    worker::Worker,
};

/// Why a run could not be submitted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DispatchError {
    /// No ready node serves the model.
    #[error("no ready node serves model `{0}`")]
    NoReadyNode(String),
    /// The node's session is saturated with commands.
    #[error("node `{0}` is busy")]
    NodeBusy(String),
}

/// The events of a submitted run. Dropping it before the terminal event
/// cancels the run on the node.
pub struct RunStream {
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
        self.done = ev.is_terminal();
        Some(ev)
    }

    /// A receiver for polling alongside other futures.
    pub fn receiver(&self) -> &mailbox::Receiver<ExecEvent> {
        &self.rx
    }

    /// Marks the run finished after a terminal was taken from `receiver()`.
    pub fn mark_done(&mut self) {
        self.done = true;
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

/// Submits `req` (run_id, adapter and target are filled in here) for
/// `route` on a ready node.
pub fn submit(worker: &Worker, route: &ModelRoute, mut req: pb::RunRequest) -> Result<RunStream, DispatchError> {
    let config = worker.config.borrow().clone();
    let routes = worker.routes.borrow();
    let chosen = match &route.node {
        Some(node) => routes.get(node).map(|r| (node.clone(), r)),
        // No node named: the first ready node (config order) running the provider.
        None => config
            .nodes
            .iter()
            .filter_map(|n| routes.get(&n.id).map(|r| (n.id.clone(), r)))
            .find(|(_, r)| r.providers.iter().any(|p| p == &route.provider)),
    };
    let Some((node_id, node)) = chosen else {
        return Err(DispatchError::NoReadyNode(route.name.clone()));
    };
    let session = node.session.clone();
    drop(routes);

    let run_id = worker.next_run_id();
    req.run_id = run_id.clone();
    req.adapter = route.provider.clone();
    req.target = route.upstream_model.clone();
    let (tx, rx) = mailbox::mailbox(RUN_EVENT_CAPACITY);
    match session.try_send(SessionCmd::Run { req, events: tx }) {
        Ok(()) => Ok(RunStream { rx, session, run_id, node_id, done: false }),
        Err(SendError::Full(_)) => Err(DispatchError::NodeBusy(node_id)),
        Err(SendError::Closed(_)) => Err(DispatchError::NoReadyNode(route.name.clone())),
    }
}
