//! Client API keys on `/v1`: with any `[[api_keys]]` configured, every
//! request needs one (`Authorization: Bearer <key>` or `x-api-key`). The
//! key is looked up by its SHA-256 and never logged (its name and a short
//! fingerprint are). Failed attempts are limited per client address, in a
//! table of their own ([`crate::limits::failures`]); a valid key never
//! touches that limit.

use std::{rc::Rc, sync::Arc};

use iop_core::http::RequestHead;

use super::{dialect::Dialect, error};
use iop_core::config::EngineDown;

use crate::{
    cluster::Verdict,
    ctx::Ctx,
    limits::failures::Credential,
    pool::keys::{KeyState, Over},
    server::Conn,
};

/// The presented key: `Authorization: Bearer …` first, else `x-api-key`.
fn presented(head: &RequestHead) -> Option<&[u8]> {
    if let Some(auth) = head.header("authorization") {
        let (scheme, rest) = auth.split_at(auth.len().min(7));
        if scheme.eq_ignore_ascii_case(b"bearer ") {
            return Some(rest.trim_ascii());
        }
    }
    head.header("x-api-key").map(<[u8]>::trim_ascii)
}

/// The request's key: `Ok(None)` when no keys are configured; `Err(keep)`
/// when the request was answered (401, or 429 past too many failures).
pub async fn authenticate(
    worker: &Rc<Ctx>,
    conn: &mut Conn,
    head: &RequestHead,
    keep: bool,
) -> Result<Option<Arc<KeyState>>, bool> {
    if worker.pool.borrow().keys.is_empty() {
        return Ok(None);
    }
    // The answers below are boxed: their states stay out of every
    // request's task (an open stream's included).
    let Some(key) = presented(head).filter(|k| !k.is_empty()) else {
        let msg = "no API key: send `Authorization: Bearer <key>` (or `x-api-key: <key>`)";
        return Err(Box::pin(respond(conn, head, 401, msg, "missing_api_key", None, keep)).await);
    };
    let digest = ring::digest::digest(&ring::digest::SHA256, key);
    let found = worker.pool.borrow().keys.iter().find(|k| k.entry.sha256[..] == *digest.as_ref()).cloned();
    if let Some(k) = found {
        return Ok(Some(k));
    }
    // Only a failed check touches the per-address limit (it takes a lock):
    // a valid key is never slowed nor refused, guessing is.
    match worker.shared.auth.failed(Credential::ApiKey, conn.peer.ip()) {
        Ok(()) => {
            // Never the key itself, nor its hash.
            tracing::debug!(peer = %conn.peer, "request with an unknown API key");
            Err(Box::pin(respond(conn, head, 401, "invalid API key", "invalid_api_key", None, keep)).await)
        }
        Err(wait) => {
            let retry = wait.as_secs().max(1).to_string();
            let msg = "invalid API key, and too many requests with an invalid API key from this address; retry later";
            Err(Box::pin(respond(conn, head, 429, msg, TOO_MANY_KEY_FAILURES, Some(&retry), keep)).await)
        }
    }
}

/// Error code of the 429 a wrong API key gets past its address's budget.
pub const TOO_MANY_KEY_FAILURES: &str = "too_many_failed_api_keys";

/// An error answer in the client's dialect: Anthropic's shape for a
/// client that speaks it, else OpenAI's (`retry_after` in seconds on 429).
pub async fn respond(
    conn: &mut Conn,
    head: &RequestHead,
    status: u16,
    msg: &str,
    code: &str,
    retry_after: Option<&str>,
    keep: bool,
) -> bool {
    let body = Dialect::of(head).error_body(status, msg, code);
    let mut extra: Vec<(&str, &str)> = Vec::new();
    if status == 401 {
        extra.push(("www-authenticate", "Bearer"));
    }
    if let Some(r) = retry_after {
        extra.push(("retry-after", r));
    }
    conn.respond(status, "application/json", &extra, &body, keep).await.is_ok() && keep
}

/// Why a key may not start a request now.
pub struct Refusal {
    pub status: u16,
    pub message: &'static str,
    pub code: &'static str,
    /// `Retry-After` in seconds (429, 503).
    pub retry_after: Option<String>,
}

/// Error code of the 503 a key that fails closed gets while the shared
/// limits engine is unreachable.
pub const LIMITS_UNAVAILABLE: &str = "rate_limits_unavailable";

impl From<Over> for Refusal {
    fn from(over: Over) -> Self {
        let secs = |wait: std::time::Duration| Some(wait.as_secs().max(1).to_string());
        let (message, retry_after) = match over {
            Over::Requests(w) => ("this API key is over its requests_per_minute", secs(w)),
            Over::Tokens(w) => ("this API key is over its tokens_per_minute", secs(w)),
            Over::Day(w) => ("this API key has spent its tokens_per_day (the day ends at 00:00 UTC)", secs(w)),
            Over::Month(w) => {
                ("this API key has spent its tokens_per_month (the month ends at 00:00 UTC on its last day)", secs(w))
            }
            Over::EngineDown => {
                let message = "this API key's limits cannot be checked now (the shared limits engine is unreachable)";
                return Refusal { status: 503, message, code: LIMITS_UNAVAILABLE, retry_after: Some("1".into()) };
            }
        };
        Refusal { status: 429, message, code: "rate_limit_exceeded", retry_after }
    }
}

/// Whether `key` may start a request for `model` now (taking one of its
/// requests when it may). With `[cluster]` the engine decides within its
/// deadline; without a verdict the key's `on_engine_down` does: `open`,
/// this edge's share of each limit locally; `closed`, a 503.
pub async fn check(worker: &Ctx, key: &KeyState, model: &str) -> Result<(), Refusal> {
    if !key.allows_model(model) {
        let message = "this API key may not use this model";
        return Err(Refusal { status: 403, message, code: "model_not_allowed", retry_after: None });
    }
    key.sync(&worker.shared.key_limits);
    let Some(engine) = &worker.shared.cluster else { return key.check_local(1).map_err(Refusal::from) };
    key.attach(engine);
    let limits = key.limits();
    if !limits.any() {
        return Ok(());
    }
    match engine.check(&key.name, limits).await {
        Ok(Verdict::Allowed) => {
            key.note_admitted();
            Ok(())
        }
        Ok(Verdict::Over(over)) => Err(over.into()),
        Err(_) => match key.entry.on_engine_down {
            EngineDown::Open => key.check_local(engine.live_edges()).map_err(Refusal::from),
            EngineDown::Closed => Err(Over::EngineDown.into()),
        },
    }
}

/// Whether `key` may start a request for `model` now: `Err(keep)` when
/// answered (403 not allowed, 429 over a limit, 503 limits unavailable).
pub async fn admit(
    worker: &Ctx,
    conn: &mut Conn,
    head: &RequestHead,
    key: &KeyState,
    model: &str,
    keep: bool,
) -> Result<(), bool> {
    let Err(r) = check(worker, key, model).await else { return Ok(()) };
    let msg = if r.status == 403 {
        format!("this API key may not use model `{}`", error::clip(model))
    } else {
        r.message.to_owned()
    };
    Err(respond(conn, head, r.status, &msg, r.code, r.retry_after.as_deref(), keep).await)
}
