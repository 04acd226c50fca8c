//! Registration, the embedded quickstart, and config checking.

use std::time::Duration;

use serde_json::json;

use crate::harness::*;

#[test]
fn wrong_token_is_refused_and_the_node_exits_non_zero() {
    let edge = Edge::start(&edge_config("http://127.0.0.1:9/v1", ""));
    let mut node = edge.node("not-the-token", &[]);
    let code = node.wait_exit(Duration::from_secs(10));
    assert_eq!(code, Some(2), "node log:\n{}", node.log_text());
    assert!(node.log_text().contains("unknown node token"), "{}", node.log_text());
    eventually(Duration::from_secs(5), "edge logs the refusal", || {
        edge.proc.log_text().contains("node registration refused")
    });
}

#[test]
fn duplicate_connection_is_refused() {
    let edge = Edge::start(&edge_config("http://127.0.0.1:9/v1", ""));
    let _first = edge.node(NODE_TOKEN, &[]);
    edge.wait_nodes_ready(1);
    let second = edge.node(NODE_TOKEN, &[]);
    eventually(Duration::from_secs(10), "second node refused as duplicate", || {
        second.log_text().contains("already has a live connection")
    });
    // The first connection still serves.
    edge.wait_nodes_ready(1);
}

#[test]
fn quickstart_config_serves_with_an_embedded_node() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../configs/quickstart.toml")).unwrap();
    let text = text.replace("127.0.0.1:8080", "127.0.0.1:0");
    let edge = Edge::start(&text);
    edge.wait_nodes_ready(1);
    let r = post_json(
        edge.http,
        "/v1/chat/completions",
        &json!({"model": "mock", "stream": true, "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(r.status, 200);
    let data = r.sse_data();
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let r = post_json(
        edge.http,
        "/v1/chat/completions",
        &json!({"model": "mock", "messages": [{"role": "user", "content": "hi"}]}),
    );
    let v = r.json();
    assert!(v["choices"][0]["message"]["content"].as_str().unwrap().starts_with("tok0 "));
    assert!(v["usage"]["completion_tokens"].as_u64().unwrap() > 0);
}

#[test]
fn check_config_reports_the_offending_key() {
    let bad = edge_config("http://127.0.0.1:9/v1", "").replace("capacity = 16", "capacity = 0");
    let path = std::env::temp_dir().join(format!("iop-e2e-bad-{}.toml", std::process::id()));
    std::fs::write(&path, bad).unwrap();
    let out = std::process::Command::new(bin("iop-edge"))
        .args(["--check-config", "--config", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("nodes[0].providers[0].capacity"), "{err}");
    let good = std::process::Command::new(bin("iop-edge"))
        .args(["--check-config", "--config", concat!(env!("CARGO_MANIFEST_DIR"), "/../configs/edge.toml")])
        .output()
        .unwrap();
    assert!(good.status.success(), "{}", String::from_utf8_lossy(&good.stderr));
}

#[test]
fn nodes_reconnect_to_a_restarted_edge() {
    let mut edge = Edge::start(&pool_config(&[mock_node("n1", 2, 0, 2, 0)], &[mock_model("m", &["n1"], "")], ""));
    let node = edge.start_node("n1", "");
    edge.wait_nodes_ready(1);
    let port = edge.nodes.port();
    edge.proc.kill9();

    // Same node port: the node's supervisor finds the new edge by itself.
    let config = pool_config(&[mock_node("n1", 2, 0, 2, 0)], &[mock_model("m", &["n1"], "")], "").replace(
        "[node_listener]\nlisten = \"127.0.0.1:0\"",
        &format!("[node_listener]\nlisten = \"127.0.0.1:{port}\""),
    );
    assert!(config.contains(&format!("127.0.0.1:{port}")));
    let edge = Edge::start(&config);
    edge.wait_nodes_ready(1);
    let r = post_json(
        edge.http,
        "/v1/chat/completions",
        &json!({"model": "m", "messages": [{"role": "user", "content": "x"}]}),
    );
    assert_eq!(r.status, 200, "{}\nnode log:\n{}", String::from_utf8_lossy(&r.body), node.log_text());
    assert_eq!(r.json()["choices"][0]["message"]["content"], "tok0 tok1 ");
}

#[test]
fn sigterm_drains_the_edge_then_exits_0() {
    let mut edge = Edge::start(&pool_config(&[mock_node("n1", 4, 0, 20, 50)], &[mock_model("m", &["n1"], "")], ""));
    let _n1 = edge.start_node("n1", "");
    edge.wait_nodes_ready(1);
    let mut a = Chat::stream(edge.http, "m");
    a.wait_data("tok1", Duration::from_secs(5));
    edge.proc.signal("TERM");
    // New clients are turned away while the stream in flight finishes.
    eventually(Duration::from_secs(2), "listener closed", || std::net::TcpStream::connect(edge.http).is_err());
    let a = a.join_within(Duration::from_secs(5));
    assert_eq!(a.last().1, "[DONE]", "{}", a.resp_text());
    assert_eq!(a.content().matches("tok").count(), 20);
    assert_eq!(edge.proc.wait_exit(Duration::from_secs(5)), Some(0), "{}", edge.proc.log_text());
}
