//! Recovery before commit: a chat request whose first provider fails
//! retryably before any byte reached the client (here: a stall before the
//! first byte) is answered by another provider, exactly once replayed;
//! after the first byte it never is.

use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::*;

const STALL_MS: u64 = 400;

/// An edge with model `m` on two providers of node `n1`, tried in this
/// order when both are idle: `first` (kind, base URL), then `second`.
fn two_providers(first: (&str, String), second: (&str, String)) -> (Edge, Proc) {
    let extra = format!("response_stall_timeout_ms = {STALL_MS}");
    let config = two_provider_config((first.0, &first.1), (second.0, &second.1), &extra);
    let edge = Edge::start(&config);
    let node = edge.node(NODE_TOKEN, &[]);
    edge.wait_nodes_ready(1);
    (edge, node)
}

fn model_requests(mock: &MockProv) -> u64 {
    mock.stats()["model_requests"].as_u64().expect("model_requests")
}

fn chat(edge: &Edge, stream: bool, extra: Value) -> Response {
    let mut body = json!({"model": "m", "stream": stream, "messages": [{"role": "user", "content": "hi"}]});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    post_json(edge.http, "/v1/chat/completions", &body)
}

#[test]
fn a_stall_before_the_first_byte_is_answered_by_the_other_provider_once() {
    // `a` never sends its first byte (a whole answer after 60 s; a stream
    // would get its role chunk at once, as OpenAI's does); `b` answers at once.
    let silent = MockProv::start(&["--ttft-ms", "60000"]);
    let fine = MockProv::start(&["--tokens", "3"]);
    let (edge, _node) = two_providers(("openai_compat", silent.base_url()), ("openai_compat", fine.base_url()));
    let r = chat(&edge, false, json!({}));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["choices"][0]["message"]["content"], "tok0 tok1 tok2 ");
    assert_eq!(model_requests(&silent), 1, "the first attempt went to `a`");
    assert_eq!(model_requests(&fine), 1, "exactly one replay, to `b`");
    edge.assert_idle();
}

#[test]
fn a_streamed_replay_may_switch_from_the_normalized_path_to_the_tunnel() {
    // `a` is an Ollama provider that sends nothing; `b` an OpenAI-compatible one.
    let silent = MockProv::start(&["--ttft-ms", "60000"]);
    let fine = MockProv::start(&["--tokens", "2"]);
    let (edge, _node) =
        two_providers(("ollama", format!("http://{}", silent.addr)), ("openai_compat", fine.base_url()));
    let r = chat(&edge, true, json!({}));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.sse_data().last().map(String::as_str), Some("[DONE]"));
    assert_eq!((model_requests(&silent), model_requests(&fine)), (1, 1));
    edge.assert_idle();
}

#[test]
fn after_the_first_byte_a_stall_ends_the_stream_with_a_typed_error_and_no_replay() {
    let first = MockProv::start(&[]);
    let second = MockProv::start(&[]);
    let (edge, _node) = two_providers(("openai_compat", first.base_url()), ("openai_compat", second.base_url()));
    let r = chat(&edge, true, json!({"mock": {"tokens": 10, "stall_after": 2}}));
    assert_eq!(r.status, 200);
    let data = r.sse_data();
    let last: Value = serde_json::from_str(data.last().expect("events")).expect("error event");
    assert_eq!(last["error"]["code"], "response_stalled", "{data:?}");
    assert_eq!((model_requests(&first), model_requests(&second)), (1, 0), "never replayed after the first byte");
    edge.assert_idle();
}

#[test]
fn with_one_provider_a_stall_is_replayed_there_only_when_its_probe_found_it_available() {
    // Listed target: the probe finds it available, so the one provider is
    // tried once more (and stalls again).
    let silent = MockProv::start(&["--ttft-ms", "60000", "--model", "mock"]);
    let config = n1_header()
        + &format!(
            r#"
[[nodes.providers]]
id = "a"
kind = "openai_compat"
base_url = "{}"
capacity = 8
response_stall_timeout_ms = {STALL_MS}
[[models]]
name = "m"
node = "n1"
provider = "a"
upstream_model = "mock"
[[models]]
name = "unlisted"
node = "n1"
provider = "a"
upstream_model = "not-listed"
"#,
            silent.base_url()
        );
    let edge = Edge::start(&config);
    let _node = edge.node(NODE_TOKEN, &[]);
    edge.wait_nodes_ready(1);
    let started = std::time::Instant::now();
    let r = chat(&edge, false, json!({}));
    assert_eq!(r.status, 504, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["error"]["code"], "response_stalled");
    assert_eq!(model_requests(&silent), 2, "one replay on the provider its probe found available");
    assert!(started.elapsed() >= Duration::from_millis(2 * STALL_MS), "two stalls: {:?}", started.elapsed());

    // Not listing the target: unavailable evidence, no replay (and the
    // overlay takes the provider out).
    let body = json!({"model": "unlisted", "messages": [{"role": "user", "content": "hi"}]});
    let r = post_json(edge.http, "/v1/chat/completions", &body);
    assert_eq!(r.status, 504, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(model_requests(&silent), 3, "no replay without available evidence");
    edge.assert_idle();
}
