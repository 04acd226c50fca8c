//! The admin API: auth, the event stream, live config reload on SIGHUP.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::harness::*;

const SECS5: Duration = Duration::from_secs(5);

#[test]
fn admin_requires_the_bearer_token() {
    let edge = Edge::start(&pool_config(&[mock_node("n1", 1, 0, 2, 0)], &[mock_model("m", &["n1"], "")], ""));
    for path in ["/admin/v1/nodes", "/admin/v1/events"] {
        let r = request(edge.http, "GET", path, None, &[]);
        assert_eq!(r.status, 401, "{path} without a token: {}", String::from_utf8_lossy(&r.body));
        assert!(r.json()["error"]["message"].is_string());
        let r = request(edge.http, "GET", path, None, &[("authorization", "Bearer not-the-token")]);
        assert_eq!(r.status, 401, "{path} with a wrong token: {}", String::from_utf8_lossy(&r.body));
        let r = request(edge.http, "GET", path, None, &[("authorization", ADMIN_TOKEN)]);
        assert_eq!(r.status, 401, "{path} without the Bearer scheme");
    }
    // With the token: every configured node listed, offline before it connects.
    let snap = edge.snapshot();
    assert_offline(&snap, "n1");
    assert_eq!(provider_of(&snap, "n1", "mock")["normal"]["configured"], 1);
    assert_eq!(model_of(&snap, "m")["max_waiters"], 256);
    assert_eq!(model_of(&snap, "m")["targets"].as_array().map(Vec::len), Some(1));
    counters_zero(&snap).unwrap();
}

#[test]
fn event_stream_reports_the_node_lifecycle_and_runs() {
    let edge = Edge::start(&pool_config(&[mock_node("n1", 1, 0, 2, 0)], &[mock_model("m", &["n1"], "")], ""));
    let mut ev = edge.events();

    let mut bad = edge.node("wrong-token", &[]);
    let refused = ev.wait("registration_refused", SECS5, |_| true);
    assert_eq!(refused["refusal"], "unknown_token", "{refused}");
    assert_eq!(bad.wait_exit(SECS5), Some(2));

    let mut n1 = edge.start_node("n1", "");
    let reg = ev.wait("node_registered", SECS5, |e| e["node"] == "n1");
    let generation = reg["generation"].as_u64().expect("generation");
    assert!(reg["ts_ms"].as_u64().expect("ts_ms") > 0, "{reg}");
    let ready = ev.wait("node_ready", SECS5, |e| e["node"] == "n1");
    assert_eq!(ready["generation"], generation, "{ready}");
    edge.wait_nodes_ready(1);
    let snap = edge.snapshot();
    let node = node_of(&snap, "n1");
    assert_eq!((node["connected"].clone(), node["ready"].clone()), (json!(true), json!(true)), "{snap:#}");
    assert_eq!(node["state"], "ready", "{snap:#}");
    assert_eq!(node["generation"], generation, "{snap:#}");
    assert_eq!(provider_of(&snap, "n1", "mock")["status"], "available", "{snap:#}");

    let r = post_json(
        edge.http,
        "/v1/chat/completions",
        &json!({"model": "m", "messages": [{"role": "user", "content": "x"}]}),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let done = ev.wait("run_terminal", SECS5, |_| true);
    assert_eq!(done["outcome"], "complete", "{done}");
    assert_eq!(done["node"], "n1", "{done}");
    assert_eq!(done["model"], "m", "{done}");
    assert!(done["run_id"].as_str().is_some_and(|s| !s.is_empty()), "{done}");

    n1.kill9();
    // Each of the node's links ends; the last one ends the generation.
    let gone = ev.wait("node_disconnected", SECS5, |e| e["node"] == "n1" && e["current"] == true);
    assert_eq!(gone["generation"], generation, "{gone}");
    assert_eq!(gone["current"], true, "{gone}");
    assert!(gone["reason"].as_str().is_some_and(|s| !s.is_empty()), "{gone}");
    let snap = edge.wait_snapshot(SECS5, "n1 offline", |s| node_of(s, "n1")["connected"] == false);
    assert_offline(&snap, "n1");
    assert_eq!(node_of(&snap, "n1")["state"], "offline", "{snap:#}");
    counters_zero(&snap).unwrap();
}

/// A node that registered and has not said it is ready is `registered`
/// in the snapshot, as its only event so far says, never `ready`; its
/// providers take nothing. When the connection ends it is offline again.
#[test]
fn a_registered_node_is_shown_registered_until_ready() {
    let edge = Edge::start(&pool_config(&[mock_node("n1", 1, 0, 2, 0)], &[mock_model("m", &["n1"], "")], ""));
    let mut ev = edge.events();
    let mut s = std::net::TcpStream::connect(edge.nodes).unwrap();
    assert_eq!(crate::hostile_peers::try_register(&mut s, &node_token("n1")), None, "registration refused");
    let reg = ev.wait("node_registered", SECS5, |e| e["node"] == "n1");
    let snap = edge.snapshot();
    let n = node_of(&snap, "n1");
    assert_eq!(n["state"], "registered", "{snap:#}");
    assert_eq!((&n["connected"], &n["ready"], &n["generation"]), (&json!(true), &json!(false), &reg["generation"]));
    assert_eq!(provider_of(&snap, "n1", "mock")["status"], "unavailable", "{snap:#}");
    assert_eq!(provider_of(&snap, "n1", "mock")["normal"]["effective"], 0, "{snap:#}");
    assert!(!ev.seen.iter().any(|e| e["type"] == "node_ready"), "{:#?}", ev.seen);
    let r = post_json(
        edge.http,
        "/v1/chat/completions",
        &json!({"model": "m", "messages": [{"role": "user", "content": "x"}]}),
    );
    assert_eq!(r.status, 503, "{}", String::from_utf8_lossy(&r.body));

    drop(s);
    let gone = ev.wait("node_disconnected", SECS5, |e| e["node"] == "n1");
    assert_eq!((&gone["current"], &gone["generation"]), (&json!(true), &reg["generation"]), "{gone}");
    let snap = edge.wait_snapshot(SECS5, "n1 offline", |s| node_of(s, "n1")["state"] == "offline");
    assert_offline(&snap, "n1");
}

/// The snapshot's request counters are those `/metrics` serves, and the
/// `?snapshots=1` stream carries the same snapshot as events.
#[test]
fn snapshots_count_requests_as_metrics_does_and_ride_the_event_stream() {
    use std::io::{BufRead, BufReader, Write};

    let edge = Edge::start(&pool_config(&[mock_node("n1", 2, 0, 2, 0)], &[mock_model("m", &["n1"], "")], ""));
    let _n1 = edge.start_node("n1", "");
    edge.wait_nodes_ready(1);
    let chat = json!({"model": "m", "messages": [{"role": "user", "content": "x"}]});
    for _ in 0..3 {
        let r = post_json(edge.http, "/v1/chat/completions", &chat);
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    }
    let snap = edge.wait_snapshot(SECS5, "3 requests of m", |s| model_of(s, "m")["requests"]["total"] == 3);
    let metrics = String::from_utf8(edge.admin("/metrics").body).unwrap();
    // Every `iop_edge_requests_total` of model m, summed by status over surfaces.
    let mut from_metrics = serde_json::Map::new();
    for l in metrics.lines().filter(|l| l.starts_with(r#"iop_edge_requests_total{model="m","#)) {
        let status = l.split("status=\"").nth(1).and_then(|r| r.split('"').next()).unwrap().to_owned();
        let n: u64 = l.rsplit(' ').next().unwrap().parse().unwrap();
        let sum = from_metrics.get(&status).and_then(serde_json::Value::as_u64).unwrap_or(0) + n;
        from_metrics.insert(status, json!(sum));
    }
    let m = model_of(&snap, "m");
    assert_eq!(m["requests"]["by_status"], serde_json::Value::Object(from_metrics), "{metrics}");
    assert_eq!(m["requests"]["by_status"], json!({"200": 3}), "{snap:#}");
    let ttft_count = metrics
        .lines()
        .find(|l| l.starts_with(r#"iop_edge_time_to_first_byte_seconds_count{model="m""#))
        .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok());
    assert_eq!(m["ttft"]["count"].as_u64(), ttft_count, "{metrics}");
    assert_eq!(
        m["ttft"]["buckets"].as_array().map(Vec::len),
        snap["histogram_bounds_seconds"].as_array().map(|b| b.len() + 1),
        "{snap:#}"
    );
    assert!(snap["ts_ms"].as_u64().is_some_and(|t| t > 0), "{snap:#}");

    // The stream opens with a snapshot and sends another within a second or so.
    let mut s = std::net::TcpStream::connect(edge.http).unwrap();
    s.set_read_timeout(Some(SECS5)).unwrap();
    let req =
        format!("GET /admin/v1/events?snapshots=1 HTTP/1.1\r\nhost: t\r\nauthorization: Bearer {ADMIN_TOKEN}\r\n\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut rd = BufReader::new(s);
    let mut snapshots = Vec::new();
    let started = Instant::now();
    let mut line = String::new();
    while snapshots.len() < 2 {
        line.clear();
        assert!(rd.read_line(&mut line).unwrap() > 0, "stream ended");
        if let Some(d) = line.trim_end().strip_prefix("data: ") {
            let v: serde_json::Value = serde_json::from_str(d).unwrap();
            if v["type"] == "snapshot" {
                snapshots.push(v);
            }
        }
    }
    assert!(started.elapsed() < Duration::from_secs(3), "two snapshots took {:?}", started.elapsed());
    let v = &snapshots[1];
    assert_eq!(node_of(v, "n1")["state"], "ready", "{v:#}");
    assert_eq!(model_of(v, "m")["requests"], snap["models"][0]["requests"], "{v:#}");
    assert!(v["ts_ms"].as_u64() >= snapshots[0]["ts_ms"].as_u64(), "{snapshots:#?}");
}

/// The status page's files are served without the token, but only while
/// the admin API exists.
#[test]
fn the_status_page_is_served_without_the_token_only_with_an_admin_api() {
    let config = pool_config(&[mock_node("n1", 1, 0, 2, 0)], &[mock_model("m", &["n1"], "")], "");
    let edge = Edge::start(&config);
    for path in ["/admin", "/admin/", "/admin/app.js", "/admin/style.css"] {
        let r = request(edge.http, "GET", path, None, &[]);
        assert_eq!(r.status, 200, "{path}");
        assert!(r.header("content-security-policy").is_some_and(|c| c.starts_with("default-src 'none'")), "{path}");
        assert_eq!(r.header("referrer-policy"), Some("no-referrer"), "{path}");
    }
    assert!(request(edge.http, "GET", "/admin/", None, &[]).header("content-type").unwrap().starts_with("text/html"));
    assert_eq!(request(edge.http, "POST", "/admin/", Some(b"{}"), &[]).status, 405);
    // Data still needs the token.
    assert_eq!(request(edge.http, "GET", "/admin/v1/nodes", None, &[]).status, 401);

    let without = config.replace(&format!("admin_token = \"{ADMIN_TOKEN}\"\n"), "");
    assert_ne!(without, config);
    let edge = Edge::start(&without);
    for path in ["/admin/", "/admin/app.js"] {
        let r = request(edge.http, "GET", path, None, &[]);
        assert_eq!(r.status, 404, "{path}: {}", String::from_utf8_lossy(&r.body));
    }
}

#[test]
fn sighup_applies_a_new_capacity_and_rejects_an_invalid_file() {
    let config =
        |capacity: u32| pool_config(&[mock_node("n1", capacity, 0, 60, 50)], &[mock_model("m", &["n1"], "")], "");
    let edge = Edge::start(&config(1));
    let mut ev = edge.events();
    let _n1 = edge.start_node("n1", "");
    edge.wait_nodes_ready(1);

    // One 3 s stream running, a short one queued behind it.
    let mut a = Chat::stream(edge.http, "m");
    a.wait_data("tok0", SECS5);
    let b = Chat::start(edge.http, "m", "hi", true, 3);
    edge.wait_model_waiters("m", 1);

    edge.rewrite_config(&config(2));
    let hup = Instant::now();
    edge.sighup();
    ev.wait("config_reloaded", SECS5, |e| e["revision"].is_u64());
    let b = b.join_within(SECS5);
    assert_eq!(b.resp.status, 200, "{}", b.resp_text());
    assert_eq!(b.content(), "tok0 tok1 tok2 ");
    let took = b.ended.saturating_duration_since(hup);
    println!("queued request finished {took:?} after SIGHUP");
    assert!(took < Duration::from_secs(1), "queued request finished only {took:?} after the reload");
    assert!(!a.is_finished(), "the queued request should not have waited for the first one");
    let snap = edge
        .wait_snapshot(SECS5, "configured capacity 2", |s| provider_of(s, "n1", "mock")["normal"]["configured"] == 2);
    assert_eq!(provider_of(&snap, "n1", "mock")["normal"]["effective"], 2, "{snap:#}");

    // An invalid file is rejected; the running config stays.
    edge.rewrite_config(&config(0));
    edge.sighup();
    let rejected = ev.wait("config_rejected", SECS5, |_| true);
    assert!(rejected["error"].as_str().is_some_and(|e| e.contains("capacity")), "{rejected}");
    eventually(SECS5, "edge logs the rejected reload", || edge.proc.log_text().contains("capacity"));
    let snap = edge.snapshot();
    assert_eq!(provider_of(&snap, "n1", "mock")["normal"]["configured"], 2, "{snap:#}");
    assert_eq!(provider_of(&snap, "n1", "mock")["status"], "available", "{snap:#}");
    // Still served, and still with room for two at once (the first stream runs on).
    assert!(!a.is_finished());
    let started = Instant::now();
    let r = post_json(
        edge.http,
        "/v1/chat/completions",
        &json!({"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]}),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["choices"][0]["message"]["content"], "tok0 tok1 ");
    assert!(started.elapsed() < Duration::from_secs(1), "request waited {:?}", started.elapsed());
    assert!(!a.is_finished(), "served beside the running stream, not after it");

    let a = a.join();
    assert_eq!(a.last().1, "[DONE]", "{}", a.resp_text());
    edge.assert_idle();
}

#[test]
fn sighup_pushes_a_changed_node_config_without_dropping_in_flight_runs() {
    // The node's provider settings change (token count): the node gets a
    // ConfigRefresh and applies it; the run in flight keeps its adapter.
    let config = |tokens: u32| pool_config(&[mock_node("n1", 4, 0, tokens, 20)], &[mock_model("m", &["n1"], "")], "");
    let edge = Edge::start(&config(40));
    let _n1 = edge.start_node("n1", "");
    edge.wait_nodes_ready(1);

    let mut a = Chat::stream(edge.http, "m");
    a.wait_data("tok0", SECS5);
    edge.rewrite_config(&config(3));
    edge.sighup();
    eventually(SECS5, "the node acknowledged the refresh", || {
        edge.proc.log_text().contains("node config refresh acknowledged")
            && edge.proc.log_text().contains("applied=true")
    });
    let r = post_json(
        edge.http,
        "/v1/chat/completions",
        &json!({"model": "m", "messages": [{"role": "user", "content": "x"}]}),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["choices"][0]["message"]["content"], "tok0 tok1 tok2 ");
    assert!(!a.is_finished(), "the first run should still be streaming");
    let a = a.join();
    assert_eq!(a.last().1, "[DONE]", "{}", a.resp_text());
    assert_eq!(a.content().matches("tok").count(), 40, "the in-flight run kept its old settings");
    edge.assert_idle();
}

#[test]
fn node_sessions_are_served_by_every_worker_core() {
    // Node connections are spread over the cores like client connections
    // (SO_REUSEPORT hashes each connection): sixteen nodes all landing on one
    // of two cores would be a 1-in-32768 fluke.
    let ids: Vec<String> = (1..=16).map(|i| format!("n{i}")).collect();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let nodes: Vec<String> = ids.iter().map(|id| mock_node(id, 1, 0, 2, 0)).collect();
    let edge = Edge::start(&pool_config(&nodes, &[mock_model("m", &ids, "")], ""));
    let _procs: Vec<_> = ids.iter().map(|id| edge.start_node(id, "")).collect();
    edge.wait_nodes_ready(ids.len() as u64);
    let snap = edge.snapshot();
    let mut workers: Vec<u64> = snap["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["worker"].as_u64().expect("worker of a connected node"))
        .collect();
    workers.sort();
    workers.dedup();
    assert_eq!(workers, vec![0, 1], "{snap:#}");
}
