//! Builds the `NodeConfigPayload` a node receives at registration.

use iop_core::{config::NodeEntry, wire::pb};

/// The wire config of `node` at config `revision`.
pub fn node_payload(node: &NodeEntry, revision: u64) -> pb::NodeConfigPayload {
    let providers = node.providers.iter().map(|p| p.to_wire()).collect();
    pb::NodeConfigPayload { node_id: node.id.clone(), revision, providers }
}
