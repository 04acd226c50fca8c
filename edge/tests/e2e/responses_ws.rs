//! The Responses API's WebSocket mode: `GET /v1/responses` upgraded, then
//! `response.create` messages answered one after another as JSON text
//! frames, with the socket's own limits (handshake checks, ping/pong,
//! close codes, message size, idle deadline, a cap on sockets). A small
//! client written here speaks the frames; the official `openai` SDK's
//! `responses.connect()` runs the same against every kind of provider.

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    time::Duration,
};

use serde_json::{json, Value};

use crate::harness::*;

/// A WebSocket client: masked frames out, the server's frames in.
struct Ws {
    s: TcpStream,
    /// Bytes read past the last frame.
    buf: Vec<u8>,
}

/// A server frame: `(opcode, payload)`.
type Frame = (u8, Vec<u8>);

impl Ws {
    /// Opens `/v1/responses` with `extra` handshake headers; the status and
    /// head of the answer, and the socket when it was upgraded.
    fn open(addr: SocketAddr, extra: &[(&str, &str)]) -> (u16, String, Option<Ws>) {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut req =
            "GET /v1/responses HTTP/1.1\r\nhost: t\r\nupgrade: websocket\r\nconnection: Upgrade\r\n".to_owned();
        let defaults = [("sec-websocket-version", "13"), ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")];
        for (k, v) in defaults.iter().filter(|(k, _)| !extra.iter().any(|(e, _)| e == k)).chain(extra) {
            if !v.is_empty() {
                req.push_str(&format!("{k}: {v}\r\n"));
            }
        }
        req.push_str("\r\n");
        s.write_all(req.as_bytes()).unwrap();
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        let end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let n = s.read(&mut chunk).unwrap();
            assert!(n > 0, "closed before the answer's head");
            buf.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
        let status: u16 = head.split(' ').nth(1).unwrap().parse().unwrap();
        let rest = buf[end..].to_vec();
        let ws = (status == 101).then(|| Ws { s, buf: rest });
        (status, head, ws)
    }

    fn send(&mut self, opcode: u8, payload: &[u8]) {
        let mask = [0x11u8, 0x22, 0x33, 0x44];
        let mut f = vec![0x80 | opcode];
        match payload.len() {
            n if n < 126 => f.push(0x80 | n as u8),
            n if n < 65536 => {
                f.push(0x80 | 126);
                f.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                f.push(0x80 | 127);
                f.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        f.extend_from_slice(&mask);
        f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        // The server may close before it has read it all (a too-big message).
        let _ = self.s.write_all(&f);
    }

    fn send_json(&mut self, v: &Value) {
        self.send(1, v.to_string().as_bytes());
    }

    fn fill(&mut self, n: usize) -> bool {
        let mut chunk = [0u8; 65536];
        while self.buf.len() < n {
            match self.s.read(&mut chunk) {
                Ok(0) | Err(_) => return false,
                Ok(k) => self.buf.extend_from_slice(&chunk[..k]),
            }
        }
        true
    }

    /// The next frame; `None` when the socket closed.
    fn recv(&mut self) -> Option<Frame> {
        if !self.fill(2) {
            return None;
        }
        let (b0, b1) = (self.buf[0], self.buf[1]);
        assert_eq!(b1 & 0x80, 0, "server frames are not masked");
        let (len, at) = match b1 & 0x7f {
            126 => {
                self.fill(4);
                (u16::from_be_bytes([self.buf[2], self.buf[3]]) as usize, 4)
            }
            127 => {
                self.fill(10);
                (u64::from_be_bytes(self.buf[2..10].try_into().unwrap()) as usize, 10)
            }
            n => (n as usize, 2),
        };
        assert!(self.fill(at + len), "cut inside a frame");
        let payload = self.buf[at..at + len].to_vec();
        self.buf.drain(..at + len);
        Some((b0 & 0x0f, payload))
    }

    /// The next text message as JSON.
    fn event(&mut self) -> Value {
        let (op, p) = self.recv().expect("the socket closed");
        assert_eq!(op, 1, "a text frame: {:?}", String::from_utf8_lossy(&p));
        serde_json::from_slice(&p).unwrap()
    }

    /// The events of one response, up to its terminal event (or an error).
    fn response(&mut self) -> Vec<Value> {
        let mut out = Vec::new();
        loop {
            let v = self.event();
            let t = v["type"].as_str().unwrap().to_owned();
            out.push(v);
            if ["response.completed", "response.incomplete", "response.failed", "error"].contains(&t.as_str()) {
                return out;
            }
        }
    }

    /// Sends a `response.create` for model `m`: `fields` beside `type` and `model`.
    fn create(&mut self, fields: Value) {
        let mut v = json!({"type": "response.create", "model": "m"});
        v.as_object_mut().unwrap().extend(fields.as_object().unwrap().clone());
        self.send_json(&v);
    }

    /// Every frame up to the first text event for which `stop` holds
    /// (included), control frames among them.
    fn frames_until(&mut self, stop: impl Fn(&Value) -> bool) -> Vec<Frame> {
        let mut out = Vec::new();
        loop {
            let f = self.recv().unwrap_or_else(|| panic!("the socket closed after {:?}", texts(&out)));
            let end = f.0 == 1 && stop(&serde_json::from_slice(&f.1).unwrap());
            out.push(f);
            if end {
                return out;
            }
        }
    }

    /// The close frame's code.
    fn close_code(&mut self) -> u16 {
        loop {
            match self.recv() {
                Some((8, p)) => return u16::from_be_bytes([p[0], p[1]]),
                Some(_) => continue,
                None => panic!("closed without a close frame"),
            }
        }
    }
}

/// The text frames of `frames` as JSON events.
fn texts(frames: &[Frame]) -> Vec<Value> {
    frames.iter().filter(|f| f.0 == 1).map(|f| serde_json::from_slice(&f.1).unwrap()).collect()
}

/// Whether `v` ends a response (or is the error event in its place).
fn ends(v: &Value) -> bool {
    ["response.completed", "response.incomplete", "response.failed", "error"]
        .contains(&v["type"].as_str().unwrap_or(""))
}

fn is_delta(v: &Value) -> bool {
    v["type"] == "response.output_text.delta"
}

/// The concatenated text deltas of `events`.
fn text_of(events: &[Value]) -> String {
    events.iter().filter(|e| is_delta(e)).map(|e| e["delta"].as_str().unwrap().to_owned()).collect()
}

/// The two ways a provider answers: through the tunnel (it speaks the
/// Responses API), or translated onto chat completions.
const MODES: [(&str, bool); 2] = [("tunnel", true), ("translated", false)];

/// An edge with model `m` on one `iop-mockprov` started with `flags`,
/// reached through the tunnel when `native`, else translated (the mock
/// without its Responses API, the provider with `native_apis = []`).
fn mock_edge(native: bool, flags: &[&str]) -> (MockProv, Edge, Proc) {
    let mut flags = flags.to_vec();
    if !native {
        flags.extend(["--without", "responses"]);
    }
    let mock = MockProv::start(&flags);
    let extra = if native { "" } else { "native_apis = []" };
    let edge = Edge::start(&one_provider_config("openai_compat", &mock.base_url(), extra, "mock-upstream"));
    let node = edge.node(NODE_TOKEN, &[]);
    edge.wait_nodes_ready(1);
    (mock, edge, node)
}

fn edge_with(http: &str) -> (Edge, Proc) {
    let node = mock_node("n1", 8, 0, 3, 0);
    let edge = Edge::start(&pool_config_with(http, "", &[node], &[mock_model("m", &["n1"], "")], ""));
    let n = edge.start_node("n1", "");
    edge.wait_nodes_ready(1);
    (edge, n)
}

#[test]
fn responses_one_after_another_on_one_socket_and_a_continuation() {
    let (edge, _node) = edge_with("");
    let (status, head, ws) = Ws::open(edge.http, &[]);
    assert_eq!(status, 101, "{head}");
    // RFC 6455 §1.3's example key and its accept value.
    assert!(head.to_ascii_lowercase().contains("sec-websocket-accept: s3pplmbitxaq9kygzzhzrbk+xoo="), "{head}");
    let mut ws = ws.unwrap();
    ws.send_json(&json!({"type": "response.create", "model": "m", "input": "hello"}));
    let first = ws.response();
    let types: Vec<&str> = first.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(types.first(), Some(&"response.created"));
    assert_eq!(types.last(), Some(&"response.completed"));
    for (i, e) in first.iter().enumerate() {
        assert_eq!(e["sequence_number"], i, "{e}");
    }
    let id = first.last().unwrap()["response"]["id"].as_str().unwrap().to_owned();
    // A ping between responses is answered with its payload.
    ws.send(9, b"are you there");
    assert_eq!(ws.recv(), Some((10, b"are you there".to_vec())));
    // The next response continues the first.
    ws.send_json(&json!({"type": "response.create", "model": "m", "input": "again", "previous_response_id": id}));
    let second = ws.response();
    assert_eq!(second.last().unwrap()["type"], "response.completed", "{second:#?}");
    // One it does not know is an error event; the socket stays open.
    ws.send_json(&json!({"type": "response.create", "model": "m", "input": "x", "previous_response_id": "resp_x"}));
    let e = ws.response();
    assert_eq!(e[0]["type"], "error");
    assert_eq!(
        (e[0]["status"].as_u64(), e[0]["error"]["code"].as_str()),
        (Some(400), Some("previous_response_not_found"))
    );
    for bad in [json!({"type": "session.update"}), json!({"type": "response.create", "model": "nope", "input": "x"})] {
        ws.send_json(&bad);
        assert_eq!(ws.response()[0]["type"], "error", "{bad}");
    }
    ws.send(1, b"{not json");
    assert_eq!(ws.response()[0]["error"]["type"], "invalid_request_error");
    ws.send_json(&json!({"type": "response.create", "model": "m", "input": "last"}));
    assert_eq!(ws.response().last().unwrap()["type"], "response.completed");
    // A normal close is answered with one.
    ws.send(8, &1000u16.to_be_bytes());
    assert_eq!(ws.close_code(), 1000);
    // One access-log line per response, and the socket's own (101).
    eventually(Duration::from_secs(5), "the socket's access-log line", || {
        let log = edge.proc.log_text();
        log.contains("status=101") && log.matches("path=\"/v1/responses\"").count() >= 7
    });
    edge.assert_idle();
}

#[test]
fn bad_handshakes_frames_and_sizes_get_their_status_and_close_codes() {
    let (edge, _node) = edge_with("max_body_bytes = 65536\n");
    let (status, _, _) = Ws::open(edge.http, &[("sec-websocket-key", "")]);
    assert_eq!(status, 400);
    let (status, head, _) = Ws::open(edge.http, &[("sec-websocket-version", "8")]);
    assert_eq!(status, 426);
    assert!(head.to_ascii_lowercase().contains("sec-websocket-version: 13"), "{head}");
    // Binary messages are not what the mode speaks: 1003.
    let mut ws = Ws::open(edge.http, &[]).2.unwrap();
    ws.send(2, b"\x00\x01");
    assert_eq!(ws.close_code(), 1003);
    // A message beyond http.max_body_bytes: 1009, refused from its header.
    let mut ws = Ws::open(edge.http, &[]).2.unwrap();
    ws.send(1, &vec![b' '; 70_000]);
    assert_eq!(ws.close_code(), 1009);
    // An unmasked client frame breaks the protocol: 1002.
    let mut ws = Ws::open(edge.http, &[]).2.unwrap();
    ws.s.write_all(&[0x81, 0x02, b'{', b'}']).unwrap();
    assert_eq!(ws.close_code(), 1002);
    // The edge is unharmed.
    let r = post_json(
        edge.http,
        "/v1/chat/completions",
        &json!({"model": "m", "messages": [{"role": "user", "content": "x"}]}),
    );
    assert_eq!(r.status, 200);
}

#[test]
fn sockets_are_capped_and_an_idle_one_is_closed() {
    let (edge, _node) = edge_with("max_websockets = 1\nidle_timeout_sec = 1\n");
    let (status, _, first) = Ws::open(edge.http, &[]);
    assert_eq!(status, 101);
    let mut first = first.unwrap();
    let (status, head, _) = Ws::open(edge.http, &[]);
    assert_eq!(status, 503, "{head}");
    // Idle past http.idle_timeout_sec: closed with 1008 (policy).
    assert_eq!(first.close_code(), 1008);
    // Its slot is free again.
    eventually(Duration::from_secs(5), "a socket again", || Ws::open(edge.http, &[]).0 == 101);
}

#[test]
fn a_ping_mid_response_is_answered_at_once_between_two_events() {
    for (mode, native) in MODES {
        // Twelve tokens, 100 ms apart: the response streams for over a second.
        let (_mock, edge, _node) = mock_edge(native, &["--tokens", "12", "--token-interval-ms", "100"]);
        let mut ws = Ws::open(edge.http, &[]).2.unwrap();
        ws.create(json!({"input": "hello"}));
        let mut frames = ws.frames_until(is_delta);
        ws.send(9, b"mid-response");
        let rest = ws.frames_until(ends);
        let pong = rest.iter().position(|f| f == &(10, b"mid-response".to_vec()));
        let pong = pong.unwrap_or_else(|| panic!("{mode}: no pong before the response's end: {:?}", texts(&rest)));
        // Answered at once: the response's events go on after it.
        assert!(texts(&rest[pong..]).iter().filter(|e| is_delta(e)).count() >= 2, "{mode}: {:?}", texts(&rest));
        frames.extend(rest);
        let events = texts(&frames);
        assert_eq!(events.last().unwrap()["type"], "response.completed", "{mode}: {events:#?}");
        for (i, e) in events.iter().enumerate() {
            assert_eq!(e["sequence_number"], i, "{mode}: every event whole and in order: {e}");
        }
        assert_eq!(text_of(&events), (0..12).map(|i| format!("tok{i} ")).collect::<String>(), "{mode}");
        // The socket serves on.
        ws.create(json!({"input": "again", "max_output_tokens": 2}));
        assert_eq!(ws.response().last().unwrap()["type"], "response.incomplete", "{mode}");
        // A client that vanishes between responses: the socket's own line
        // comes (once), not the last response's again.
        drop(ws);
        eventually(Duration::from_secs(5), "the socket's access-log line", || {
            edge.proc.log_text().contains("status=101")
        });
        let log = edge.proc.log_text();
        assert_eq!(log.matches("path=\"/v1/responses\"").count(), 3, "{mode}: two responses and the socket");
        edge.assert_idle();
    }
}

#[test]
fn a_close_mid_response_cancels_it_upstream_and_the_edge_serves_on() {
    for (mode, native) in MODES {
        let (mock, edge, _node) = mock_edge(native, &["--tokens", "1000", "--token-interval-ms", "50"]);
        let mut ws = Ws::open(edge.http, &[]).2.unwrap();
        // The mock's tag reaches it through the tunnel only (a translation
        // leaves unknown fields out): its close counter serves both.
        ws.create(json!({"input": "a long one", "mock": {"tag": "ws-close"}}));
        ws.frames_until(is_delta);
        assert_eq!(mock.stats()["early_closed"], 0, "{mode}");
        ws.send(8, &1000u16.to_be_bytes());
        assert_eq!(ws.close_code(), 1000, "{mode}");
        assert!(ws.recv().is_none(), "{mode}: nothing after the close frame");
        // The run was cancelled: the provider's connection closed early,
        // the lease came back.
        eventually(Duration::from_secs(5), "the provider request closed", || mock.stats()["early_closed"] == 1);
        if native {
            mock.wait_closed("ws-close");
        }
        edge.assert_idle();
        // The response's access-log line says the client ended it.
        eventually(Duration::from_secs(5), "the cancelled response's log line", || {
            edge.proc
                .log_text()
                .lines()
                .any(|l| l.contains("path=\"/v1/responses\"") && l.contains("outcome=\"cancelled\""))
        });
        // The edge serves on, on another socket.
        let mut ws = Ws::open(edge.http, &[]).2.unwrap();
        ws.create(json!({"input": "short", "max_output_tokens": 2}));
        let events = ws.response();
        assert_eq!(events.last().unwrap()["type"], "response.incomplete", "{mode}: {events:#?}");
        assert_eq!(text_of(&events), "tok0 tok1 ", "{mode}");
        edge.assert_idle();
    }
}

#[test]
fn a_response_create_sent_mid_response_is_answered_after_it_and_a_third_is_refused() {
    for (mode, native) in MODES {
        let (mock, edge, _node) = mock_edge(native, &["--tokens", "8", "--token-interval-ms", "50"]);
        let mut ws = Ws::open(edge.http, &[]).2.unwrap();
        ws.create(json!({"input": "first"}));
        let mut first = ws.frames_until(is_delta);
        ws.create(json!({"input": "second", "max_output_tokens": 3}));
        first.extend(ws.frames_until(ends));
        // The first went on to its end, alone: one response's events.
        let first = texts(&first);
        assert_eq!(first.last().unwrap()["type"], "response.completed", "{mode}: {first:#?}");
        assert_eq!(first.iter().filter(|e| e["type"] == "response.created").count(), 1, "{mode}");
        assert_eq!(text_of(&first), (0..8).map(|i| format!("tok{i} ")).collect::<String>(), "{mode}");
        // Then the second, whole.
        let second = ws.response();
        assert_eq!(second[0]["type"], "response.created", "{mode}: {second:#?}");
        assert_eq!(second.last().unwrap()["type"], "response.incomplete", "{mode}: {second:#?}");
        assert_eq!(text_of(&second), "tok0 tok1 tok2 ", "{mode}");
        assert_ne!(second[0]["response"]["id"], first[0]["response"]["id"], "{mode}");
        assert_eq!(mock.stats()["model_requests"], 2, "{mode}");

        // One waits at most: a third while one waits closes with 1008,
        // and the response that streams is cancelled.
        ws.create(json!({"input": "third"}));
        ws.frames_until(is_delta);
        ws.create(json!({"input": "fourth"}));
        ws.create(json!({"input": "fifth"}));
        assert_eq!(ws.close_code(), 1008, "{mode}");
        eventually(Duration::from_secs(5), "the provider request closed", || mock.stats()["early_closed"] == 1);
        assert_eq!(mock.stats()["model_requests"], 3, "{mode}: the waiting one was never sent");
        edge.assert_idle();
    }
}

#[test]
fn while_a_response_queues_a_ping_is_answered_and_a_close_leaves_the_queue() {
    // One slot, held by a slow response (40 tokens, 50 ms apart) on another socket.
    let node = mock_node("n1", 1, 0, 40, 50);
    let edge = Edge::start(&pool_config_with("", "", &[node], &[mock_model("m", &["n1"], "")], ""));
    let _node = edge.start_node("n1", "");
    edge.wait_nodes_ready(1);
    let mut busy = Ws::open(edge.http, &[]).2.unwrap();
    busy.create(json!({"input": "slow"}));
    busy.frames_until(is_delta);
    let mut queued = Ws::open(edge.http, &[]).2.unwrap();
    queued.create(json!({"input": "waits"}));
    edge.wait_model_waiters("m", 1);
    queued.send(9, b"still there?");
    assert_eq!(queued.recv(), Some((10, b"still there?".to_vec())), "answered while queued");
    queued.send(8, &1000u16.to_be_bytes());
    assert_eq!(queued.close_code(), 1000);
    edge.wait_model_waiters("m", 0);
    // The slow response went on undisturbed.
    let events = texts(&busy.frames_until(ends));
    assert_eq!(events.last().unwrap()["type"], "response.completed", "{events:#?}");
    edge.assert_idle();
}

#[test]
fn a_provider_that_cannot_be_reached_is_replaced_before_the_first_frame() {
    for (mode, native) in MODES {
        let (_guard, closed) = closed_port();
        let mut flags = vec!["--tokens", "3"];
        if !native {
            flags.extend(["--without", "responses"]);
        }
        let mock = MockProv::start(&flags);
        let extra = if native { "" } else { "native_apis = []" };
        // `a` (unreachable) is tried first when both are idle, then `b`.
        let unreachable = format!("http://127.0.0.1:{closed}/v1");
        let config = two_provider_config(("openai_compat", &unreachable), ("openai_compat", &mock.base_url()), extra);
        let edge = Edge::start(&config);
        let _node = edge.node(NODE_TOKEN, &[]);
        edge.wait_nodes_ready(1);
        let mut ws = Ws::open(edge.http, &[]).2.unwrap();
        ws.create(json!({"input": "hello"}));
        let events = ws.response();
        assert!(events.iter().all(|e| e["type"] != "error"), "{mode}: {events:#?}");
        assert_eq!(events.last().unwrap()["type"], "response.completed", "{mode}: {events:#?}");
        assert_eq!(text_of(&events), "tok0 tok1 tok2 ", "{mode}");
        assert_eq!(mock.stats()["model_requests"], 1, "{mode}");
        // Two attempts, the second answered.
        eventually(Duration::from_secs(5), "the response's log line", || {
            edge.proc.log_text().lines().any(|l| l.contains("path=\"/v1/responses\"") && l.contains("attempts=2"))
        });
        let metrics = String::from_utf8(edge.admin("/metrics").body).unwrap();
        assert!(
            metrics.contains(r#"iop_edge_liveness_recovery_results_total{result="answered"} 1"#),
            "{mode}: {metrics}"
        );
        // The socket serves on.
        ws.create(json!({"input": "again"}));
        assert_eq!(ws.response().last().unwrap()["type"], "response.completed", "{mode}");
        edge.assert_idle();
    }
}

/// Runs `scripts/responses_ws.py` (the openai SDK's `responses.connect()`).
fn sdk_ws(base: &str, model: &str) -> Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/responses_ws.py");
    let out = std::process::Command::new("python3")
        .args([script, base, model])
        .output()
        .unwrap_or_else(|e| panic!("python3: {e} (scripts/fetch-test-model.sh installs the SDK)"));
    assert!(out.status.success(), "responses_ws.py failed:\n{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn assert_sdk_ws(what: &str, v: &Value) {
    assert!(v.get("exception").is_none(), "{what}: {v:#}");
    for turn in ["first", "second", "third"] {
        assert_eq!(v[turn]["status"], "completed", "{what} {turn}: {v:#}");
        assert!(v[turn]["text"].as_str().unwrap().starts_with("tok0"), "{what} {turn}");
    }
    assert_eq!(v["unknown"]["error"]["error"]["code"], "previous_response_not_found", "{what}");
}

#[test]
#[ignore = "needs python3 with the openai SDK and websockets, installed by scripts/fetch-test-model.sh; CI runs it"]
fn the_openai_sdk_speaks_the_websocket_mode_on_every_kind_of_provider() {
    // The in-process mock (translated).
    let (edge, _node) = edge_with("");
    assert_sdk_ws("mock", &sdk_ws(&format!("http://{}/v1", edge.http), "m"));
    // A server with the Responses API (through the tunnel), and one
    // without it (translated): the continuation carries the first turn.
    for (flags, native) in [(&["--tokens", "3"][..], true), (&["--tokens", "3", "--without", "responses"][..], false)] {
        let mock = MockProv::start(flags);
        let extra = if native { "" } else { "native_apis = []" };
        let edge = Edge::start(&one_provider_config("openai_compat", &mock.base_url(), extra, "mock-upstream"));
        let _node = edge.node(NODE_TOKEN, &[]);
        edge.wait_nodes_ready(1);
        let v = sdk_ws(&format!("http://{}/v1", edge.http), "m");
        assert_sdk_ws(if native { "native" } else { "translated" }, &v);
        // The second turn reached the provider with the first before it.
        let log = request(mock.addr, "GET", "/log", None, &[]).json();
        let second = log
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["request_body"].as_str().unwrap_or("").contains("again"))
            .unwrap()
            .clone();
        let body: Value = serde_json::from_str(second["request_body"].as_str().unwrap()).unwrap();
        let text = body.to_string();
        assert!(text.contains("hello") && text.contains("tok0"), "the history went along: {body:#}");
        assert!(body.get("previous_response_id").is_none(), "{body:#}");
    }
}
