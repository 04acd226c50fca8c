//! `GET /v1/models`.

use iop_core::config::EdgeConfig;
use serde_json::json;

/// The model list body.
pub fn list(config: &EdgeConfig, key: Option<&crate::pool::keys::KeyState>) -> Vec<u8> {
    let data: Vec<_> = config
        .models
        .iter()
        // With a key: only what it may use.
        .filter(|m| key.is_none_or(|k| k.allows_model(&m.name)))
        .map(|m| json!({"id": m.name, "object": "model", "created": 0, "owned_by": "iop"}))
        .collect();
    serde_json::to_vec(&json!({"object": "list", "data": data})).unwrap_or_default()
}
