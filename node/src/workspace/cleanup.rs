//! A request's cleanup, exactly once: the first call closes it to new
//! operations and signals its commands at once, then (off the reactor)
//! waits for what is in flight, removes its job directory and keeps the
//! result; a second or concurrent call gets that result.

use std::sync::Arc;

use iop_core::wire::pb::{self, WorkspaceStatus as Status};

use super::{
    answers::{cleaned_answer, cleanup_answer, label},
    jobs,
    requests::Workspaces,
};

/// A first cleanup, begun: its commands signalled, the rest still to do.
#[derive(Debug)]
pub struct CleanupTicket {
    ws: Arc<Workspaces>,
    request_id: String,
    done: bool,
}

/// How a cleanup call goes on.
#[derive(Debug)]
pub enum CleanupStart {
    /// Answered at once (a cached result, or nothing to clean).
    Answer(pb::WorkspaceCleanupResponse),
    /// The request's one cleanup: run the ticket.
    First(CleanupTicket),
    /// Another call is cleaning it: wait with [`Workspaces::wait_cleaned`].
    Pending,
}

impl Workspaces {
    /// Begins a cleanup: the first call for an open request closes it to
    /// new operations and signals its commands at once (quick: fine on a
    /// reactor); the rest is the ticket's.
    pub fn begin_cleanup(self: &Arc<Self>, request_id: &str) -> CleanupStart {
        let mut table = self.table();
        if let Some(result) = table.cleaned(request_id) {
            return CleanupStart::Answer(cleaned_answer(request_id, result));
        }
        let Some(slot) = table.open.get_mut(request_id) else {
            // Never opened here (or cleaned long ago): nothing to clean.
            return CleanupStart::Answer(cleanup_answer(request_id, Status::Ok, ""));
        };
        if slot.closing {
            return CleanupStart::Pending;
        }
        slot.closing = true;
        for cancel in slot.running.values() {
            let _ = cancel.try_send(());
        }
        CleanupStart::First(CleanupTicket { ws: self.clone(), request_id: request_id.to_owned(), done: false })
    }

    /// Waits for the cleanup another call is running, and answers its
    /// result (blocking).
    pub fn wait_cleaned(&self, request_id: &str) -> pb::WorkspaceCleanupResponse {
        let mut table = self.table();
        loop {
            if let Some(result) = table.cleaned(request_id) {
                return cleaned_answer(request_id, result);
            }
            match table.open.get(request_id) {
                None => return cleanup_answer(request_id, Status::Ok, ""),
                // That cleanup never ran (its thread could not start).
                Some(slot) if !slot.closing => return cleanup_answer(request_id, Status::Busy, label::BUSY),
                Some(_) => table = self.wait(table),
            }
        }
    }

    /// Cleans a request up, exactly once (blocking): a second or
    /// concurrent call gets the first one's result.
    pub fn cleanup(self: &Arc<Self>, req: &pb::WorkspaceCleanupRequest) -> pb::WorkspaceCleanupResponse {
        match self.begin_cleanup(&req.request_id) {
            CleanupStart::Answer(answer) => answer,
            CleanupStart::First(ticket) => ticket.run(),
            CleanupStart::Pending => self.wait_cleaned(&req.request_id),
        }
    }
}

impl CleanupTicket {
    /// Waits for the request's operations (its commands were signalled),
    /// removes its job directory, closes it and keeps the result.
    pub fn run(mut self) -> pb::WorkspaceCleanupResponse {
        let mut table = self.ws.table();
        while table.open.get(&self.request_id).is_some_and(|s| s.in_flight > 0) {
            table = self.ws.wait(table);
        }
        let opened = table.open.get(&self.request_id).and_then(|s| s.opened.clone());
        drop(table);
        // An open that failed made nothing to remove.
        let result = opened.map_or(Ok(()), |o| jobs::cleanup(&o.root, &self.request_id));
        let mut table = self.ws.table();
        table.open.remove(&self.request_id);
        table.remember(self.request_id.clone(), result, self.ws.limits.max_cleaned);
        self.done = true;
        drop(table);
        self.ws.notify();
        cleaned_answer(&self.request_id, result)
    }
}

impl Drop for CleanupTicket {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        // Never ran: the request stays open, and a later cleanup may run.
        if let Some(slot) = self.ws.table().open.get_mut(&self.request_id) {
            slot.closing = false;
        }
        self.ws.notify();
    }
}
