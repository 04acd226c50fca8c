//! The workspace calls of the edge's coordinator, decided and run: each
//! call is first decided under the state's lock (`begin_*`, quick, fine on
//! a reactor), which answers a refusal at once or hands back a ticket; the
//! ticket's `run` does the blocking part (files, a command, a cleanup) on a
//! thread off the reactor, and its drop ends the operation in the table
//! whatever happened, so a cleanup waiting for it always wakes. The
//! cleanup is in [`cleanup`](super::cleanup); [`serve`](super::serve) puts
//! the tickets on threads and sends the answers.

use std::sync::Arc;

use bytes::Bytes;
use crossbeam_channel::{bounded, Receiver};
use iop_core::wire::pb::{self, WorkspaceOperation as Op, WorkspaceStatus as Status};

use super::{
    answers::{artifact_answer, file_status, label, list_entry, open_answer, tool_answer},
    command::{self, Spec},
    files::Root,
    jobs::{Artifact, Job},
    requests::{safe_id, Authority, Opened, Slot, Workspaces, MAX_ID_BYTES},
};

/// A call refused before any effect: its status and error label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    /// REFUSED, DENIED, INVALID or BUSY.
    pub status: Status,
    /// One of [`label`]'s.
    pub error: &'static str,
}

/// An open decided: its root and job directory still to make.
#[derive(Debug)]
pub struct OpenTicket {
    ws: Arc<Workspaces>,
    request_id: String,
    root: String,
    opened: bool,
}

/// A tool call decided: its operation still to run.
#[derive(Debug)]
pub struct ToolTicket {
    ws: Arc<Workspaces>,
    req: pb::WorkspaceToolRequest,
    op: Op,
    opened: Arc<Opened>,
    authority: Arc<Authority>,
    /// The template's argv and the cancel channel of a command.
    command: Option<(Arc<[String]>, Receiver<()>)>,
    ran: bool,
}

/// An artifact call decided.
#[derive(Debug)]
pub struct ArtifactTicket {
    ws: Arc<Workspaces>,
    req: pb::WorkspaceArtifactRequest,
    artifact: Artifact,
    write: bool,
    opened: Arc<Opened>,
    max_read: u64,
    max_write: u64,
}

impl Workspaces {
    /// Decides an open: the id, the catalog, the authority, the table.
    pub fn begin_open(self: &Arc<Self>, req: &pb::WorkspaceOpenRequest) -> Result<OpenTicket, Refusal> {
        let refuse = |status, error| Err(Refusal { status, error });
        if !safe_id(&req.request_id) {
            return refuse(Status::Invalid, label::REQUEST_ID_INVALID);
        }
        let Some(entry) = self.entry(&req.workspace_ref) else {
            return refuse(Status::Refused, label::UNKNOWN_WORKSPACE);
        };
        let Some(authority) = Authority::granted(&entry, req) else {
            return refuse(Status::Refused, label::AUTHORITY_EXCEEDS_CATALOG);
        };
        let mut table = self.table();
        // A request opens its workspace once: a cleaned one stays closed.
        if table.open.contains_key(&req.request_id) || table.cleaned(&req.request_id).is_some() {
            return refuse(Status::Refused, label::ALREADY_OPEN);
        }
        if table.open.len() >= self.limits.max_open {
            return refuse(Status::Busy, label::BUSY);
        }
        table.open.insert(req.request_id.clone(), Slot::opening(authority));
        Ok(OpenTicket { ws: self.clone(), request_id: req.request_id.clone(), root: entry.root.clone(), opened: false })
    }

    /// Opens a request's use of a workspace (blocking).
    pub fn open(self: &Arc<Self>, req: &pb::WorkspaceOpenRequest) -> pb::WorkspaceOpenResponse {
        match self.begin_open(req) {
            Ok(ticket) => ticket.run(),
            Err(r) => open_answer(&req.request_id, r.status, r.error),
        }
    }

    /// Decides a tool call: the request open, the operation and command
    /// granted, the tool id new, a write's size.
    pub fn begin_tool(self: &Arc<Self>, req: &pb::WorkspaceToolRequest) -> Result<ToolTicket, Refusal> {
        let refuse = |status, error| Err(Refusal { status, error });
        let max_tool_ids = self.limits.max_tool_ids;
        let mut table = self.table();
        let Some(slot) = table.live(&req.request_id) else { return refuse(Status::Refused, label::NOT_OPEN) };
        let op = match Op::try_from(req.operation) {
            Ok(op) if slot.authority.operations.contains(&op) => op,
            _ => return refuse(Status::Denied, label::OPERATION_DENIED),
        };
        if req.tool_id.is_empty() || req.tool_id.len() > MAX_ID_BYTES {
            return refuse(Status::Invalid, label::TOOL_ID_INVALID);
        }
        if slot.tool_ids.contains(&req.tool_id) {
            return refuse(Status::Refused, label::DUPLICATE_TOOL_ID);
        }
        if slot.tool_ids.len() >= max_tool_ids {
            return refuse(Status::Refused, label::TOO_MANY_TOOLS);
        }
        if op == Op::Write && req.content.len() as u64 > slot.authority.max_write {
            return refuse(Status::Invalid, label::TOO_LARGE);
        }
        let (Some(opened), authority) = (slot.opened.clone(), slot.authority.clone()) else {
            return refuse(Status::Refused, label::NOT_OPEN);
        };
        let command = if op == Op::Command {
            let Some(argv) = slot.authority.commands.get(&req.command_id) else {
                return refuse(Status::Denied, label::COMMAND_DENIED);
            };
            let (cancel, cancelled) = bounded(1);
            slot.running.insert(req.tool_id.clone(), cancel);
            Some((argv.clone(), cancelled))
        } else {
            None
        };
        slot.tool_ids.insert(req.tool_id.clone());
        slot.in_flight += 1;
        drop(table);
        Ok(ToolTicket { ws: self.clone(), req: req.clone(), op, opened, authority, command, ran: false })
    }

    /// Runs one tool call (blocking; a command until it ends).
    pub fn tool(self: &Arc<Self>, req: &pb::WorkspaceToolRequest) -> pb::WorkspaceToolResponse {
        match self.begin_tool(req) {
            Ok(ticket) => ticket.run(),
            Err(r) => tool_answer(req, r.status, r.error),
        }
    }

    /// Decides an artifact call.
    pub fn begin_artifact(self: &Arc<Self>, req: &pb::WorkspaceArtifactRequest) -> Result<ArtifactTicket, Refusal> {
        let refuse = |status, error| Err(Refusal { status, error });
        let mut table = self.table();
        let Some(slot) = table.live(&req.request_id) else { return refuse(Status::Refused, label::NOT_OPEN) };
        let artifact = match pb::WorkspaceArtifactKind::try_from(req.kind) {
            Ok(pb::WorkspaceArtifactKind::Plan) => Artifact::Plan,
            Ok(pb::WorkspaceArtifactKind::Review) => Artifact::Review,
            _ => return refuse(Status::Invalid, label::ARTIFACT_INVALID),
        };
        let write = match pb::WorkspaceArtifactOperation::try_from(req.operation) {
            Ok(pb::WorkspaceArtifactOperation::Read) => false,
            Ok(pb::WorkspaceArtifactOperation::Write) => true,
            _ => return refuse(Status::Invalid, label::ARTIFACT_INVALID),
        };
        let (max_read, max_write) = (slot.authority.max_read, slot.authority.max_write);
        if write && req.content.len() as u64 > max_write {
            return refuse(Status::Invalid, label::TOO_LARGE);
        }
        let Some(opened) = slot.opened.clone() else { return refuse(Status::Refused, label::NOT_OPEN) };
        slot.in_flight += 1;
        drop(table);
        Ok(ArtifactTicket { ws: self.clone(), req: req.clone(), artifact, write, opened, max_read, max_write })
    }

    /// Reads or writes one artifact (blocking).
    pub fn artifact(self: &Arc<Self>, req: &pb::WorkspaceArtifactRequest) -> pb::WorkspaceArtifactResponse {
        match self.begin_artifact(req) {
            Ok(ticket) => ticket.run(),
            Err(r) => artifact_answer(req, r.status, r.error),
        }
    }

    /// Signals the request's running command `tool_id` (empty: all of
    /// them). Quick: fine on a reactor.
    pub fn cancel(&self, req: &pb::WorkspaceCancelRequest) -> pb::WorkspaceCancelResponse {
        let answer = |status: Status, cancelled: u32| pb::WorkspaceCancelResponse {
            request_id: req.request_id.clone(),
            status: status as i32,
            cancelled,
        };
        let mut table = self.table();
        let Some(slot) = table.live(&req.request_id) else { return answer(Status::Refused, 0) };
        let mut signalled = 0u32;
        for (tool_id, cancel) in &slot.running {
            if req.tool_id.is_empty() || *tool_id == req.tool_id {
                // Full: signalled already, and still counted.
                let _ = cancel.try_send(());
                signalled = signalled.saturating_add(1);
            }
        }
        answer(Status::Ok, signalled)
    }
}

impl OpenTicket {
    /// Opens the root and makes the job directory.
    pub fn run(mut self) -> pb::WorkspaceOpenResponse {
        let made = Root::open(&self.root).and_then(|root| Job::create(&root, &self.request_id).map(|job| (root, job)));
        match made {
            Ok((root, job)) => {
                let mut table = self.ws.table();
                if let Some(slot) = table.open.get_mut(&self.request_id) {
                    slot.opened = Some(Arc::new(Opened { root, job }));
                    slot.end_one();
                }
                self.opened = true;
                drop(table);
                self.ws.notify();
                open_answer(&self.request_id, Status::Ok, "")
            }
            // The drop takes the reservation back.
            Err(e) => open_answer(&self.request_id, Status::Failed, &e.to_string()),
        }
    }
}

impl Drop for OpenTicket {
    fn drop(&mut self) {
        if self.opened {
            return;
        }
        let mut table = self.ws.table();
        match table.open.get_mut(&self.request_id) {
            // A cleanup waits for this open: it removes the slot.
            Some(slot) if slot.closing => slot.end_one(),
            Some(_) => {
                table.open.remove(&self.request_id);
            }
            None => {}
        }
        drop(table);
        self.ws.notify();
    }
}

impl ToolTicket {
    /// Runs the operation.
    pub fn run(mut self) -> pb::WorkspaceToolResponse {
        self.ran = true;
        let mut answer = tool_answer(&self.req, Status::Ok, "");
        let (root, a, req) = (&self.opened.root, &self.authority, &self.req);
        let done = match self.op {
            Op::Read => root.read(&req.path, a.max_read).map(|read| {
                answer.content = Bytes::from(read.bytes);
                answer.truncated = read.truncated;
            }),
            Op::List => {
                let after = Some(req.after.as_str()).filter(|s| !s.is_empty());
                root.list(&req.path, after, a.max_list).map(|listing| {
                    answer.entries = listing.entries.into_iter().map(list_entry).collect();
                    answer.more = listing.more;
                })
            }
            Op::Write => root.write(&req.path, &req.content, a.max_write),
            Op::Delete => root.delete(&req.path),
            Op::Command => return self.run_command(answer),
            Op::Unspecified => return tool_answer(req, Status::Denied, label::OPERATION_DENIED),
        };
        match done {
            Ok(()) => answer,
            Err(e) => tool_answer(req, file_status(e), &e.to_string()),
        }
    }

    fn run_command(&self, mut answer: pb::WorkspaceToolResponse) -> pb::WorkspaceToolResponse {
        let Some((argv, cancel)) = &self.command else {
            return tool_answer(&self.req, Status::Denied, label::COMMAND_DENIED);
        };
        // Cancelled before it started: never started.
        if cancel.try_recv().is_ok() {
            return tool_answer(&self.req, Status::Cancelled, "");
        }
        let a = &self.authority;
        let spec = Spec {
            argv,
            env: &a.env,
            timeout: a.timeout,
            max_output: a.max_output,
            supervised: self.ws.limits.supervised,
        };
        match command::run(&self.opened.root, &spec, cancel) {
            Ok(result) => {
                if result.cancelled {
                    answer.status = Status::Cancelled as i32;
                }
                answer.content = Bytes::from(result.output);
                answer.truncated = result.truncated;
                answer.exit_code = result.exit_code;
                answer.signal = result.signal.unwrap_or(0);
                answer.timed_out = result.timed_out;
                answer
            }
            Err(e) => tool_answer(&self.req, Status::Failed, &e.to_string()),
        }
    }
}

impl Drop for ToolTicket {
    fn drop(&mut self) {
        let mut table = self.ws.table();
        if let Some(slot) = table.open.get_mut(&self.req.request_id) {
            if self.command.is_some() {
                slot.running.remove(&self.req.tool_id);
            }
            // Dropped unrun (no thread): the tool id may come again.
            if !self.ran {
                slot.tool_ids.remove(&self.req.tool_id);
            }
            slot.end_one();
        }
        drop(table);
        self.ws.notify();
    }
}

impl ArtifactTicket {
    /// Reads or writes the artifact.
    pub fn run(self) -> pb::WorkspaceArtifactResponse {
        let job = &self.opened.job;
        let done = if self.write {
            job.write(self.artifact, &self.req.content, self.max_write).map(|()| (Bytes::new(), false))
        } else {
            job.read(self.artifact, self.max_read).map(|read| (Bytes::from(read.bytes), read.truncated))
        };
        match done {
            Ok((content, truncated)) => {
                pb::WorkspaceArtifactResponse { content, truncated, ..artifact_answer(&self.req, Status::Ok, "") }
            }
            Err(e) => artifact_answer(&self.req, file_status(e), &e.to_string()),
        }
    }
}

impl Drop for ArtifactTicket {
    fn drop(&mut self) {
        if let Some(slot) = self.ws.table().open.get_mut(&self.req.request_id) {
            slot.end_one();
        }
        self.ws.notify();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#[path = "handler_tests.rs"]
mod tests;
