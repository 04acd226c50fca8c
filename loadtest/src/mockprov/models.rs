//! `GET /v1/models`: the one model the mock serves by default.

use super::json::json_str;

/// The `GET /v1/models` body.
pub fn models_body(model: &str) -> String {
    format!(
        "{{\"object\":\"list\",\"data\":[{{\"id\":{},\"object\":\"model\",\"created\":0,\"owned_by\":\"iop-mockprov\"}}]}}",
        json_str(model)
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn lists_the_model() {
        let v: serde_json::Value = serde_json::from_str(&models_body("mock")).unwrap();
        assert_eq!((v["object"].as_str(), v["data"][0]["id"].as_str()), (Some("list"), Some("mock")));
    }
}
