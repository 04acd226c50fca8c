//! OpenAI-shaped error bodies.

use serde_json::json;

/// The OpenAI `error.type` for an HTTP status.
pub fn error_type(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        403 => "permission_error",
        429 => "rate_limit_error",
        400..=499 => "invalid_request_error",
        _ => "server_error",
    }
}

/// `{"error":{"message","type","param":null,"code"}}` for `status`.
pub fn body(status: u16, message: &str, code: Option<&str>) -> Vec<u8> {
    let v = json!({
        "error": {
            "message": message,
            "type": error_type(status),
            "param": null,
            "code": code,
        }
    });
    serde_json::to_vec(&v).unwrap_or_default()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn shape() {
        let v: serde_json::Value = serde_json::from_slice(&body(404, "nope", Some("model_not_found"))).unwrap();
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["code"], "model_not_found");
        assert_eq!(v["error"]["message"], "nope");
        assert_eq!(error_type(503), "server_error");
        assert_eq!(error_type(429), "rate_limit_error");
    }
}
