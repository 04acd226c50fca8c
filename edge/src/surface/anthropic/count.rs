//! `POST /v1/messages/count_tokens` where the provider does not serve the
//! Messages API (one that does gets the request through the tunnel): the
//! prompt translated to chat and counted by the provider's own tokenizer
//! endpoint where it has one ([`tokenize`]: vLLM's and llama.cpp's
//! `/tokenize`), else the edge's estimate, said to be one in the
//! [`ESTIMATE_HEADER`].

use std::rc::Rc;

use iop_core::{exec::ExecEvent, messages, wire::pb};
use serde_json::Value;

use crate::{
    ctx::Ctx,
    dispatch,
    pool::Admitted,
    server::{with_disconnect_watch, BodyPermit, Conn, WHOLE_WATCH},
    surface::{dialect::Dialect, replay::Replay, reply},
};

/// Present (`estimate`) when the count is the edge's estimate.
pub const ESTIMATE_HEADER: &str = "iop-token-count";

/// Answers with the estimated `input_tokens` of the request in `body`:
/// the text it carries (system, messages, tool definitions) at four bytes
/// a token, plus a few tokens of framing per message. Resolves to whether
/// the connection may be kept.
pub async fn estimate(conn: &mut Conn, body: &[u8], keep: bool) -> bool {
    let d = crate::surface::dialect::Dialect::Anthropic;
    let v: Value = match serde_json::from_slice(body) {
        Ok(v @ Value::Object(_)) => v,
        _ => {
            let body = d.error_body(400, "request body must be a JSON object", "invalid_request");
            return conn.respond(400, "application/json", &[], &body, keep).await.is_ok() && keep;
        }
    };
    let Some(messages) = v.get("messages").and_then(Value::as_array) else {
        let body = d.error_body(400, "messages: field required (an array)", "invalid_request");
        return conn.respond(400, "application/json", &[], &body, keep).await.is_ok() && keep;
    };
    let tokens = (request_text_bytes(&v) as u64).div_ceil(4) + 4 * messages.len() as u64;
    let body = serde_json::json!({ "input_tokens": tokens }).to_string();
    let headers = [(ESTIMATE_HEADER, "estimate")];
    conn.respond(200, "application/json", &headers, body.as_bytes(), keep).await.is_ok() && keep
}

/// Counts an admitted request's prompt with its provider's tokenizer; a
/// provider that has none (or fails) leaves it to [`estimate`]. Resolves
/// to whether the connection may be kept. A count is not charged to the
/// key's token budget: nothing was generated.
pub fn tokenize<'a>(
    worker: &Rc<Ctx>,
    conn: &'a mut Conn,
    parts: Replay,
    permit: Option<BodyPermit>,
    admitted: Admitted,
) -> impl std::future::Future<Output = bool> + 'a {
    let keep = parts.head.keep_alive;
    let target = admitted.target.upstream_model.clone();
    let key = admitted.lease.key().clone();
    let translated =
        with_max_tokens(&parts.bytes).and_then(|body| messages::to_chat(&body, &target, &messages::Limits::default()));
    let run = translated.map(|t| {
        let principal = conn.exchange.api_key.as_ref().map(|k| k.entry.name.clone()).unwrap_or_default();
        let req = pb::RunRequest {
            body: t.body.into(),
            operation: pb::RunOperation::Tokenize as i32,
            whole: true,
            principal,
            session_id: conn.exchange.session_id().to_owned(),
            ..Default::default()
        };
        dispatch::submit(worker, &parts.group.name, admitted, req)
    });
    drop(permit);
    async move {
        let mut run = match run {
            Ok(Ok(run)) => run,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "count_tokens: no run on the provider; estimated");
                return estimate(conn, &parts.bytes, keep).await;
            }
            Err(invalid) => {
                let msg = invalid.to_string();
                let d = Dialect::Anthropic;
                return reply::error(&mut conn.responder(), d, invalid.status, &msg, "invalid_request", keep).await;
            }
        };
        run.report_to(&conn.exchange.finish, &key);
        let counted = async {
            while let Some(ev) = run.next().await {
                match ev {
                    ExecEvent::Complete { usage: Some(u), .. } => return Some(u.input_tokens),
                    ExecEvent::Complete { .. } | ExecEvent::Error(_) | ExecEvent::Cancelled { .. } => return None,
                    _ => {}
                }
            }
            None
        };
        let counted = {
            let Conn { rd, buf, .. } = &mut *conn;
            with_disconnect_watch::<WHOLE_WATCH, _, _>(rd, buf, std::pin::pin!(counted)).await
        };
        conn.exchange.finish.borrow_mut().usage = None;
        match counted {
            None => false,
            Some(None) => estimate(conn, &parts.bytes, keep).await,
            Some(Some(tokens)) => {
                let body = serde_json::json!({ "input_tokens": tokens }).to_string();
                let id = run.run_id().to_owned();
                let mut headers = vec![("x-request-id", id.as_str())];
                headers.extend(Dialect::Anthropic.request_id_header().map(|h| (h, id.as_str())));
                conn.respond(200, "application/json", &headers, body.as_bytes(), keep).await.is_ok() && keep
            }
        }
    }
}

/// The count request as a Messages request: `max_tokens`, which a count
/// does not take, set so the translation accepts it.
fn with_max_tokens(body: &[u8]) -> Result<Vec<u8>, messages::Invalid> {
    let invalid = |message: &str| messages::Invalid { status: 400, param: String::new(), message: message.into() };
    let mut v: serde_json::Map<String, Value> =
        serde_json::from_slice(body).map_err(|_| invalid("request body must be a JSON object"))?;
    v.insert("max_tokens".into(), Value::from(1));
    serde_json::to_vec(&v).map_err(|e| invalid(&e.to_string()))
}

/// Bytes of the text a request carries: its system prompt, messages and
/// tool definitions.
fn request_text_bytes(v: &Value) -> usize {
    ["system", "messages", "tools"].iter().filter_map(|k| v.get(*k)).map(text_bytes).sum()
}

/// Bytes of the strings in `v` (keys left out: they are the format's).
fn text_bytes(v: &Value) -> usize {
    match v {
        Value::String(s) => s.len(),
        Value::Array(a) => a.iter().map(text_bytes).sum(),
        Value::Object(o) => o.iter().filter(|(k, _)| k.as_str() != "type").map(|(_, v)| text_bytes(v)).sum(),
        _ => 0,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn counts_the_text_not_the_format() {
        let v: Value = serde_json::from_str(
            r#"{"system":"abcd","messages":[{"role":"user","content":[{"type":"text","text":"abcdefgh"}]}]}"#,
        )
        .unwrap();
        // "abcd" + "user" + "abcdefgh"
        assert_eq!(request_text_bytes(&v), 16);
    }
}
