//! `/metrics` and the access log after a full run: every label value comes
//! from a closed set (configured ids, statuses, fixed vocabularies), and no
//! request id, prompt or secret appears in either.

use std::collections::HashSet;

use serde_json::{json, Value};

use crate::harness::*;

/// A prompt no metric or log line may ever contain.
const PROMPT: &str = "secret-prompt-7f3a";
const PROVIDER_KEY: &str = "sk-provider-key-91c2";
const SECS5: std::time::Duration = std::time::Duration::from_secs(5);

fn config(mock: &MockProv) -> String {
    n1_header()
        + &format!(
            r#"
[[nodes.providers]]
id = "up"
kind = "openai_compat"
base_url = "{}"
api_key = "{PROVIDER_KEY}"
capacity = 8
response_stall_timeout_ms = 300
health_probe_interval_ms = 50
[[nodes.providers]]
id = "ol"
kind = "ollama"
base_url = "http://{}"
capacity = 8
[[models]]
name = "m"
node = "n1"
provider = "up"
upstream_model = "mock"
[[models]]
name = "o"
node = "n1"
provider = "ol"
upstream_model = "mock"
"#,
            mock.base_url(),
            mock.addr
        )
}

fn chat(edge: &Edge, model: &str, stream: bool, mock: Value) -> Response {
    let body =
        json!({"model": model, "stream": stream, "messages": [{"role": "user", "content": PROMPT}], "mock": mock});
    post_json(edge.http, "/v1/chat/completions", &body)
}

/// `name{labels} value` lines: (name, [(label, value)]).
fn samples(text: &str) -> Vec<(String, Vec<(String, String)>)> {
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let (series, value) = line.rsplit_once(' ').expect("a value");
        assert!(value.parse::<f64>().is_ok(), "not a number: {line}");
        let (name, labels) = match series.split_once('{') {
            Some((n, rest)) => (n, rest.strip_suffix('}').expect("closing brace")),
            None => (series, ""),
        };
        let labels = labels
            .split(',')
            .filter(|l| !l.is_empty())
            .map(|l| {
                let (k, v) = l.split_once('=').expect("label=value");
                (k.to_owned(), v.trim_matches('"').to_owned())
            })
            .collect();
        out.push((name.to_owned(), labels));
    }
    out
}

#[test]
fn metrics_and_access_log_name_only_closed_sets_and_never_a_secret() {
    let mock = MockProv::start(&["--model", "mock", "--tokens", "3"]);
    let edge = Edge::start(&config(&mock));
    let mut ev = edge.events();
    let _node = edge.node(NODE_TOKEN, &[]);
    edge.wait_nodes_ready(1);
    // Tunnel and normalized, streamed and whole.
    for (model, stream) in [("m", false), ("m", true), ("o", false), ("o", true)] {
        let r = chat(&edge, model, stream, json!({}));
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    }
    // An unknown model, a provider error, a stall whose probe finds the provider down.
    assert_eq!(chat(&edge, "nope", false, json!({})).status, 404);
    assert_eq!(chat(&edge, "m", false, json!({"error_status": 500})).status, 500);
    let r = post_json(mock.addr, "/mock/health", &json!({"state": "down"}));
    assert_eq!(r.status, 200);
    let r = chat(&edge, "m", true, json!({"tokens": 10, "stall_after": 2}));
    assert_eq!(r.status, 200);
    ev.wait("provider_health", SECS5, |e| e["outcome"] == "lowered");
    assert_eq!(post_json(mock.addr, "/mock/health", &json!({"state": "ok"})).status, 200);
    ev.wait("provider_health", SECS5, |e| e["outcome"] == "recovered");

    // Without the admin token: refused.
    assert_eq!(request(edge.http, "GET", "/metrics", None, &[]).status, 401);
    let r = edge.admin("/metrics");
    assert_eq!(r.status, 200);
    let text = String::from_utf8(r.body.clone()).expect("utf-8");
    let closed: &[(&str, &[&str])] = &[
        ("model", &["m", "o", ""]),
        (
            "surface",
            &["chat_completions", "completions", "embeddings", "responses", "messages", "count_tokens", "other"],
        ),
        ("node", &["n1"]),
        ("provider", &["up", "ol"]),
        ("class", &["normal", "long"]),
        ("kind", &["input", "output", "reasoning", "cached"]),
        ("path", &["tunnel", "normalized"]),
        ("source", &["stall", "probe"]),
        ("health", &["available", "unavailable", "unknown", "starting"]),
        ("outcome", &["lowered", "starting", "recovered"]),
        ("runtime_health", &["healthy", "unavailable", "starting"]),
        ("decision", &["eligible", "ineligible"]),
        (
            "reason",
            &[
                "not_retryable",
                "no_replay_left",
                "no_alternate",
                "alternate",
                "stalled_provider_available",
                "readmission_refused",
                "replayed",
            ],
        ),
        ("result", &["answered", "failed"]),
        ("credential", &["node_registration", "admin", "api_key"]),
        ("listener", &["node", "http"]),
        (
            "action",
            &[
                "evicted_same_address",
                "evicted_under_pressure",
                "refused_full",
                "first_bytes_timeout",
                "tls_rate",
                "tls_concurrency",
                "tls_table_full",
            ],
        ),
    ];
    let mut names = HashSet::new();
    for (name, labels) in samples(&text) {
        names.insert(name.clone());
        for (k, v) in labels {
            match k.as_str() {
                "status" => assert!(v.parse::<u16>().is_ok_and(|s| (100..=599).contains(&s)), "{name} status {v}"),
                "le" => assert!(v == "+Inf" || v.parse::<f64>().is_ok(), "{name} le {v}"),
                _ => {
                    let set =
                        closed.iter().find(|(l, _)| *l == k).unwrap_or_else(|| panic!("{name}: unknown label {k}"));
                    assert!(set.1.contains(&v.as_str()), "{name}: {k}={v:?} is not in {:?}", set.1);
                }
            }
        }
    }
    for expected in [
        "iop_edge_requests_total",
        "iop_edge_request_duration_seconds_bucket",
        "iop_edge_time_to_first_byte_seconds_bucket",
        "iop_edge_inter_token_gap_seconds_bucket",
        "iop_edge_queue_wait_seconds_bucket",
        "iop_edge_queue_depth",
        "iop_edge_leases_in_use",
        "iop_edge_lease_capacity",
        "iop_edge_tokens_total",
        "iop_edge_node_links",
        "iop_edge_node_reconnects_total",
        "iop_edge_provider_health_evidence_total",
        "iop_edge_provider_health_transitions_total",
    ] {
        assert!(names.contains(expected), "no {expected} in:\n{text}");
    }
    // The request without the admin token above.
    assert!(text.contains(r#"iop_edge_auth_failures_total{credential="admin"} 1"#), "{text}");
    assert!(text.contains(r#"iop_edge_requests_total{model="m",surface="chat_completions",status="200"} 3"#), "{text}");
    assert!(text.contains(r#"iop_edge_requests_total{model="o",surface="chat_completions",status="200"} 2"#), "{text}");
    assert!(text.contains(r#"iop_edge_requests_total{model="m",surface="chat_completions",status="500"} 1"#), "{text}");
    assert!(text.contains(r#"iop_edge_requests_total{model="",surface="chat_completions",status="404"} 1"#), "{text}");
    assert!(text.contains(r#"iop_edge_provider_health_transitions_total{outcome="lowered"} 1"#), "{text}");
    assert!(text.contains(r#"iop_edge_provider_health_transitions_total{outcome="recovered"} 1"#), "{text}");

    // The access log: one line per answered request, with its id and numbers
    // only. Written off the reactors: its lines may land a moment late.
    let chat_lines = |log: &str| {
        log.lines().filter(|l| l.contains("iop::access") && l.contains("path=\"/v1/chat/completions\"")).count()
    };
    eventually(std::time::Duration::from_secs(10), "seven chat lines in the access log", || {
        chat_lines(&edge.proc.log_text()) >= 7
    });
    let log = edge.proc.log_text();
    let chats: Vec<&str> =
        log.lines().filter(|l| l.contains("iop::access") && l.contains("path=\"/v1/chat/completions\"")).collect();
    assert_eq!(chats.len(), 7, "one line per chat request:\n{log}");
    let ids: Vec<&str> =
        chats.iter().filter_map(|l| l.split_once(" id=")?.1.split(' ').next()).filter(|id| !id.is_empty()).collect();
    assert_eq!(ids.len(), 6, "every dispatched request has its run or tunnel id: {chats:#?}");
    for id in &ids {
        assert_eq!(log.matches(&format!(" id={id} ")).count(), 1, "one line for {id}");
        assert!(!text.contains(id), "a request id in the metrics: {id}");
    }
    assert!(chats.iter().all(|l| l.contains("duration_ms=")), "{chats:#?}");
    assert!(
        chats.iter().any(|l| l.contains("model=o") && l.contains("provider=\"ol\"") && l.contains("output_tokens=3")),
        "{chats:#?}"
    );
    assert!(chats.iter().any(|l| l.contains("status=404")), "{log}");
    for secret in [PROMPT, PROVIDER_KEY, NODE_TOKEN, ADMIN_TOKEN] {
        assert!(!text.contains(secret), "{secret} in the metrics");
        assert!(!log.contains(secret), "{secret} in the edge's log");
    }
    edge.assert_idle();
}
