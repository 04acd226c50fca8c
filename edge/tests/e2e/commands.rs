//! Node commands through the edge's admin API: a node's capabilities and
//! transport status, and Ollama's own API (`/api/tags`, `/api/ps`,
//! `/api/show`) relayed by the node from iop-mockprov.

use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::*;

/// Node `n1` with one provider of every kind; the HTTP ones are the mock.
fn setup() -> (MockProv, Edge, Proc) {
    let mock = MockProv::start(&["--tokens", "200", "--token-interval-ms", "20"]);
    let node = format!(
        r#"
[[nodes]]
id = "n1"
token = "{token}"
[[nodes.providers]]
id = "mock"
kind = "mock"
capacity = 4
[nodes.providers.mock]
tokens = 200
token_interval_ms = 20
[[nodes.providers]]
id = "up"
kind = "openai_compat"
base_url = "{base}"
capacity = 3
[[nodes.providers]]
id = "vl"
kind = "vllm"
base_url = "{base}"
capacity = 2
[[nodes.providers]]
id = "ol"
kind = "ollama"
base_url = "http://{addr}"
capacity = 5
"#,
        token = node_token("n1"),
        base = mock.base_url(),
        addr = mock.addr
    );
    let models = [
        mock_model("m", &["n1"], ""),
        "\n[[models]]\nname = \"tun\"\nnode = \"n1\"\nprovider = \"up\"\nupstream_model = \"mock-upstream\"\n".into(),
    ];
    let edge = Edge::start(&pool_config(&[node], &models, ""));
    let n1 = edge.start_node("n1", "");
    edge.wait_nodes_ready(1);
    (mock, edge, n1)
}

fn admin_post(edge: &Edge, path: &str, body: &[u8]) -> Response {
    request(edge.http, "POST", path, Some(body), &[("authorization", &format!("Bearer {ADMIN_TOKEN}"))])
}

fn error_code(r: &Response) -> Value {
    r.json()["error"]["code"].clone()
}

#[test]
fn capabilities_name_every_provider_its_kind_relay_and_routes() {
    let (_mock, edge, _n1) = setup();
    let r = edge.admin("/admin/v1/nodes/n1/capabilities");
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    let providers = v["providers"].as_array().unwrap();
    let by_id = |id: &str| providers.iter().find(|p| p["id"] == id).unwrap_or_else(|| panic!("no {id}: {v:#}"));
    let all = json!(["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"]);
    let normalized = json!(["/v1/chat/completions", "/v1/embeddings"]);
    for (id, kind, relay, routes, max) in [
        ("mock", "mock", "normalized", &normalized, 4),
        ("up", "openai_compat", "tunnel", &all, 3),
        ("vl", "vllm", "tunnel", &all, 2),
        ("ol", "ollama", "normalized", &normalized, 5),
    ] {
        let p = by_id(id);
        assert_eq!((&p["kind"], &p["relay"], &p["routes"]), (&json!(kind), &json!(relay), routes), "{p:#}");
        assert_eq!(p["max_concurrency"], max, "{p:#}");
        assert_eq!(p["in_flight"], 0, "{p:#}");
    }
    assert_eq!(by_id("ol")["native_api"], json!(["GET /api/tags", "GET /api/ps", "POST /api/show"]));
    assert_eq!(by_id("up")["native_api"], json!([]));
    assert!(v["node_version"].is_string() && v["draining"] == false, "{v:#}");

    let one = edge.admin("/admin/v1/nodes/n1/providers/vl/capabilities").json();
    assert_eq!(one["providers"].as_array().map(Vec::len), Some(1), "{one:#}");
    assert_eq!(one["providers"][0]["kind"], "vllm");

    let r = edge.admin("/admin/v1/nodes/n1/providers/nope/capabilities");
    assert_eq!((r.status, error_code(&r)), (404, json!("provider_not_found")));
    let r = edge.admin("/admin/v1/nodes/ghost/capabilities");
    assert_eq!((r.status, error_code(&r)), (404, json!("node_not_found")));
    let r = request(edge.http, "GET", "/admin/v1/nodes/n1/capabilities", None, &[]);
    assert_eq!(r.status, 401);
    let r = admin_post(&edge, "/admin/v1/nodes/n1/capabilities", b"");
    assert_eq!(r.status, 405);
    assert_eq!(r.header("allow"), Some("GET, HEAD"));
}

#[test]
fn transport_status_counts_runs_and_tunnels_in_flight() {
    let (_mock, edge, _n1) = setup();
    let idle = edge.admin("/admin/v1/nodes/n1/transport").json();
    assert_eq!((&idle["streams"], &idle["runs"], &idle["tunnels"]), (&json!(0), &json!(0), &json!(0)), "{idle:#}");
    let mut run = Chat::stream(edge.http, "m");
    let mut tunnel = Chat::stream(edge.http, "tun");
    run.wait_data("tok1 ", Duration::from_secs(5));
    tunnel.wait_data("tok1 ", Duration::from_secs(5));
    let busy = edge.admin("/admin/v1/nodes/n1/transport").json();
    assert_eq!((&busy["streams"], &busy["runs"], &busy["tunnels"]), (&json!(2), &json!(1), &json!(1)), "{busy:#}");
    assert_eq!(
        busy["providers"],
        json!([{"id": "mock", "runs": 1, "tunnels": 0}, {"id": "up", "runs": 0, "tunnels": 1}])
    );
    assert!(busy["queued_to_edge_bytes"].is_u64() && busy["waiting_for_credit"].is_u64(), "{busy:#}");
    let caps = edge.admin("/admin/v1/nodes/n1/capabilities").json();
    let in_flight: Vec<(Value, Value)> =
        caps["providers"].as_array().unwrap().iter().map(|p| (p["id"].clone(), p["in_flight"].clone())).collect();
    assert!(in_flight.contains(&(json!("mock"), json!(1))) && in_flight.contains(&(json!("up"), json!(1))));
    drop((run, tunnel));
}

#[test]
fn ollamas_own_api_is_relayed_as_the_provider_answers_it() {
    let (mock, edge, _n1) = setup();
    for api in ["tags", "ps"] {
        let through = edge.admin(&format!("/admin/v1/nodes/n1/providers/ol/api/{api}"));
        assert_eq!(through.status, 200, "{api}: {}", String::from_utf8_lossy(&through.body));
        assert_eq!(through.header("content-type"), Some("application/json"));
        let direct = request(mock.addr, "GET", &format!("/api/{api}"), None, &[]);
        let (mut t, mut d) = (through.json(), direct.json());
        // /api/ps says when the model expires: a time, not part of the comparison.
        for m in t["models"].as_array_mut().into_iter().chain(d["models"].as_array_mut()).flatten() {
            m.as_object_mut().unwrap().remove("expires_at");
        }
        assert_eq!(t, d, "{api}");
        assert!(!t["models"].as_array().unwrap().is_empty(), "{api}: {t:#}");
    }
    let show = admin_post(&edge, "/admin/v1/nodes/n1/providers/ol/api/show", br#"{"model":"mock-llama"}"#);
    assert_eq!(show.status, 200, "{}", String::from_utf8_lossy(&show.body));
    let direct = request(mock.addr, "POST", "/api/show", Some(br#"{"model":"mock-llama"}"#), &[]);
    assert_eq!(show.body, direct.body, "api/show is relayed byte for byte");
    let by_query = edge.admin("/admin/v1/nodes/n1/providers/ol/api/show?model=mock-llama");
    assert_eq!(by_query.body, direct.body);

    // Refusals, each with its reason.
    let r = edge.admin("/admin/v1/nodes/n1/providers/up/api/tags");
    assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("no native API"), "{:?}", r.json());
    let r = edge.admin("/admin/v1/nodes/n1/providers/ol/api/pull");
    assert_eq!((r.status, error_code(&r)), (404, json!("not_found")));
    let r = admin_post(&edge, "/admin/v1/nodes/n1/providers/ol/api/show", b"{nope");
    assert_eq!((r.status, error_code(&r)), (400, json!("invalid_request")));
    let r = edge.admin("/admin/v1/nodes/n1/providers/ol/api/show");
    assert_eq!((r.status, error_code(&r)), (400, json!("invalid_request")));
}

#[test]
fn provider_api_errors_keep_the_providers_status_and_body() {
    let (mock, edge, mut n1) = setup();
    let through = admin_post(&edge, "/admin/v1/nodes/n1/providers/ol/api/show", b"{}");
    let direct = request(mock.addr, "POST", "/api/show", Some(b"{}"), &[]);
    assert_eq!(direct.status, 400);
    assert_eq!((through.status, &through.body), (direct.status, &direct.body));
    // A node that is gone answers 503 with Retry-After.
    n1.kill9();
    edge.wait_snapshot(Duration::from_secs(5), "n1 offline", |s| node_of(s, "n1")["connected"] == false);
    // Every core forgets the session once the fence reaches it.
    eventually(Duration::from_secs(5), "every core answers 503 node_not_ready", || {
        (0..8).all(|_| {
            let r = edge.admin("/admin/v1/nodes/n1/providers/ol/api/tags");
            r.status == 503 && error_code(&r) == "node_not_ready" && r.header("retry-after") == Some("1")
        })
    });
}
