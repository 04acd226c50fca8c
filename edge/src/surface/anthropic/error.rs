//! Anthropic-shaped error bodies:
//! `{"type":"error","error":{"type":…,"message":…}}`.

use serde_json::json;

/// Anthropic's `error.type` for an HTTP status.
pub fn error_type(status: u16) -> &'static str {
    match status {
        400 | 413 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        _ => "api_error",
    }
}

/// The error body for `status` with `message` (cut like OpenAI's).
pub fn body(status: u16, message: &str) -> Vec<u8> {
    let message = crate::surface::openai::error::clip_to(message, crate::surface::openai::error::MAX_MESSAGE_BYTES);
    let v = json!({"type": "error", "error": {"type": error_type(status), "message": message}});
    v.to_string().into_bytes()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn shape_and_types() {
        let v: serde_json::Value = serde_json::from_slice(&body(401, "invalid API key")).unwrap();
        assert_eq!(
            v,
            json!({"type": "error", "error": {"type": "authentication_error", "message": "invalid API key"}})
        );
        assert_eq!(
            (error_type(403), error_type(429), error_type(500)),
            ("permission_error", "rate_limit_error", "api_error")
        );
    }
}
