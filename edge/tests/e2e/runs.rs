//! The client's session id (`http.session_header`, by default Claude
//! Code's `x-claude-code-session-id`) on a request's runs, and the node's
//! run store read through the admin API (`GET /admin/v1/nodes/{node}/runs`
//! and `…/runs/{run_id}`): real edge, node and iop-mockprov, a tunnelled
//! and a normalized provider.

use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::*;

/// The session header of a default config.
const SESSION_HEADER: &str = "x-claude-code-session-id";

/// Node `n1` with an `openai_compat` provider (`up`: the tunnel, model
/// `tun`) and an `ollama` one (`ol`: the normalized path, model `norm`),
/// both on the mock; the node keeps its run store in a scratch file.
fn setup() -> (MockProv, Edge, Proc) {
    let mock = MockProv::start(&[]);
    let node = format!(
        r#"
[[nodes]]
id = "n1"
token = "{token}"
[[nodes.providers]]
id = "up"
kind = "openai_compat"
base_url = "{base}"
capacity = 4
[[nodes.providers]]
id = "ol"
kind = "ollama"
base_url = "http://{addr}"
capacity = 4
"#,
        token = node_token("n1"),
        base = mock.base_url(),
        addr = mock.addr
    );
    let models = [
        "\n[[models]]\nname = \"tun\"\nnode = \"n1\"\nprovider = \"up\"\nupstream_model = \"mock-upstream\"\n"
            .to_owned(),
        "\n[[models]]\nname = \"norm\"\nnode = \"n1\"\nprovider = \"ol\"\nupstream_model = \"mock-llama\"\n".to_owned(),
    ];
    let edge = Edge::start(&pool_config(&[node], &models, ""));
    let store = scratch("runs.db");
    let n1 = edge.start_node("n1", &format!("[store]\npath = \"{}\"\n", store.display()));
    edge.wait_nodes_ready(1);
    (mock, edge, n1)
}

/// A whole chat answer from `model`, with `headers`.
fn chat(edge: &Edge, model: &str, extra: Value, headers: &[(&str, &str)]) -> Response {
    let mut body = json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    request(edge.http, "POST", "/v1/chat/completions", Some(body.to_string().as_bytes()), headers)
}

/// `GET /admin/v1/nodes/n1/runs…`, answered 200.
fn runs(edge: &Edge, query: &str) -> Vec<Value> {
    let r = edge.admin(&format!("/admin/v1/nodes/n1/runs{query}"));
    assert_eq!(r.status, 200, "{query}: {}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.header("cache-control"), Some("no-store"));
    r.json()["runs"].as_array().unwrap_or_else(|| panic!("no runs: {}", String::from_utf8_lossy(&r.body))).clone()
}

fn error_code(r: &Response) -> Value {
    r.json()["error"]["code"].clone()
}

/// The access-log line of the request that ran `run_id`.
fn access_line(edge: &Edge, run_id: &str) -> String {
    let needle = format!(" id={run_id} ");
    let mut line = String::new();
    eventually(Duration::from_secs(5), &format!("the access-log line of {run_id}"), || {
        let log = edge.proc.log_text();
        match log.lines().find(|l| l.contains("iop::access") && l.contains(&needle)) {
            Some(l) => {
                line = l.to_owned();
                true
            }
            None => false,
        }
    });
    line
}

/// One request of the test and what its run shows.
struct Asked {
    /// `tun` (the tunnel) or `norm` (the normalized path).
    model: &'static str,
    headers: &'static [(&'static str, &'static str)],
    /// The provider fails it (Ollama's 404 for a missing model).
    fails: bool,
    /// The session id its run carries.
    session: Option<&'static str>,
}

impl Asked {
    fn path(&self) -> &'static str {
        if self.model == "tun" {
            "tunnel"
        } else {
            "normalized"
        }
    }

    fn status(&self) -> &'static str {
        if self.fails {
            "error"
        } else {
            "complete"
        }
    }
}

#[test]
fn session_ids_travel_to_the_run_store_events_and_access_log() {
    let (_mock, edge, _n1) = setup();
    let mut events = edge.events();
    let within = Duration::from_secs(10);

    let asked = [
        Asked { model: "tun", headers: &[(SESSION_HEADER, "sess-A")], fails: false, session: Some("sess-A") },
        // Same session, a run of its own.
        Asked { model: "norm", headers: &[(SESSION_HEADER, "sess-A")], fails: false, session: Some("sess-A") },
        // No session header; a header that is not the configured one is not read.
        Asked { model: "norm", headers: &[("x-session-id", "other")], fails: false, session: None },
        Asked { model: "norm", headers: &[(SESSION_HEADER, "sess-B")], fails: true, session: Some("sess-B") },
        // Not visible ASCII: ignored, the request served.
        Asked { model: "tun", headers: &[(SESSION_HEADER, "has space")], fails: false, session: None },
    ];
    let mut ids = Vec::new();
    for a in &asked {
        let extra = if a.fails { json!({"mock": {"error_status": 404}}) } else { json!({}) };
        let r = chat(&edge, a.model, extra, a.headers);
        assert_eq!(r.status, if a.fails { 404 } else { 200 }, "{}: {}", a.model, String::from_utf8_lossy(&r.body));
        let ev = events.wait("run_terminal", within, |e| e["model"] == a.model);
        assert_eq!((&ev["path"], &ev["session_id"]), (&json!(a.path()), &json!(a.session)), "{ev}");
        assert_eq!(ev["outcome"], a.status(), "{ev}");
        let run_id = ev["run_id"].as_str().unwrap().to_owned();
        // The access log names the session, quoted ("" when none).
        let line = access_line(&edge, &run_id);
        let logged = format!("session_id=\"{}\"", a.session.unwrap_or(""));
        assert!(line.contains(&logged), "`{logged}` not in: {line}");
        ids.push(run_id);
    }

    // The store thread writes rows in the background: poll until all are in.
    let mut rows = Vec::new();
    eventually(within, "every run in the node's run store", || {
        rows = runs(&edge, "");
        ids.iter().all(|id| rows.iter().any(|r| r["run_id"] == **id))
    });
    assert_eq!(rows.len(), asked.len(), "{rows:#?}");
    // Newest first.
    let listed: Vec<&str> = rows.iter().map(|r| r["run_id"].as_str().unwrap()).collect();
    let newest_first: Vec<&str> = ids.iter().rev().map(String::as_str).collect();
    assert_eq!(listed, newest_first);
    for (row, a) in rows.iter().rev().zip(&asked) {
        let (adapter, target) = if a.model == "tun" { ("up", "mock-upstream") } else { ("ol", "mock-llama") };
        assert_eq!(
            (&row["path"], &row["status"], &row["session_id"], &row["adapter"], &row["target"]),
            (&json!(a.path()), &json!(a.status()), &json!(a.session), &json!(adapter), &json!(target)),
            "{row:#}"
        );
        let at = |k: &str| row[k].as_u64();
        let (queued, ended) = (at("queued_at_ms").unwrap(), at("ended_at_ms").unwrap());
        let started = at("started_at_ms").unwrap_or_else(|| panic!("not started: {row:#}"));
        // A failure before any output has no first byte.
        let first = at("first_byte_at_ms").or(a.fails.then_some(started));
        let first = first.unwrap_or_else(|| panic!("no first byte: {row:#}"));
        assert!(queued <= started && started <= first && first <= ended, "times out of order: {row:#}");
        if !a.fails {
            assert_eq!(row["code"], 200, "{row:#}");
            assert!(row["usage"]["output"].as_u64().is_some_and(|n| n > 0), "usage: {row:#}");
            assert!(row["usage"]["input"].as_u64().is_some(), "usage: {row:#}");
            assert_eq!(row["error_class"], Value::Null, "{row:#}");
        } else {
            assert_eq!(row["code"], 404, "{row:#}");
            assert!(row["error_class"].as_str().is_some_and(|c| !c.is_empty()), "{row:#}");
            assert_eq!(row["usage"], Value::Null, "{row:#}");
        }
    }

    // One run, as listed.
    let one = edge.admin(&format!("/admin/v1/nodes/n1/runs/{}", ids[3]));
    assert_eq!(one.status, 200, "{}", String::from_utf8_lossy(&one.body));
    assert_eq!(one.json(), rows[1]);

    // Filters.
    let errors = runs(&edge, "?status=error");
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert_eq!(errors[0]["run_id"], ids[3].as_str());
    assert!(runs(&edge, "?status=cancelled").is_empty());
    let two: Vec<Value> = runs(&edge, "?limit=2").iter().map(|r| r["run_id"].clone()).collect();
    assert_eq!(two, vec![json!(ids[4]), json!(ids[3])]);
    let complete: Vec<Value> = runs(&edge, "?status=complete&limit=3").iter().map(|r| r["run_id"].clone()).collect();
    assert_eq!(complete, vec![json!(ids[4]), json!(ids[2]), json!(ids[1])]);
    assert_eq!(runs(&edge, "?limit=500").len(), asked.len());

    // Refused before the node is asked.
    for query in
        ["?limit=0", "?limit=501", "?limit=x", "?status=running", "?status=", "?stat=error", "?limit=1&limit=2"]
    {
        let r = edge.admin(&format!("/admin/v1/nodes/n1/runs{query}"));
        assert_eq!(r.status, 400, "{query}: {}", String::from_utf8_lossy(&r.body));
        assert_eq!(error_code(&r), "invalid_request", "{query}");
    }
    let r = edge.admin("/admin/v1/nodes/n1/runs/no-such-run");
    assert_eq!((r.status, error_code(&r)), (404, json!("run_not_found")), "{}", String::from_utf8_lossy(&r.body));
    for path in ["/admin/v1/nodes/nx/runs", "/admin/v1/nodes/nx/runs/a"] {
        let r = edge.admin(path);
        assert_eq!((r.status, error_code(&r)), (404, json!("node_not_found")), "{path}");
    }
    let r = request(
        edge.http,
        "POST",
        "/admin/v1/nodes/n1/runs",
        Some(b"{}"),
        &[("authorization", &format!("Bearer {ADMIN_TOKEN}"))],
    );
    assert_eq!(r.status, 405);
    let r = request(edge.http, "GET", "/admin/v1/nodes/n1/runs", None, &[]);
    assert_eq!(r.status, 401, "the admin token is required");
}
