//! Per-address limits before authentication (issue 24): silent connections
//! squatting the node listener's handshake slots from one address or from
//! many, failed admin and API-key checks from a node's own address,
//! sprayed addresses against the failure table, and TLS handshake floods
//! on both listeners. Each attack runs while the peer it must not hurt (a
//! restarting node, the right admin token, another TLS client) is checked.

use std::{
    io::{ErrorKind, Read, Write},
    net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use iop_core::wire::pb;
use serde_json::json;

use crate::{
    attack::*,
    harness::*,
    hostile_peers::{closed_within, try_register},
    pki::*,
};

fn v4(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(a, b, c, d))
}

/// A TCP connection from `from` to `to`, or None when the edge's backlog
/// did not take it within a second.
fn try_connect_from(from: IpAddr, to: SocketAddr) -> Option<TcpStream> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::for_address(to), Type::STREAM, None).ok()?;
    socket.bind(&SocketAddr::new(from, 0).into()).ok()?;
    socket.connect_timeout(&to.into(), Duration::from_secs(1)).ok()?;
    Some(socket.into())
}

/// A counter line of `/metrics` (0 when absent).
fn metric(edge: &Edge, series: &str) -> u64 {
    let text = String::from_utf8_lossy(&edge.admin("/metrics").body).to_string();
    text.lines().find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok())).unwrap_or(0)
}

/// Connections that never send a byte, from `sources` in turn, each
/// reopened (from the same source) as soon as the edge closes it.
struct Squatters {
    stop: Arc<AtomicBool>,
    closed: Arc<AtomicU64>,
    handle: Option<JoinHandle<()>>,
}

impl Squatters {
    fn start(to: SocketAddr, sources: Vec<IpAddr>, n: usize) -> Squatters {
        let (stop, closed) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
        let handle = {
            let (stop, closed) = (stop.clone(), closed.clone());
            std::thread::spawn(move || {
                let open = |i: usize| {
                    let s = try_connect_from(sources[i % sources.len()], to)?;
                    s.set_nonblocking(true).ok()?;
                    Some(s)
                };
                let mut conns: Vec<Option<TcpStream>> = (0..n).map(open).collect();
                while !stop.load(Ordering::Relaxed) {
                    for (i, c) in conns.iter_mut().enumerate() {
                        let ended = match c {
                            None => true,
                            Some(s) => match s.read(&mut [0u8; 64]) {
                                Ok(_) => true,
                                Err(e) => e.kind() != ErrorKind::WouldBlock,
                            },
                        };
                        if ended {
                            if c.is_some() {
                                closed.fetch_add(1, Ordering::Relaxed);
                            }
                            *c = open(i);
                        }
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            })
        };
        Squatters { stop, closed, handle: Some(handle) }
    }

    fn closed(&self) -> u64 {
        self.closed.load(Ordering::Relaxed)
    }
}

impl Drop for Squatters {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

fn squat_config() -> String {
    // The production handshake limits (64 slots, 16 per address, a reserve
    // of 16, 2 s for the first bytes, 10 s for the handshake).
    pool_config(&[mock_node("n1", 8, 0, 3, 0)], &[mock_model("m", &["n1"], "")], "")
}

/// Kills node `n1` and starts it again while `squatters` hold the node
/// listener; it must register at its first attempt.
fn restart_node_while_squatted(edge: &Edge, n1: &mut Proc, squatters: &Squatters, at_least_closed: u64) -> Proc {
    // The squat is in effect once the edge closed some of its connections
    // (at accept or to admit newer ones).
    eventually(Duration::from_secs(10), "the edge closed squatting connections", || {
        squatters.closed() >= at_least_closed
    });
    n1.kill9();
    edge.wait_nodes_ready(0);
    let started = Instant::now();
    let node = edge.start_node("n1", "");
    edge.wait_nodes_ready(1);
    let took = started.elapsed();
    let log = node.log_text();
    assert!(!log.contains("edge connection failed"), "the node needed more than one attempt ({took:?}):\n{log}");
    assert!(took < Duration::from_secs(5), "the node took {took:?} to register");
    node
}

#[test]
fn silent_connections_from_one_address_do_not_keep_a_node_out() {
    let _machine = exclusive();
    let edge = Edge::start(&squat_config());
    let mut n1 = edge.start_node("n1", "");
    edge.wait_nodes_ready(1);
    // 80 silent connections from one address: more than all 64 slots.
    let squatters = Squatters::start(edge.nodes, vec![v4(127, 0, 0, 2)], 80);
    // The address holds 16 (its cap), and each newer one closes its oldest.
    let _n1 = restart_node_while_squatted(&edge, &mut n1, &squatters, 64);
    let closed_own =
        metric(&edge, "iop_edge_connection_limits_total{listener=\"node\",action=\"evicted_same_address\"}");
    assert!(closed_own >= 64, "{closed_own}");
    drop(squatters);
    assert_served_quickly(edge.http, "m");
}

#[test]
fn silent_connections_from_many_addresses_make_way_for_a_node() {
    let _machine = exclusive();
    let edge = Edge::start(&squat_config());
    let mut n1 = edge.start_node("n1", "");
    edge.wait_nodes_ready(1);
    // 80 silent connections from 80 addresses: each address is under its
    // own cap, together they hold every slot.
    let sources = (1..=80).map(|i| v4(127, 0, 3, i)).collect();
    let squatters = Squatters::start(edge.nodes, sources, 80);
    let _n1 = restart_node_while_squatted(&edge, &mut n1, &squatters, 16);
    let pressure =
        metric(&edge, "iop_edge_connection_limits_total{listener=\"node\",action=\"evicted_under_pressure\"}");
    assert!(pressure >= 16, "{pressure}");
    drop(squatters);
    assert_served_quickly(edge.http, "m");
}

#[test]
fn a_silent_node_connection_gives_its_slot_back_at_the_first_bytes_deadline() {
    let edge = Edge::start(&pool_config_with(
        "",
        "handshake_timeout_sec = 2\nfirst_bytes_timeout_ms = 300",
        &[mock_node("n1", 8, 0, 3, 0)],
        &[mock_model("m", &["n1"], "")],
        "",
    ));
    let started = Instant::now();
    let mut silent = TcpStream::connect(edge.nodes).unwrap();
    let mut spoke = TcpStream::connect(edge.nodes).unwrap();
    // The first byte of a frame's length, and nothing more.
    spoke.write_all(&[0]).unwrap();
    assert!(closed_within(&mut silent, Duration::from_millis(1500)), "a silent connection was kept");
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(250), "closed after {took:?}, before its first-bytes deadline");
    // One that spoke has the whole handshake deadline.
    assert!(!closed_within(&mut spoke, Duration::from_millis(800)), "closed at the first-bytes deadline");
    assert!(closed_within(&mut spoke, Duration::from_secs(3)), "kept past the handshake deadline");
    assert!(metric(&edge, "iop_edge_connection_limits_total{listener=\"node\",action=\"first_bytes_timeout\"}") >= 1);
}

const API_KEY: &str = "sk-limits-5d1c";

fn sha256_hex(key: &str) -> String {
    ring::digest::digest(&ring::digest::SHA256, key.as_bytes()).as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// One response on a keep-alive connection.
fn next_response(s: &mut TcpStream, buf: &mut Vec<u8>) -> Response {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:").and_then(|v| v.trim().parse().ok()))
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                let r = parse_response(&buf[..end + 4 + len]);
                buf.drain(..end + 4 + len);
                return r;
            }
        }
        let mut chunk = [0u8; 8192];
        let n = s.read(&mut chunk).expect("response");
        assert!(n > 0, "connection closed");
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// `n` requests of `raw` on one keep-alive connection from `from`.
fn keep_alive_flood(from: IpAddr, to: SocketAddr, raw: &str, n: usize) -> Vec<Response> {
    let mut s = connect_from(from, to);
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = Vec::new();
    (0..n)
        .map(|_| {
            s.write_all(raw.as_bytes()).unwrap();
            next_response(&mut s, &mut buf)
        })
        .collect()
}

/// One admin request from `from` with `token`.
fn admin_from(from: IpAddr, to: SocketAddr, token: &str) -> Response {
    let raw = format!("GET /admin/v1/nodes HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {token}\r\n\r\n");
    keep_alive_flood(from, to, &raw, 1).remove(0)
}

/// The statuses of `rs` that are not `expected` 429s, after checking every
/// 429 names `code` and says when to retry.
fn not_limited<'a>(rs: &'a [Response], code: &str) -> Vec<&'a Response> {
    for r in rs.iter().filter(|r| r.status == 429) {
        assert_eq!(r.json()["error"]["code"], code, "{}", String::from_utf8_lossy(&r.body));
        assert!(r.header("retry-after").is_some());
    }
    rs.iter().filter(|r| r.status != 429).collect()
}

#[test]
fn admin_and_api_key_failures_from_a_nodes_address_lock_out_neither_the_node_nor_the_right_token() {
    let _machine = exclusive();
    let keys = format!("[[api_keys]]\nname = \"k\"\nsha256 = \"{}\"\nmodels = [\"m\"]\n", sha256_hex(API_KEY));
    let edge = Edge::start(&pool_config(&[mock_node("n1", 8, 0, 3, 0)], &[mock_model("m", &["n1"], "")], &keys));
    let mut n1 = edge.start_node("n1", "");
    edge.wait_nodes_ready(1);
    let mut events = edge.events();
    let here = v4(127, 0, 0, 1);

    // ~400 cheap failures from the node's own address: wrong admin tokens
    // and wrong API keys, each kind refused past its own budget.
    let admin = keep_alive_flood(
        here,
        edge.http,
        "GET /admin/v1/nodes HTTP/1.1\r\nhost: x\r\nauthorization: Bearer guess\r\n\r\n",
        200,
    );
    let denied = not_limited(&admin, "too_many_failed_admin_authentications");
    assert!(denied.len() <= 12 && denied.iter().all(|r| r.status == 401), "{} admin tokens checked", denied.len());
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).to_string();
    let chat = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer sk-guess\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let keyed = keep_alive_flood(here, edge.http, &chat, 200);
    let denied = not_limited(&keyed, "too_many_failed_api_keys");
    assert!(denied.len() <= 12 && denied.iter().all(|r| r.status == 401), "{} API keys checked", denied.len());
    let limited = admin.iter().chain(&keyed).filter(|r| r.status == 429).count();
    assert!(limited >= 370, "{limited}");
    let msg = admin.last().unwrap().json()["error"]["message"].as_str().unwrap_or("").to_owned();
    assert!(msg.contains("failed admin authentications"), "{msg}");

    // The right admin token and the right API key from that same address.
    assert_eq!(edge.admin("/admin/v1/nodes").status, 200);
    let auth = format!("Bearer {API_KEY}");
    let r = request(edge.http, "POST", "/v1/chat/completions", Some(body.as_bytes()), &[("authorization", &auth)]);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    // Node registrations from there are untouched: a wrong token is still
    // checked, and the node registers again at its first attempt.
    let mut s = connect_from(here, edge.nodes);
    assert_eq!(try_register(&mut s, "guess"), Some(pb::RegisterRefusal::UnknownToken));
    n1.kill9();
    edge.wait_nodes_ready(0);
    let n1 = edge.start_node("n1", "");
    edge.wait_nodes_ready(1);
    assert!(!n1.log_text().contains("edge connection failed"), "{}", n1.log_text());

    // The other way round: failed registrations lock out neither the
    // admin token nor admin checks of that address.
    let other = v4(127, 0, 0, 2);
    let mut kinds = Vec::new();
    for _ in 0..15 {
        let mut s = connect_from(other, edge.nodes);
        kinds.push(try_register(&mut s, "guess"));
    }
    assert_eq!(kinds.last(), Some(&Some(pb::RegisterRefusal::RateLimited)), "{kinds:?}");
    events.wait("registration_refused", Duration::from_secs(5), |e| e["refusal"] == "too_many_failed_registrations");
    assert_eq!(admin_from(other, edge.http, ADMIN_TOKEN).status, 200);
    assert_eq!(admin_from(other, edge.http, "guess").status, 401);
    // A right token from the locked address is checked first: here only a
    // second connection of the live node, never "too many failures".
    let mut s = connect_from(other, edge.nodes);
    assert_eq!(try_register(&mut s, &node_token("n1")), Some(pb::RegisterRefusal::DuplicateConnection));

    assert!(metric(&edge, "iop_edge_auth_refused_total{credential=\"admin\"}") >= 180);
    assert!(metric(&edge, "iop_edge_auth_refused_total{credential=\"api_key\"}") >= 180);
    assert!(metric(&edge, "iop_edge_auth_refused_total{credential=\"node_registration\"}") >= 1);
    let log = edge.proc.log_text();
    assert!(!log.contains(API_KEY) && !log.contains(ADMIN_TOKEN), "a credential in the log");
}

/// One wrong admin token from `from`, on its own connection: the status.
fn one_wrong_admin_token(from: IpAddr, to: SocketAddr) -> Option<u16> {
    let mut s = try_connect_from(from, to)?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    s.write_all(b"GET /admin/v1/nodes HTTP/1.1\r\nhost: x\r\nauthorization: Bearer guess\r\nconnection: close\r\n\r\n")
        .ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    Some(parse_response(&raw).status)
}

#[test]
fn spraying_addresses_does_not_unlock_a_locked_one() {
    let _machine = exclusive();
    let edge = Edge::start(&pool_config(&[mock_node("n1", 8, 0, 3, 0)], &[mock_model("m", &["n1"], "")], ""));
    let locked = v4(127, 0, 0, 2);
    let first = keep_alive_flood(
        locked,
        edge.http,
        "GET /admin/v1/nodes HTTP/1.1\r\nhost: x\r\nauthorization: Bearer guess\r\n\r\n",
        12,
    );
    assert_eq!(first.last().map(|r| r.status), Some(429));
    // 4 500 other addresses (more than the table holds), 20 in each of
    // 225 /24s, fail once each.
    let http = edge.http;
    let sprayers: Vec<_> = (0..4)
        .map(|t| {
            std::thread::spawn(move || {
                (0..4500u32)
                    .filter(|i| i % 4 == t)
                    .filter_map(|i| {
                        let net = u8::try_from(1 + i / 20).unwrap();
                        let host = u8::try_from(1 + i % 20).unwrap();
                        one_wrong_admin_token(v4(127, net, 7, host), http)
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let statuses: Vec<u16> = sprayers.into_iter().flat_map(|h| h.join().unwrap()).collect();
    assert!(statuses.len() >= 4400, "only {} sprayed requests were answered", statuses.len());
    assert!(statuses.iter().all(|s| *s == 401 || *s == 429), "{statuses:?}");
    // Still locked (it earns one attempt back per 5 s; the spray took less).
    let r = admin_from(locked, edge.http, "guess");
    assert_eq!(r.status, 429, "the locked address got a fresh guess: {}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["error"]["code"], "too_many_failed_admin_authentications");
    // Its right token was never refused.
    assert_eq!(admin_from(locked, edge.http, ADMIN_TOKEN).status, 200);
}

/// A TLS handshake from `from` with `to`: Ok when it completed.
fn tls_handshake_from(config: &Arc<rustls::ClientConfig>, from: IpAddr, to: SocketAddr) -> std::io::Result<()> {
    let tcp = try_connect_from(from, to).ok_or_else(|| std::io::Error::other("connect"))?;
    tcp.set_read_timeout(Some(Duration::from_secs(5)))?;
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let conn = rustls::ClientConnection::new(config.clone(), name).unwrap();
    let mut s = rustls::StreamOwned::new(conn, tcp);
    while s.conn.is_handshaking() {
        s.conn.complete_io(&mut s.sock)?;
    }
    Ok(())
}

/// What a TLS flood saw.
#[derive(Debug, Default)]
struct Flood {
    completed: usize,
    refused: usize,
    slowest_refusal: Duration,
}

/// Handshakes from `from` with `to` as fast as `threads` threads can, for
/// `run_for`.
fn tls_flood(
    config: Arc<rustls::ClientConfig>,
    from: IpAddr,
    to: SocketAddr,
    threads: usize,
    run_for: Duration,
) -> JoinHandle<Flood> {
    std::thread::spawn(move || {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                let config = config.clone();
                std::thread::spawn(move || {
                    let mut f = Flood::default();
                    let started = Instant::now();
                    while started.elapsed() < run_for {
                        let t = Instant::now();
                        match tls_handshake_from(&config, from, to) {
                            Ok(()) => f.completed += 1,
                            Err(_) => {
                                f.refused += 1;
                                f.slowest_refusal = f.slowest_refusal.max(t.elapsed());
                                // Hundreds of attempts a second per thread
                                // (the report measured 615 a second), not a
                                // connect flood that would load the machine.
                                std::thread::sleep(Duration::from_millis(2));
                            }
                        }
                    }
                    f
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).fold(Flood::default(), |a, b| Flood {
            completed: a.completed + b.completed,
            refused: a.refused + b.refused,
            slowest_refusal: a.slowest_refusal.max(b.slowest_refusal),
        })
    })
}

/// Checks a flood at 10 handshakes a second (bursts of 10) for 1.5 s.
fn assert_flood_limited(f: &Flood) {
    assert!(f.completed <= 10 + 10 * 2 + 5, "{f:?}: too many handshakes completed from one address");
    assert!(f.refused > f.completed, "{f:?}");
    assert!(f.slowest_refusal < Duration::from_millis(500), "{f:?}: a refused handshake was not closed at once");
}

/// `[http.tls]` (or `[node_listener.tls]`) with `leaf` and low limits: 4 at
/// once and 10 a second per address.
fn tls_table(section: &str, leaf: &Leaf) -> String {
    format!(
        "[{section}]\ncert = \"{}\"\nkey = \"{}\"\nmax_handshakes_per_address = 4\nhandshakes_per_sec_per_address = 10\n",
        leaf.cert.display(),
        leaf.key.display()
    )
}

#[test]
fn a_tls_handshake_flood_from_one_address_is_limited_on_the_client_listener() {
    let _machine = exclusive();
    let pki = Pki::new();
    let leaf = pki.leaf(&["127.0.0.1", "localhost"]);
    let edge = Edge::start(&pool_config_with(
        &tls_table("http.tls", &leaf),
        "",
        &[mock_node("n1", 8, 0, 3, 0)],
        &[mock_model("m", &["n1"], "")],
        "",
    ));
    let run_for = Duration::from_millis(1500);
    let flood = tls_flood(pki.client_config(b"http/1.1"), v4(127, 0, 0, 2), edge.http, 4, run_for);
    // Another client is served promptly meanwhile.
    std::thread::sleep(Duration::from_millis(200));
    for _ in 0..5 {
        let started = Instant::now();
        let mut s = connect(&pki, edge.http, "localhost").unwrap();
        assert_eq!(https_request(&mut s, "GET", "/healthz", "").status, 200);
        let took = started.elapsed();
        assert!(took < Duration::from_secs(1), "another client waited {took:?} during the flood");
        std::thread::sleep(Duration::from_millis(150));
    }
    assert_flood_limited(&flood.join().unwrap());
    // Counted (scraped over TLS, from this address's own budget).
    let mut s = connect(&pki, edge.http, "localhost").unwrap();
    let scrape =
        format!("GET /metrics HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {ADMIN_TOKEN}\r\nconnection: close\r\n\r\n");
    s.write_all(scrape.as_bytes()).unwrap();
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    assert!(text.contains("iop_edge_connection_limits_total{listener=\"http\",action=\"tls_rate\"}"), "{text}");

    // Concurrency: 10 connections from a fresh address that never start
    // their handshake; 4 are held, the rest closed at once.
    let mut silent: Vec<TcpStream> = (0..10).map(|_| connect_from(v4(127, 0, 0, 3), edge.http)).collect();
    let closed = silent.iter_mut().map(|s| closed_within(s, Duration::from_millis(300))).filter(|c| *c).count();
    assert_eq!(closed, 6, "with 4 handshakes allowed at once per address");
}

#[test]
fn a_tls_handshake_flood_on_the_node_listener_leaves_nodes_registering() {
    let _machine = exclusive();
    let pki = Pki::new();
    let leaf = pki.leaf(&["127.0.0.1"]);
    let edge = Edge::start(&pool_config_with(
        "",
        &tls_table("node_listener.tls", &leaf),
        &[mock_node("n1", 8, 0, 3, 0)],
        &[mock_model("m", &["n1"], "")],
        "",
    ));
    let run_for = Duration::from_millis(1500);
    let flood = tls_flood(pki.client_config(b"iop-link/1"), v4(127, 0, 0, 2), edge.nodes, 4, run_for);
    std::thread::sleep(Duration::from_millis(200));
    let started = Instant::now();
    let edge_tls = format!("[edge_tls]\nca = \"{}\"\n", pki.ca.display());
    let node = edge.node_with(&node_token("n1"), &edge_tls, &[]);
    edge.wait_nodes_ready(1);
    assert!(started.elapsed() < Duration::from_secs(3), "the node took {:?} during the flood", started.elapsed());
    assert!(!node.log_text().contains("edge connection failed"), "{}", node.log_text());
    assert_flood_limited(&flood.join().unwrap());
    assert!(metric(&edge, "iop_edge_connection_limits_total{listener=\"node\",action=\"tls_rate\"}") >= 1);
    assert_served_quickly(edge.http, "m");
}
