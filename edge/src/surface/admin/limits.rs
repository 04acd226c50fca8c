//! API key limits at run time, under `/admin/v1/keys`:
//!
//! - `GET /admin/v1/keys`: every key's limits (configured and in force),
//!   its `on_engine_down`, and the engine's state with `[cluster]`.
//! - `GET /admin/v1/keys/{name}/limits`: one key's.
//! - `PUT /admin/v1/keys/{name}/limits` with
//!   `{"requests_per_minute": …, "tokens_per_minute": …, "tokens_per_day": …,
//!   "tokens_per_month": …}`: these limits replace the config's (a field
//!   absent or `null`: no such limit). With `[cluster]` they are stored in
//!   the engine and every edge applies them within a second (503 while it
//!   is unreachable); without, they hold on this edge until it restarts.
//! - `DELETE /admin/v1/keys/{name}/limits`: back to the config's.
//!
//! Keys are named by their configured name, never by the key.

use std::rc::Rc;

use iop_core::{
    config::{api_keys::MAX_BUDGET, api_keys::MAX_RATE, KeyLimits},
    http::RequestHead,
};
use serde_json::{json, Value};

use super::respond_error;
use crate::{ctx::Ctx, events::EdgeEvent, pool::keys::KeyState, server::Conn, surface::openai::error};

/// The list of keys.
pub const KEYS_PATH: &str = "/admin/v1/keys";
/// The largest body a limits change may have.
const MAX_BODY_BYTES: usize = 4096;

/// A route below [`KEYS_PATH`].
#[derive(Debug, PartialEq, Eq)]
pub enum LimitsRoute {
    /// `/admin/v1/keys`.
    All,
    /// `/admin/v1/keys/{name}/limits`, the name percent-decoded.
    Key(String),
}

impl LimitsRoute {
    /// The route of `path` (`None`: not one of these).
    pub fn parse(path: &str) -> Option<Self> {
        if path == KEYS_PATH {
            return Some(LimitsRoute::All);
        }
        let name = path.strip_prefix("/admin/v1/keys/")?.strip_suffix("/limits")?;
        (!name.is_empty() && !name.contains('/')).then(|| percent_decode(name)).flatten().map(LimitsRoute::Key)
    }
}

/// `%XX` escapes decoded; `None` for a bad escape or a name that is not UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Parses a `PUT` body: an object of the four limits, each an integer in
/// its range or `null`. `Err((field or "body", why))`.
pub fn parse_limits(body: &[u8]) -> Result<KeyLimits, (String, String)> {
    if body.len() > MAX_BODY_BYTES {
        return Err(("body".into(), format!("must be at most {MAX_BODY_BYTES} bytes")));
    }
    let v: Value = serde_json::from_slice(body).map_err(|e| ("body".to_owned(), format!("is not JSON: {e}")))?;
    let Value::Object(map) = v else { return Err(("body".into(), "must be a JSON object".into())) };
    if let Some(unknown) = map.keys().find(|k| !KeyLimits::FIELDS.contains(&k.as_str())) {
        let unknown = error::clip(unknown).into_owned();
        return Err((unknown, format!("is not a limit (one of {})", KeyLimits::FIELDS.join(", "))));
    }
    let mut values = [None; 4];
    for (i, field) in KeyLimits::FIELDS.iter().enumerate() {
        let max = if i < 2 { MAX_RATE } else { MAX_BUDGET };
        values[i] = match map.get(*field) {
            None | Some(Value::Null) => None,
            Some(v) => match v.as_u64() {
                Some(n) if (1..=max).contains(&n) => Some(n),
                _ => return Err(((*field).to_owned(), format!("must be an integer 1-{max}, or null for none"))),
            },
        };
    }
    Ok(KeyLimits::from_values(values))
}

fn limits_json(l: &KeyLimits) -> Value {
    let mut m = serde_json::Map::new();
    for (field, v) in KeyLimits::FIELDS.iter().zip(l.values()) {
        m.insert((*field).to_owned(), json!(v));
    }
    Value::Object(m)
}

/// One key as the API shows it.
fn key_json(worker: &Ctx, k: &KeyState) -> Value {
    k.sync(&worker.shared.key_limits);
    let set = worker.shared.key_limits.get(&k.entry.name).is_some();
    let (day, month) = k.local_spent();
    json!({
        "name": k.entry.name,
        "configured": limits_json(&k.entry.limits),
        "in_force": limits_json(&k.limits()),
        "source": if set { "admin" } else { "config" },
        "on_engine_down": k.entry.on_engine_down.as_str(),
        "tokens_spent_here": {"day": day, "month": month},
    })
}

fn cluster_json(worker: &Ctx) -> Value {
    match &worker.shared.cluster {
        Some(e) => json!({"engine": if e.is_up() { "up" } else { "down" }, "live_edges": e.live_edges()}),
        None => Value::Null,
    }
}

/// Handles a [`LimitsRoute`]; returns whether the connection may be kept.
pub async fn handle(worker: &Rc<Ctx>, conn: &mut Conn, head: &RequestHead, route: LimitsRoute, body: &[u8]) -> bool {
    let keep = head.keep_alive;
    let method = if head.method == "HEAD" { "GET" } else { head.method.as_str() };
    let name = match (&route, method) {
        (LimitsRoute::All, "GET") => {
            let keys: Vec<Value> = worker.pool.borrow().keys.iter().map(|k| key_json(worker, k)).collect();
            return respond_json(conn, 200, &json!({"keys": keys, "cluster": cluster_json(worker)}), keep).await;
        }
        (LimitsRoute::Key(name), "GET" | "PUT" | "DELETE") => name,
        _ => {
            let allow = if route == LimitsRoute::All { "GET, HEAD" } else { "GET, HEAD, PUT, DELETE" };
            let msg = format!("{} is not allowed here", error::clip(&head.method));
            return respond_error(conn, 405, &msg, Some("method_not_allowed"), &[("allow", allow)], keep).await;
        }
    };
    let key = worker.pool.borrow().keys.iter().find(|k| *k.entry.name == **name).cloned();
    let Some(key) = key else {
        let msg = format!("no API key named `{}`", error::clip(name));
        return respond_error(conn, 404, &msg, Some("unknown_api_key"), &[], keep).await;
    };
    let limits = match method {
        "GET" => return respond_json(conn, 200, &key_json(worker, &key), keep).await,
        "PUT" => match parse_limits(body) {
            Ok(l) => Some(l),
            Err((field, why)) => {
                let msg = format!("`{field}` {why}");
                return respond_error(conn, 400, &msg, Some("invalid_limits"), &[], keep).await;
            }
        },
        _ => None,
    };
    if let Some(engine) = &worker.shared.cluster {
        if !engine.store(name, limits).await {
            let msg = "the shared limits engine is unreachable: the change was not stored";
            return respond_error(conn, 503, msg, Some("limits_engine_unavailable"), &[("retry-after", "1")], keep)
                .await;
        }
    }
    // With the engine, its copy is read back before the answer; this
    // changes nothing then, and is the change itself without it.
    worker.shared.key_limits.put(name, limits);
    tracing::info!(key = %name, cleared = limits.is_none(), "API key limits changed through the admin API");
    worker.shared.events.publish(EdgeEvent::KeyLimitsChanged { key: name.clone(), source: "admin" });
    respond_json(conn, 200, &key_json(worker, &key), keep).await
}

async fn respond_json(conn: &mut Conn, status: u16, v: &Value, keep: bool) -> bool {
    let body = serde_json::to_vec(v).unwrap_or_default();
    conn.respond(status, "application/json", &[("cache-control", "no-store")], &body, keep).await.is_ok() && keep
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert_eq!(LimitsRoute::parse(KEYS_PATH), Some(LimitsRoute::All));
        assert_eq!(LimitsRoute::parse("/admin/v1/keys/alice/limits"), Some(LimitsRoute::Key("alice".into())));
        assert_eq!(LimitsRoute::parse("/admin/v1/keys/team%20a/limits"), Some(LimitsRoute::Key("team a".into())));
        assert_eq!(LimitsRoute::parse("/admin/v1/keys//limits"), None);
        assert_eq!(LimitsRoute::parse("/admin/v1/keys/a/b/limits"), None);
        assert_eq!(LimitsRoute::parse("/admin/v1/keys/%zz/limits"), None);
        assert_eq!(LimitsRoute::parse("/admin/v1/keys/alice"), None);
    }

    #[test]
    fn bodies_are_validated_naming_the_field() {
        let l = parse_limits(br#"{"requests_per_minute": 5, "tokens_per_day": null}"#).unwrap();
        assert_eq!(l, KeyLimits { requests_per_minute: Some(5), ..Default::default() });
        assert_eq!(parse_limits(b"{}").unwrap(), KeyLimits::default());
        for (body, field) in [
            (&br#"{"requests_per_minute": 0}"#[..], "requests_per_minute"),
            (br#"{"tokens_per_minute": -1}"#, "tokens_per_minute"),
            (br#"{"tokens_per_month": 1.5}"#, "tokens_per_month"),
            (br#"{"tokens_per_day": "10"}"#, "tokens_per_day"),
            (br#"{"requests_per_minute": 1000000001}"#, "requests_per_minute"),
            (br#"{"rpm": 1}"#, "rpm"),
            (b"[1]", "body"),
            (b"nope", "body"),
        ] {
            assert_eq!(parse_limits(body).unwrap_err().0, field, "{}", String::from_utf8_lossy(body));
        }
    }
}
