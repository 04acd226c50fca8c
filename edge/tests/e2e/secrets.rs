//! Secret hygiene: a full run at `IOP_LOG=debug` on both binaries, then
//! every log line, the metrics, admin answers and error bodies are searched
//! for the node token, the admin token, the client API keys and the
//! provider key. None may appear anywhere.

use serde_json::json;

use crate::harness::*;

const CLIENT_KEY: &str = "sk-client-5e1f0a93";
const PROVIDER_KEY: &str = "sk-provider-aa41c7d2";
const DEBUG: [(&str, &str); 1] = [("IOP_LOG", "debug")];

#[test]
fn no_secret_reaches_a_log_a_metric_or_an_answer_at_debug_level() {
    let mock = MockProv::start(&["--model", "mock", "--tokens", "3"]);
    let hash: String = ring::digest::digest(&ring::digest::SHA256, CLIENT_KEY.as_bytes())
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let config = n1_header()
        + &format!(
            r#"
[[nodes.providers]]
id = "up"
kind = "openai_compat"
base_url = "{}"
api_key = "{PROVIDER_KEY}"
capacity = 8
response_stall_timeout_ms = 300
[[nodes.providers]]
id = "ol"
kind = "ollama"
base_url = "http://{}"
api_key = "{PROVIDER_KEY}"
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
[[api_keys]]
name = "client"
sha256 = "{hash}"
models = ["m", "o"]
"#,
            mock.base_url(),
            mock.addr
        );
    let edge = Edge::start_with_env(&config, &DEBUG);
    let node = edge.node_with(NODE_TOKEN, "metrics_listen = \"127.0.0.1:0\"", &DEBUG);
    edge.wait_nodes_ready(1);
    let mut seen: Vec<String> = Vec::new();
    let auth = format!("Bearer {CLIENT_KEY}");
    for (model, stream, mock_knobs) in [
        ("m", false, json!({})),
        ("m", true, json!({})),
        ("o", true, json!({})),
        ("m", false, json!({"error_status": 401})),
        ("m", true, json!({"tokens": 10, "stall_after": 2})),
    ] {
        let body = json!({"model": model, "stream": stream, "messages": [{"role": "user", "content": "hi"}], "mock": mock_knobs});
        let bytes = serde_json::to_vec(&body).expect("json");
        let r = request(
            edge.http,
            "POST",
            "/v1/chat/completions",
            Some(&bytes),
            &[("content-type", "application/json"), ("authorization", &auth)],
        );
        seen.push(String::from_utf8_lossy(&r.body).into_owned());
    }
    // Refused requests: wrong client key, wrong admin token.
    let bad = request(edge.http, "POST", "/v1/chat/completions", Some(b"{}"), &[("authorization", "Bearer sk-wrong")]);
    seen.push(String::from_utf8_lossy(&bad.body).into_owned());
    let bad = request(edge.http, "GET", "/admin/v1/nodes", None, &[("authorization", "Bearer wrong-admin")]);
    seen.push(String::from_utf8_lossy(&bad.body).into_owned());
    // Admin answers: the snapshot, a node command, the metrics.
    for path in ["/admin/v1/nodes", "/admin/v1/nodes/n1/capabilities", "/admin/v1/nodes/n1/transport", "/metrics"] {
        let r = edge.admin(path);
        seen.push(String::from_utf8_lossy(&r.body).into_owned());
    }
    let line = node.line("iop-node metrics http=");
    let addr: std::net::SocketAddr = line.trim_start_matches("iop-node metrics http=").parse().expect("address");
    seen.push(String::from_utf8_lossy(&request(addr, "GET", "/metrics", None, &[]).body).into_owned());
    edge.assert_idle();
    // The provider key did travel (edge → node → provider): the search is not vacuous.
    let upstream = request(mock.addr, "GET", "/log", None, &[]);
    assert!(String::from_utf8_lossy(&upstream.body).contains(PROVIDER_KEY), "the provider never got its key");
    let (edge_log, node_log) = (edge.proc.log_text(), node.log_text());
    assert!(edge_log.contains("DEBUG"), "the edge logged at debug level");
    assert!(node_log.contains("node ready"), "the node's log was read");
    for secret in [NODE_TOKEN, ADMIN_TOKEN, CLIENT_KEY, PROVIDER_KEY, "wrong-admin", "sk-wrong"] {
        for (what, text) in [("edge log", &edge_log), ("node log", &node_log)] {
            let hit = text.lines().find(|l| l.contains(secret));
            assert!(hit.is_none(), "{secret} in the {what}: {hit:?}");
        }
        for (i, body) in seen.iter().enumerate() {
            assert!(!body.contains(secret), "{secret} in answer {i}: {body}");
        }
    }
}
