//! A node process opens one link per worker; the links join one
//! registration and generation, spread over the edge's cores, share the
//! node's runs, and come and go one by one (DESIGN.md, "Node links").

use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::*;

const SECS5: Duration = Duration::from_secs(5);

/// An edge with 2 workers and node `n1` (one mock provider of `capacity`,
/// slow tokens so runs stay in flight).
fn edge_with(capacity: u32) -> Edge {
    Edge::start(&pool_config(&[mock_node("n1", capacity, 0, 400, 10)], &[mock_model("m", &["n1"], "")], ""))
}

fn links(edge: &Edge) -> Vec<Value> {
    node_of(&edge.snapshot(), "n1")["links"].as_array().unwrap().clone()
}

fn wait_links_ready(edge: &Edge, n: usize) -> Value {
    edge.wait_snapshot(SECS5, "every link ready", |s| {
        let l = node_of(s, "n1")["links"].as_array().unwrap().clone();
        l.len() == n && l.iter().all(|l| l["ready"] == true)
    })
}

fn transport(edge: &Edge) -> Value {
    let r = edge.admin("/admin/v1/nodes/n1/transport");
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.json()
}

/// Streams in flight on both links. A run prefers the link on its client's
/// edge core, and the kernel places client connections: at least 8 streams
/// are opened, more (up to 16) until both links carry some.
fn streams_on_both_links(edge: &Edge) -> Vec<Chat> {
    let mut chats = Vec::new();
    loop {
        let mut c = Chat::stream(edge.http, "m");
        c.wait_data("tok1 ", SECS5);
        chats.push(c);
        if chats.len() < 8 {
            continue;
        }
        let t = transport(edge);
        let per_link: Vec<u64> =
            t["links"].as_array().unwrap().iter().map(|l| l["streams"].as_u64().unwrap()).collect();
        if per_link.len() == 2 && per_link.iter().all(|&n| n > 0) {
            return chats;
        }
        assert!(chats.len() < 16, "16 streams and one link carries none: {t:#}");
    }
}

fn close_link(edge: &Edge, index: u32) -> Response {
    let auth = format!("Bearer {ADMIN_TOKEN}");
    request(
        edge.http,
        "POST",
        &format!("/admin/v1/nodes/n1/links/{index}/close"),
        Some(b""),
        &[("authorization", &auth)],
    )
}

#[test]
fn a_node_opens_one_link_per_worker_spread_over_the_edge_cores() {
    let edge = edge_with(8);
    let mut ev = edge.events();
    let _n1 = edge.start_node("n1", "workers = 4");
    let ready = ev.wait("node_ready", SECS5, |e| e["node"] == "n1");
    let snap = wait_links_ready(&edge, 4);
    let node = node_of(&snap, "n1");
    assert_eq!(node["generation"], ready["generation"], "one generation for all links: {snap:#}");
    let mut per_core = [0, 0];
    for l in node["links"].as_array().unwrap() {
        per_core[l["worker"].as_u64().unwrap() as usize] += 1;
    }
    assert_eq!(per_core, [2, 2], "links spread evenly over the edge's cores: {snap:#}");
    // Only the first link makes the node ready; no second node_ready.
    std::thread::sleep(Duration::from_millis(200));
    assert!(!ev.seen.iter().skip_while(|e| e != &&ready).skip(1).any(|e| e["type"] == "node_ready"), "{:#?}", ev.seen);
}

#[test]
fn runs_spread_over_the_links_and_each_reports_its_own() {
    let edge = edge_with(16);
    let _n1 = edge.start_node("n1", "workers = 2");
    wait_links_ready(&edge, 2);
    let chats = streams_on_both_links(&edge);
    let n = chats.len() as u64;
    let t = transport(&edge);
    assert_eq!(t["streams"], n, "{t:#}");
    let per_link: Vec<u64> = t["links"].as_array().unwrap().iter().map(|l| l["streams"].as_u64().unwrap()).collect();
    assert_eq!(per_link.len(), 2, "{t:#}");
    assert!(per_link.iter().all(|&n| n > 0), "both links carry runs: {t:#}");
    // The provider's gate counts the runs of every link.
    let caps = edge.admin("/admin/v1/nodes/n1/capabilities").json();
    assert_eq!(caps["providers"][0]["in_flight"], n, "{caps:#}");
    for c in chats {
        assert_eq!(c.join_within(Duration::from_secs(20)).data.last().map(|(_, d)| d.as_str()), Some("[DONE]"));
    }
    edge.assert_idle();
}

#[test]
fn losing_one_link_fails_only_its_runs_and_the_link_rejoins_the_generation() {
    let edge = edge_with(16);
    let mut ev = edge.events();
    let _n1 = edge.start_node("n1", "workers = 2");
    let generation = ev.wait("node_ready", SECS5, |e| e["node"] == "n1")["generation"].clone();
    wait_links_ready(&edge, 2);
    let chats = streams_on_both_links(&edge);
    let n = chats.len() as u64;
    let on_link0 = transport(&edge)["links"][0]["streams"].as_u64().unwrap();
    assert!(on_link0 > 0 && on_link0 < n);

    let r = close_link(&edge, 0);
    assert_eq!(r.status, 202, "{}", String::from_utf8_lossy(&r.body));
    let gone = ev.wait("node_disconnected", SECS5, |e| e["node"] == "n1");
    assert_eq!((&gone["link"], &gone["current"], &gone["generation"]), (&json!(0), &json!(false), &generation));
    assert_eq!(gone["reason"], "closed_by_admin");
    // The node stays ready on its other link throughout.
    let snap = edge.snapshot();
    assert_eq!((&node_of(&snap, "n1")["ready"], &node_of(&snap, "n1")["generation"]), (&json!(true), &generation));
    let r = post_json(
        edge.http,
        "/v1/chat/completions",
        &json!({"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]}),
    );
    assert_eq!(r.status, 200, "a new run goes to the remaining link: {}", String::from_utf8_lossy(&r.body));

    // The runs of the closed link ended with an error, the others complete.
    let (mut failed, mut complete) = (0, 0);
    for c in chats {
        let t = c.join_within(Duration::from_secs(20));
        match t.data.last().map(|(_, d)| d.as_str()) {
            Some("[DONE]") => complete += 1,
            Some(last) => {
                let v: Value = serde_json::from_str(last).unwrap();
                assert_eq!(v["error"]["code"], "node_disconnected", "{last}");
                failed += 1;
            }
            None => panic!("empty stream"),
        }
    }
    assert_eq!((failed, complete), (on_link0, n - on_link0));

    // The link comes back into the same generation (a partial reconnect).
    let snap = wait_links_ready(&edge, 2);
    assert_eq!(node_of(&snap, "n1")["generation"], generation, "{snap:#}");
    assert!(!ev.seen.iter().any(|e| e["type"] == "node_disconnected" && e["current"] == true), "{:#?}", ev.seen);
    edge.assert_idle();
}

#[test]
fn killing_the_process_ends_the_generation_once_and_a_new_process_starts_anew() {
    let edge = edge_with(4);
    let mut ev = edge.events();
    let mut n1 = edge.start_node("n1", "workers = 3");
    let first = ev.wait("node_ready", SECS5, |e| e["node"] == "n1")["generation"].as_u64().unwrap();
    wait_links_ready(&edge, 3);
    n1.kill9();
    let end = ev.wait("node_disconnected", SECS5, |e| e["node"] == "n1" && e["current"] == true);
    assert_eq!(end["generation"], first);
    let snap = edge.wait_snapshot(SECS5, "n1 offline", |s| node_of(s, "n1")["connected"] == false);
    assert_offline(&snap, "n1");
    // Links end on different cores: an earlier link's event may be
    // published after the one that ended the generation.
    let link_ends = |ev: &Events| ev.seen.iter().filter(|e| e["type"] == "node_disconnected").count();
    while link_ends(&ev) < 3 {
        ev.wait("node_disconnected", SECS5, |_| true);
    }
    let current = ev.seen.iter().filter(|e| e["type"] == "node_disconnected" && e["current"] == true).count();
    assert_eq!((link_ends(&ev), current), (3, 1), "one per link, one ending the generation: {:#?}", ev.seen);

    let _again = edge.start_node("n1", "workers = 2");
    let second = ev.wait("node_ready", SECS5, |e| e["node"] == "n1")["generation"].as_u64().unwrap();
    assert!(second > first);
    let snap = wait_links_ready(&edge, 2);
    assert_eq!(node_of(&snap, "n1")["generation"], second);
    assert_eq!(links(&edge).len(), 2);
    let r = close_link(&edge, 7);
    assert_eq!((r.status, r.json()["error"]["code"].clone()), (404, json!("link_not_found")));
}
