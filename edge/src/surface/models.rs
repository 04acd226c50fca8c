//! `GET /v1/models` and `GET /v1/models/{id}`: the configured model groups
//! and the agents a node serves a workspace for now (with an API key, only
//! those it may use), in OpenAI's shape, or in Anthropic's for a client
//! that sends `anthropic-version`.

use iop_core::config::EdgeConfig;
use serde_json::{json, Value};

use super::dialect::Dialect;
use crate::ctx::Ctx;

/// When each model is said to have been created: fixed, so the answer is
/// the same across restarts and edges (the groups are config, not
/// releases of a model).
const CREATED: u64 = 0;
const CREATED_AT: &str = "1970-01-01T00:00:00Z";

/// The names listed: model groups, then the agents served now.
fn visible<'a>(
    ctx: &'a Ctx,
    config: &'a EdgeConfig,
    key: Option<&'a crate::pool::keys::KeyState>,
) -> impl Iterator<Item = &'a str> + 'a {
    let groups = config.models.iter().map(|m| m.name.as_str());
    let agents =
        config.agents.iter().filter(|a| crate::coordinator::workspace::serves(ctx, a)).map(|a| a.name.as_str());
    groups.chain(agents).filter(move |name| key.is_none_or(|k| k.allows_model(name)))
}

fn object(d: Dialect, name: &str) -> Value {
    match d {
        Dialect::OpenAi => json!({"id": name, "object": "model", "created": CREATED, "owned_by": "iop"}),
        Dialect::Anthropic => {
            json!({"type": "model", "id": name, "display_name": name, "created_at": CREATED_AT})
        }
    }
}

/// The model list body.
pub fn list(d: Dialect, ctx: &Ctx, config: &EdgeConfig, key: Option<&crate::pool::keys::KeyState>) -> Vec<u8> {
    let data: Vec<Value> = visible(ctx, config, key).map(|m| object(d, m)).collect();
    let v = match d {
        Dialect::OpenAi => json!({"object": "list", "data": data}),
        Dialect::Anthropic => {
            let id = |m: Option<&Value>| m.map_or(Value::Null, |m| m["id"].clone());
            json!({"data": data, "has_more": false, "first_id": id(data.first()), "last_id": id(data.last())})
        }
    };
    serde_json::to_vec(&v).unwrap_or_default()
}

/// One model's body; `None` when there is no such model (for this key).
pub fn one(
    d: Dialect,
    ctx: &Ctx,
    config: &EdgeConfig,
    key: Option<&crate::pool::keys::KeyState>,
    id: &str,
) -> Option<Vec<u8>> {
    let m = visible(ctx, config, key).find(|m| *m == id)?;
    serde_json::to_vec(&object(d, m)).ok()
}
