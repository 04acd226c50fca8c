//! Builds the `NodeConfigPayload` a node receives at registration.

use iop_core::{config::NodeEntry, lease::Issuer, wire::pb};

/// The wire config of `node` at config `revision`. In managed mode
/// (`leases`) a provider's `api_key` stays here: the node learns that it is
/// leased and the credential's epoch, and gets the key per run, sealed.
pub fn node_payload(node: &NodeEntry, revision: u64, leases: Option<&Issuer>) -> pb::NodeConfigPayload {
    let providers = node
        .providers
        .iter()
        .map(|p| {
            let mut wire = p.to_wire();
            if let Some(issuer) = leases.filter(|_| !wire.api_key.is_empty()) {
                wire.credential_epoch = issuer.epoch_of(&wire.api_key);
                wire.api_key.clear();
                wire.leased = true;
            }
            wire
        })
        .collect();
    let workspaces = node.workspaces.iter().map(iop_core::config::WorkspaceEntry::to_wire).collect();
    pb::NodeConfigPayload { node_id: node.id.clone(), revision, providers, workspaces }
}
