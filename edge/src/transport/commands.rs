//! Requests in flight on one session (node commands, workspace calls):
//! each gets a correlation id, and the node's response (same id) goes to
//! the waiting caller. Bounded; a session that ends drops its callers'
//! replies (they see the node gone).

use std::{
    cell::{Cell, RefCell},
    collections::HashMap,
};

use iop_core::{
    rt::oneshot::OneshotSender,
    wire::{pb, WorkspaceAnswer},
};

/// Requests of one family one session may have waiting at once.
pub const MAX_PENDING_COMMANDS: usize = 64;

/// Replies of the requests of one family sent on one session, by
/// correlation id.
pub struct Pending<T> {
    next: Cell<u64>,
    waiting: RefCell<HashMap<u64, OneshotSender<T>>>,
}

/// Node commands waiting for their response.
pub type PendingCommands = Pending<pb::NodeCommandResponse>;
/// Workspace calls waiting for their answer.
pub type PendingWorkspace = Pending<WorkspaceAnswer>;

impl<T> Default for Pending<T> {
    fn default() -> Self {
        Self { next: Cell::new(0), waiting: RefCell::new(HashMap::new()) }
    }
}

impl<T> Pending<T> {
    /// A correlation id for `reply`, or `None` when too many are waiting.
    pub fn register(&self, reply: OneshotSender<T>) -> Option<u64> {
        let mut waiting = self.waiting.borrow_mut();
        if waiting.len() >= MAX_PENDING_COMMANDS {
            return None;
        }
        // Correlation ids of responses are never 0 (one-way frames use 0).
        let id = self.next.get() + 1;
        self.next.set(id);
        waiting.insert(id, reply);
        Some(id)
    }

    /// Hands the node's response to its caller; false for an unknown id.
    pub fn answer(&self, id: u64, resp: T) -> bool {
        match self.waiting.borrow_mut().remove(&id) {
            Some(reply) => {
                reply.send(resp);
                true
            }
            None => false,
        }
    }

    /// Forgets a command (its caller gave up, or it could not be sent).
    pub fn forget(&self, id: u64) {
        self.waiting.borrow_mut().remove(&id);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use iop_core::rt::oneshot::oneshot;

    use super::*;

    #[test]
    fn answers_reach_their_caller_and_the_table_is_bounded() {
        let p: PendingCommands = Pending::default();
        let (tx, rx) = oneshot();
        let id = p.register(tx).unwrap();
        assert!(id > 0);
        assert!(!p.answer(id + 1, pb::NodeCommandResponse::default()));
        assert!(p.answer(id, pb::NodeCommandResponse { ok: true, ..Default::default() }));
        let got = iop_core::rt::block_on_current(rx).unwrap();
        assert!(got.unwrap().ok);
        let held: Vec<_> = (0..MAX_PENDING_COMMANDS).map(|_| oneshot()).collect();
        let mut rxs = Vec::new();
        for (tx, rx) in held {
            assert!(p.register(tx).is_some());
            rxs.push(rx);
        }
        assert!(p.register(oneshot().0).is_none());
    }
}
