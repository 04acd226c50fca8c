//! The capacity lease guard: the only way capacity is given back is by
//! dropping it, so it is released exactly once whatever ends the run.

use std::sync::{atomic::Ordering, Arc};

use iop_core::rt::mailbox;

use super::{LeaseClass, ResourceKey, ResourceLoad};
use crate::{
    link::NodeRoute,
    mesh::{post, CoreMsg},
};

/// One unit of a resource's capacity, held by a run.
pub struct Lease {
    key: ResourceKey,
    class: LeaseClass,
    load: Arc<ResourceLoad>,
    owner: mailbox::Sender<CoreMsg>,
    route: Option<NodeRoute>,
}

impl Lease {
    /// A lease the owner core has just counted.
    pub(super) fn new(
        key: ResourceKey,
        class: LeaseClass,
        load: Arc<ResourceLoad>,
        owner: mailbox::Sender<CoreMsg>,
        route: Option<NodeRoute>,
    ) -> Self {
        load.live_guards.fetch_add(1, Ordering::AcqRel);
        Self { key, class, load, owner, route }
    }

    /// The node connection (generation and session) the owner core saw
    /// online when it granted this lease: the run goes exactly there, even
    /// if this core has not applied that node's ready broadcast yet.
    pub fn route(&self) -> Option<&NodeRoute> {
        self.route.as_ref()
    }

    /// The resource leased.
    pub fn key(&self) -> &ResourceKey {
        &self.key
    }

    /// The pool it draws on.
    pub fn class(&self) -> LeaseClass {
        self.class
    }

    /// Sends a health observation about the leased resource to its owner
    /// core (which keeps the overlay). Never blocks: with the owner's
    /// inbox full it is sent from a task of its own.
    pub fn report_health(&self, report: super::HealthReport) {
        post(&self.owner, CoreMsg::Health(Box::new(report)));
    }

    /// Ends a lease of a connection just fenced: the owner core drops it
    /// after the fence, which the caller has already sent it (inboxes are
    /// FIFO). Dropped here, its count would be free at once while other
    /// cores still see the resource online, and a waiter or a new request
    /// could be granted the dead connection.
    pub fn release_after_fence(self) {
        // Shutting down (the inbox closed): dropped with the message, here.
        let owner = self.owner.clone();
        post(&owner, CoreMsg::DropLease(self));
    }
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Lease({}, {:?})", self.key, self.class)
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.load.give_back(self.class);
        self.load.live_guards.fetch_sub(1, Ordering::AcqRel);
        // The owner hears of it only when it may have a waiter to grant to
        // (the owner publishes its queue before it tries to grant, and this
        // reads it after giving back: one of the two sees the other), or
        // when the resource went away (it counts the stray release).
        let online = self.load.online.load(Ordering::Acquire);
        if online && self.load.waiters.load(Ordering::SeqCst) == 0 {
            return;
        }
        // Never lose a release: `post` waits for room off the caller's path.
        post(&self.owner, CoreMsg::Release { key: self.key.clone(), class: self.class, load: self.load.clone() });
    }
}
