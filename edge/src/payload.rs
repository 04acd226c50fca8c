//! Builds the `NodeConfigPayload` a node receives at registration.

use iop_core::{
    config::{NodeEntry, ProviderKind},
    wire::pb,
};

/// The wire config of `node` at config `revision`.
pub fn node_payload(node: &NodeEntry, revision: u64) -> pb::NodeConfigPayload {
    let providers = node
        .providers
        .iter()
        .map(|p| {
            let (kind, base_url, mock) = match &p.kind {
                ProviderKind::Mock(m) => (
                    pb::ProviderKind::Mock,
                    String::new(),
                    Some(pb::MockSettings {
                        tokens: m.tokens,
                        token_interval_ms: millis(m.token_interval),
                        first_token_delay_ms: millis(m.first_token_delay),
                        reasoning: m.reasoning,
                    }),
                ),
                ProviderKind::OpenAiCompat { base_url } => (
                    pb::ProviderKind::OpenaiCompat,
                    format!("http://{}{}", base_url.authority(), base_url.path_prefix),
                    None,
                ),
            };
            pb::ProviderConfig {
                id: p.id.clone(),
                kind: kind as i32,
                base_url,
                api_key: p.api_key.as_ref().map(|k| k.expose().to_owned()).unwrap_or_default(),
                max_concurrency: p.max_concurrency(),
                mock,
                request_timeout_ms: millis(p.request_timeout),
            }
        })
        .collect();
    pb::NodeConfigPayload { node_id: node.id.clone(), revision, providers }
}

fn millis(d: std::time::Duration) -> u32 {
    u32::try_from(d.as_millis()).unwrap_or(u32::MAX)
}
