//! `POST /tokenize`, as vLLM serves it beside `/v1`: a chat prompt
//! (`messages`) or a text (`prompt`) in, `{"count","max_model_len",
//! "tokens"}` out. The count is the one the mock reports as the same
//! prompt's `prompt_tokens`, so a client can check one against the other.

use serde::Deserialize;

use super::overrides::{content_chars, prompt_tokens, BadRequest};

/// The context length the mock claims.
const MAX_MODEL_LEN: u64 = 32_768;

#[derive(Debug, Deserialize)]
struct TokenizeRequest {
    #[serde(default)]
    messages: Option<Vec<Message>>,
    #[serde(default)]
    prompt: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Message {
    #[serde(default)]
    content: serde_json::Value,
}

/// The answer to a tokenize request.
pub fn tokenize_body(body: &[u8]) -> Result<String, BadRequest> {
    let req: TokenizeRequest = serde_json::from_slice(body).map_err(|e| BadRequest(format!("invalid request: {e}")))?;
    let chars = match (req.messages, req.prompt) {
        (Some(m), _) => m.iter().map(|m| content_chars(&m.content)).sum(),
        (None, Some(p)) => p.chars().count(),
        (None, None) => return Err(BadRequest("either `messages` or `prompt` is required".into())),
    };
    let count = prompt_tokens(chars);
    let tokens: Vec<String> = (0..count).map(|i| i.to_string()).collect();
    Ok(format!(
        "{{\"count\":{count},\"max_model_len\":{MAX_MODEL_LEN},\"tokens\":[{}],\"token_strs\":null}}",
        tokens.join(",")
    ))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn counts_as_the_chat_usage_does() {
        let body = br#"{"model":"m","messages":[{"role":"system","content":"abcd"},{"role":"user","content":[{"type":"text","text":"efghijkl"}]}]}"#;
        let v: serde_json::Value = serde_json::from_str(&tokenize_body(body).unwrap()).unwrap();
        assert_eq!((v["count"].as_u64(), v["tokens"].as_array().map(Vec::len)), (Some(3), Some(3)));
        let v: serde_json::Value = serde_json::from_str(&tokenize_body(br#"{"prompt":"x"}"#).unwrap()).unwrap();
        assert_eq!(v["count"], 1);
        assert!(tokenize_body(br#"{"model":"m"}"#).is_err());
        assert!(tokenize_body(b"[").is_err());
    }
}
