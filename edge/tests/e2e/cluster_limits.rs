//! Shared limits (`[cluster]`): two edges in front of three nodes, each
//! node linked to both (`edges = [..]`), enforce the API keys' limits
//! together through a `redis-server` the test starts on a socket in its
//! scratch directory. A key's N
//! requests a minute through both edges admit exactly N; a limit changed
//! through one edge's admin API holds on the other; with the engine gone
//! each key's `on_engine_down` holds (closed: 503; open: each edge's share)
//! and says so in an event and a metric; back, the limits are shared again.

use std::{
    io::{Read, Write},
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::{json, Value};

use crate::harness::*;

const SHARED: &str = "sk-shared-5e1f";
const CHANGED: &str = "sk-changed-a7c2";
const OPEN: &str = "sk-open-90d3";
/// `requests_per_minute` of the closed key.
const N: usize = 5;
/// The nodes, each linked to both edges.
const NODES: [&str; 3] = ["n1", "n2", "n3"];

/// Node `id`, linked to every edge of `edges`.
fn start_node(id: &str, edges: &[&Edge]) -> Proc {
    let path = scratch(&format!("{id}.toml"));
    let list: Vec<String> = edges.iter().map(|e| format!("\"{}\"", e.nodes)).collect();
    let text = format!(
        "edges = [{}]\ntoken = \"{}\"\nworkers = 2\nstore = false\n[reconnect]\nmax_attempts = 0\ninterval_sec = 1\n",
        list.join(", "),
        node_token(id)
    );
    std::fs::write(&path, text).expect("write node config");
    Proc::spawn("iop-node", &["--config", path.to_str().expect("utf8")], &[])
}

fn sha256_hex(key: &str) -> String {
    ring::digest::digest(&ring::digest::SHA256, key.as_bytes()).as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// A `redis-server` on a unix socket, killed on drop.
struct Redis {
    child: Child,
    dir: PathBuf,
}

impl Redis {
    fn start(dir: &Path) -> Redis {
        let sock = dir.join("redis.sock");
        let child = Command::new("redis-server")
            .args(["--port", "0", "--unixsocket"])
            .arg(&sock)
            .args(["--unixsocketperm", "700", "--save", "", "--appendonly", "no", "--dir"])
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server (scripts/install-redis.sh installs it)");
        eventually(Duration::from_secs(10), "redis-server answers PING", || ping(&sock));
        Redis { child, dir: dir.to_owned() }
    }

    fn url(&self) -> String {
        format!("unix://{}", self.dir.join("redis.sock").display())
    }

    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn ping(sock: &Path) -> bool {
    let Ok(mut s) = UnixStream::connect(sock) else { return false };
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    let mut buf = [0u8; 7];
    s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}

fn config(redis_url: &str) -> String {
    format!(
        r#"workers = 2
admin_token = "{ADMIN_TOKEN}"
[http]
listen = "127.0.0.1:0"
[node_listener]
listen = "127.0.0.1:0"
{nodes}
[[models]]
name = "m"
provider = "mock"
[cluster]
redis = "{redis_url}"
prefix = "e2e:{pid}:"
# Generous for a debug build on a busy machine; the default is 20.
deadline_ms = 500
[[api_keys]]
name = "shared"
sha256 = "{shared}"
models = ["m"]
requests_per_minute = {N}
on_engine_down = "closed"
[[api_keys]]
name = "changed"
sha256 = "{changed}"
models = ["m"]
requests_per_minute = 100
[[api_keys]]
name = "open"
sha256 = "{open}"
models = ["m"]
requests_per_minute = 4
on_engine_down = "open"
"#,
        pid = std::process::id(),
        nodes = NODES
            .iter()
            .map(|id| format!(
                "[[nodes]]\nid = \"{id}\"\ntoken = \"{}\"\n[[nodes.providers]]\nid = \"mock\"\nkind = \"mock\"\n\
                 capacity = 64\n[nodes.providers.mock]\ntokens = 2\ntoken_interval_ms = 1\nreasoning = false\n",
                node_token(id)
            ))
            .collect::<String>(),
        shared = sha256_hex(SHARED),
        changed = sha256_hex(CHANGED),
        open = sha256_hex(OPEN),
    )
}

fn chat(edge: &Edge, key: &str) -> Response {
    let body = serde_json::to_vec(&json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]})).unwrap();
    let auth = format!("Bearer {key}");
    request(
        edge.http,
        "POST",
        "/v1/chat/completions",
        Some(&body),
        &[("content-type", "application/json"), ("authorization", &auth)],
    )
}

/// Sends `n` requests with `key` alternately through `edges`; the statuses.
fn burst(edges: &[&Edge], key: &str, n: usize) -> Vec<u16> {
    (0..n).map(|i| chat(edges[i % edges.len()], key).status).collect()
}

fn count(statuses: &[u16], status: u16) -> usize {
    statuses.iter().filter(|&&s| s == status).count()
}

fn keys(edge: &Edge) -> Value {
    let r = edge.admin("/admin/v1/keys");
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.json()
}

fn engine_up(edge: &Edge, live: u64) -> bool {
    let k = keys(edge);
    k["cluster"]["engine"] == "up" && k["cluster"]["live_edges"] == live
}

fn limits(edge: &Edge, name: &str) -> Value {
    let r = edge.admin(&format!("/admin/v1/keys/{name}/limits"));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.json()
}

fn admin_send(edge: &Edge, method: &str, path: &str, body: Option<&[u8]>) -> Response {
    let auth = format!("Bearer {ADMIN_TOKEN}");
    request(edge.http, method, path, body, &[("authorization", &auth), ("content-type", "application/json")])
}

fn metrics(edge: &Edge) -> String {
    String::from_utf8_lossy(&edge.admin("/metrics").body).into_owned()
}

#[test]
#[ignore = "needs redis-server (scripts/install-redis.sh)"]
fn keys_limits_are_shared_across_edges_and_hold_their_fail_mode() {
    let dir = scratch("redis");
    std::fs::create_dir_all(&dir).unwrap();
    let redis = Redis::start(&dir);
    let url = redis.url();
    let a = Edge::start(&config(&url));
    let b = Edge::start(&config(&url));
    let _nodes: Vec<Proc> = NODES.iter().map(|id| start_node(id, &[&a, &b])).collect();
    a.wait_nodes_ready(3);
    b.wait_nodes_ready(3);
    let mut events = a.events();
    eventually(Duration::from_secs(10), "both edges see the engine and each other", || {
        engine_up(&a, 2) && engine_up(&b, 2)
    });
    assert!(metrics(&a).contains("iop_edge_cluster_engine_up 1"), "{}", metrics(&a));

    // N a minute through both edges: exactly N of 2N.
    let statuses = burst(&[&a, &b], SHARED, 2 * N);
    assert_eq!(count(&statuses, 200), N, "{statuses:?}");
    assert_eq!(count(&statuses, 429), N, "{statuses:?}");
    let refused = chat(&b, SHARED);
    assert_eq!(refused.status, 429);
    assert_eq!(refused.json()["error"]["code"], "rate_limit_exceeded");
    let retry: u64 = refused.header("retry-after").and_then(|v| v.parse().ok()).expect("retry-after");
    assert!((1..=60).contains(&retry), "retry-after {retry}");

    // A limit changed through edge A holds on edge B.
    let bad = admin_send(&a, "PUT", "/admin/v1/keys/changed/limits", Some(br#"{"tokens_per_day": 0}"#));
    assert_eq!(bad.status, 400, "{}", String::from_utf8_lossy(&bad.body));
    assert!(bad.json()["error"]["message"].as_str().unwrap_or("").contains("tokens_per_day"));
    let unknown = admin_send(&a, "PUT", "/admin/v1/keys/nobody/limits", Some(br#"{}"#));
    assert_eq!(unknown.status, 404);
    let put = admin_send(&a, "PUT", "/admin/v1/keys/changed/limits", Some(br#"{"requests_per_minute": 3}"#));
    assert_eq!(put.status, 200, "{}", String::from_utf8_lossy(&put.body));
    assert_eq!(put.json()["in_force"]["requests_per_minute"], 3);
    events.wait("key_limits_changed", Duration::from_secs(5), |e| e["key"] == "changed");
    eventually(Duration::from_secs(5), "edge B applies the limit set through edge A", || {
        let l = limits(&b, "changed");
        l["in_force"]["requests_per_minute"] == 3 && l["source"] == "admin"
    });
    assert_eq!(limits(&b, "changed")["configured"]["requests_per_minute"], 100);
    let statuses = burst(&[&a, &b], CHANGED, 6);
    assert_eq!(count(&statuses, 200), 3, "{statuses:?}");

    // The engine gone: an event and a metric say so; the closed key is
    // refused with 503, the open one gets each edge's share (4 / 2 edges).
    redis.kill();
    events.wait("cluster_engine", Duration::from_secs(10), |e| e["state"] == "down");
    let (mut seen_a, mut seen_b) = (false, false);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !(seen_a && seen_b) {
        assert!(Instant::now() < deadline, "the edges never noticed the engine was gone");
        // A request notices at the next check or presence round.
        seen_a = seen_a || chat(&a, SHARED).status == 503;
        seen_b = seen_b || chat(&b, SHARED).status == 503;
        std::thread::sleep(Duration::from_millis(50));
    }
    let closed = chat(&a, SHARED);
    assert_eq!(closed.status, 503);
    assert_eq!(closed.json()["error"]["code"], "rate_limits_unavailable");
    let m = metrics(&a);
    assert!(m.contains("iop_edge_cluster_engine_up 0"), "{m}");
    assert!(m.contains("iop_edge_cluster_limit_mode{mode=\"closed\"} 1"), "{m}");
    assert!(m.contains("iop_edge_cluster_limit_mode{mode=\"open\"} 2"), "{m}");
    assert_eq!(keys(&b)["cluster"]["engine"], "down");
    // A change cannot be stored now.
    let put = admin_send(&b, "PUT", "/admin/v1/keys/changed/limits", Some(br#"{"requests_per_minute": 9}"#));
    assert_eq!(put.status, 503);
    let on_a = burst(&[&a], OPEN, 3);
    let on_b = burst(&[&b], OPEN, 3);
    assert_eq!((count(&on_a, 200), count(&on_b, 200)), (2, 2), "a {on_a:?}, b {on_b:?}");

    // Back on the same socket (empty: no persistence): shared limits again.
    let redis = Redis::start(&dir);
    events.wait("cluster_engine", Duration::from_secs(10), |e| e["state"] == "up");
    eventually(Duration::from_secs(10), "both edges see the engine again", || engine_up(&a, 2) && engine_up(&b, 2));
    let statuses = burst(&[&b, &a], SHARED, 2 * N);
    assert_eq!(count(&statuses, 200), N, "{statuses:?}");
    assert_eq!(count(&statuses, 429), N, "{statuses:?}");
    assert!(metrics(&b).contains("iop_edge_cluster_engine_up 1"));
    // The engine's copy of the set limits was lost with it: the config's hold.
    eventually(Duration::from_secs(5), "the config's limits are back", || limits(&b, "changed")["source"] == "config");
    drop(redis);
}
