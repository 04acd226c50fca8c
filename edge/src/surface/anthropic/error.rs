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

/// The status an Anthropic client gets for the gateway's `status`: no
/// capacity in time (503) is Anthropic's `overloaded_error`, 529.
pub fn status(status: u16) -> u16 {
    if status == 503 {
        529
    } else {
        status
    }
}

/// The error body of a run failure: the provider's message under the type
/// its status has in Anthropic's API (an OpenAI-shaped provider's own
/// `type` names OpenAI's types, not Anthropic's).
pub fn failure_body(f: &iop_core::exec::RunFailure) -> Vec<u8> {
    body(status(f.status), &f.message)
}

/// The error body for `status` with `message` (cut like OpenAI's).
pub fn body(status: u16, message: &str) -> Vec<u8> {
    let message = crate::surface::error::clip_to(message, crate::surface::error::MAX_MESSAGE_BYTES);
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
