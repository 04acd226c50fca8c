//! Hostile HTTP clients: trickled heads, stalled and trickled bodies, idle
//! connection floods, the connection cap, the in-flight body budget, and
//! the small HTTP details. While each attack runs a well-behaved client is
//! served in under a second and the edge's RSS stays within 100 MiB of idle.

use std::{
    io::{Read, Write},
    net::TcpStream,
    time::{Duration, Instant},
};

use serde_json::json;

use crate::{attack::*, harness::*};

/// An edge with `http` keys, one ready mock node `n1` (model `m`) and the
/// node's idle RSS measured after a warm-up request.
fn edge_with(http: &str) -> (Edge, Proc, u64) {
    let edge =
        Edge::start(&pool_config_with(http, "", &[mock_node("n1", 64, 0, 3, 0)], &[mock_model("m", &["n1"], "")], ""));
    let node = edge.start_node("n1", "");
    edge.wait_nodes_ready(1);
    assert_served_quickly(edge.http, "m");
    let idle = edge.proc.rss_kib();
    (edge, node, idle)
}

#[test]
fn slowloris_heads_get_408_at_the_header_deadline() {
    let _machine = exclusive();
    let (edge, _node, idle) = edge_with("header_timeout_sec = 2");
    let head = format!("GET /healthz HTTP/1.1\r\nhost: x\r\nx-slow: {}\r\n\r\n", "a".repeat(4000));
    let addr = edge.http;
    let (outcomes, peak) = while_attacked(&edge, "m", 5, move || {
        // One byte every 300 ms: each byte used to restart the idle timer.
        trickle(addr, 500, head.as_bytes(), 0, Duration::from_millis(300), Duration::from_secs(10))
    });
    assert_rss_bounded("slowloris", idle, peak);
    let unanswered: Vec<_> = outcomes.iter().filter(|o| o.status().is_none()).collect();
    assert!(unanswered.is_empty(), "{} unanswered, e.g. {:?}", unanswered.len(), unanswered.first());
    for o in &outcomes {
        assert_eq!(o.status(), Some(408), "{:?}", String::from_utf8_lossy(&o.response));
        let answered = o.answered.expect("answered");
        assert!(answered >= Duration::from_millis(1800) && answered < Duration::from_millis(3500), "{answered:?}");
        assert!(o.closed.is_some(), "the connection was closed");
    }
    assert_served_quickly(edge.http, "m");
}

#[test]
fn stalled_and_trickled_bodies_get_408() {
    let _machine = exclusive();
    let (edge, _node, idle) =
        edge_with("header_timeout_sec = 5\nbody_timeout_sec = 1\nread_timeout_sec = 3\nmax_body_bytes = 65536");
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "x".repeat(200)}]}).to_string();
    let request =
        format!("POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n{body}", body.len());
    let head_len = request.len() - body.len();
    let addr = edge.http;
    let (stalled, peak) = {
        let request = request.clone();
        while_attacked(&edge, "m", 4, move || {
            // 8 bytes of the body, then silence.
            trickle(addr, 300, request.as_bytes(), head_len + 8, Duration::from_secs(3600), Duration::from_secs(8))
        })
    };
    assert_rss_bounded("stalled bodies", idle, peak);
    for o in &stalled {
        assert_eq!(o.status(), Some(408), "{:?}", String::from_utf8_lossy(&o.response));
        let answered = o.answered.expect("answered");
        assert!(answered >= Duration::from_millis(900) && answered < Duration::from_millis(2500), "{answered:?}");
        assert!(o.closed.is_some());
    }
    // A body making progress every 400 ms never trips the progress timeout,
    // but the whole request must still arrive within read_timeout_sec.
    let trickled = trickle(addr, 5, request.as_bytes(), head_len, Duration::from_millis(400), Duration::from_secs(8));
    for o in &trickled {
        assert_eq!(o.status(), Some(408), "{:?}", String::from_utf8_lossy(&o.response));
        let answered = o.answered.expect("answered");
        assert!(answered >= Duration::from_millis(2800) && answered < Duration::from_millis(4500), "{answered:?}");
        assert!(o.sent < request.len(), "the body never completed");
    }
    assert_served_quickly(edge.http, "m");
    edge.assert_idle();
}

#[test]
fn two_thousand_idle_connections_are_cheap_and_closed_at_the_header_deadline() {
    let _machine = exclusive();
    let (edge, _node, idle) = edge_with("header_timeout_sec = 2");
    let addr = edge.http;
    let (conns, peak) = while_attacked(&edge, "m", 5, move || {
        (0..2000).map(|_| TcpStream::connect(addr).expect("connect")).collect::<Vec<_>>()
    });
    assert_rss_bounded("2,000 idle connections", idle, peak);
    // Never sent a byte: closed without an answer once the head is overdue.
    let started = Instant::now();
    for mut c in conns {
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 64];
        match c.read(&mut buf) {
            Ok(0) => {}
            Ok(n) => panic!("an idle connection got an answer: {:?}", String::from_utf8_lossy(&buf[..n])),
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
        }
    }
    assert!(started.elapsed() < Duration::from_secs(4), "idle connections closed late: {:?}", started.elapsed());
    assert_served_quickly(edge.http, "m");
}

#[test]
fn connections_beyond_the_cap_are_refused_at_once_with_one_log_line() {
    let _machine = exclusive();
    let (edge, _node, _idle) = edge_with("max_connections = 40");
    // 40 keep-alive connections, each known to be accepted (it was answered).
    let held: Vec<TcpStream> = (0..40)
        .map(|_| {
            let mut s = TcpStream::connect(edge.http).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            s.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n").unwrap();
            let mut buf = Vec::new();
            let _ = crate::hostile_peers::read_one_response(&mut s, &mut buf);
            s
        })
        .collect();
    assert!(closed_at_once(edge.http), "the 41st connection was accepted");
    let refused_at = Instant::now();
    for _ in 0..200 {
        assert!(closed_at_once(edge.http), "a connection over the cap was accepted");
    }
    assert!(refused_at.elapsed() < Duration::from_secs(2), "refusals were slow: {:?}", refused_at.elapsed());
    let lines = edge.proc.log_text().matches("client connection limit (http.max_connections) reached").count();
    assert_eq!(lines, 1, "the refusals logged {lines} lines (one per interval)");
    // Once the held connections are gone, clients are served again.
    drop(held);
    // Until the edge has read the held connections' EOF, a new one is still
    // refused (reset): that is "not yet", not a failure.
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "x"}]}).to_string();
    eventually(Duration::from_secs(3), "slots freed", || {
        let head = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        let Ok(mut s) = TcpStream::connect(edge.http) else { return false };
        let mut raw = Vec::new();
        s.set_read_timeout(Some(Duration::from_secs(5))).is_ok()
            && s.write_all(head.as_bytes()).is_ok()
            && s.write_all(body.as_bytes()).is_ok()
            && s.read_to_end(&mut raw).is_ok()
            && raw.starts_with(b"HTTP/1.1 200")
    });
}

/// A new connection is closed by the edge without a byte.
fn closed_at_once(addr: std::net::SocketAddr) -> bool {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    let mut buf = [0u8; 16];
    match s.read(&mut buf) {
        Ok(0) => true,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        Ok(_) => false,
    }
}

#[test]
fn stalled_bodies_beyond_the_descriptor_limit_lock_nobody_out() {
    let _machine = exclusive();
    // The setup: an edge limited to 300 descriptors, 320 stalled bodies.
    let config = pool_config_with(
        "body_timeout_sec = 2",
        "",
        &[mock_node("n1", 64, 0, 3, 0)],
        &[mock_model("m", &["n1"], "")],
        "",
    );
    let edge = Edge::start_with_nofile(&config, 300);
    let _node = edge.start_node("n1", "");
    edge.wait_nodes_ready(1);
    assert!(edge.proc.log_text().contains("max_connections=263"), "the cap follows the descriptor limit");
    let body = "{\"model\":\"m\",\"messages\":[]}".repeat(4);
    let request = format!("POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{}", &body[..8]);
    let stalled =
        trickle(edge.http, 320, request.as_bytes(), request.len(), Duration::from_secs(3600), Duration::from_secs(6));
    let timed_out = stalled.iter().filter(|o| o.status() == Some(408)).count();
    let refused = stalled
        .iter()
        .filter(|o| o.response.is_empty() && o.closed.is_some_and(|c| c < Duration::from_secs(1)))
        .count();
    assert!(timed_out >= 250, "{timed_out} got 408");
    assert_eq!(timed_out + refused, 320, "every connection was answered or refused at once: {stalled:?}");
    let log = edge.proc.log_text();
    assert_eq!(log.matches("client accept failed").count(), 0, "descriptors ran out:\n{log}");
    assert!(log.matches("client connection limit").count() <= 1);
    // The stalled ones are gone: clients are served again.
    assert_served_quickly(edge.http, "m");
}

/// One `POST` of a `len`-byte JSON body for a model that does not exist.
fn big_unknown_model_request(addr: std::net::SocketAddr, len: usize) -> (u16, Option<String>) {
    let filler = "x".repeat(len - 80);
    let body = json!({"model": "no-such-model", "messages": [{"role": "user", "content": filler}]}).to_string();
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    let _ = s.write_all(body.as_bytes());
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let r = parse_response(&raw);
    let retry = r.header("retry-after").map(str::to_owned);
    (r.status, retry)
}

#[test]
fn the_in_flight_body_budget_bounds_memory_and_gives_it_back() {
    let _machine = exclusive();
    let (edge, _node, idle) = edge_with("max_body_bytes = 4194304");
    let addr = edge.http;
    let (results, peak) = while_attacked(&edge, "m", 3, move || {
        let threads: Vec<_> =
            (0..40).map(|_| std::thread::spawn(move || big_unknown_model_request(addr, 4 << 20))).collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect::<Vec<_>>()
    });
    assert_rss_bounded("40 concurrent 4 MiB bodies", idle, peak);
    for (status, retry) in &results {
        match status {
            404 => {}
            503 => assert_eq!(retry.as_deref(), Some("1")),
            other => panic!("unexpected status {other}: {results:?}"),
        }
    }
    assert!(results.iter().any(|(s, _)| *s == 404), "some bodies were taken: {results:?}");
    // After the burst the memory goes back.
    eventually(Duration::from_secs(10), "RSS back near idle", || edge.proc.rss_kib() < idle + 24 * 1024);
    assert_served_quickly(edge.http, "m");
}

#[test]
fn http_details_head_allow_chunk_framing_and_bounded_echoes() {
    let _machine = exclusive();
    let (edge, _node, _idle) = edge_with("");
    // HEAD: the GET head, no body.
    for path in ["/healthz", "/v1/models"] {
        let get = request(edge.http, "GET", path, None, &[]);
        let head = request(edge.http, "HEAD", path, None, &[]);
        assert_eq!(head.status, 200);
        assert!(head.body.is_empty(), "HEAD {path} got a body: {:?}", String::from_utf8_lossy(&head.body));
        assert_eq!(head.header("content-length"), get.header("content-length"));
    }
    // 405 names the allowed methods.
    let r = request(edge.http, "POST", "/healthz", Some(b"{}"), &[]);
    assert_eq!((r.status, r.header("allow")), (405, Some("GET, HEAD")));
    let r = request(edge.http, "GET", "/v1/chat/completions", None, &[]);
    assert_eq!((r.status, r.header("allow")), (405, Some("POST")));
    assert_eq!(r.json()["error"]["code"], "method_not_allowed");
    // A bare LF inside a chunk extension is refused.
    let mut s = TcpStream::connect(edge.http).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n2;a\nb\r\n{}\r\n0\r\n\r\n",
    )
    .unwrap();
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    assert_eq!(parse_response(&raw).status, 400, "{}", String::from_utf8_lossy(&raw));
    // An unknown model name of any size is not echoed whole.
    let long = "m".repeat(100_000);
    let r = post_json(
        edge.http,
        "/v1/chat/completions",
        &json!({"model": long, "messages": [{"role": "user", "content": "x"}]}),
    );
    assert_eq!(r.status, 404);
    let msg = r.json()["error"]["message"].as_str().unwrap().to_owned();
    assert!(msg.len() < 300, "{} bytes echoed", msg.len());
    // Neither is a long path.
    let r = request(edge.http, "GET", &format!("/{}", "p".repeat(3000)), None, &[]);
    assert_eq!(r.status, 404);
    assert!(r.body.len() < 600, "{} bytes", r.body.len());
}
