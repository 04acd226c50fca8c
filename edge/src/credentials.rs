//! Issuing credential leases on a node link (managed mode): each run or
//! tunnel to a provider with an `api_key` carries the key sealed to the
//! node's process key, bound to the run (see `iop_core::lease`). The node's
//! config then carries no key at all.

use std::{cell::Cell, rc::Rc, sync::Arc};

use iop_core::{
    lease::{self, Binding, Issuer},
    wire::pb,
};

use crate::ctx::ConfigCell;

/// One link's lease issuing.
pub struct LinkCredentials {
    pub issuer: Arc<Issuer>,
    /// The config of the link's core (its providers' keys).
    pub config: ConfigCell,
    pub node: String,
    pub generation: u64,
    /// The node's X25519 public key (from its registration).
    pub recipient: Vec<u8>,
    /// The config revision last sent to the node on this link.
    pub sent_revision: Rc<Cell<u64>>,
}

impl LinkCredentials {
    /// Seals the provider's credential into `req`, bound to the capacity
    /// profile of `lease` (nothing for a provider without an `api_key`: it
    /// has no secret to lease).
    pub fn seal_run(&self, req: &mut pb::RunRequest, lease: &crate::pool::Lease) {
        req.profile = profile(lease).into();
        req.credential = self.seal(&Binding {
            provider: &req.adapter,
            target: &req.target,
            route: lease::run_route(req.operation),
            slot: &req.run_id,
            profile: &req.profile,
            principal: &req.principal,
        });
    }

    /// As [`LinkCredentials::seal_run`], for a tunnel (its route: the provider path).
    pub fn seal_tunnel(&self, req: &mut pb::ProviderTunnelRequest, lease: &crate::pool::Lease) {
        req.profile = profile(lease).into();
        req.credential = self.seal(&Binding {
            provider: &req.adapter,
            target: &req.target,
            route: &req.path,
            slot: &req.tunnel_id,
            profile: &req.profile,
            principal: &req.principal,
        });
    }

    fn seal(&self, b: &Binding<'_>) -> Option<pb::SealedLease> {
        let config = self.config.borrow();
        let entry = config.node(&self.node)?.providers.iter().find(|p| p.id == b.provider)?;
        let key = entry.api_key.as_ref()?;
        let scope = pb::LeaseScope {
            node: self.node.clone(),
            revision: self.sent_revision.get(),
            generation: self.generation,
            credential_epoch: self.issuer.epoch_of(key.expose()),
            ..b.scope()
        };
        let sealed = self.issuer.issue(scope, key.expose(), &self.recipient, lease::now_ms());
        if sealed.is_none() {
            // The node then refuses the run (mismatched): closed, not open.
            tracing::error!(node = %self.node, provider = b.provider, "could not seal a credential lease");
        }
        sealed
    }
}

/// The capacity profile a lease is bound to (only managed mode sends it).
fn profile(lease: &crate::pool::Lease) -> &'static str {
    match lease.class() {
        crate::pool::LeaseClass::Normal => "normal",
        crate::pool::LeaseClass::Long => "long",
    }
}
