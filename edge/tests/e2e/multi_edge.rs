//! One node serving two edges (issue 28, parts 1 and 2): the node links to
//! both (`edges = [..]`), each edge dispatches to it on its own within the
//! capacity share the node announces, the provider never runs more than its
//! capacity across both, and an edge killed mid-stream leaves the other's
//! streams alone while its share moves to the survivor within 2 s.

use std::time::{Duration, Instant};

use crate::harness::*;

const CAPACITY: u32 = 4;

fn config(upstream: &str) -> String {
    format!(
        "{}[[nodes.providers]]\nid = \"up\"\nkind = \"openai_compat\"\nbase_url = \"{upstream}\"\ncapacity = {CAPACITY}\n\
         [[models]]\nname = \"m\"\nnode = \"n1\"\nprovider = \"up\"\nupstream_model = \"mock\"\nqueue_timeout_ms = 30000\n",
        n1_header()
    )
}

/// The normal share edge `edge`'s snapshot shows for `n1/up` (none: no share in force).
fn share(edge: &Edge) -> Option<u64> {
    provider_of(&edge.snapshot(), "n1", "up")["normal"]["share"].as_u64()
}

#[test]
fn one_node_serves_two_edges_within_its_capacity_and_survives_one_dying() {
    // Paced streams: 40 tokens, 25 ms apart (about a second each).
    let mock = MockProv::start(&["--tokens", "40", "--token-interval-ms", "25"]);
    let mut a = Edge::start(&config(&mock.base_url()));
    let b = Edge::start(&config(&mock.base_url()));
    let path = scratch("node.toml");
    std::fs::write(
        &path,
        format!(
            "edges = [\"{}\", \"{}\"]\ntoken = \"{NODE_TOKEN}\"\nworkers = 2\n[reconnect]\nmax_attempts = 0\ninterval_sec = 1\n",
            a.nodes, b.nodes
        ),
    )
    .expect("write node config");
    let _node = Proc::spawn("iop-node", &["--config", path.to_str().expect("utf8")], &[]);
    a.wait_nodes_ready(1);
    b.wait_nodes_ready(1);
    // Both edges hold a share; together they are the capacity.
    eventually(
        Duration::from_secs(5),
        "the shares add up to the capacity",
        || matches!((share(&a), share(&b)), (Some(x), Some(y)) if x + y == u64::from(CAPACITY) && x > 0 && y > 0),
    );

    // Twice the capacity through each edge at once: each admits within its
    // share and queues the rest; every request is served, never more than
    // the capacity at the provider at any instant.
    let chats: Vec<Chat> =
        (0..2 * CAPACITY).flat_map(|_| [Chat::stream(a.http, "m"), Chat::stream(b.http, "m")]).collect();
    for c in chats {
        let t = c.join_within(Duration::from_secs(60));
        assert_eq!(t.resp.status, 200, "{}", t.resp_text());
        assert_eq!(t.last().1, "[DONE]", "{}", t.resp_text());
    }
    let peak = mock.stats()["peak_streams"].as_u64().expect("peak_streams");
    assert!(peak <= u64::from(CAPACITY), "the provider ran {peak} streams at once, capacity {CAPACITY}");
    assert!(peak >= 2, "the two edges' streams overlapped ({peak})");

    // A stream on each edge; kill edge A mid-stream.
    let mut on_a = Chat::stream(a.http, "m");
    let mut on_b = Chat::stream(b.http, "m");
    on_a.wait_data("content", Duration::from_secs(10));
    on_b.wait_data("content", Duration::from_secs(10));
    a.proc.kill9();
    // The node moves A's share to B within 2 s.
    let killed = Instant::now();
    eventually(Duration::from_secs(2), "B holds the whole capacity", || share(&b) == Some(u64::from(CAPACITY)));
    assert!(killed.elapsed() < Duration::from_secs(2));
    // A's client sees its connection end; B's stream is untouched.
    let t = on_a.join_within(Duration::from_secs(10));
    assert_ne!(t.data.last().map(|d| d.1.as_str()), Some("[DONE]"), "a stream through a killed edge cannot complete");
    let t = on_b.join_within(Duration::from_secs(30));
    assert_eq!((t.resp.status, t.last().1.as_str()), (200, "[DONE]"), "{}", t.resp_text());
    // And B uses it: the capacity's worth of streams run at once.
    let chats: Vec<Chat> = (0..CAPACITY).map(|_| Chat::stream(b.http, "m")).collect();
    eventually(Duration::from_secs(5), "all of B's streams run at once", || {
        mock.stats()["active_streams"].as_u64() == Some(u64::from(CAPACITY))
    });
    for c in chats {
        let t = c.join_within(Duration::from_secs(30));
        assert_eq!(t.resp.status, 200, "{}", t.resp_text());
    }

    // Edge A comes back on its address: the node links to it again (its own
    // schedule) and, as A's clients queue, shares move back by demand.
    let nodes_addr = a.nodes;
    let a = Edge::start(&config(&mock.base_url()).replacen(
        "[node_listener]\nlisten = \"127.0.0.1:0\"",
        &format!("[node_listener]\nlisten = \"{nodes_addr}\""),
        1,
    ));
    a.wait_nodes_ready(1);
    let chats: Vec<Chat> = (0..CAPACITY).map(|_| Chat::stream(a.http, "m")).collect();
    eventually(Duration::from_secs(5), "A holds a share again", || share(&a).is_some_and(|s| s > 0));
    for c in chats {
        let t = c.join_within(Duration::from_secs(30));
        assert_eq!((t.resp.status, t.last().1.as_str()), (200, "[DONE]"), "{}", t.resp_text());
    }
    let peak = mock.stats()["peak_streams"].as_u64().expect("peak_streams");
    assert!(peak <= u64::from(CAPACITY), "the provider ran {peak} streams at once, capacity {CAPACITY}");
    // Idle again, the two split the capacity between them.
    eventually(
        Duration::from_secs(10),
        "the shares add up to the capacity again",
        || matches!((share(&a), share(&b)), (Some(x), Some(y)) if x + y == u64::from(CAPACITY) && x > 0 && y > 0),
    );
}
