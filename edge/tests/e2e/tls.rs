//! TLS: the client listener (`[http.tls]`, renewed on SIGHUP), the node
//! link (`[node_listener.tls]` / `[edge_tls]`), mutual TLS binding a node's
//! certificate to its id (managed mode), and `https://` upstreams.

use std::{
    io::{Read, Write},
    time::Duration,
};

use serde_json::json;

use crate::{harness::*, pki::*};

const CHAT: &str = "/v1/chat/completions";

fn chat_body(stream: bool) -> String {
    json!({"model": "gpt-test", "stream": stream, "messages": [{"role": "user", "content": "hi"}]}).to_string()
}

/// The edge config of [`edge_config`] with `[http.tls]` of `leaf`.
fn https_edge(upstream: &str, leaf: &Leaf) -> String {
    format!(
        "{}\n[http.tls]\ncert = \"{}\"\nkey = \"{}\"\n",
        edge_config(upstream, ""),
        leaf.cert.display(),
        leaf.key.display()
    )
}

/// `GET /healthz` over TLS until the node is ready.
fn wait_ready_tls(pki: &Pki, edge: &Edge) {
    eventually(Duration::from_secs(20), "node ready (over TLS)", || {
        let mut s = connect(pki, edge.http, "localhost").unwrap();
        let r = https_request(&mut s, "GET", "/healthz", "");
        r.json()["nodes_ready"] == 1
    });
}

#[test]
fn the_client_listener_speaks_tls_only_and_streams_over_it() {
    let pki = Pki::new();
    let leaf = pki.leaf(&["localhost", "127.0.0.1"]);
    let mock = MockProv::start(&["--tokens", "3"]);
    let edge = Edge::start(&https_edge(&mock.base_url(), &leaf));
    let _node = edge.node(NODE_TOKEN, &[]);
    wait_ready_tls(&pki, &edge);

    let mut s = connect(&pki, edge.http, "localhost").unwrap();
    assert_eq!(s.conn.alpn_protocol(), Some(&b"http/1.1"[..]));
    let r = https_request(&mut s, "POST", CHAT, &chat_body(true));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let data = r.sse_data();
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{data:?}");
    let content: String = data[..data.len() - 1]
        .iter()
        .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(content, "tok0 tok1 tok2 ");

    // Plain HTTP on the TLS port: no HTTP answer, the connection just ends
    // (at most after a TLS alert record).
    let mut plain = std::net::TcpStream::connect(edge.http).unwrap();
    plain.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    plain.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n").unwrap();
    let mut got = Vec::new();
    let _ = plain.read_to_end(&mut got);
    assert!(!got.starts_with(b"HTTP/"), "a plain answer: {}", String::from_utf8_lossy(&got));
    assert!(got.is_empty() || got[0] == 0x15, "not an alert: {got:?}");

    // A client that does not trust the edge's CA gives up in the handshake.
    let other = Pki::new();
    let Err(err) = connect(&other, edge.http, "localhost") else { panic!("a foreign CA was trusted") };
    assert!(err.to_string().contains("certificate"), "{err}");
    // The listener is unharmed.
    let mut s = connect(&pki, edge.http, "localhost").unwrap();
    assert_eq!(https_request(&mut s, "GET", "/healthz", "").status, 200);
}

#[test]
fn sighup_renews_the_certificate_and_keeps_open_streams() {
    let pki = Pki::new();
    let leaf = pki.leaf(&["localhost"]);
    let first = leaf.der();
    let mock = MockProv::start(&["--tokens", "8", "--token-interval-ms", "200"]);
    let edge = Edge::start(&https_edge(&mock.base_url(), &leaf));
    let _node = edge.node(NODE_TOKEN, &[]);
    wait_ready_tls(&pki, &edge);

    // A stream opened with the first certificate.
    let mut s = connect(&pki, edge.http, "localhost").unwrap();
    assert_eq!(s.conn.peer_certificates().unwrap()[0].as_ref(), &first[..]);
    let body = chat_body(true);
    let req = format!(
        "POST {CHAT} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\nconnection: close\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("tok0") {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0);
        got.extend_from_slice(&buf[..n]);
    }

    // Renew: new files in place, then SIGHUP.
    let renewed = pki.leaf(&["localhost"]);
    std::fs::copy(&renewed.cert, &leaf.cert).unwrap();
    std::fs::copy(&renewed.key, &leaf.key).unwrap();
    edge.sighup();
    eventually(Duration::from_secs(10), "config reloaded", || edge.proc.log_text().contains("config reloaded"));
    let s2 = connect(&pki, edge.http, "localhost").unwrap();
    assert_eq!(s2.conn.peer_certificates().unwrap()[0].as_ref(), &renewed.der()[..], "new handshakes use the new one");

    // The stream opened before goes on to its end.
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(e) => panic!("the open stream broke: {e}"),
        }
    }
    let text = String::from_utf8_lossy(&got);
    assert!(text.contains("tok7") && text.contains("data: [DONE]"), "{text}");

    // A renewal that does not load is refused; the running one stays.
    std::fs::write(&leaf.key, "not a key").unwrap();
    edge.sighup();
    eventually(Duration::from_secs(10), "reload rejected", || edge.proc.log_text().contains("config reload rejected"));
    let s3 = connect(&pki, edge.http, "localhost").unwrap();
    assert_eq!(s3.conn.peer_certificates().unwrap()[0].as_ref(), &renewed.der()[..]);
}

/// An edge whose node listener speaks TLS with `leaf` (and, with
/// `client_ca`, asks nodes for certificates: managed mode), provider `up`
/// at `upstream` (with `tls_ca` when given).
fn tls_link_edge(
    leaf: &Leaf,
    client_ca: Option<&std::path::Path>,
    upstream: &str,
    tls_ca: Option<&std::path::Path>,
) -> String {
    let ca = client_ca.map(|c| format!("client_ca = \"{}\"\n", c.display())).unwrap_or_default();
    let mut cfg = format!(
        "{}\n[node_listener.tls]\ncert = \"{}\"\nkey = \"{}\"\n{ca}",
        edge_config(upstream, ""),
        leaf.cert.display(),
        leaf.key.display()
    );
    if let Some(ca) = tls_ca {
        cfg = cfg.replacen("capacity = 16\n", &format!("capacity = 16\ntls_ca = \"{}\"\n", ca.display()), 1);
    }
    cfg
}

/// `[edge_tls]` of a node trusting `pki`, presenting `identity`.
fn edge_tls(pki: &Pki, identity: Option<&Leaf>) -> String {
    let id = identity
        .map(|l| format!("cert = \"{}\"\nkey = \"{}\"\n", l.cert.display(), l.key.display()))
        .unwrap_or_default();
    format!("[edge_tls]\nca = \"{}\"\n{id}", pki.ca.display())
}

/// `GET /stats` of a mock serving TLS with a certificate of `pki`.
fn tls_stats(pki: &Pki, mock: &MockProv) -> serde_json::Value {
    let mut s = connect(pki, mock.addr, "localhost").unwrap();
    https_request(&mut s, "GET", "/stats", "").json()
}

#[test]
fn the_node_link_and_an_https_upstream_over_tls() {
    let pki = Pki::new();
    let edge_leaf = pki.leaf(&["127.0.0.1"]);
    let upstream_leaf = pki.leaf(&["127.0.0.1", "localhost"]);
    let mock = MockProv::start(&[
        "--tokens",
        "3",
        "--tls-cert",
        upstream_leaf.cert.to_str().unwrap(),
        "--tls-key",
        upstream_leaf.key.to_str().unwrap(),
    ]);
    let https = format!("https://localhost:{}/v1", mock.addr.port());
    let edge = Edge::start(&tls_link_edge(&edge_leaf, None, &https, Some(&pki.ca)));
    let _node = edge.node_with(NODE_TOKEN, &edge_tls(&pki, None), &[]);
    edge.wait_nodes_ready(1);
    for stream in [false, true] {
        let r = request(edge.http, "POST", CHAT, Some(chat_body(stream).as_bytes()), &[]);
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        let text = String::from_utf8_lossy(&r.body);
        assert!(text.contains("tok2"), "{text}");
    }
    // Both went to the mock, whose only port speaks TLS.
    assert_eq!(tls_stats(&pki, &mock)["requests"], 2);

    // A node without TLS cannot register on the TLS listener.
    let mut plain = edge.node(NODE_TOKEN, &[]);
    eventually(Duration::from_secs(10), "TLS refused", || edge.proc.log_text().contains("node TLS handshake failed"));
    assert!(plain.wait_exit(Duration::from_secs(30)).is_some(), "the plain node gave up");
    // The TLS node was not disturbed.
    let r = request(edge.http, "POST", CHAT, Some(chat_body(false).as_bytes()), &[]);
    assert_eq!(r.status, 200);
}

#[test]
fn an_https_upstream_with_an_untrusted_certificate_fails_without_its_address() {
    let pki = Pki::new();
    let stranger = Pki::new();
    let upstream_leaf = stranger.leaf(&["localhost"]);
    let mock = MockProv::start(&[
        "--tls-cert",
        upstream_leaf.cert.to_str().unwrap(),
        "--tls-key",
        upstream_leaf.key.to_str().unwrap(),
    ]);
    let https = format!("https://localhost:{}/v1", mock.addr.port());
    // The provider trusts only `pki`; the mock's certificate is another CA's.
    let cfg = edge_config(&https, "").replacen(
        "capacity = 16\n",
        &format!("capacity = 16\ntls_ca = \"{}\"\n", pki.ca.display()),
        1,
    );
    let edge = Edge::start(&cfg);
    let node = edge.node(NODE_TOKEN, &[]);
    edge.wait_nodes_ready(1);
    let r = request(edge.http, "POST", CHAT, Some(chat_body(false).as_bytes()), &[]);
    assert_eq!(r.status, 502, "{}", String::from_utf8_lossy(&r.body));
    let text = String::from_utf8_lossy(&r.body);
    assert!(text.contains("TLS"), "{text}");
    assert!(!text.contains(&mock.addr.port().to_string()), "the provider's address leaked: {text}");
    assert_eq!(tls_stats(&stranger, &mock)["requests"], 0);
    // The node says why, with the address, in its own log.
    eventually(Duration::from_secs(5), "node logs the TLS failure", || node.log_text().contains("TLS with localhost"));
}

#[test]
fn managed_mode_binds_a_node_to_its_certificate() {
    let pki = Pki::new();
    let edge_leaf = pki.leaf(&["127.0.0.1"]);
    let mock = MockProv::start(&["--tokens", "2"]);
    let edge = Edge::start(&tls_link_edge(&edge_leaf, Some(&pki.ca), &mock.base_url(), None));

    // The right certificate and token: ready, and it serves.
    let n1 = pki.leaf(&["n1"]);
    let _node = edge.node_with(NODE_TOKEN, &edge_tls(&pki, Some(&n1)), &[]);
    edge.wait_nodes_ready(1);
    let r = request(edge.http, "POST", CHAT, Some(chat_body(false).as_bytes()), &[]);
    assert_eq!(r.status, 200);

    let mut events = edge.events();
    // A valid certificate for another node id with n1's token: refused,
    // typed, and the node stops (retrying cannot help).
    let n2 = pki.leaf(&["n2"]);
    let mut wrong = edge.node_with(NODE_TOKEN, &edge_tls(&pki, Some(&n2)), &[]);
    let ev = events.wait("registration_refused", Duration::from_secs(10), |_| true);
    assert_eq!((&ev["refusal"], &ev["node"]), (&json!("identity_mismatch"), &json!("n1")), "{ev}");
    assert!(wrong.wait_exit(Duration::from_secs(10)).is_some_and(|c| c != 0));
    assert!(wrong.log_text().contains("edge_tls.cert must be issued for this node"), "{}", wrong.log_text());

    // A valid certificate for n1 with another token: the token is unknown.
    let mut bad_token = edge.node_with("not-a-token", &edge_tls(&pki, Some(&n1)), &[]);
    events.wait("registration_refused", Duration::from_secs(10), |e| e["refusal"] == "unknown_token");
    assert!(bad_token.wait_exit(Duration::from_secs(10)).is_some());

    // A certificate of another CA, an expired one, and none at all: the
    // handshake fails.
    let stranger = Pki::new().leaf(&["n1"]);
    let expired = pki.expired_leaf(&["n1"]);
    for identity in [Some(&stranger), Some(&expired), None] {
        let before = edge.proc.log_text().matches("node TLS handshake failed").count();
        let _n = edge.node_with(NODE_TOKEN, &edge_tls(&pki, identity), &[]);
        events.wait("registration_refused", Duration::from_secs(10), |e| e["refusal"] == "tls_handshake");
        eventually(Duration::from_secs(10), "handshake refused", || {
            edge.proc.log_text().matches("node TLS handshake failed").count() > before
        });
    }
    // Through all of it n1 stayed ready and serving.
    let r = request(edge.http, "POST", CHAT, Some(chat_body(false).as_bytes()), &[]);
    assert_eq!(r.status, 200);
}

#[test]
#[ignore = "needs python3 with the openai SDK, installed by scripts/fetch-test-model.sh; CI runs it"]
fn the_sdk_streams_over_tls_with_a_custom_ca_as_it_does_in_plain() {
    let pki = Pki::new();
    let leaf = pki.leaf(&["localhost"]);
    let mock = MockProv::start(&["--tokens", "4"]);
    let edge = Edge::start(&https_edge(&mock.base_url(), &leaf));
    let _node = edge.node(NODE_TOKEN, &[]);
    wait_ready_tls(&pki, &edge);
    let flows = "tools_stream,choices_stream,refusal_stream,completions_stream,responses_stream";
    let ca = pki.ca.to_str().unwrap();
    let through = crate::sdk_fidelity::sdk_flows_with(
        &format!("https://localhost:{}/v1", edge.http.port()),
        "gpt-test",
        flows,
        &[("IOP_TEST_CA", ca)],
    );
    let direct = crate::sdk_fidelity::sdk_flows(&mock.base_url(), "mock-upstream", flows);
    for flow in flows.split(',') {
        assert!(direct[flow].get("exception").is_none(), "{flow}: {:#}", direct[flow]);
        assert_eq!(
            through[flow], direct[flow],
            "flow {flow} over TLS\nthrough: {:#}\ndirect: {:#}",
            through[flow], direct[flow]
        );
    }
}
