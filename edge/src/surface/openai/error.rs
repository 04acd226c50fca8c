//! OpenAI-shaped error bodies.

use serde_json::json;

pub use crate::surface::error::{clip, clip_to, retry_after, MAX_ECHO_BYTES, MAX_MESSAGE_BYTES};

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
            "message": clip_to(message, MAX_MESSAGE_BYTES),
            "type": error_type(status),
            "param": null,
            "code": code,
        }
    });
    serde_json::to_vec(&v).unwrap_or_default()
}

/// The error body of a run failure: the provider's own `code`, `param` and
/// `type` when it sent them, else the gateway's classification.
pub fn failure_body(f: &iop_core::exec::RunFailure) -> Vec<u8> {
    let p = f.provider.as_deref().cloned().unwrap_or_default();
    let v = json!({
        "error": {
            "message": clip_to(&f.message, MAX_MESSAGE_BYTES),
            "type": p.kind.as_deref().unwrap_or(error_type(f.status)),
            "param": p.param,
            "code": p.code.as_deref().unwrap_or(f.code),
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

    #[test]
    fn failures_carry_the_providers_fields_and_wait() {
        use iop_core::exec::{FailureSource, ProviderError, RunFailure};
        let f = RunFailure::new("upstream_status", 429, FailureSource::Provider, "slow").with_provider(
            Some(ProviderError { code: Some("rate_limit_exceeded".into()), param: Some("n".into()), kind: None }),
            Some(7500),
        );
        let v: serde_json::Value = serde_json::from_slice(&failure_body(&f)).unwrap();
        assert_eq!(v["error"]["code"], "rate_limit_exceeded");
        assert_eq!(v["error"]["param"], "n");
        assert_eq!(v["error"]["type"], "rate_limit_error");
        assert_eq!(retry_after(&f), Some(("8".into(), "7500".into())));
        let plain = RunFailure::new("no_ready_node", 503, FailureSource::Edge, "x");
        assert_eq!(retry_after(&plain), Some(("1".into(), "1000".into())));
        let v: serde_json::Value = serde_json::from_slice(&failure_body(&plain)).unwrap();
        assert_eq!(
            (v["error"]["code"].as_str(), v["error"]["type"].as_str()),
            (Some("no_ready_node"), Some("server_error"))
        );
        assert_eq!(retry_after(&RunFailure::new("x", 400, FailureSource::Client, "x")), None);
    }

    #[test]
    fn messages_and_echoes_are_bounded() {
        let huge = "é".repeat(100_000);
        let v: serde_json::Value = serde_json::from_slice(&body(400, &huge, None)).unwrap();
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.len() <= MAX_MESSAGE_BYTES + 3 && msg.ends_with('…'), "{}", msg.len());
        assert_eq!(clip("short"), "short");
        let clipped = clip(&huge);
        assert!(clipped.len() <= MAX_ECHO_BYTES + 3 && clipped.starts_with("éé"));
    }
}
