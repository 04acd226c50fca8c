//! Clients that never read: each open stream holds at most its credit
//! window (plus a read buffer) on the edge, whatever the size of the
//! deltas the provider sends.

use std::{
    io::{Read, Write},
    net::TcpStream,
    time::Duration,
};

use serde_json::json;

use crate::{attack::*, harness::*};

/// Never-reading clients at once through the tunnel (the attack);
/// the normalized path's bound per stream is checked with fewer (each
/// stream first fills the kernel's socket buffers: a few MiB of deltas
/// rendered by debug builds).
const CLIENTS: usize = 40;
const CLIENTS_NORMALIZED: usize = 20;
/// The stream credit window (`iop_core::flow::WINDOW_BYTES`).
const WINDOW_KIB: u64 = 1024;
/// What a stream may hold beyond its window: the link's read buffer share,
/// the client connection's buffers and the task's state.
const PER_STREAM_EXTRA_KIB: u64 = 128;
/// The allocator's own slack (size classes, thread caches).
const SLACK_KIB: u64 = 8 * 1024;

/// A client that sends a streamed chat request for `model`, reads the
/// status line and then nothing more.
fn never_reading(addr: std::net::SocketAddr, model: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    let body = json!({"model": model, "stream": true, "messages": [{"role": "user", "content": "x"}]}).to_string();
    let req = format!("POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\ncontent-length: {}\r\n\r\n{body}", body.len());
    s.write_all(req.as_bytes()).unwrap();
    let mut head = [0u8; 16];
    s.read_exact(&mut head).unwrap();
    assert!(head.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&head));
    s
}

/// Starts `clients` never-reading clients on 1 MiB deltas and waits until each
/// stream has all it may (the node waits for credit on every one), then
/// until the edge's RSS settles within the bound (freed buffers go back to
/// the system about a second after a burst); what it grew by.
fn held_by_never_reading_clients(provider_kind: &str, clients: usize) -> u64 {
    let _machine = exclusive();
    // Unpaced 1 MiB deltas: the upstream sends as fast as the node reads.
    let big = MockProv::start(&["--token-bytes", "1048576", "--tokens", "5000"]);
    let (kind, base) = match provider_kind {
        "openai_compat" => ("openai_compat", big.base_url()),
        _ => ("ollama", format!("http://{}", big.addr)),
    };
    let node = format!(
        "[[nodes]]\nid = \"n1\"\ntoken = \"{}\"\n[[nodes.providers]]\nid = \"big\"\nkind = \"{kind}\"\n\
         base_url = \"{base}\"\ncapacity = 64\n",
        node_token("n1"),
    );
    let model = "[[models]]\nname = \"big\"\nnode = \"n1\"\nprovider = \"big\"\nupstream_model = \"mock\"\n";
    let edge = Edge::start(&pool_config_with("idle_timeout_sec = 60", "", &[node], &[model.to_owned()], ""));
    let _n1 = edge.start_node("n1", "");
    edge.wait_nodes_ready(1);
    let idle = edge.proc.rss_kib();
    let held: Vec<TcpStream> = (0..clients).map(|_| never_reading(edge.http, "big")).collect();
    eventually(Duration::from_secs(30), "every stream waits for credit", || {
        edge.admin("/admin/v1/nodes/n1/transport").json()["waiting_for_credit"].as_u64() == Some(clients as u64)
    });
    // Buffers freed while the streams filled go back to the system about
    // a second later (jemalloc's decay): what is left is what they hold.
    let growth = settled_rss(&edge.proc).saturating_sub(idle);
    println!(
        "{provider_kind}: {clients} never-reading clients on 1 MiB deltas hold +{growth} KiB on the edge \
         ({} KiB per stream; idle {} MiB)",
        growth / clients as u64,
        idle / 1024,
    );
    drop(held);
    edge.wait_snapshot(Duration::from_secs(20), "the abandoned streams released their leases", |s| {
        provider_of(s, "n1", "big")["leases_in_use"] == 0
    });
    growth
}

/// The RSS once it stopped falling for 1.5 s (at most 10 s).
fn settled_rss(proc: &Proc) -> u64 {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut low = proc.rss_kib();
    let mut since = std::time::Instant::now();
    while since.elapsed() < Duration::from_millis(1500) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        let now = proc.rss_kib();
        if now + 256 < low {
            since = std::time::Instant::now();
        }
        low = low.min(now);
    }
    low
}

fn assert_within_windows(clients: usize, growth: u64) {
    let allowed = clients as u64 * (WINDOW_KIB + PER_STREAM_EXTRA_KIB) + SLACK_KIB;
    assert!(growth <= allowed, "{clients} never-reading clients hold {growth} KiB on the edge (allowed {allowed} KiB)");
}

#[test]
fn never_reading_clients_hold_one_window_each_through_the_tunnel() {
    assert_within_windows(CLIENTS, held_by_never_reading_clients("openai_compat", CLIENTS));
}

#[test]
fn never_reading_clients_hold_one_window_each_on_the_normalized_path() {
    assert_within_windows(CLIENTS_NORMALIZED, held_by_never_reading_clients("ollama", CLIENTS_NORMALIZED));
}
