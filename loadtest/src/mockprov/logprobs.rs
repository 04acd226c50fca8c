//! Deterministic log probabilities in OpenAI's chat shape. Token `i` has
//! logprob `-(i % 9 + 1) / 100`; its `top_logprobs` list the token itself
//! first and then `alt1`, `alt2`, ... each one nat less likely, so a test can
//! recompute every value.

use super::json::{json_bytes, json_f64, json_str};

/// Most `top_logprobs` OpenAI allows.
pub const MAX_TOP: u64 = 20;

/// The logprob of token `i`.
pub fn logprob(i: u64) -> f64 {
    -((i % 9 + 1) as f64) / 100.0
}

/// One `ChatCompletionTokenLogprob` for token `i` with text `token` and
/// `top` alternatives.
pub fn token_entry(token: &str, i: u64, top: u64) -> String {
    let lp = logprob(i);
    let mut out = format!(
        "{{\"token\":{},\"logprob\":{},\"bytes\":{},\"top_logprobs\":[",
        json_str(token),
        json_f64(lp),
        json_bytes(token)
    );
    for j in 0..top.min(MAX_TOP) {
        if j > 0 {
            out.push(',');
        }
        let alt = if j == 0 { token.to_owned() } else { format!("alt{j}") };
        out.push_str(&format!(
            "{{\"token\":{},\"logprob\":{},\"bytes\":{}}}",
            json_str(&alt),
            json_f64(lp - j as f64),
            json_bytes(&alt)
        ));
    }
    out.push_str("]}");
    out
}

/// `choices[].logprobs` carrying `entries` (already rendered) as `content`,
/// or as `refusal` when `refusal` is set.
pub fn choice_logprobs(entries: &[String], refusal: bool) -> String {
    let list = format!("[{}]", entries.join(","));
    if refusal {
        format!("{{\"content\":null,\"refusal\":{list}}}")
    } else {
        format!("{{\"content\":{list},\"refusal\":null}}")
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    #[test]
    fn entries_are_deterministic_and_openai_shaped() {
        let v: Value = serde_json::from_str(&token_entry("tok1 ", 1, 3)).unwrap();
        assert_eq!(v["token"], "tok1 ");
        assert_eq!(v["logprob"], -0.02);
        assert_eq!(v["bytes"], json!([116, 111, 107, 49, 32]));
        let top = v["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        assert_eq!(top[0], json!({"token":"tok1 ","logprob":-0.02,"bytes":[116,111,107,49,32]}));
        assert_eq!((top[2]["token"].as_str(), top[2]["logprob"].as_f64()), (Some("alt2"), Some(-2.02)));
        let v: Value = serde_json::from_str(&token_entry("x", 9, 0)).unwrap();
        assert_eq!((v["logprob"].as_f64(), v["top_logprobs"].as_array().map(Vec::len)), (Some(-0.01), Some(0)));
        let v: Value = serde_json::from_str(&token_entry("x", 0, 500)).unwrap();
        assert_eq!(v["top_logprobs"].as_array().unwrap().len(), 20);

        let entries = vec![token_entry("a", 0, 0), token_entry("b", 1, 0)];
        let v: Value = serde_json::from_str(&choice_logprobs(&entries, false)).unwrap();
        assert_eq!((v["content"].as_array().unwrap().len(), &v["refusal"]), (2, &Value::Null));
        let v: Value = serde_json::from_str(&choice_logprobs(&entries, true)).unwrap();
        assert_eq!((&v["content"], v["refusal"][1]["token"].as_str()), (&Value::Null, Some("b")));
    }
}
