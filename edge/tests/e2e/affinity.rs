//! Cache affinity without coordination (issue 28, part 4): two edges with
//! the same config, three targets (nodes `n1`-`n3`, each edge with nodes of
//! its own for them), each target its own mock upstream, so the test sees
//! which one served. A session's requests land on one target through
//! either edge, whatever carries the key; sessions spread over targets;
//! past the imbalance bound, load wins.

use std::{
    io::{Read, Write},
    net::TcpStream,
    time::Duration,
};

use serde_json::{json, Value};

use crate::harness::*;

const NODES: [&str; 3] = ["n1", "n2", "n3"];

/// Three nodes, each with provider `up` (capacity 4) on its own mock, and
/// model `m` on all three.
fn config(mocks: &[MockProv]) -> String {
    let nodes: Vec<String> = NODES
        .iter()
        .zip(mocks)
        .map(|(id, mock)| {
            format!(
                "[[nodes]]\nid = \"{id}\"\ntoken = \"{}\"\n[[nodes.providers]]\nid = \"up\"\n\
                 kind = \"openai_compat\"\nbase_url = \"{}\"\ncapacity = 4\n",
                node_token(id),
                mock.base_url()
            )
        })
        .collect();
    let mut model = "[[models]]\nname = \"m\"\n".to_owned();
    for id in NODES {
        model.push_str(&format!("[[models.targets]]\nnode = \"{id}\"\nprovider = \"up\"\nmodel = \"mock\"\n"));
    }
    pool_config(&nodes, &[model], "")
}

/// The three mocks and an edge with its three nodes ready.
struct Site {
    edge: Edge,
    _nodes: Vec<Proc>,
}

fn site(config: &str) -> Site {
    let edge = Edge::start(config);
    let nodes = NODES.iter().map(|id| edge.start_node(id, "")).collect();
    edge.wait_nodes_ready(3);
    Site { edge, _nodes: nodes }
}

fn served(mocks: &[MockProv]) -> Vec<u64> {
    mocks.iter().map(|m| m.stats()["model_requests"].as_u64().expect("model_requests")).collect()
}

/// Sends one request and returns the index of the target (mock) that served it.
fn target_of(mocks: &[MockProv], edge: &Edge, path: &str, body: &Value, headers: &[(&str, &str)]) -> usize {
    let before = served(mocks);
    let r = request(edge.http, "POST", path, Some(body.to_string().as_bytes()), headers);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let after = served(mocks);
    let moved: Vec<usize> = (0..mocks.len()).filter(|&i| after[i] != before[i]).collect();
    assert_eq!(moved.len(), 1, "one target serves one request: {before:?} -> {after:?}");
    moved[0]
}

fn chat(extra: Value) -> Value {
    let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "hello"}]});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    body
}

#[test]
fn a_sessions_requests_land_on_one_target_through_either_edge() {
    let mocks: Vec<MockProv> = (0..3).map(|_| MockProv::start(&["--tokens", "2"])).collect();
    let config = config(&mocks);
    let (a, b) = (site(&config), site(&config));
    let edges = [&a.edge, &b.edge];

    // Each key source, six sessions each, four requests per session
    // through the two edges in turn.
    let mut chosen = Vec::new();
    for source in ["header", "user", "metadata.user_id", "prompt_cache_key", "prefix"] {
        for s in 0..6 {
            let value = format!("secret-session-{source}-{s}");
            let mut targets = Vec::new();
            for turn in 0..4 {
                let edge = edges[turn % 2];
                let t = match source {
                    "header" => target_of(
                        &mocks,
                        edge,
                        "/v1/chat/completions",
                        &chat(json!({})),
                        &[("x-session-affinity", &value)],
                    ),
                    "user" => target_of(&mocks, edge, "/v1/chat/completions", &chat(json!({"user": value})), &[]),
                    "prompt_cache_key" => target_of(
                        &mocks,
                        edge,
                        "/v1/chat/completions",
                        &chat(json!({"prompt_cache_key": value, "user": format!("other-{turn}")})),
                        &[],
                    ),
                    "metadata.user_id" => {
                        let body = json!({"model": "m", "max_tokens": 8, "metadata": {"user_id": value},
                                          "messages": [{"role": "user", "content": format!("turn {turn}")}]});
                        target_of(&mocks, edge, "/v1/messages", &body, &[])
                    }
                    _ => {
                        // No key: the conversation's opening, which every turn resends.
                        let mut messages = vec![
                            json!({"role": "system", "content": "be brief"}),
                            json!({"role": "user", "content": value}),
                        ];
                        for t in 0..turn {
                            messages.push(json!({"role": "assistant", "content": format!("answer {t}")}));
                            messages.push(json!({"role": "user", "content": format!("more {t}")}));
                        }
                        target_of(
                            &mocks,
                            edge,
                            "/v1/chat/completions",
                            &json!({"model": "m", "messages": messages}),
                            &[],
                        )
                    }
                };
                targets.push(t);
            }
            assert!(targets.iter().all(|t| *t == targets[0]), "{source} session {s} moved: {targets:?}");
            chosen.push(targets[0]);
        }
    }
    let mut used = chosen.clone();
    used.sort_unstable();
    used.dedup();
    assert_eq!(used.len(), 3, "30 sessions spread over the three targets: {chosen:?}");

    // The access log says how the target was chosen, never the key.
    for edge in edges {
        eventually(Duration::from_secs(5), "access-log lines with the affinity", || {
            let log = edge.proc.log_text();
            ["header", "user", "metadata.user_id", "prompt_cache_key", "prefix"]
                .iter()
                .all(|from| log.contains(&format!("affinity_from=\"{from}\"")))
        });
        let log = edge.proc.log_text();
        assert!(log.contains("affinity=\"preferred\""), "{log}");
        assert!(!log.contains("affinity=\"fallback\""), "one request at a time: never past the bound\n{log}");
        assert!(!log.contains("secret-session"), "a client's key is never logged");
    }
}

/// Opens a slow stream for session `key` and waits for its first bytes;
/// the stream holds its lease until the returned socket is dropped.
fn held_stream(edge: &Edge, key: &str) -> TcpStream {
    let body = chat(json!({"stream": true, "mock": {"tokens": 200, "token_interval_ms": 100}})).to_string();
    let mut s = TcpStream::connect(edge.http).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\nx-session-affinity: {key}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).expect("write head");
    s.write_all(body.as_bytes()).expect("write body");
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("data:") {
        let n = s.read(&mut buf).expect("read the stream's start");
        assert!(n > 0, "stream closed: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    assert!(seen.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&seen));
    s
}

#[test]
fn past_the_imbalance_bound_load_wins_in_rendezvous_order() {
    let mocks: Vec<MockProv> = (0..3).map(|_| MockProv::start(&["--tokens", "2"])).collect();
    let one = site(&config(&mocks));
    let edge = &one.edge;
    let key = "busy-session";
    let header = [("x-session-affinity", key)];
    let preferred = target_of(&mocks, edge, "/v1/chat/completions", &chat(json!({})), &header);
    let node = NODES[preferred];

    // Two of the preferred target's four leases: the second still within
    // the bound (a quarter busier than the idle others), then half busier.
    let first = held_stream(edge, key);
    edge.wait_in_use(node, "up", 1);
    let second = held_stream(edge, key);
    edge.wait_in_use(node, "up", 2);
    let elsewhere = target_of(&mocks, edge, "/v1/chat/completions", &chat(json!({})), &header);
    assert_ne!(elsewhere, preferred, "load wins past max_imbalance");
    // The fallback is the key's second in rendezvous order, not whichever
    // is least loaded: the same target every time while the first is busy.
    for _ in 0..3 {
        assert_eq!(target_of(&mocks, edge, "/v1/chat/completions", &chat(json!({})), &header), elsewhere);
    }
    eventually(Duration::from_secs(5), "a fallback in the access log", || {
        edge.proc.log_text().contains("affinity=\"fallback\"")
    });

    // Load gone, the session is back on its target.
    drop((first, second));
    edge.wait_in_use(node, "up", 0);
    assert_eq!(target_of(&mocks, edge, "/v1/chat/completions", &chat(json!({})), &header), preferred);
}

#[test]
fn affinity_off_spreads_one_session_by_load() {
    let mocks: Vec<MockProv> = (0..3).map(|_| MockProv::start(&["--tokens", "2"])).collect();
    let one = site(&(config(&mocks) + "\n[affinity]\nenabled = false\n"));
    let edge = &one.edge;
    // With nothing in flight, least loaded picks the first target every time.
    let header = [("x-session-affinity", "s")];
    for _ in 0..3 {
        assert_eq!(target_of(&mocks, edge, "/v1/chat/completions", &chat(json!({})), &header), 0);
    }
    let held = held_stream(edge, "s");
    edge.wait_in_use("n1", "up", 1);
    assert_eq!(target_of(&mocks, edge, "/v1/chat/completions", &chat(json!({})), &header), 1, "least loaded");
    drop(held);
    eventually(Duration::from_secs(5), "the access log says none", || {
        edge.proc.log_text().contains("affinity=\"none\"")
    });
}
