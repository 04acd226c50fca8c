//! A slow client never stalls the node connection; bad frames never harm the edge.

use std::{
    io::{Read, Write},
    net::TcpStream,
    time::{Duration, Instant},
};

use bytes::BytesMut;
use iop_core::wire::{self, pb};
use serde_json::json;

use crate::harness::*;

#[test]
fn a_client_that_stops_reading_holds_up_only_its_own_run_until_cut() {
    // A flood of tokens with no pacing: the stalled client's socket buffers
    // fill, then its credit window; the node then waits for that run alone.
    let edge = Edge::start(&pool_config_with(
        "idle_timeout_sec = 3",
        "",
        &[mock_node("n1", 4, 0, 500_000, 0)],
        &[mock_model("m", &["n1"], "")],
        "",
    ));
    let _n1 = edge.start_node("n1", "");
    edge.wait_nodes_ready(1);
    let mut events = edge.events();

    let mut stalled = TcpStream::connect(edge.http).unwrap();
    let body = json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "x"}]}).to_string();
    let req = format!("POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\ncontent-length: {}\r\n\r\n{body}", body.len());
    stalled.write_all(req.as_bytes()).unwrap();
    let mut head = [0u8; 64];
    let n = stalled.read(&mut head).unwrap();
    assert!(String::from_utf8_lossy(&head[..n]).starts_with("HTTP/1.1 200"));
    // From here on the client reads nothing.

    // Another run on the same node connection is served normally meanwhile.
    let started = Instant::now();
    let r = post_json(
        edge.http,
        "/v1/chat/completions",
        &json!({"model": "m", "stream": true, "max_tokens": 5, "messages": [{"role": "user", "content": "y"}]}),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.sse_data().last().map(String::as_str), Some("[DONE]"));
    assert!(started.elapsed() < Duration::from_secs(3), "the other run was stalled: {:?}", started.elapsed());

    // The client that accepts nothing for idle_timeout_sec is cut (without
    // reading a byte meanwhile); its run is cancelled on the node and its
    // lease returned.
    let cut = events.wait("run_terminal", Duration::from_secs(10), |e| e["outcome"] == "cancelled");
    assert_eq!(cut["model"], "m");
    assert!(closed_within(&mut stalled, Duration::from_secs(10)), "the stalled client was never cut");
    let snap = edge.wait_snapshot(Duration::from_secs(5), "the stalled client's lease was released", |s| {
        provider_of(s, "n1", "mock")["leases_in_use"] == 0
    });
    assert_eq!(provider_of(&snap, "n1", "mock")["live_leases"], 0, "{snap:#}");
    edge.assert_idle();
}

#[test]
fn a_slow_reader_gets_its_whole_stream_while_a_fast_one_runs_at_full_speed() {
    // 100 000 unpaced tokens (~13 MB of SSE): many windows, and more than a
    // per-stream buffer would ever hold, so the slow reader lives on credit.
    let edge = Edge::start(&pool_config(&[mock_node("n1", 4, 0, 100_000, 0)], &[mock_model("m", &["n1"], "")], ""));
    let _n1 = edge.start_node("n1", "");
    edge.wait_nodes_ready(1);
    let body = json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "x"}]}).to_string();
    let addr = edge.http;
    // Far slower than the node produces, in small reads.
    let slow =
        std::thread::spawn(move || read_slowly(addr, "/v1/chat/completions", &body, |_| Duration::from_millis(2)));
    // Meanwhile fast streams on the same node, one after another.
    std::thread::sleep(Duration::from_millis(300));
    for _ in 0..3 {
        let started = Instant::now();
        let r = post_json(
            edge.http,
            "/v1/chat/completions",
            &json!({"model": "m", "stream": true, "max_tokens": 2000, "messages": [{"role": "user", "content": "y"}]}),
        );
        assert_eq!(r.status, 200);
        assert_eq!(r.sse_data().len(), 2000 + 3, "role, 2000 tokens, finish, [DONE]");
        assert!(started.elapsed() < Duration::from_secs(2), "the fast stream waited: {:?}", started.elapsed());
    }
    let r = slow.join().unwrap();
    assert_eq!(r.status, 200);
    let data = r.sse_data();
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "the slow reader was not failed");
    let text: String = data[..data.len() - 1]
        .iter()
        .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(text.matches("tok").count(), 100_000);
    edge.assert_idle();
}

/// Reads until the peer closes; true if it did within `within`.
fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).unwrap();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + within;
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
        if Instant::now() > deadline {
            return false;
        }
    }
}

fn frame(body: pb::envelope::Body) -> Vec<u8> {
    let mut out = BytesMut::new();
    wire::encode(&pb::Envelope { correlation_id: 1, body: Some(body) }, &mut out, 1 << 20).unwrap();
    out.to_vec()
}

#[test]
fn bad_frames_close_only_their_connection() {
    let edge = Edge::start(&pool_config(&[mock_node("n1", 2, 0, 3, 0)], &[mock_model("m", &["n1"], "")], ""));

    // Garbage bytes.
    let mut s = TcpStream::connect(edge.nodes).unwrap();
    s.write_all(b"\x00\x00\x00\x05hello, this is not protobuf at all").unwrap();
    assert!(closed_within(&mut s, Duration::from_secs(5)), "garbage should close the connection");

    // A length prefix far above the frame limit: refused before any body arrives.
    let mut s = TcpStream::connect(edge.nodes).unwrap();
    s.write_all(&u32::MAX.to_be_bytes()).unwrap();
    assert!(closed_within(&mut s, Duration::from_secs(5)), "an oversize frame should close the connection");

    // Registered, then a frame the edge must never receive before ready.
    let mut s = TcpStream::connect(edge.nodes).unwrap();
    s.write_all(&frame(pb::envelope::Body::RegisterRequest(pb::RegisterRequest {
        token: node_token("n1"),
        node_version: "test".into(),
        ..Default::default()
    })))
    .unwrap();
    s.write_all(&frame(pb::envelope::Body::RunRequest(pb::RunRequest::default()))).unwrap();
    assert!(closed_within(&mut s, Duration::from_secs(5)), "a protocol violation should close the connection");

    // The registration was released: the real node registers and serves.
    let _n1 = edge.start_node("n1", "");
    edge.wait_nodes_ready(1);
    let r = post_json(
        edge.http,
        "/v1/chat/completions",
        &json!({"model": "m", "messages": [{"role": "user", "content": "x"}]}),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    edge.assert_idle();
}

#[test]
fn an_unpaced_burst_reaches_a_reading_client_whole() {
    // No pacing at all: the node sends events as fast as it can; a client
    // that keeps reading must get every one of them, not a slow-consumer error.
    let edge = Edge::start(&pool_config(&[mock_node("n1", 4, 0, 20_000, 0)], &[mock_model("m", &["n1"], "")], ""));
    let _n1 = edge.start_node("n1", "");
    edge.wait_nodes_ready(1);
    for stream in [true, false] {
        let r = post_json(
            edge.http,
            "/v1/chat/completions",
            &json!({"model": "m", "stream": stream, "messages": [{"role": "user", "content": "x"}]}),
        );
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body[..r.body.len().min(500)]));
        let text = if stream {
            let data = r.sse_data();
            assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
            data[..data.len() - 1]
                .iter()
                .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
                .filter_map(|c| c["choices"][0]["delta"]["content"].as_str().map(str::to_owned))
                .collect::<String>()
        } else {
            r.json()["choices"][0]["message"]["content"].as_str().unwrap().to_owned()
        };
        assert_eq!(text.matches("tok").count(), 20_000);
        assert!(text.ends_with("tok19999 "));
    }
    edge.assert_idle();
}
