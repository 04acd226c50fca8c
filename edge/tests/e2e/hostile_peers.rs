//! Hostile peers: unauthenticated frames on the node listener, a flood of
//! handshakes, a node that never answers, clients that never read a
//! large-delta stream, an upstream that hangs up after reading a request,
//! and token floods. While each attack runs a well-behaved client is served
//! in under a second and the edge's RSS stays within 100 MiB of idle.

use std::{
    io::{Read, Write},
    net::{IpAddr, SocketAddr, TcpStream},
    sync::mpsc,
    time::{Duration, Instant},
};

use bytes::BytesMut;
use iop_core::wire::{self, pb, pb::envelope::Body};
use serde_json::json;

use crate::{attack::*, harness::*};

const OTHER_LOOPBACK: &str = "127.0.0.2";

fn other() -> IpAddr {
    OTHER_LOOPBACK.parse().unwrap()
}

pub fn send_frame(s: &mut TcpStream, body: Body) {
    let mut out = BytesMut::new();
    wire::encode(&pb::Envelope { correlation_id: 1, body: Some(body) }, &mut out, 1 << 24).unwrap();
    s.write_all(&out).unwrap();
}

/// Next frame, or None when the connection ends (or `within` passes).
pub fn read_frame(s: &mut TcpStream, buf: &mut BytesMut, within: Duration) -> Option<pb::Envelope> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(env) = wire::decode(buf, 1 << 24).expect("valid frame") {
            return Some(env);
        }
        let left = deadline.checked_duration_since(Instant::now())?;
        s.set_read_timeout(Some(left.max(Duration::from_millis(1)))).unwrap();
        let mut chunk = [0u8; 16 * 1024];
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// True when the peer closes within `within` (EOF or reset).
pub fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).unwrap();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
    false
}

/// A registration attempt with `token`; the refusal kind (None = accepted).
pub fn try_register(s: &mut TcpStream, token: &str) -> Option<pb::RegisterRefusal> {
    send_frame(
        s,
        Body::RegisterRequest(pb::RegisterRequest {
            token: token.into(),
            node_version: "fake".into(),
            ..Default::default()
        }),
    );
    let mut buf = BytesMut::new();
    match read_frame(s, &mut buf, Duration::from_secs(5)).and_then(|e| e.body) {
        Some(Body::RegisterResponse(r)) if r.accepted => None,
        Some(Body::RegisterResponse(r)) => Some(pb::RegisterRefusal::try_from(r.refusal).unwrap()),
        other => panic!("expected a RegisterResponse, got {other:?}"),
    }
}

fn handshake_config(extra_listener: &str) -> String {
    pool_config_with(
        "",
        &format!("handshake_timeout_sec = 2\n{extra_listener}"),
        &[mock_node("n1", 64, 0, 3, 0)],
        &[mock_model("m", &["n1"], "")],
        "",
    )
}

#[test]
fn unauthenticated_big_frames_are_refused_before_any_buffering() {
    let _machine = exclusive();
    let edge = Edge::start(&handshake_config(""));
    let _node = edge.start_node("n1", "");
    edge.wait_nodes_ready(1);
    assert_served_quickly(edge.http, "m");
    let idle = edge.proc.rss_kib();
    let addr = edge.nodes;
    let (trickled, peak) = while_attacked(&edge, "m", 4, move || {
        // Announcing 16 MiB before registering: closed at once.
        for _ in 0..40 {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(&(16u32 << 20).to_be_bytes()).unwrap();
            let _ = s.write_all(&vec![0u8; 1 << 20]);
            assert!(closed_within(&mut s, Duration::from_secs(2)), "a 16 MiB pre-auth frame was accepted");
        }
        // Under the pre-auth limit, announced and almost sent: held only
        // until the handshake deadline, buffered only as it arrives.
        let mut held: Vec<TcpStream> = (0..40)
            .map(|_| {
                let mut s = TcpStream::connect(addr).unwrap();
                s.write_all(&(60u32 << 10).to_be_bytes()).unwrap();
                // On a loaded machine the 2 s deadline may close it before the
                // edge read all of it: the write then breaks, and the check
                // below (closed within the deadline) holds all the more.
                let _ = s.write_all(&vec![0u8; (60 << 10) - 9]);
                s
            })
            .collect();
        let started = Instant::now();
        for s in &mut held {
            assert!(closed_within(s, Duration::from_secs(4)), "held past the handshake deadline");
        }
        started.elapsed()
    });
    assert!(trickled < Duration::from_secs(4), "{trickled:?}");
    assert_rss_bounded("pre-auth frames", idle, peak);
    assert!(peak < idle + 16 * 1024, "pre-auth frames cost {} MiB", (peak - idle) / 1024);
    assert_served_quickly(edge.http, "m");
}

#[test]
fn handshakes_are_capped_and_timed_out() {
    let _machine = exclusive();
    let edge = Edge::start(&handshake_config("max_handshakes = 8"));
    let _node = edge.start_node("n1", "");
    edge.wait_nodes_ready(1);
    let addr = edge.nodes;
    let idle = edge.proc.rss_kib();
    let (closed_early, peak) = while_attacked(&edge, "m", 3, move || {
        let mut silent: Vec<TcpStream> = (0..20).map(|_| TcpStream::connect(addr).unwrap()).collect();
        let mut early = 0;
        for s in &mut silent {
            if closed_within(s, Duration::from_millis(100)) {
                early += 1;
            }
        }
        // The rest are cut at the handshake deadline.
        for s in &mut silent {
            assert!(
                closed_within(s, Duration::from_secs(4)),
                "a silent node connection outlived the handshake deadline"
            );
        }
        early
    });
    assert!(closed_early >= 12, "only {closed_early} of 20 were refused at once with 8 allowed");
    assert_rss_bounded("a handshake flood", idle, peak);
    // Slots are free again: a new node connection can register.
    let mut s = TcpStream::connect(edge.nodes).unwrap();
    assert_eq!(try_register(&mut s, "wrong"), Some(pb::RegisterRefusal::UnknownToken));
    assert_served_quickly(edge.http, "m");
}

/// Registers as node `n1` and reports ready; then answers pings, records
/// run requests and cancels, and never answers a run.
fn silent_node(addr: SocketAddr) -> mpsc::Receiver<Body> {
    scripted_node(addr, |_| Vec::new())
}

/// [`silent_node`], answering each run with the frames `answer` makes of it.
fn scripted_node(
    addr: SocketAddr,
    answer: impl Fn(&pb::RunRequest) -> Vec<Body> + Send + 'static,
) -> mpsc::Receiver<Body> {
    let mut s = TcpStream::connect(addr).unwrap();
    assert_eq!(try_register(&mut s, &node_token("n1")), None);
    send_frame(
        &mut s,
        Body::NodeReadyRequest(pb::NodeReadyRequest { node_id: "n1".into(), config_revision: 1, ..Default::default() }),
    );
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = BytesMut::new();
        while let Some(env) = read_frame(&mut s, &mut buf, Duration::from_secs(60)) {
            let Some(body) = env.body else { continue };
            if let Body::Heartbeat(hb) = &body {
                if hb.ping {
                    send_frame(&mut s, Body::Heartbeat(pb::Heartbeat { ping: false, sent_at_ms: hb.sent_at_ms }));
                }
            } else if matches!(body, Body::NodeCommandRequest(_)) {
                // The edge's first probe of each provider: never answered.
            } else {
                if let Body::RunRequest(req) = &body {
                    for frame in answer(req) {
                        send_frame(&mut s, frame);
                    }
                }
                if tx.send(body).is_err() {
                    return;
                }
            }
        }
    });
    rx
}

/// An edge whose model `m` runs on node `n1`'s mock provider (`extra`:
/// more of its keys), for a test that plays `n1` by hand.
fn edge_of_hand_driven_n1(extra: &str) -> Edge {
    let node = format!(
        "[[nodes]]\nid = \"n1\"\ntoken = \"{}\"\n[[nodes.providers]]\nid = \"mock\"\nkind = \"mock\"\ncapacity = 4\n{extra}",
        node_token("n1")
    );
    Edge::start(&pool_config(&[node], &[mock_model("m", &["n1"], "")], ""))
}

#[test]
fn a_node_that_never_answers_runs_into_the_edge_deadline() {
    let _machine = exclusive();
    let edge = edge_of_hand_driven_n1("request_timeout_sec = 1\n");
    let frames = silent_node(edge.nodes);
    assert!(matches!(frames.recv_timeout(Duration::from_secs(5)), Ok(Body::NodeReadyResponse(r)) if r.ready));
    edge.wait_nodes_ready(1);
    for stream in [false, true] {
        let started = Instant::now();
        let r = post_json(
            edge.http,
            "/v1/chat/completions",
            &json!({"model": "m", "stream": stream, "messages": [{"role": "user", "content": "x"}]}),
        );
        let took = started.elapsed();
        assert_eq!(r.status, 504, "{}", String::from_utf8_lossy(&r.body));
        assert_eq!(r.json()["error"]["code"], "deadline_exceeded");
        assert!(took >= Duration::from_secs(1) && took < Duration::from_secs(4), "{took:?}");
        // The run reached the node, then was cancelled there for its deadline.
        let run = match frames.recv_timeout(Duration::from_secs(1)) {
            Ok(Body::RunRequest(req)) => req,
            other => panic!("expected the run request, got {other:?}"),
        };
        assert!(run.deadline_ms > 0, "the deadline travels with the run");
        match frames.recv_timeout(Duration::from_secs(2)) {
            Ok(Body::CancelRequest(c)) => assert_eq!((c.run_id, c.reason.as_str()), (run.run_id, "deadline_exceeded")),
            other => panic!("expected a cancel, got {other:?}"),
        }
    }
    // Each lease was released exactly once.
    edge.assert_idle();
}

#[test]
fn a_token_that_is_not_utf8_ends_its_stream_alone_and_is_cancelled_on_the_node() {
    use prost::Message;
    let _machine = exclusive();
    let edge = edge_of_hand_driven_n1("");
    // One frame of tokens in their shortest form, the third not UTF-8:
    // the edge reads them where they arrived, so it finds out late.
    let token = |text: &[u8]| {
        let ev = pb::RunEvent {
            kind: Some(pb::run_event::Kind::Delta(pb::TextDelta { text: String::from_utf8_lossy(text).into() })),
            ..Default::default()
        };
        let mut raw = ev.encode_to_vec();
        let at = raw.len() - text.len();
        raw[at..].copy_from_slice(text);
        bytes::Bytes::from(raw)
    };
    let frames = scripted_node(edge.nodes, move |req| {
        let events = vec![token(b"tok0 "), token(b"tok1 "), token(b"b\xffd"), token(b"tok3 ")];
        vec![Body::RunEvents(pb::RunEvents { run_id: req.run_id.clone().into(), seq: 0, events })]
    });
    assert!(matches!(frames.recv_timeout(Duration::from_secs(5)), Ok(Body::NodeReadyResponse(r)) if r.ready));
    edge.wait_nodes_ready(1);
    let t = Chat::stream(edge.http, "m").join();
    assert_eq!(t.resp.status, 200);
    assert_eq!(t.content(), "tok0 tok1 ", "{}", t.resp_text());
    let (_, last) = t.last();
    let err: serde_json::Value = serde_json::from_str(last).unwrap_or_else(|_| panic!("{}", t.resp_text()));
    assert_eq!(err["error"]["message"], "node sent a malformed run event", "{}", t.resp_text());
    let run = match frames.recv_timeout(Duration::from_secs(2)) {
        Ok(Body::RunRequest(req)) => req,
        other => panic!("expected the run request, got {other:?}"),
    };
    match frames.recv_timeout(Duration::from_secs(2)) {
        Ok(Body::CancelRequest(c)) => assert_eq!((c.run_id, c.reason.as_str()), (run.run_id, "protocol_violation")),
        other => panic!("expected a cancel, got {other:?}"),
    }
    // Its lease went back.
    edge.assert_idle();
}

#[test]
fn a_stream_past_its_deadline_ends_with_a_typed_error() {
    let _machine = exclusive();
    // The first token at once, the next ones 5 s apart: the 1 s deadline
    // passes mid-stream, after the client already has bytes.
    let node = format!(
        "[[nodes]]\nid = \"n1\"\ntoken = \"{}\"\n[[nodes.providers]]\nid = \"mock\"\nkind = \"mock\"\ncapacity = 4\n\
         request_timeout_sec = 1\n[nodes.providers.mock]\ntokens = 5\ntoken_interval_ms = 5000\n",
        node_token("n1")
    );
    let edge = Edge::start(&pool_config(&[node], &[mock_model("m", &["n1"], "")], ""));
    let _n1 = edge.start_node("n1", "");
    edge.wait_nodes_ready(1);
    let started = Instant::now();
    let t = Chat::stream(edge.http, "m").join();
    assert_eq!(t.resp.status, 200);
    assert!(t.content().starts_with("tok0 "), "{}", t.resp_text());
    let (_, last) = t.last();
    let err: serde_json::Value = serde_json::from_str(last).unwrap_or_else(|_| panic!("{}", t.resp_text()));
    assert!(
        ["deadline_exceeded", "upstream_timeout"].contains(&err["error"]["code"].as_str().unwrap_or("")),
        "{}",
        t.resp_text()
    );
    // The body ended cleanly (the last chunk arrived) well before the tokens would have.
    assert!(started.elapsed() < Duration::from_secs(4), "{:?}", started.elapsed());
    edge.assert_idle();
}

/// An openai_compat provider entry.
fn compat_provider(id: &str, base_url: &str) -> String {
    format!("[[nodes.providers]]\nid = \"{id}\"\nkind = \"openai_compat\"\nbase_url = \"{base_url}\"\ncapacity = 16\n")
}

fn compat_model(name: &str, provider: &str) -> String {
    format!("[[models]]\nname = \"{name}\"\nnode = \"n1\"\nprovider = \"{provider}\"\nupstream_model = \"mock\"\n")
}

/// Clients that never read, each on a stream of 1 MiB deltas.
const NEVER_READING: usize = 3;

#[test]
fn clients_that_never_read_large_deltas_fail_alone_with_bounded_memory() {
    let _machine = exclusive();
    // Unpaced 1 MiB deltas: the upstream sends as fast as the node reads.
    let big = MockProv::start(&["--token-bytes", "1048576", "--tokens", "5000"]);
    let small = MockProv::start(&["--tokens", "3"]);
    let node = format!(
        "[[nodes]]\nid = \"n1\"\ntoken = \"{}\"\n{}{}",
        node_token("n1"),
        compat_provider("big", &big.base_url()),
        compat_provider("small", &small.base_url())
    );
    let edge = Edge::start(&pool_config_with(
        "idle_timeout_sec = 3",
        "",
        &[node],
        &[compat_model("big", "big"), compat_model("m", "small")],
        "",
    ));
    let _n1 = edge.start_node("n1", "");
    edge.wait_nodes_ready(1);
    assert_served_quickly(edge.http, "m");
    let idle = edge.proc.rss_kib();
    let addr = edge.http;
    let (held, peak) = while_attacked(&edge, "m", 6, move || {
        (0..NEVER_READING)
            .map(|_| {
                let mut s = TcpStream::connect(addr).unwrap();
                let body =
                    json!({"model": "big", "stream": true, "messages": [{"role": "user", "content": "x"}]}).to_string();
                let req = format!(
                    "POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
                s.write_all(req.as_bytes()).unwrap();
                let mut head = [0u8; 16];
                s.read_exact(&mut head).unwrap();
                assert!(head.starts_with(b"HTTP/1.1 200"));
                // From here on this client reads nothing.
                s
            })
            .collect::<Vec<_>>()
    });
    // Each stalled run failed alone: its lease is back and the node closed its upstream request.
    edge.wait_snapshot(Duration::from_secs(20), "the stalled runs released their leases", |s| {
        provider_of(s, "n1", "big")["leases_in_use"] == 0
    });
    eventually(Duration::from_secs(10), "the upstream requests were closed", || {
        big.stats()["early_closed"].as_u64() == Some(NEVER_READING as u64)
    });
    let peak_after = RssPeak::start(&edge.proc);
    // The edge cuts the clients that accept nothing for idle_timeout_sec.
    std::thread::sleep(Duration::from_secs(4));
    let peak = peak.max(peak_after.stop());
    assert_rss_bounded("never-reading clients on 1 MiB deltas", idle, peak);
    drop(held);
    assert_served_quickly(edge.http, "m");
    edge.assert_idle();
}

#[test]
fn a_request_the_upstream_read_is_never_replayed() {
    let _machine = exclusive();
    let mock = MockProv::start(&["--tokens", "3"]);
    let node = format!(
        "[[nodes]]\nid = \"n1\"\ntoken = \"{}\"\n{}",
        node_token("n1"),
        compat_provider("up", &mock.base_url())
    );
    let edge = Edge::start(&pool_config(&[node], &[compat_model("m", "up")], ""));
    let _n1 = edge.start_node("n1", "");
    edge.wait_nodes_ready(1);
    let ask = |extra: serde_json::Value| {
        let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "x"}]});
        body["mock"] = extra;
        post_json(edge.http, "/v1/chat/completions", &body)
    };
    assert_eq!(ask(json!({})).status, 200);
    // Read on the pooled connection, then the upstream closes without answering.
    let r = ask(json!({"hangup": true}));
    assert_eq!(r.status, 502, "{}", String::from_utf8_lossy(&r.body));
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(mock.stats()["requests"], 2, "the upstream received the request exactly once");
    assert_eq!(ask(json!({})).status, 200);
    assert_eq!(mock.stats()["requests"], 3);
    edge.assert_idle();
}

#[test]
fn token_floods_are_refused_without_slowing_nodes_or_clients() {
    let _machine = exclusive();
    let edge = Edge::start(&handshake_config(""));
    let mut n1 = edge.start_node("n1", "");
    edge.wait_nodes_ready(1);
    let nodes = edge.nodes;
    let idle = edge.proc.rss_kib();
    let (kinds, peak) = while_attacked(&edge, "m", 4, move || {
        (0..500)
            .map(|_| {
                let mut s = connect_from(other(), nodes);
                try_register(&mut s, "guess")
            })
            .collect::<Vec<_>>()
    });
    let unknown = kinds.iter().filter(|k| **k == Some(pb::RegisterRefusal::UnknownToken)).count();
    let limited = kinds.iter().filter(|k| **k == Some(pb::RegisterRefusal::RateLimited)).count();
    assert!(unknown <= 12, "{unknown} tokens were checked from one address");
    assert_rss_bounded("a node token flood", idle, peak);
    assert_eq!(unknown + limited, 500);
    // A right token is checked before the failure limit, so the flooding
    // address still gets it compared (and refused only as a second
    // connection of the live node).
    let mut s = connect_from(other(), edge.nodes);
    assert_eq!(try_register(&mut s, &node_token("n1")), Some(pb::RegisterRefusal::DuplicateConnection));
    n1.kill9();
    edge.wait_nodes_ready(0);
    let _n1 = edge.start_node("n1", "");
    edge.wait_nodes_ready(1);
    assert_served_quickly(edge.http, "m");

    // 2,000 wrong admin tokens on one keep-alive connection.
    let http = edge.http;
    let (statuses, peak) = while_attacked(&edge, "m", 4, move || {
        let mut s = connect_from(other(), http);
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut statuses = Vec::new();
        let mut buf = Vec::new();
        for _ in 0..2000 {
            s.write_all(b"GET /admin/v1/nodes HTTP/1.1\r\nhost: x\r\nauthorization: Bearer guess\r\n\r\n").unwrap();
            statuses.push(read_one_response(&mut s, &mut buf));
        }
        statuses
    });
    let denied = statuses.iter().filter(|(s, _)| *s == 401).count();
    assert!(denied <= 12, "{denied} admin tokens were checked from one address");
    assert_rss_bounded("an admin token flood", idle, peak);
    assert!(statuses.iter().filter(|(s, _)| *s == 429).all(|(_, retry)| retry.is_some()));
    assert_eq!(denied + statuses.iter().filter(|(s, _)| *s == 429).count(), 2000);
    // The admin API still answers the right token from another address.
    assert_eq!(edge.admin("/admin/v1/nodes").status, 200);
}

/// Reads one Content-Length response from a keep-alive connection; its
/// status and `Retry-After`.
pub fn read_one_response(s: &mut TcpStream, buf: &mut Vec<u8>) -> (u16, Option<String>) {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_string();
            let len: usize = head
                .lines()
                .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse().unwrap()))
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                let r = parse_response(&buf[..end + 4 + len]);
                buf.drain(..end + 4 + len);
                return (r.status, r.header("retry-after").map(str::to_owned));
            }
        }
        let mut chunk = [0u8; 8192];
        let n = s.read(&mut chunk).expect("response");
        assert!(n > 0, "connection closed");
        buf.extend_from_slice(&chunk[..n]);
    }
}
