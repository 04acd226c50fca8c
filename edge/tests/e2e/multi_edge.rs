//! Nodes serving two edges (issue 28): three nodes each link to both edges
//! (`edges = [..]`); each edge dispatches to them on its own within the
//! capacity share each node announces; no provider ever runs more than its
//! capacity across both edges; an edge killed mid-stream leaves the other's
//! streams alone while its shares move to the survivor within 2 s; restarted,
//! it gets shares back by demand; a session lands on one target through
//! either edge.

use std::time::{Duration, Instant};

use crate::harness::*;

const CAPACITY: u32 = 4;
const NODES: [&str; 3] = ["n1", "n2", "n3"];

fn config(mocks: &[MockProv], node_listener: &str) -> String {
    let mut s = format!(
        "workers = 2\nadmin_token = \"{ADMIN_TOKEN}\"\n[http]\nlisten = \"127.0.0.1:0\"\n\
         [node_listener]\nlisten = \"{node_listener}\"\n"
    );
    for (id, mock) in NODES.iter().zip(mocks) {
        s.push_str(&format!(
            "[[nodes]]\nid = \"{id}\"\ntoken = \"{}\"\n[[nodes.providers]]\nid = \"up\"\nkind = \"openai_compat\"\n\
             base_url = \"{}\"\ncapacity = {CAPACITY}\n",
            node_token(id),
            mock.base_url()
        ));
    }
    s.push_str("[[models]]\nname = \"m\"\nprovider = \"up\"\nupstream_model = \"mock\"\nqueue_timeout_ms = 30000\n");
    s
}

/// The normal share edge `edge`'s snapshot shows for `node`/up (none: no share in force).
fn share(edge: &Edge, node: &str) -> Option<u64> {
    provider_of(&edge.snapshot(), node, "up")["normal"]["share"].as_u64()
}

/// Every node's shares on `a` and `b` add up to its capacity, both non-zero.
fn split(a: &Edge, b: &Edge) -> bool {
    NODES.iter().all(
        |n| matches!((share(a, n), share(b, n)), (Some(x), Some(y)) if x + y == u64::from(CAPACITY) && x > 0 && y > 0),
    )
}

fn start_node(id: &str, a: &Edge, b: &Edge) -> Proc {
    let path = scratch(&format!("{id}.toml"));
    std::fs::write(
        &path,
        format!(
            "edges = [\"{}\", \"{}\"]\ntoken = \"{}\"\nworkers = 2\n[reconnect]\nmax_attempts = 0\ninterval_sec = 1\n",
            a.nodes,
            b.nodes,
            node_token(id)
        ),
    )
    .expect("write node config");
    Proc::spawn("iop-node", &["--config", path.to_str().expect("utf8")], &[])
}

/// The most streams each mock (provider) ran at once, all below the capacity.
fn assert_within_capacity(mocks: &[MockProv]) {
    for (id, mock) in NODES.iter().zip(mocks) {
        let peak = mock.stats()["peak_streams"].as_u64().expect("peak_streams");
        assert!(peak <= u64::from(CAPACITY), "{id}'s provider ran {peak} streams at once, capacity {CAPACITY}");
    }
}

#[test]
fn nodes_serve_two_edges_within_their_capacity_and_survive_one_dying() {
    // Paced streams: 40 tokens, 25 ms apart (about a second each).
    let mocks: Vec<MockProv> =
        NODES.iter().map(|_| MockProv::start(&["--tokens", "40", "--token-interval-ms", "25"])).collect();
    let mut a = Edge::start(&config(&mocks, "127.0.0.1:0"));
    let b = Edge::start(&config(&mocks, "127.0.0.1:0"));
    let _nodes: Vec<Proc> = NODES.iter().map(|id| start_node(id, &a, &b)).collect();
    a.wait_nodes_ready(3);
    b.wait_nodes_ready(3);
    eventually(Duration::from_secs(5), "every node's shares add up to its capacity", || split(&a, &b));

    // Twice the capacity through each edge at once: each admits within its
    // shares and queues the rest; every request is served, and no provider
    // runs more than its capacity at any instant.
    let n = 2 * CAPACITY * NODES.len() as u32;
    let chats: Vec<Chat> = (0..n).flat_map(|_| [Chat::stream(a.http, "m"), Chat::stream(b.http, "m")]).collect();
    for c in chats {
        let t = c.join_within(Duration::from_secs(60));
        assert_eq!(t.resp.status, 200, "{}", t.resp_text());
        assert_eq!(t.last().1, "[DONE]", "{}", t.resp_text());
    }
    assert_within_capacity(&mocks);
    let peaks: u64 = mocks.iter().map(|m| m.stats()["peak_streams"].as_u64().unwrap_or(0)).sum();
    assert!(peaks >= 6, "the edges' streams overlapped on the providers ({peaks})");

    // A stream on each edge; kill edge A mid-stream.
    let mut on_a = Chat::stream(a.http, "m");
    let mut on_b = Chat::stream(b.http, "m");
    on_a.wait_data("content", Duration::from_secs(10));
    on_b.wait_data("content", Duration::from_secs(10));
    a.proc.kill9();
    // The nodes move A's shares to B within 2 s.
    let killed = Instant::now();
    eventually(Duration::from_secs(2), "B holds every node's whole capacity", || {
        NODES.iter().all(|n| share(&b, n) == Some(u64::from(CAPACITY)))
    });
    assert!(killed.elapsed() < Duration::from_secs(2));
    // A's client sees its connection end; B's stream is untouched.
    let t = on_a.join_within(Duration::from_secs(10));
    assert_ne!(t.data.last().map(|d| d.1.as_str()), Some("[DONE]"), "a stream through a killed edge cannot complete");
    let t = on_b.join_within(Duration::from_secs(30));
    assert_eq!((t.resp.status, t.last().1.as_str()), (200, "[DONE]"), "{}", t.resp_text());
    // And B uses it: every node's capacity runs at once through B.
    let chats: Vec<Chat> = (0..CAPACITY * NODES.len() as u32).map(|_| Chat::stream(b.http, "m")).collect();
    eventually(Duration::from_secs(5), "all of B's streams run at once", || {
        mocks.iter().map(|m| m.stats()["active_streams"].as_u64().unwrap_or(0)).sum::<u64>()
            == u64::from(CAPACITY) * NODES.len() as u64
    });
    for c in chats {
        let t = c.join_within(Duration::from_secs(30));
        assert_eq!(t.resp.status, 200, "{}", t.resp_text());
    }

    // Edge A comes back on its address: the nodes link to it again (on their
    // own schedule) and, as A's clients queue, shares move back by demand.
    let a = Edge::start(&config(&mocks, &a.nodes.to_string()));
    a.wait_nodes_ready(3);
    let chats: Vec<Chat> = (0..CAPACITY * NODES.len() as u32).map(|_| Chat::stream(a.http, "m")).collect();
    eventually(Duration::from_secs(5), "A holds shares again", || {
        NODES.iter().all(|n| share(&a, n).is_some_and(|s| s > 0))
    });
    for c in chats {
        let t = c.join_within(Duration::from_secs(30));
        assert_eq!((t.resp.status, t.last().1.as_str()), (200, "[DONE]"), "{}", t.resp_text());
    }
    assert_within_capacity(&mocks);
    eventually(Duration::from_secs(10), "idle again, the shares are split again", || split(&a, &b));

    // Affinity: one session's requests land on one target through either edge.
    let before: Vec<u64> = mocks.iter().map(|m| m.stats()["requests"].as_u64().unwrap_or(0)).collect();
    let body =
        serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "mock": {"tokens": 2}});
    let body = serde_json::to_vec(&body).expect("json");
    for i in 0..6 {
        let edge = if i % 2 == 0 { &a } else { &b };
        let headers = [("content-type", "application/json"), ("x-session-affinity", "session-42")];
        let r = request(edge.http, "POST", "/v1/chat/completions", Some(&body), &headers);
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    }
    let got: Vec<u64> =
        mocks.iter().zip(&before).map(|(m, b)| m.stats()["requests"].as_u64().unwrap_or(0) - b).collect();
    assert_eq!((got.iter().sum::<u64>(), got.iter().filter(|&&g| g > 0).count()), (6, 1), "{got:?}");
}
