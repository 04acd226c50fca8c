//! The workspace calls on a session's reactor: each is decided at once
//! under the state's lock; what blocks (files, commands that may run for
//! minutes, a cleanup) runs on a thread of its own, bounded process-wide,
//! and its answer comes back through a oneshot to a task on this reactor,
//! which sends it with the call's correlation id. Logs carry ids, the
//! operation, the status and the error label only.

use std::sync::Arc;

use iop_core::{
    rt::{frames::FrameWriter, oneshot::oneshot},
    wire::pb::{self, envelope::Body, Envelope, WorkspaceStatus as Status},
};

use super::{
    answers::{artifact_answer, cleanup_answer, label, open_answer, tool_answer},
    cleanup::CleanupStart,
    handler::Refusal,
    requests::{Permit, Workspaces},
};

/// Every operation thread is taken.
const BUSY: Refusal = Refusal { status: Status::Busy, error: label::BUSY };

/// The requests opened through one session. The edge calls a request's
/// workspace only on the link it froze at admission, so when that link
/// ends no cleanup will come for them: the session cleans them up itself.
#[derive(Default)]
pub struct Opened(std::cell::RefCell<Vec<String>>);

impl Opened {
    /// Cleans up, off the reactor, every request opened through the
    /// session that just ended (one already cleaned gets its cached
    /// result: nothing happens twice).
    pub fn clean_all(&self, ws: &Arc<Workspaces>) {
        let ids = std::mem::take(&mut *self.0.borrow_mut());
        if ids.is_empty() {
            return;
        }
        let ws = ws.clone();
        let spawned = std::thread::Builder::new().name("iop-ws-orphans".into()).spawn(move || {
            for request_id in ids {
                let r = ws.cleanup(&pb::WorkspaceCleanupRequest { request_id });
                tracing::info!(request_id = %field(&r.request_id), status = status_name(r.status), error = %r.error, "workspace of a closed link cleaned");
            }
        });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "could not start the cleanup of a closed link's workspaces");
        }
    }
}

/// Answers a workspace call `body` (correlation id `cid`) on `writer`;
/// other bodies are ignored. `opened` remembers what this session opened.
pub fn serve(cid: u64, body: Body, ws: &Arc<Workspaces>, writer: &FrameWriter, opened: &Opened) {
    match &body {
        Body::WorkspaceOpenRequest(req) => {
            let mut ids = opened.0.borrow_mut();
            // Bounded by the open table: ids cleaned through it leave here.
            if !ids.contains(&req.request_id) && ids.len() < MAX_REMEMBERED {
                ids.push(req.request_id.clone());
            }
        }
        Body::WorkspaceCleanupRequest(req) => opened.0.borrow_mut().retain(|id| *id != req.request_id),
        _ => {}
    }
    match body {
        Body::WorkspaceOpenRequest(req) => {
            let begun = ws.permit().ok_or(BUSY).and_then(|permit| Ok((permit, ws.begin_open(&req)?)));
            let id = req.request_id;
            let fail = move |status, error| Body::WorkspaceOpenResponse(open_answer(&id, status, error));
            match begun {
                Ok((permit, ticket)) => {
                    offload(Some(permit), move || Body::WorkspaceOpenResponse(ticket.run()), writer, cid, fail)
                }
                Err(r) => send(writer, cid, fail(r.status, r.error)),
            }
        }
        Body::WorkspaceToolRequest(req) => {
            let begun = ws.permit().ok_or(BUSY).and_then(|permit| Ok((permit, ws.begin_tool(&req)?)));
            // An answer echoes the call's identities, never its content.
            let echo = pb::WorkspaceToolRequest { content: Default::default(), ..req };
            let fail = move |status, error| Body::WorkspaceToolResponse(tool_answer(&echo, status, error));
            match begun {
                Ok((permit, ticket)) => {
                    offload(Some(permit), move || Body::WorkspaceToolResponse(ticket.run()), writer, cid, fail)
                }
                Err(r) => send(writer, cid, fail(r.status, r.error)),
            }
        }
        Body::WorkspaceArtifactRequest(req) => {
            let begun = ws.permit().ok_or(BUSY).and_then(|permit| Ok((permit, ws.begin_artifact(&req)?)));
            let echo = pb::WorkspaceArtifactRequest { content: Default::default(), ..req };
            let fail = move |status, error| Body::WorkspaceArtifactResponse(artifact_answer(&echo, status, error));
            match begun {
                Ok((permit, ticket)) => {
                    offload(Some(permit), move || Body::WorkspaceArtifactResponse(ticket.run()), writer, cid, fail)
                }
                Err(r) => send(writer, cid, fail(r.status, r.error)),
            }
        }
        Body::WorkspaceCancelRequest(req) => send(writer, cid, Body::WorkspaceCancelResponse(ws.cancel(&req))),
        Body::WorkspaceCleanupRequest(req) => {
            let id = req.request_id;
            let fail = {
                let id = id.clone();
                move |status, error| Body::WorkspaceCleanupResponse(cleanup_answer(&id, status, error))
            };
            match ws.begin_cleanup(&id) {
                CleanupStart::Answer(answer) => send(writer, cid, Body::WorkspaceCleanupResponse(answer)),
                // Outside the thread bound: it is what stops the commands
                // holding it, and there is one per open request at most.
                CleanupStart::First(ticket) => {
                    offload(None, move || Body::WorkspaceCleanupResponse(ticket.run()), writer, cid, fail)
                }
                CleanupStart::Pending => {
                    let Some(permit) = ws.permit() else { return send(writer, cid, fail(Status::Busy, label::BUSY)) };
                    let ws = ws.clone();
                    offload(
                        Some(permit),
                        move || Body::WorkspaceCleanupResponse(ws.wait_cleaned(&id)),
                        writer,
                        cid,
                        fail,
                    )
                }
            }
        }
        _ => {}
    }
}

/// Requests one session remembers as opened (far more than the open table
/// holds, so only a misbehaving edge reaches it).
const MAX_REMEMBERED: usize = 4096;

/// Runs `work` on a thread of its own (holding `permit` until it ends)
/// and sends its answer from a task on this reactor. No thread: the work
/// is dropped unrun (its ticket gives its reservation back) and the call
/// is BUSY; a thread that ends without an answer gives FAILED.
fn offload(
    permit: Option<Permit>,
    work: impl FnOnce() -> Body + Send + 'static,
    writer: &FrameWriter,
    cid: u64,
    fail: impl FnOnce(Status, &'static str) -> Body + 'static,
) {
    let (tx, rx) = oneshot();
    let spawned = std::thread::Builder::new().name("iop-ws-op".into()).spawn(move || {
        let answer = work();
        // Given back before the answer goes: a caller answered may start another.
        drop(permit);
        tx.send(answer);
    });
    if spawned.is_err() {
        return send(writer, cid, fail(Status::Busy, label::BUSY));
    }
    let writer = writer.clone();
    monoio::spawn(async move {
        let body = rx.await.unwrap_or_else(|| fail(Status::Failed, label::LOST));
        send(&writer, cid, body);
    });
}

/// Logs the answer (ids, status, label) and sends it.
fn send(writer: &FrameWriter, cid: u64, body: Body) {
    log(&body);
    let _ = writer.send(&Envelope { correlation_id: cid, body: Some(body) });
}

/// An id from the wire as a log field: escaped, at most 128 characters.
fn field(s: &str) -> String {
    s.chars().take(128).flat_map(char::escape_debug).collect()
}

fn status_name(status: i32) -> &'static str {
    Status::try_from(status).map_or("unknown", |s| s.as_str_name())
}

fn log(body: &Body) {
    match body {
        Body::WorkspaceOpenResponse(r) => {
            tracing::info!(request_id = %field(&r.request_id), status = status_name(r.status), error = %r.error, "workspace open")
        }
        Body::WorkspaceToolResponse(r) => tracing::debug!(
            request_id = %field(&r.request_id),
            stage_id = %field(&r.stage_id),
            tool_id = %field(&r.tool_id),
            operation = pb::WorkspaceOperation::try_from(r.operation).map_or("unknown", |o| o.as_str_name()),
            status = status_name(r.status),
            error = %r.error,
            "workspace tool"
        ),
        Body::WorkspaceArtifactResponse(r) => tracing::debug!(
            request_id = %field(&r.request_id),
            kind = pb::WorkspaceArtifactKind::try_from(r.kind).map_or("unknown", |k| k.as_str_name()),
            operation = pb::WorkspaceArtifactOperation::try_from(r.operation).map_or("unknown", |o| o.as_str_name()),
            status = status_name(r.status),
            error = %r.error,
            "workspace artifact"
        ),
        Body::WorkspaceCancelResponse(r) => tracing::debug!(
            request_id = %field(&r.request_id),
            status = status_name(r.status),
            cancelled = r.cancelled,
            "workspace cancel"
        ),
        Body::WorkspaceCleanupResponse(r) => {
            tracing::info!(request_id = %field(&r.request_id), status = status_name(r.status), error = %r.error, "workspace cleanup")
        }
        _ => {}
    }
}
