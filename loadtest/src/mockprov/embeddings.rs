//! Embeddings for `POST /v1/embeddings` (OpenAI) and `POST /api/embed`
//! (Ollama). A vector is a pure function of its input: SHA-256 of the input
//! text (a token array: its ids joined by `,`) and a block counter, read as
//! little-endian `u32`s mapped to [-1, 1), then L2-normalized, so equal
//! inputs get equal vectors on both APIs. `encoding_format: "base64"` is the
//! base64 of the little-endian `f32`s.

use serde::Deserialize;
use serde_json::Value;

use super::json::{base64, json_f32, json_str, sha256};
use super::overrides::{self, BadRequest, Knobs, MockOverrides};
use super::reply::{self, Action, Env, Flavor, Reply, Whole, OLLAMA_JSON};

/// Dimensions when the request sets none.
pub const DEFAULT_DIMENSIONS: usize = 8;
/// Most dimensions a request may ask for.
pub const MAX_DIMENSIONS: usize = 4096;

/// The embedding of `seed` with `dims` dimensions.
pub fn vector(seed: &str, dims: usize) -> Vec<f32> {
    let mut raw = Vec::with_capacity(dims);
    let mut block = 0u32;
    while raw.len() < dims {
        let mut input = seed.as_bytes().to_vec();
        input.extend_from_slice(&block.to_le_bytes());
        for word in sha256(&input).chunks_exact(4) {
            let w = u32::from_le_bytes([word[0], word[1], word[2], word[3]]);
            raw.push(f64::from(w) / 2_147_483_648.0 - 1.0);
        }
        block += 1;
    }
    raw.truncate(dims);
    let norm = raw.iter().map(|x| x * x).sum::<f64>().sqrt();
    raw.iter().map(|x| if norm > 0.0 { (x / norm) as f32 } else { 0.0 }).collect()
}

/// A vector as a JSON array of `f32`s.
pub fn vector_json(v: &[f32]) -> String {
    let items: Vec<String> = v.iter().map(|x| json_f32(*x)).collect();
    format!("[{}]", items.join(","))
}

/// A vector as base64 of its little-endian `f32`s.
pub fn vector_base64(v: &[f32]) -> String {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    base64(&bytes)
}

/// One input: the text its vector derives from, and its token count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Input {
    /// Seed of the vector.
    pub seed: String,
    /// Prompt tokens.
    pub tokens: u64,
}

impl Input {
    fn text(s: &str) -> Self {
        Self { seed: s.to_owned(), tokens: overrides::prompt_tokens(s.chars().count()) }
    }

    fn token_ids(ids: &[Value]) -> Self {
        let seed: Vec<String> = ids.iter().map(|t| t.to_string()).collect();
        Self { seed: seed.join(","), tokens: ids.len() as u64 }
    }
}

/// OpenAI's `input`: a string, strings, a token array or token arrays.
pub fn openai_inputs(input: &Value) -> Result<Vec<Input>, BadRequest> {
    let bad = || BadRequest("'input' must be a non-empty string, array of strings, or token arrays".into());
    match input {
        Value::String(s) if !s.is_empty() => Ok(vec![Input::text(s)]),
        Value::Array(items) if !items.is_empty() && items.iter().all(Value::is_u64) => {
            Ok(vec![Input::token_ids(items)])
        }
        Value::Array(items) if !items.is_empty() => items
            .iter()
            .map(|item| match item {
                Value::String(s) if !s.is_empty() => Ok(Input::text(s)),
                Value::Array(ids) if !ids.is_empty() && ids.iter().all(Value::is_u64) => Ok(Input::token_ids(ids)),
                _ => Err(bad()),
            })
            .collect(),
        _ => Err(bad()),
    }
}

#[derive(Debug, Deserialize)]
struct EmbeddingRequest {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    input: Option<Value>,
    #[serde(default)]
    encoding_format: Option<String>,
    #[serde(default)]
    dimensions: Option<usize>,
    #[serde(default)]
    mock: Option<MockOverrides>,
}

fn dimensions(d: Option<usize>) -> Result<usize, BadRequest> {
    match d {
        None => Ok(DEFAULT_DIMENSIONS),
        Some(d) if (1..=MAX_DIMENSIONS).contains(&d) => Ok(d),
        Some(d) => Err(BadRequest(format!("'dimensions' must be in 1..={MAX_DIMENSIONS}, got {d}"))),
    }
}

/// The `POST /v1/embeddings` body for `inputs`.
pub fn openai_body(model: &str, inputs: &[Input], dims: usize, base64: bool) -> String {
    let data: Vec<String> = inputs
        .iter()
        .enumerate()
        .map(|(i, input)| {
            let v = vector(&input.seed, dims);
            let embedding = if base64 { json_str(&vector_base64(&v)) } else { vector_json(&v) };
            format!("{{\"object\":\"embedding\",\"index\":{i},\"embedding\":{embedding}}}")
        })
        .collect();
    let tokens: u64 = inputs.iter().map(|i| i.tokens).sum();
    format!(
        "{{\"object\":\"list\",\"data\":[{}],\"model\":{},\"usage\":{{\"prompt_tokens\":{tokens},\"total_tokens\":{tokens}}}}}",
        data.join(","),
        json_str(model)
    )
}

/// Sends `body` after the first-token delay; any `abort_after` closes instead
/// (an embedding cannot be cut midway).
fn whole(knobs: &Knobs, content_type: &'static str, body: String) -> Whole {
    let mut w = Whole::json(200, content_type, body);
    w.delay = knobs.ttft;
    w.abort = knobs.abort_after.is_some();
    w
}

/// `POST /v1/embeddings`.
pub fn openai_reply(body: &[u8], env: &Env<'_>) -> Reply {
    let parsed = (|| {
        let req: EmbeddingRequest =
            serde_json::from_slice(body).map_err(|e| BadRequest(format!("invalid request body: {e}")))?;
        let inputs = openai_inputs(req.input.as_ref().ok_or_else(|| BadRequest("'input' is required".into()))?)?;
        let base64 = match req.encoding_format.as_deref() {
            None | Some("float") => false,
            Some("base64") => true,
            Some(other) => return Err(BadRequest(format!("'encoding_format' must be float or base64, got {other}"))),
        };
        let knobs = Knobs::resolve(req.mock, env.config)?;
        let model = req.model.filter(|m| !m.is_empty()).unwrap_or_else(|| env.config.model.clone());
        Ok((knobs, model, inputs, dimensions(req.dimensions)?, base64))
    })();
    let (knobs, model, inputs, dims, base64) = match parsed {
        Ok(p) => p,
        Err(e) => return reply::bad_request(Flavor::OpenAi, &e),
    };
    if let Some(early) = reply::early_reply(Flavor::OpenAi, knobs.hangup, knobs.error_status, &model) {
        return early;
    }
    let body = openai_body(&model, &inputs, dims, base64);
    Reply::new(Flavor::OpenAi, Action::Whole(whole(&knobs, "application/json", body)))
}

#[derive(Debug, Deserialize)]
struct OllamaEmbedRequest {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    input: Option<Value>,
    #[serde(default)]
    dimensions: Option<usize>,
    #[serde(default)]
    mock: Option<MockOverrides>,
}

/// The `POST /api/embed` body for `inputs` (durations in ns, deterministic;
/// zero fields are left out, as Go's `omitempty` does).
pub fn ollama_body(model: &str, inputs: &[Input], dims: usize, knobs: &Knobs) -> String {
    let vectors: Vec<String> = inputs.iter().map(|i| vector_json(&vector(&i.seed, dims))).collect();
    if inputs.is_empty() {
        return format!("{{\"model\":{},\"embeddings\":[]}}", json_str(model));
    }
    let tokens: u64 = inputs.iter().map(|i| i.tokens).sum();
    let load = super::ollama_chat::LOAD_DURATION_NS;
    let total = load + tokens * super::ollama_chat::PROMPT_EVAL_NS_PER_TOKEN + knobs.ttft.as_nanos() as u64;
    format!(
        "{{\"model\":{},\"embeddings\":[{}],\"total_duration\":{total},\"load_duration\":{load},\"prompt_eval_count\":{tokens}}}",
        json_str(model),
        vectors.join(",")
    )
}

/// `POST /api/embed`.
pub fn ollama_reply(body: &[u8], env: &Env<'_>) -> Reply {
    let parsed = (|| {
        let req: OllamaEmbedRequest = serde_json::from_slice(body).map_err(|e| BadRequest(e.to_string()))?;
        let model = req.model.filter(|m| !m.is_empty()).ok_or_else(|| BadRequest("model is required".into()))?;
        let inputs = match &req.input {
            None => Vec::new(),
            Some(Value::String(s)) if s.is_empty() => Vec::new(),
            Some(Value::String(s)) => vec![Input::text(s)],
            Some(Value::Array(items)) => items
                .iter()
                .map(|i| i.as_str().map(Input::text).ok_or_else(|| BadRequest("invalid input type".into())))
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(BadRequest("invalid input type".into())),
        };
        let knobs = Knobs::resolve(req.mock, env.config)?;
        Ok((knobs, model, inputs, dimensions(req.dimensions)?))
    })();
    let (knobs, model, inputs, dims) = match parsed {
        Ok(p) => p,
        Err(e) => return reply::bad_request(Flavor::Ollama, &e),
    };
    if knobs.error_status == Some(404) && !knobs.hangup {
        // Ollama words a missing embedding model differently from a chat one.
        let body = super::errors::ollama_error_body(&format!("model '{model}' not found"));
        return Reply::new(Flavor::Ollama, Action::Whole(Whole::json(404, OLLAMA_JSON, body)));
    }
    if let Some(early) = reply::early_reply(Flavor::Ollama, knobs.hangup, knobs.error_status, &model) {
        return early;
    }
    let body = ollama_body(&model, &inputs, dims, &knobs);
    Reply::new(Flavor::Ollama, Action::Whole(whole(&knobs, OLLAMA_JSON, body)))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::mockprov::clock::Timestamp;
    use crate::mockprov::MockConfig;
    use serde_json::json;

    #[test]
    fn vectors_are_deterministic_normalized_and_input_dependent() {
        let a = vector("hello", 8);
        assert_eq!(a, vector("hello", 8));
        assert_ne!(a, vector("hello!", 8));
        assert_eq!(a.len(), 8);
        let norm: f32 = a.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "{norm}");
        let long = vector("hello", 20);
        assert_eq!(long.len(), 20);
        // The JSON floats parse back to the exact f32 values base64 carries.
        let parsed: Vec<f32> = serde_json::from_str(&vector_json(&a)).unwrap();
        assert_eq!(parsed, a);
        let b64 = vector_base64(&a);
        assert_eq!(b64.len(), 44, "32 bytes of f32");
        assert_eq!(b64, base64(&a.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>()));
    }

    #[test]
    fn openai_inputs_and_body() {
        assert_eq!(openai_inputs(&json!("abcdefgh")).unwrap(), [Input { seed: "abcdefgh".into(), tokens: 2 }]);
        assert_eq!(openai_inputs(&json!([1, 2, 3])).unwrap(), [Input { seed: "1,2,3".into(), tokens: 3 }]);
        assert_eq!(openai_inputs(&json!(["a", [4, 5]])).unwrap().len(), 2);
        for bad in [json!(""), json!([]), json!([""]), json!([[]]), json!(3), json!([{"x": 1}])] {
            assert!(openai_inputs(&bad).is_err(), "{bad}");
        }
        let inputs = openai_inputs(&json!(["a", "b"])).unwrap();
        let v: Value = serde_json::from_str(&openai_body("e", &inputs, 8, false)).unwrap();
        assert_eq!((&v["object"], &v["model"]), (&json!("list"), &json!("e")));
        assert_eq!(v["usage"], json!({"prompt_tokens": 2, "total_tokens": 2}));
        assert_eq!(v["data"][1]["index"], 1);
        assert_eq!(v["data"][1]["object"], "embedding");
        let got: Vec<f32> = serde_json::from_value(v["data"][0]["embedding"].clone()).unwrap();
        assert_eq!(got, vector("a", 8));
        let v: Value = serde_json::from_str(&openai_body("e", &inputs, 8, true)).unwrap();
        assert_eq!(v["data"][0]["embedding"], vector_base64(&vector("a", 8)));
    }

    #[test]
    fn replies_validate_and_honour_knobs() {
        let config = MockConfig::for_tests();
        let env = Env { config: &config, seq: 1, now: Timestamp::from_secs(0) };
        let whole = |r: Reply| match r.action {
            Action::Whole(w) => w,
            other => panic!("{other:?}"),
        };
        let w = whole(openai_reply(br#"{"input":"x","dimensions":3,"mock":{"ttft_ms":4}}"#, &env));
        let v: Value = serde_json::from_str(&w.body).unwrap();
        assert_eq!((w.status, v["data"][0]["embedding"].as_array().unwrap().len()), (200, 3));
        assert_eq!(w.delay, std::time::Duration::from_millis(4));
        for bad in [&br#"{"input":"x","encoding_format":"hex"}"#[..], br#"{"input":"x","dimensions":0}"#, b"{}"] {
            assert_eq!(whole(openai_reply(bad, &env)).status, 400);
        }
        assert!(whole(openai_reply(br#"{"input":"x","mock":{"abort_after":0}}"#, &env)).abort);

        let w = whole(ollama_reply(br#"{"model":"m","input":["a","b"]}"#, &env));
        let v: Value = serde_json::from_str(&w.body).unwrap();
        assert_eq!((w.content_type, v["model"].as_str()), (OLLAMA_JSON, Some("m")));
        let first: Vec<f32> = serde_json::from_value(v["embeddings"][0].clone()).unwrap();
        assert_eq!(first, vector("a", 8), "the same vector as OpenAI's for the same text");
        assert_eq!(v["prompt_eval_count"], 2);
        assert!(v["total_duration"].as_u64().unwrap() > v["load_duration"].as_u64().unwrap());
        let v: Value = serde_json::from_str(&whole(ollama_reply(br#"{"model":"m"}"#, &env)).body).unwrap();
        assert_eq!(v, json!({"model":"m","embeddings":[]}));
        let w = whole(ollama_reply(br#"{"input":"a"}"#, &env));
        assert_eq!((w.status, w.body.as_str()), (400, r#"{"error":"model is required"}"#));
        let w = whole(ollama_reply(br#"{"model":"m","input":[1]}"#, &env));
        assert_eq!((w.status, w.body.as_str()), (400, r#"{"error":"invalid input type"}"#));
        let w = whole(ollama_reply(br#"{"model":"gone","input":"a","mock":{"error_status":404}}"#, &env));
        assert_eq!((w.status, w.body.as_str()), (404, r#"{"error":"model 'gone' not found"}"#));
    }
}
