//! Error answers in the shapes of the servers the mock stands in for: OpenAI
//! (`{"error":{"message","type","param","code"}}` plus its retry headers),
//! Anthropic (`{"type":"error","error":{"type","message"}}`) and Ollama
//! (`{"error":"..."}`).

use super::json::json_str;

/// The message of every configured error (`error_status`).
pub const MOCK_ERROR_MESSAGE: &str = "mock provider error";

/// OpenAI-shaped error body. `code` is a JSON value (string or `null`).
pub fn error_body(message: &str, kind: &str, code: &str) -> String {
    format!(
        "{{\"error\":{{\"message\":{},\"type\":{},\"param\":null,\"code\":{code}}}}}",
        json_str(message),
        json_str(kind)
    )
}

/// OpenAI's `type` and `code` for an error status.
pub fn error_kind(status: u16) -> (&'static str, &'static str) {
    match status {
        401 => ("invalid_request_error", "invalid_api_key"),
        404 => ("invalid_request_error", "model_not_found"),
        429 => ("rate_limit_error", "rate_limit_exceeded"),
        500..=599 => ("server_error", "mock_error"),
        _ => ("invalid_request_error", "mock_error"),
    }
}

/// The configured provider error (`error_status`) in OpenAI's shape.
pub fn mock_error_body(status: u16) -> String {
    let (kind, code) = error_kind(status);
    error_body(MOCK_ERROR_MESSAGE, kind, &json_str(code))
}

/// Headers OpenAI adds to an error: when to retry, on 429 and 503.
pub fn retry_headers(status: u16) -> Vec<(&'static str, String)> {
    if matches!(status, 429 | 503) {
        vec![("retry-after", "7".to_owned()), ("retry-after-ms", "7000".to_owned())]
    } else {
        Vec::new()
    }
}

/// Anthropic-shaped error body.
pub fn anthropic_error_body(kind: &str, message: &str) -> String {
    format!("{{\"type\":\"error\",\"error\":{{\"type\":{},\"message\":{}}}}}", json_str(kind), json_str(message))
}

/// Anthropic's error `type` for a status.
pub fn anthropic_error_kind(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        504 => "timeout_error",
        529 => "overloaded_error",
        500..=599 => "api_error",
        _ => "invalid_request_error",
    }
}

/// The configured provider error (`error_status`) in Anthropic's shape.
pub fn anthropic_mock_error_body(status: u16) -> String {
    anthropic_error_body(anthropic_error_kind(status), MOCK_ERROR_MESSAGE)
}

/// Headers Anthropic adds to an error: when to retry, on 429 and overload.
pub fn anthropic_retry_headers(status: u16) -> Vec<(&'static str, String)> {
    if matches!(status, 429 | 503 | 529) {
        vec![("retry-after", "7".to_owned())]
    } else {
        Vec::new()
    }
}

/// Ollama-shaped error body.
pub fn ollama_error_body(message: &str) -> String {
    format!("{{\"error\":{}}}", json_str(message))
}

/// The configured provider error in Ollama's words: a 404 is the missing-model
/// message Ollama sends, anything else the mock's message.
pub fn ollama_mock_error_message(status: u16, model: &str) -> String {
    if status == 404 {
        format!("model {} not found, try pulling it first", json_str(model))
    } else {
        MOCK_ERROR_MESSAGE.to_owned()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    #[test]
    fn openai_errors() {
        let v: Value = serde_json::from_str(&mock_error_body(500)).unwrap();
        assert_eq!(
            v,
            json!({"error":{"message":"mock provider error","type":"server_error","param":null,"code":"mock_error"}})
        );
        let v: Value = serde_json::from_str(&mock_error_body(429)).unwrap();
        assert_eq!(
            (&v["error"]["type"], &v["error"]["code"]),
            (&json!("rate_limit_error"), &json!("rate_limit_exceeded"))
        );
        assert_eq!(error_kind(404).1, "model_not_found");
        assert_eq!(error_kind(418), ("invalid_request_error", "mock_error"));
        let v: Value = serde_json::from_str(&error_body("a \"b\"", "invalid_request_error", "null")).unwrap();
        assert_eq!((&v["error"]["message"], &v["error"]["code"]), (&json!("a \"b\""), &Value::Null));
        assert_eq!(retry_headers(503), [("retry-after", "7".to_owned()), ("retry-after-ms", "7000".to_owned())]);
        assert!(retry_headers(500).is_empty());
    }

    #[test]
    fn anthropic_errors() {
        let v: Value = serde_json::from_str(&anthropic_mock_error_body(529)).unwrap();
        assert_eq!(v, json!({"type":"error","error":{"type":"overloaded_error","message":"mock provider error"}}));
        assert_eq!((anthropic_error_kind(429), anthropic_error_kind(500)), ("rate_limit_error", "api_error"));
        assert_eq!(
            (anthropic_error_kind(404), anthropic_error_kind(418)),
            ("not_found_error", "invalid_request_error")
        );
        assert_eq!(anthropic_retry_headers(529), [("retry-after", "7".to_owned())]);
        assert!(anthropic_retry_headers(500).is_empty());
    }

    #[test]
    fn ollama_errors() {
        let v: Value = serde_json::from_str(&ollama_error_body(&ollama_mock_error_message(404, "x"))).unwrap();
        assert_eq!(v, json!({"error": "model \"x\" not found, try pulling it first"}));
        assert_eq!(ollama_mock_error_message(500, "x"), "mock provider error");
    }
}
