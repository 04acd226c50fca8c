//! Error answers: OpenAI-shaped JSON with the right status.

use serde_json::json;

use crate::harness::*;

fn assert_openai_error(r: &Response, status: u16) -> serde_json::Value {
    assert_eq!(r.status, status, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    assert!(v["error"]["message"].is_string(), "{v}");
    assert!(v["error"]["type"].is_string(), "{v}");
    v
}

#[test]
fn bad_requests() {
    let mock = MockProv::start(&[]);
    let edge = Edge::start(&edge_config(&mock.base_url(), ""));
    let _node = edge.node(NODE_TOKEN, &[]);
    edge.wait_nodes_ready(1);

    let r = request(edge.http, "POST", "/v1/chat/completions", Some(b"{not json"), &[]);
    assert_openai_error(&r, 400);

    let r = post_json(edge.http, "/v1/chat/completions", &json!({"model": "gpt-test", "messages": []}));
    assert_openai_error(&r, 400);

    let r = post_json(
        edge.http,
        "/v1/chat/completions",
        &json!({"model": "nope", "messages": [{"role": "user", "content": "x"}]}),
    );
    let v = assert_openai_error(&r, 404);
    assert_eq!(v["error"]["code"], "model_not_found");

    let r = request(edge.http, "GET", "/v1/nothing", None, &[]);
    assert_openai_error(&r, 404);
    let r = request(edge.http, "GET", "/v1/chat/completions", None, &[]);
    assert_openai_error(&r, 405);

    // Limits from the config: 4 KiB of headers, 64 KiB of body.
    let big = "x".repeat(8192);
    let r = request(edge.http, "GET", "/healthz", None, &[("x-big", &big)]);
    assert_eq!(r.status, 431);
    let huge = vec![b' '; 70_000];
    let r = request(edge.http, "POST", "/v1/chat/completions", Some(&huge), &[]);
    assert_openai_error(&r, 413);

    // The edge is unharmed.
    let r = post_json(
        edge.http,
        "/v1/chat/completions",
        &json!({"model": "gpt-test", "messages": [{"role": "user", "content": "x"}]}),
    );
    assert_eq!(r.status, 200);
}

#[test]
fn no_ready_node_is_503() {
    let edge = Edge::start(&edge_config("http://127.0.0.1:9/v1", ""));
    let r = post_json(
        edge.http,
        "/v1/chat/completions",
        &json!({"model": "gpt-test", "messages": [{"role": "user", "content": "x"}]}),
    );
    assert_openai_error(&r, 503);
    assert_eq!(r.header("retry-after"), Some("1"));
}

#[test]
fn upstream_error_status_is_mapped() {
    let mock = MockProv::start(&["--error-status", "429"]);
    let edge = Edge::start(&edge_config(&mock.base_url(), ""));
    let _node = edge.node(NODE_TOKEN, &[]);
    edge.wait_nodes_ready(1);
    for stream in [false, true] {
        let r = post_json(
            edge.http,
            "/v1/chat/completions",
            &json!({"model": "gpt-test", "stream": stream, "messages": [{"role": "user", "content": "x"}]}),
        );
        let v = assert_openai_error(&r, 429);
        assert!(v["error"]["message"].as_str().unwrap().contains("mock provider error"), "{v}");
    }
}

#[test]
fn unreachable_upstream_is_502() {
    let (_guard, port) = closed_port();
    let edge = Edge::start(&edge_config(&format!("http://127.0.0.1:{port}/v1"), ""));
    let _node = edge.node(NODE_TOKEN, &[]);
    edge.wait_nodes_ready(1);
    let r = post_json(
        edge.http,
        "/v1/chat/completions",
        &json!({"model": "gpt-test", "messages": [{"role": "user", "content": "x"}]}),
    );
    assert_openai_error(&r, 502);
    assert_eq!(r.json()["error"]["code"], "upstream_connect");
    // The provider's address is internal: never shown to the client.
    let body = String::from_utf8_lossy(&r.body);
    assert!(!body.contains("127.0.0.1") && !body.contains(&port.to_string()), "{body}");
}
