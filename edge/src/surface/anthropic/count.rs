//! `POST /v1/messages/count_tokens` where no provider of the model counts
//! tokens itself: an estimate, said to be one in the [`ESTIMATE_HEADER`]
//! (a provider that serves the Messages API natively gets the request
//! through the tunnel and counts with its own tokenizer).

use serde_json::Value;

use crate::server::Conn;

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
