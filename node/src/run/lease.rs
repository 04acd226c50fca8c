//! Opening a run's credential lease (managed mode), after capacity
//! admission and right before the provider call. A refused lease fails the
//! run closed: a typed terminal, a `node_credential_lease_refused` log
//! event and `iop_node_credential_lease_refusals_total{reason}`; never a
//! provider call, never another credential.

use std::{cell::RefCell, collections::HashMap, sync::Arc};

use iop_core::{
    config::Secret,
    exec::{FailureSource, RunFailure},
    lease::{self, Binding, Expect, LeaseError, Opener},
    wire::pb,
};

/// What this link knows to check leases against.
pub struct NodeLeases {
    opener: Arc<Opener>,
    verify_key: Vec<u8>,
    node: String,
    generation: u64,
    /// The applied config's revision and its leased providers' credential epochs.
    applied: RefCell<(u64, HashMap<String, u64>)>,
}

impl NodeLeases {
    /// From a registration answer that carried the edge's verify key.
    pub fn new(opener: Arc<Opener>, verify_key: Vec<u8>, generation: u64, payload: &pb::NodeConfigPayload) -> Self {
        let leases = Self {
            opener,
            verify_key,
            node: payload.node_id.clone(),
            generation,
            applied: RefCell::new((0, HashMap::new())),
        };
        leases.applied(payload);
        leases
    }

    /// A config (registration or refresh) was applied.
    pub fn applied(&self, payload: &pb::NodeConfigPayload) {
        let leased =
            payload.providers.iter().filter(|p| p.leased).map(|p| (p.id.clone(), p.credential_epoch)).collect();
        *self.applied.borrow_mut() = (payload.revision, leased);
    }

    /// The credential of a run: `Ok(None)` for a provider that has none to
    /// lease (and no lease came); the opened secret as a bearer header
    /// value; or the failure that ends the run.
    pub fn open(&self, run: &Binding<'_>, lease: Option<&pb::SealedLease>) -> Result<Option<Secret>, RunFailure> {
        let (revision, epoch) = {
            let applied = self.applied.borrow();
            (applied.0, applied.1.get(run.provider).copied())
        };
        let lease = match (lease, epoch) {
            (None, None) => return Ok(None),
            // A leased provider's run must bring its lease.
            (None, Some(_)) => return Err(refused(run, LeaseError::Mismatched)),
            (Some(l), _) => l,
        };
        let expect = Expect {
            node: &self.node,
            run: *run,
            revision,
            generation: self.generation,
            credential_epoch: epoch,
            now_ms: lease::now_ms(),
        };
        match self.opener.open(lease, &self.verify_key, &expect) {
            Ok(opened) => Ok(Some(Secret::new(format!("Bearer {}", opened.secret.expose())))),
            Err(e) => Err(refused(run, e)),
        }
    }
}

fn refused(run: &Binding<'_>, e: LeaseError) -> RunFailure {
    crate::metrics::lease_refused(e.label());
    tracing::warn!(
        event = "node_credential_lease_refused",
        reason = e.label(),
        provider = run.provider,
        run = run.slot,
        "credential lease refused; the run fails closed"
    );
    RunFailure::new(e.code(), 502, FailureSource::Node, e.to_string())
}
