//! The run's calls into its workspace on the frozen link: open (once),
//! the PLAN and REVIEW artifacts, one tool call at a time (its answer taken
//! only when it echoes the pending call's ids), the typed cancel when the
//! client leaves, and the one cleanup. Any failure is fail-closed.

use std::time::{Duration, Instant};

use iop_core::wire::{pb, WorkspaceAnswer, WorkspaceCall};

use super::{
    run::{error, Driver, Step},
    state::{ErrorClass, Phase, Stage, Terminal},
    tools::ToolCall,
    workspace::CallError,
};

/// How long the workspace's cleanup may take (its commands are killed
/// first; this waits for operations in flight on the node).
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the typed cancel sent when the client leaves may wait.
const CANCEL_TIMEOUT: Duration = Duration::from_secs(5);

impl Driver {
    /// Runs one tool call on the node; its result resumes the Work stage.
    pub(super) async fn tool(
        &mut self,
        stage_id: &str,
        call: ToolCall,
        deadline: Instant,
    ) -> Step<pb::WorkspaceToolResponse> {
        self.tool_calls += 1;
        let tool_id = format!("t{}", self.tool_calls);
        self.enter(Stage::InternalTool { issued_by: Phase::Working })?;
        let req = call.request(&self.task.request_id, stage_id, &tool_id);
        let answer = self.ws.call(WorkspaceCall::Tool(req), deadline).await.map_err(call_error)?;
        let WorkspaceAnswer::Tool(resp) = answer else { return Err(error(ErrorClass::InternalTool)) };
        // Only the pending call's own result is taken.
        if resp.stage_id != stage_id || resp.tool_id != tool_id {
            return Err(error(ErrorClass::InternalTool));
        }
        self.enter(Stage::Working)?;
        let status = pb::WorkspaceStatus::try_from(resp.status).map_or("unknown", |s| s.as_str_name());
        tracing::debug!(request_id = %self.task.request_id, stage_id, tool_id, status, error = %resp.error, "workspace tool call");
        Ok(resp)
    }

    /// Opens the workspace for this request (once).
    pub(super) async fn open(&mut self, deadline: Instant) -> Step<()> {
        // Before the call: a node that got it may have made the job
        // directory even if its answer never comes, so cleanup is owed.
        self.run.workspace_opened();
        let req = self.ws.open_request(&self.task.request_id);
        match self.ws.call(WorkspaceCall::Open(req), deadline).await.map_err(call_error)? {
            WorkspaceAnswer::Open(r) if r.status == pb::WorkspaceStatus::Ok as i32 => Ok(()),
            WorkspaceAnswer::Open(r) => {
                tracing::warn!(request_id = %self.task.request_id, workspace = %self.ws.reference, error = %r.error, "workspace open refused");
                Err(error(ErrorClass::InternalTool))
            }
            _ => Err(error(ErrorClass::InternalTool)),
        }
    }

    /// Writes (`content`) or reads an artifact; a read returns its text.
    pub(super) async fn artifact(
        &mut self,
        kind: pb::WorkspaceArtifactKind,
        content: Option<String>,
        stage_id: &str,
        deadline: Instant,
    ) -> Step<String> {
        let write = content.is_some();
        let operation =
            if write { pb::WorkspaceArtifactOperation::Write } else { pb::WorkspaceArtifactOperation::Read };
        let req = pb::WorkspaceArtifactRequest {
            request_id: self.task.request_id.clone(),
            stage_id: stage_id.to_owned(),
            kind: kind as i32,
            operation: operation as i32,
            content: content.map(|c| bytes::Bytes::from(c.into_bytes())).unwrap_or_default(),
        };
        match self.ws.call(WorkspaceCall::Artifact(req), deadline).await.map_err(call_error)? {
            WorkspaceAnswer::Artifact(r)
                if r.status == pb::WorkspaceStatus::Ok as i32
                    && r.kind == kind as i32
                    && r.operation == operation as i32
                    && !r.truncated =>
            {
                Ok(String::from_utf8_lossy(&r.content).into_owned())
            }
            _ => Err(error(ErrorClass::InternalTool)),
        }
    }

    /// The client left: one typed cancel of the request's commands.
    pub(super) async fn cancel_commands(&self) {
        if !self.run.needs_cleanup() {
            return;
        }
        let req = pb::WorkspaceCancelRequest { request_id: self.task.request_id.clone(), tool_id: String::new() };
        let _ = self.ws.call(WorkspaceCall::Cancel(req), Instant::now() + CANCEL_TIMEOUT).await;
    }

    /// The workspace's one cleanup; whether it succeeded.
    pub(super) async fn cleanup(&self) -> bool {
        let req = pb::WorkspaceCleanupRequest { request_id: self.task.request_id.clone() };
        let ok = matches!(
            self.ws.call(WorkspaceCall::Cleanup(req), Instant::now() + CLEANUP_TIMEOUT).await,
            Ok(WorkspaceAnswer::Cleanup(r)) if r.status == pb::WorkspaceStatus::Ok as i32
        );
        if !ok {
            tracing::warn!(request_id = %self.task.request_id, workspace = %self.ws.reference, "workspace cleanup failed");
        }
        ok
    }
}

fn call_error(e: CallError) -> Terminal {
    match e {
        CallError::Timeout => error(ErrorClass::Timeout),
        CallError::LinkGone | CallError::Malformed => error(ErrorClass::InternalTool),
    }
}
