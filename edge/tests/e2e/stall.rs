//! The response-stall watchdog: a provider that goes silent (its connection
//! open) ends the request with one `response_stalled` terminal after the
//! provider's `response_stall_timeout_ms`, not after `request_timeout_sec`;
//! the node closes the provider request and joins an exact-target probe.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::harness::*;

const STALL_MS: u64 = 400;
const SECS5: Duration = Duration::from_secs(5);
/// The recovery probe interval of the test provider.
const PROBE_MS: u64 = 100;

/// A mock, an edge whose one provider (`kind`, listing `listed` as its
/// model) has a short stall timeout, and a node.
fn setup(kind: &str, upstream_model: &str) -> (MockProv, Edge, Proc) {
    let mock = MockProv::start(&["--model", "mock-upstream"]);
    let extra = format!("response_stall_timeout_ms = {STALL_MS}\nhealth_probe_interval_ms = {PROBE_MS}");
    let config = one_provider_config(kind, &mock.base_for(kind), &extra, upstream_model);
    let edge = Edge::start(&config);
    let node = edge.node_with(NODE_TOKEN, "metrics_listen = \"127.0.0.1:0\"", &[]);
    edge.wait_nodes_ready(1);
    (mock, edge, node)
}

/// The node's `GET /metrics` (its address from its stdout line).
fn node_metrics(node: &Proc) -> String {
    let line = node.line("iop-node metrics http=");
    let addr: std::net::SocketAddr = line.trim_start_matches("iop-node metrics http=").parse().expect("address");
    let r = request(addr, "GET", "/metrics", None, &[]);
    assert_eq!(r.status, 200);
    String::from_utf8(r.body).expect("utf-8")
}

fn chat(edge: &Edge, body: Value) -> (Response, Duration) {
    let started = Instant::now();
    let r = post_json(edge.http, "/v1/chat/completions", &body);
    (r, started.elapsed())
}

/// The one error event ending an SSE answer, after `data` chunks.
fn stream_error(r: &Response) -> (usize, Value) {
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let data = r.sse_data();
    let (last, chunks) = data.split_last().expect("events");
    assert!(!data.iter().any(|d| d == "[DONE]"), "a stalled stream does not end well: {data:?}");
    let err: Value = serde_json::from_str(last).expect("error event JSON");
    let chunks = chunks.iter().filter(|c| !c.contains("\"error\"")).count();
    (chunks, err["error"].clone())
}

/// Waits for the node's stall observation classified `classification`.
fn wait_observation(node: &Proc, classification: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = node.log_text();
        let seen = log.lines().find(|l| l.contains("node_response_stall_observation") && l.contains(classification));
        if let Some(line) = seen {
            return line.to_owned();
        }
        assert!(Instant::now() < deadline, "no stall observation {classification}; node log:\n{log}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_tunnel_stream_that_goes_silent_ends_with_one_stall_error_event() {
    let (mock, edge, node) = setup("openai_compat", "mock-upstream");
    let body = json!({"model":"m","stream":true,"messages":[{"role":"user","content":"x"}],
        "mock":{"tokens":20,"stall_after":3,"tag":"stalled-tunnel"}});
    let (r, took) = chat(&edge, body);
    let (chunks, err) = stream_error(&r);
    assert!(chunks >= 3, "the chunks before the silence arrive: {chunks}");
    assert_eq!(err["code"], "response_stalled", "{err}");
    assert!(took >= Duration::from_millis(STALL_MS), "ended after {took:?}");
    assert!(took < Duration::from_secs(5), "ended after {took:?}, not at the stall timeout");
    // The node closed the provider request, and its probe found the target listed.
    mock.wait_closed("stalled-tunnel");
    let line = wait_observation(&node, "request_stalled");
    assert!(!line.contains(&mock.addr.to_string()), "no provider address in the observation: {line}");
    edge.assert_idle();
}

#[test]
fn a_provider_silent_before_its_first_byte_is_a_504_and_unlisting_its_target_takes_it_out() {
    let (_mock, edge, node) = setup("openai_compat", "not-listed");
    let mut ev = edge.events();
    let (r, took) =
        chat(&edge, json!({"model":"m","messages":[{"role":"user","content":"x"}],"mock":{"ttft_ms":60000}}));
    assert_eq!(r.status, 504, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["error"]["code"], "response_stalled");
    assert!(took < Duration::from_secs(5), "ended after {took:?}");
    // The provider answers but does not list the target: unavailable, and
    // the edge's overlay takes the provider out.
    wait_observation(&node, "provider_unhealthy");
    let lowered = ev.wait("provider_health", SECS5, |e| e["outcome"] == "lowered");
    assert_eq!((lowered["source"].as_str(), lowered["overlay"].as_str()), (Some("stall"), Some("unavailable")));
    let (r, took) = chat(&edge, json!({"model":"m","messages":[{"role":"user","content":"x"}]}));
    assert_eq!(r.status, 503, "{}", String::from_utf8_lossy(&r.body));
    assert!(took < Duration::from_secs(1), "refused only after {took:?}");
    // Probes keep answering "unavailable" (the target is still not listed): no recovery.
    ev.wait("provider_health", SECS5, |e| e["source"] == "probe" && e["outcome"] == "unchanged");
    assert_eq!(edge.snapshot()["nodes"][0]["providers"][0]["runtime_health"], "unavailable");
    edge.assert_idle();
}

#[test]
fn progress_keeps_a_slow_provider_alive() {
    let (_mock, edge, _node) = setup("openai_compat", "mock-upstream");
    // Tokens every 150 ms for 1.5 s: each one is progress, no stall.
    let body = json!({"model":"m","stream":true,"messages":[{"role":"user","content":"x"}],
        "mock":{"tokens":10,"token_interval_ms":150}});
    let (r, took) = chat(&edge, body);
    assert_eq!(r.status, 200);
    assert_eq!(r.sse_data().last().map(String::as_str), Some("[DONE]"), "{}", String::from_utf8_lossy(&r.body));
    assert!(took > Duration::from_millis(STALL_MS * 2), "took {took:?}");
    edge.assert_idle();
}

/// `POST /mock/health` on the mock.
fn set_mock_health(mock: &MockProv, state: &str) {
    let r = post_json(mock.addr, "/mock/health", &json!({ "state": state }));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
}

#[test]
fn a_provider_found_unhealthy_by_a_stall_takes_no_traffic_until_a_probe_finds_it_back() {
    let (mock, edge, node) = setup("openai_compat", "mock-upstream");
    let mut ev = edge.events();
    // The provider's model list fails: the stall's probe says unavailable.
    set_mock_health(&mock, "down");
    let body = json!({"model":"m","stream":true,"messages":[{"role":"user","content":"x"}],
        "mock":{"tokens":20,"stall_after":2,"tag":"stall-down"}});
    let (r, _) = chat(&edge, body);
    let (_, err) = stream_error(&r);
    assert_eq!(err["code"], "response_stalled", "{err}");
    wait_observation(&node, "provider_unhealthy");
    ev.wait("provider_health", SECS5, |e| e["source"] == "stall" && e["outcome"] == "lowered");
    let text = node_metrics(&node);
    assert!(text.contains("iop_node_response_stalls_total{health=\"unavailable\"} 1"), "{text}");
    assert!(text.contains("iop_node_response_stall_duration_seconds_count 1"), "{text}");
    let snap = edge.snapshot();
    let p = &snap["nodes"][0]["providers"][0];
    assert_eq!(
        (p["status"].as_str(), p["health"].as_str(), p["runtime_health"].as_str()),
        (Some("unavailable"), Some("online"), Some("unavailable")),
        "{p:#}"
    );
    assert_eq!(p["normal"]["effective"], 0, "{p:#}");
    let ready = request(edge.http, "GET", "/readyz", None, &[]);
    assert_eq!(ready.status, 503, "{}", String::from_utf8_lossy(&ready.body));
    let (r, _) = chat(&edge, json!({"model":"m","messages":[{"role":"user","content":"x"}]}));
    assert_eq!(r.status, 503, "no traffic to an unavailable provider: {}", String::from_utf8_lossy(&r.body));
    let answered = request(mock.addr, "GET", "/stats", None, &[]).json()["requests"].clone();

    // Back: the next probe finds the target and the provider takes traffic again.
    set_mock_health(&mock, "ok");
    let up = ev.wait("provider_health", SECS5, |e| e["outcome"] == "recovered");
    assert_eq!((up["source"].as_str(), up["overlay"].as_str()), (Some("probe"), Some("healthy")));
    assert_eq!(edge.snapshot()["nodes"][0]["providers"][0]["runtime_health"], "healthy");
    let (r, _) = chat(&edge, json!({"model":"m","messages":[{"role":"user","content":"x"}]}));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let after = request(mock.addr, "GET", "/stats", None, &[]).json()["requests"].clone();
    assert_eq!(after.as_u64(), answered.as_u64().map(|n| n + 1), "exactly the one request after recovery");
    assert_eq!(request(edge.http, "GET", "/readyz", None, &[]).status, 200);
    edge.assert_idle();
}

#[test]
fn a_normalized_stream_that_goes_silent_ends_with_one_stall_error_event() {
    let (mock, edge, node) = setup("ollama", "mock-upstream");
    let body = json!({"model":"m","stream":true,"messages":[{"role":"user","content":"x"}],
        "mock":{"tokens":20,"stall_after":2,"tag":"stalled-ollama"}});
    let (r, took) = chat(&edge, body);
    let (chunks, err) = stream_error(&r);
    assert!(chunks >= 2, "{chunks}");
    assert_eq!(err["code"], "response_stalled", "{err}");
    assert!(took < Duration::from_secs(5), "ended after {took:?}");
    mock.wait_closed("stalled-ollama");
    wait_observation(&node, "request_stalled");
    edge.assert_idle();
}

#[test]
fn a_provider_still_loading_is_starting_and_gets_no_traffic_until_ready() {
    let mock = MockProv::start(&["--model", "mock-upstream"]);
    // Loading before its node connects: the edge's first probe sees it.
    set_mock_health(&mock, "loading");
    let config = n1_header()
        + &format!(
            r#"
[[nodes.providers]]
id = "up"
kind = "openai_compat"
base_url = "{}"
capacity = 8
health_probe_interval_ms = {PROBE_MS}
[[models]]
name = "m"
node = "n1"
provider = "up"
upstream_model = "mock-upstream"
"#,
            mock.base_url()
        );
    let edge = Edge::start(&config);
    let mut ev = edge.events();
    let _node = edge.node(NODE_TOKEN, &[]);
    let starting = ev.wait("provider_health", SECS5, |e| e["outcome"] == "starting");
    assert_eq!((starting["health"].as_str(), starting["overlay"].as_str()), (Some("starting"), Some("starting")));
    let p = edge.snapshot()["nodes"][0]["providers"][0].clone();
    assert_eq!((p["status"].as_str(), p["runtime_health"].as_str()), (Some("unavailable"), Some("starting")), "{p:#}");
    let (r, _) = chat(&edge, json!({"model":"m","messages":[{"role":"user","content":"x"}]}));
    assert_eq!(r.status, 503, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(mock.stats()["model_requests"], 0, "nothing dispatched to a loading provider");
    // Probed until ready.
    ev.wait("provider_health", SECS5, |e| e["source"] == "probe" && e["outcome"] == "unchanged");
    set_mock_health(&mock, "ok");
    ev.wait("provider_health", SECS5, |e| e["outcome"] == "recovered");
    let (r, _) = chat(&edge, json!({"model":"m","messages":[{"role":"user","content":"x"}]}));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    edge.assert_idle();
}
