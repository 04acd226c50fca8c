//! A coordinated request's workspace: admitted once before the first stage
//! (the configured owner, its dispatch-ready connection generation, the
//! capabilities and limits, all frozen), then reached only through the
//! frozen link: a node that reconnected meanwhile is another generation,
//! and its calls fail closed with no other node tried.

use std::time::Instant;

use iop_core::{
    config::{AgentEntry, WorkspaceLimits, WorkspaceOp},
    rt::{
        mailbox::{self, SendError},
        oneshot::oneshot,
    },
    wire::{pb, WorkspaceAnswer, WorkspaceCall},
};

use crate::{ctx::Ctx, link::SessionCmd, registry::Generation, workspaces::Serving};

/// Why a workspace was not admitted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdmitFailure {
    /// The request named a workspace the agent may not use.
    #[error("the agent has no such workspace")]
    Foreign,
    /// Its node is not ready, has not said it serves it (pending), refused
    /// it, or is gone from the config.
    #[error("the workspace is not available")]
    Unavailable,
}

/// A workspace as frozen for one request.
#[derive(Clone)]
pub struct Frozen {
    /// Its reference.
    pub reference: String,
    /// The node that serves it.
    pub node: String,
    /// The node's connection generation at admission.
    pub generation: Generation,
    session: mailbox::Sender<SessionCmd>,
    /// What the request may do there.
    pub operations: Vec<WorkspaceOp>,
    /// The command templates' ids.
    pub command_ids: Vec<String>,
    /// Environment names commands see.
    pub env: Vec<String>,
    /// Its limits.
    pub limits: WorkspaceLimits,
}

/// Admits the workspace `requested` (the agent's first by default) for a
/// request of `agent` on this core.
pub fn freeze(ctx: &Ctx, agent: &AgentEntry, requested: Option<&str>) -> Result<Frozen, AdmitFailure> {
    let reference = match requested {
        Some(r) if agent.workspaces.iter().any(|w| w == r) => r.to_owned(),
        Some(_) => return Err(AdmitFailure::Foreign),
        None => agent.workspaces.first().cloned().ok_or(AdmitFailure::Unavailable)?,
    };
    let config = ctx.config.borrow();
    let (node, entry) = config
        .nodes
        .iter()
        .find_map(|n| n.workspaces.iter().find(|w| w.reference == reference).map(|w| (n.id.clone(), w.clone())))
        .ok_or(AdmitFailure::Unavailable)?;
    let routes = ctx.routes.borrow();
    let route = routes.get(&node).ok_or(AdmitFailure::Unavailable)?;
    if ctx.shared.workspaces.serving(&node, route.generation, &reference) != Serving::Yes {
        return Err(AdmitFailure::Unavailable);
    }
    let link = route.links.iter().find(|l| !l.session.is_closed()).ok_or(AdmitFailure::Unavailable)?;
    Ok(Frozen {
        reference,
        generation: route.generation,
        session: link.session.clone(),
        node,
        operations: entry.operations.clone(),
        command_ids: entry.commands.keys().cloned().collect(),
        env: entry.env.clone(),
        limits: entry.limits,
    })
}

/// Whether a request of `agent` could be admitted now on one of its
/// workspaces (it is listed among the models only then).
pub fn serves(ctx: &Ctx, agent: &AgentEntry) -> bool {
    agent.workspaces.iter().any(|w| freeze(ctx, agent, Some(w)).is_ok())
}

/// Why a workspace call failed: always fail-closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// The frozen link is gone (the node went away or reconnected).
    #[error("workspace link gone")]
    LinkGone,
    /// No answer within the deadline.
    #[error("workspace call timed out")]
    Timeout,
    /// An answer of another family, or for another request.
    #[error("malformed workspace answer")]
    Malformed,
}

impl Frozen {
    /// The open request carrying this frozen authority.
    pub fn open_request(&self, request_id: &str) -> pb::WorkspaceOpenRequest {
        pb::WorkspaceOpenRequest {
            request_id: request_id.to_owned(),
            workspace_ref: self.reference.clone(),
            operations: self.operations.iter().map(|o| o.to_wire() as i32).collect(),
            command_ids: self.command_ids.clone(),
            env: self.env.clone(),
            max_read_bytes: self.limits.read_bytes,
            max_write_bytes: self.limits.write_bytes,
            max_list_entries: self.limits.list_entries,
            command_timeout_ms: u64::try_from(self.limits.command_timeout.as_millis()).unwrap_or(u64::MAX),
            max_output_bytes: self.limits.output_bytes,
        }
    }

    /// Sends `call` on the frozen link and waits for its answer until
    /// `deadline`; the answer must be of the call's family and request.
    pub async fn call(&self, call: WorkspaceCall, deadline: Instant) -> Result<WorkspaceAnswer, CallError> {
        let request_id = call.request_id().to_owned();
        let family = std::mem::discriminant(&call);
        let (reply, answer) = oneshot();
        let cmd = SessionCmd::Workspace { call: Box::new(call), reply };
        match self.session.try_send(cmd) {
            Ok(()) => {}
            Err(SendError::Closed(_)) => return Err(CallError::LinkGone),
            Err(SendError::Full(cmd)) => {
                let sent = iop_core::rt::time::timeout_at(deadline, self.session.send(cmd)).await;
                match sent {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) => return Err(CallError::LinkGone),
                    Err(_) => return Err(CallError::Timeout),
                }
            }
        }
        let answer = match iop_core::rt::time::timeout_at(deadline, answer).await {
            Ok(Some(a)) => a,
            Ok(None) => return Err(CallError::LinkGone),
            Err(_) => return Err(CallError::Timeout),
        };
        if answer.request_id() != request_id || !same_family(family, &answer) {
            return Err(CallError::Malformed);
        }
        Ok(answer)
    }
}

fn same_family(call: std::mem::Discriminant<WorkspaceCall>, answer: &WorkspaceAnswer) -> bool {
    let expected = match answer {
        WorkspaceAnswer::Open(_) => WorkspaceCall::Open(Default::default()),
        WorkspaceAnswer::Tool(_) => WorkspaceCall::Tool(Default::default()),
        WorkspaceAnswer::Artifact(_) => WorkspaceCall::Artifact(Default::default()),
        WorkspaceAnswer::Cancel(_) => WorkspaceCall::Cancel(Default::default()),
        WorkspaceAnswer::Cleanup(_) => WorkspaceCall::Cleanup(Default::default()),
    };
    std::mem::discriminant(&expected) == call
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn answers_must_be_of_the_calls_family() {
        let tool = std::mem::discriminant(&WorkspaceCall::Tool(Default::default()));
        assert!(same_family(tool, &WorkspaceAnswer::Tool(Default::default())));
        assert!(!same_family(tool, &WorkspaceAnswer::Cleanup(Default::default())));
    }
}
