//! Client API keys: with `[[api_keys]]` configured, every `/v1` request
//! needs a valid key, may use only its models, and stays within its
//! request and token rates; the key never reaches a log.

use serde_json::{json, Value};

use crate::harness::*;

const ALICE: &str = "sk-alice-0c1e9a";
const BOB: &str = "sk-bob-77d2f4";

fn sha256_hex(key: &str) -> String {
    ring::digest::digest(&ring::digest::SHA256, key.as_bytes()).as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

fn config(mock: &MockProv) -> String {
    n1_header()
        + &format!(
            r#"
[[nodes.providers]]
id = "up"
kind = "openai_compat"
base_url = "{}"
capacity = 8
[[models]]
name = "m"
node = "n1"
provider = "up"
upstream_model = "mock"
[[models]]
name = "o"
node = "n1"
provider = "up"
upstream_model = "mock"
[[api_keys]]
name = "alice"
sha256 = "{}"
models = ["m"]
requests_per_minute = 2
[[api_keys]]
name = "bob"
sha256 = "{}"
models = ["m", "o"]
tokens_per_minute = 3
"#,
            mock.base_url(),
            sha256_hex(ALICE),
            sha256_hex(BOB),
        )
}

fn chat(edge: &Edge, model: &str, auth: &[(&str, &str)]) -> Response {
    let body = json!({"model": model, "messages": [{"role": "user", "content": "hi"}]});
    let bytes = serde_json::to_vec(&body).expect("json");
    let mut headers = vec![("content-type", "application/json")];
    headers.extend_from_slice(auth);
    request(edge.http, "POST", "/v1/chat/completions", Some(&bytes), &headers)
}

fn code(r: &Response) -> Value {
    r.json()["error"]["code"].clone()
}

fn models(edge: &Edge, key: &str) -> Vec<String> {
    let auth = format!("Bearer {key}");
    let r = request(edge.http, "GET", "/v1/models", None, &[("authorization", &auth)]);
    assert_eq!(r.status, 200);
    r.json()["data"].as_array().expect("data").iter().map(|m| m["id"].as_str().unwrap_or("").to_owned()).collect()
}

#[test]
fn keys_gate_every_v1_request_by_model_and_rate() {
    let mock = MockProv::start(&["--model", "mock", "--tokens", "3"]);
    let edge = Edge::start(&config(&mock));
    let _node = edge.node(NODE_TOKEN, &[]);
    edge.wait_nodes_ready(1);
    let alice = format!("Bearer {ALICE}");

    // Missing and wrong keys; the key in `x-api-key` counts too.
    let r = chat(&edge, "m", &[]);
    assert_eq!((r.status, code(&r)), (401, json!("missing_api_key")), "{}", String::from_utf8_lossy(&r.body));
    let r = chat(&edge, "m", &[("authorization", "Bearer sk-nope")]);
    assert_eq!((r.status, code(&r)), (401, json!("invalid_api_key")));
    assert_eq!(request(edge.http, "GET", "/v1/models", None, &[]).status, 401);

    // Each key lists and uses only its models.
    assert_eq!(models(&edge, ALICE), ["m"]);
    assert_eq!(models(&edge, BOB), ["m", "o"]);
    let r = chat(&edge, "o", &[("authorization", &alice)]);
    assert_eq!((r.status, code(&r)), (403, json!("model_not_allowed")));

    // Alice: 2 requests a minute (the refused one above took none).
    assert_eq!(chat(&edge, "m", &[("authorization", &alice)]).status, 200);
    assert_eq!(chat(&edge, "m", &[("x-api-key", ALICE)]).status, 200);
    let r = chat(&edge, "m", &[("authorization", &alice)]);
    assert_eq!((r.status, code(&r)), (429, json!("rate_limit_exceeded")));
    let retry: u64 = r.header("retry-after").expect("retry-after").parse().expect("seconds");
    assert!((1..=60).contains(&retry), "{retry}");

    // Bob: 3 tokens a minute; one answer reports 4, so the next waits.
    let r = chat(&edge, "o", &[("x-api-key", BOB)]);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let r = chat(&edge, "o", &[("x-api-key", BOB)]);
    assert_eq!((r.status, code(&r)), (429, json!("rate_limit_exceeded")), "{}", String::from_utf8_lossy(&r.body));

    // The admin API and health need no API key.
    assert_eq!(edge.admin("/admin/v1/nodes").status, 200);
    assert_eq!(request(edge.http, "GET", "/healthz", None, &[]).status, 200);

    // The access log is written off the reactors: its lines may land a
    // moment after the answers.
    let fp = &sha256_hex(ALICE)[..8];
    eventually(std::time::Duration::from_secs(10), "alice's name and key fingerprint in the access log", || {
        let log = edge.proc.log_text();
        (log.contains("api_key=\"alice\"") || log.contains("api_key=alice")) && log.contains(fp)
    });
    let log = edge.proc.log_text();
    for secret in [ALICE, BOB] {
        assert!(!log.contains(secret), "a key in the log");
    }
    edge.assert_idle();
}

#[test]
fn a_client_that_speaks_anthropic_gets_its_refusals_in_anthropic_shape() {
    let mock = MockProv::start(&[]);
    let edge = Edge::start(&config(&mock));
    let _node = edge.node(NODE_TOKEN, &[]);
    edge.wait_nodes_ready(1);
    let anthropic = |r: &Response, status: u16, kind: &str| {
        assert_eq!(r.status, status, "{}", String::from_utf8_lossy(&r.body));
        let v = r.json();
        assert_eq!((&v["type"], &v["error"]["type"]), (&json!("error"), &json!(kind)), "{v}");
        assert!(v["error"]["message"].is_string() && v.get("code").is_none(), "{v}");
    };
    let messages = |auth: &[(&str, &str)]| {
        let body = br#"{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}"#;
        let mut headers = vec![("content-type", "application/json"), ("anthropic-version", "2023-06-01")];
        headers.extend_from_slice(auth);
        request(edge.http, "POST", "/v1/messages", Some(body), &headers)
    };
    // Missing and wrong keys on the Messages route.
    anthropic(&messages(&[]), 401, "authentication_error");
    anthropic(&messages(&[("x-api-key", "sk-nobody")]), 401, "authentication_error");
    // A model the key may not use, and a rate exceeded, from a client
    // sending Anthropic's version header.
    let av = ("anthropic-version", "2023-06-01");
    anthropic(&chat(&edge, "o", &[("x-api-key", ALICE), av]), 403, "permission_error");
    for _ in 0..2 {
        assert_eq!(chat(&edge, "m", &[("x-api-key", ALICE), av]).status, 200);
    }
    let r = chat(&edge, "m", &[("x-api-key", ALICE), av]);
    anthropic(&r, 429, "rate_limit_error");
    assert!(r.header("retry-after").is_some());
    // Without the header the same refusal is OpenAI's.
    let r = chat(&edge, "o", &[("authorization", &format!("Bearer {ALICE}"))]);
    assert_eq!((r.status, code(&r)), (403, json!("model_not_allowed")));
}

#[test]
fn the_messages_api_takes_x_api_key_and_answers_refusals_in_anthropics_shape() {
    let mock = MockProv::start(&["--tokens", "4", "--without", "messages"]);
    let edge = Edge::start(&config(&mock));
    let _node = edge.node(NODE_TOKEN, &[]);
    edge.wait_nodes_ready(1);
    let messages = |model: &str, auth: &[(&str, &str)]| {
        let body = json!({"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]});
        let mut headers = vec![("anthropic-version", "2023-06-01")];
        headers.extend_from_slice(auth);
        request(edge.http, "POST", "/v1/messages", Some(body.to_string().as_bytes()), &headers)
    };
    let kind = |r: &Response| r.json()["error"]["type"].as_str().map(str::to_owned);
    let r = messages("m", &[]);
    assert_eq!((r.status, kind(&r).as_deref()), (401, Some("authentication_error")));
    let r = messages("o", &[("x-api-key", ALICE)]);
    assert_eq!((r.status, kind(&r).as_deref()), (403, Some("permission_error")));
    // Bob's 3 tokens a minute: the first answer's usage spends them.
    let r = messages("m", &[("x-api-key", BOB)]);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["type"], "message");
    eventually(std::time::Duration::from_secs(5), "bob's tokens charged", || {
        let r = messages("m", &[("x-api-key", BOB)]);
        r.status == 429 && kind(&r).as_deref() == Some("rate_limit_error")
    });
    // The gateway's key never reaches the provider.
    let rec = request(mock.addr, "GET", "/log", None, &[]).json();
    assert!(!rec.to_string().contains(BOB), "the client's key reached the provider");
}
