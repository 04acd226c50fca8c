//! Spawns the real binaries on port 0 and talks to them over real sockets.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::{SocketAddr, TcpStream},
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicUsize, Ordering},
        mpsc,
    },
    time::{Duration, Instant},
};

static SEQ: AtomicUsize = AtomicUsize::new(0);

/// Path of a workspace binary built next to this test.
pub fn bin(name: &str) -> PathBuf {
    if name == "iop-edge" {
        return PathBuf::from(env!("CARGO_BIN_EXE_iop-edge"));
    }
    // target/<profile>/deps/e2e-xxxx → target/<profile>/<name>
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    let path = dir.join(name);
    assert!(path.exists(), "{} is not built; run `cargo test --workspace` (it builds every binary)", path.display());
    path
}

pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("iop-e2e-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join(format!("{}-{}", SEQ.fetch_add(1, Ordering::Relaxed), name))
}

/// A child process killed on drop; its stderr goes to a log file shown on failure.
pub struct Proc {
    pub child: Child,
    pub log: PathBuf,
    lines: mpsc::Receiver<String>,
}

impl Proc {
    pub fn spawn(name: &str, args: &[&str], envs: &[(&str, &str)]) -> Proc {
        let mut cmd = Command::new(bin(name));
        if name == "iop-node" {
            // A node keeps its run store (`iop.db`) in its working directory
            // by default: one of its own per node, never the crate's.
            let dir = scratch("node-cwd");
            std::fs::create_dir_all(&dir).expect("node dir");
            cmd.current_dir(dir);
        }
        Self::spawn_in(name, cmd, args, envs)
    }

    /// Like [`Proc::spawn`], through `cmd` (e.g. `prlimit … <binary>`),
    /// which must end up exec-ing the binary.
    pub fn spawn_in(name: &str, mut cmd: Command, args: &[&str], envs: &[(&str, &str)]) -> Proc {
        let log = scratch(&format!("{name}.log"));
        let stderr = std::fs::File::create(&log).expect("log file");
        cmd.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(stderr);
        cmd.env("IOP_LOG", "info,iop_edge=debug,iop_node=debug");
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {name}: {e}"));
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Proc { child, log, lines }
    }

    /// Waits for a stdout line starting with `prefix`.
    pub fn line(&self, prefix: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.starts_with(prefix) => return l,
                Ok(_) => {}
                Err(_) => panic!("no `{prefix}` line; log:\n{}", self.log_text()),
            }
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits for the process to exit; returns its exit code.
    pub fn wait_exit(&mut self, within: Duration) -> Option<i32> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("---- {} ----\n{}", self.log.display(), self.log_text());
        }
    }
}

/// `iop-mockprov` with extra CLI flags.
#[allow(dead_code)] // `proc` is held so the child lives as long as the handle.
pub struct MockProv {
    pub proc: Proc,
    pub addr: SocketAddr,
}

impl MockProv {
    pub fn start(flags: &[&str]) -> MockProv {
        let mut args = vec!["--listen", "127.0.0.1:0"];
        args.extend_from_slice(flags);
        let proc = Proc::spawn("iop-mockprov", &args, &[]);
        let line = proc.line("iop-mockprov listening on ");
        let addr = line.trim_start_matches("iop-mockprov listening on ").trim().parse().expect("mockprov addr");
        MockProv { proc, addr }
    }

    pub fn stats(&self) -> serde_json::Value {
        let r = request(self.addr, "GET", "/stats", None, &[]);
        serde_json::from_slice(&r.body).expect("stats json")
    }

    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The base URL a provider of `kind` is configured with (Ollama's has no `/v1`).
    pub fn base_for(&self, kind: &str) -> String {
        if kind == "ollama" {
            format!("http://{}", self.addr)
        } else {
            self.base_url()
        }
    }

    /// Waits until the mock saw the connection of the request tagged `tag`
    /// closed before the answer's end (`GET /closes`).
    pub fn wait_closed(&self, tag: &str) {
        let needle = format!("\"tag\":\"{tag}\"");
        eventually(Duration::from_secs(10), &format!("the provider connection of {tag} closed"), || {
            let r = request(self.addr, "GET", "/closes", None, &[]);
            String::from_utf8_lossy(&r.body).contains(&needle)
        });
    }
}

/// A local port nothing listens on, kept so while the guard lives: the
/// local end of a connection, which no other socket can be given. (A port
/// bound and closed can be handed to another test's listener meanwhile,
/// which then answers in its place.)
pub fn closed_port() -> (std::net::TcpStream, u16) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let guard = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let port = guard.local_addr().unwrap().port();
    (guard, port)
}

/// Edge config: node `n1` with one provider `up` of `kind` at `base`
/// (`provider_extra`: more of its keys) and model `m` on it, named
/// `upstream_model` upstream.
pub fn one_provider_config(kind: &str, base: &str, provider_extra: &str, upstream_model: &str) -> String {
    n1_header()
        + &format!(
            "[[nodes.providers]]\nid = \"up\"\nkind = \"{kind}\"\nbase_url = \"{base}\"\ncapacity = 8\n{provider_extra}\n\
             [[models]]\nname = \"m\"\nnode = \"n1\"\nprovider = \"up\"\nupstream_model = \"{upstream_model}\"\n"
        )
}

/// Node `n1` with providers `a` and `b` (kind, base URL), each with
/// `provider_extra`, and model `m` on both, tried in that order when both
/// are idle.
pub fn two_provider_config(a: (&str, &str), b: (&str, &str), provider_extra: &str) -> String {
    let provider = |id: &str, (kind, base): (&str, &str)| {
        format!("[[nodes.providers]]\nid = \"{id}\"\nkind = \"{kind}\"\nbase_url = \"{base}\"\ncapacity = 8\n{provider_extra}\n")
    };
    let target = |id: &str| format!("[[models.targets]]\nnode = \"n1\"\nprovider = \"{id}\"\nmodel = \"mock\"\n");
    n1_header() + &provider("a", a) + &provider("b", b) + "[[models]]\nname = \"m\"\n" + &target("a") + &target("b")
}

pub struct Edge {
    pub proc: Proc,
    pub http: SocketAddr,
    pub nodes: SocketAddr,
    /// The config file the edge was started with (rewrite it, then `sighup`).
    pub config_path: PathBuf,
}

pub const NODE_TOKEN: &str = "e2e-node-token";

/// The start of an edge config with two workers, the admin token, both
/// listeners on port 0 and node `n1` (token [`NODE_TOKEN`]); its providers,
/// models and the rest follow.
pub fn n1_header() -> String {
    format!(
        "workers = 2\nadmin_token = \"{ADMIN_TOKEN}\"\n[http]\nlisten = \"127.0.0.1:0\"\n\
         [node_listener]\nlisten = \"127.0.0.1:0\"\n[[nodes]]\nid = \"n1\"\ntoken = \"{NODE_TOKEN}\"\n"
    )
}

/// Edge config with one node `n1` whose provider `up` is openai_compat at `upstream`.
pub fn edge_config(upstream: &str, extra: &str) -> String {
    format!(
        r#"
workers = 2
admin_token = "{ADMIN_TOKEN}"
[http]
listen = "127.0.0.1:0"
max_header_bytes = 4096
max_body_bytes = 65536
[node_listener]
listen = "127.0.0.1:0"
[[nodes]]
id = "n1"
token = "{NODE_TOKEN}"
[[nodes.providers]]
id = "up"
kind = "openai_compat"
base_url = "{upstream}"
capacity = 16
[[models]]
name = "gpt-test"
node = "n1"
provider = "up"
upstream_model = "mock-upstream"
{extra}
"#
    )
}

impl Edge {
    pub fn start(config: &str) -> Edge {
        Self::start_with_env(config, &[])
    }

    pub fn start_with_env(config: &str, envs: &[(&str, &str)]) -> Edge {
        Self::start_in(config, Command::new(bin("iop-edge")), envs)
    }

    /// An edge whose open-file limit (soft and hard) is `nofile`.
    pub fn start_with_nofile(config: &str, nofile: u32) -> Edge {
        let mut cmd = Command::new("prlimit");
        cmd.arg(format!("--nofile={nofile}:{nofile}")).arg("--").arg(bin("iop-edge"));
        Self::start_in(config, cmd, &[])
    }

    fn start_in(config: &str, cmd: Command, envs: &[(&str, &str)]) -> Edge {
        let path = scratch("edge.toml");
        std::fs::write(&path, config).expect("write config");
        let proc = Proc::spawn_in("iop-edge", cmd, &["--config", path.to_str().expect("utf8")], envs);
        let line = proc.line("iop-edge ready ");
        let field = |k: &str| -> SocketAddr {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(k))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no {k} in `{line}`"))
        };
        Edge { http: field("http="), nodes: field("nodes="), proc, config_path: path }
    }

    /// Starts an `iop-node` for this edge with `token`.
    pub fn node(&self, token: &str, envs: &[(&str, &str)]) -> Proc {
        self.node_with(token, "", envs)
    }

    /// Starts an `iop-node` with `token` and `extra` TOML (top-level keys
    /// first, then tables such as `[testing]`; not `[reconnect]`).
    pub fn node_with(&self, token: &str, extra: &str, envs: &[(&str, &str)]) -> Proc {
        let path = scratch("node.toml");
        let cfg = format!(
            "edge = \"{}\"\ntoken = \"{token}\"\n{extra}\n[reconnect]\nmax_attempts = 3\ninterval_sec = 1\n",
            self.nodes
        );
        std::fs::write(&path, cfg).expect("write node config");
        Proc::spawn("iop-node", &["--config", path.to_str().expect("utf8")], envs)
    }

    /// Starts the node `id` of a [`pool_config`] (token `node_token(id)`).
    pub fn start_node(&self, id: &str, extra: &str) -> Proc {
        self.node_with(&node_token(id), extra, &[])
    }

    /// Waits until every worker core sees `n` ready nodes.
    pub fn wait_nodes_ready(&self, n: u64) {
        let deadline = Instant::now() + Duration::from_secs(20);
        // Each connection lands on some core; probe several times so every core has answered.
        let mut streak = 0;
        while streak < 8 {
            assert!(Instant::now() < deadline, "nodes never became ready; log:\n{}", self.proc.log_text());
            let r = request(self.http, "GET", "/healthz", None, &[]);
            let v: serde_json::Value = serde_json::from_slice(&r.body).expect("healthz json");
            if v["nodes_ready"].as_u64() == Some(n) {
                streak += 1;
            } else {
                streak = 0;
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    /// `data:` payloads of an SSE body.
    pub fn sse_data(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.body)
            .lines()
            .filter_map(|l| l.strip_prefix("data: ").map(str::to_owned))
            .collect()
    }
}

/// Opens a connection and writes one `Connection: close` request.
fn send_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
    headers: &[(&str, &str)],
    read_timeout: Duration,
) -> TcpStream {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(read_timeout)).expect("timeout");
    let mut req = format!("{method} {path} HTTP/1.1\r\nhost: test\r\nconnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if let Some(b) = body {
        req.push_str(&format!("content-type: application/json\r\ncontent-length: {}\r\n", b.len()));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).expect("write head");
    if let Some(b) = body {
        s.write_all(b).expect("write body");
    }
    s
}

/// One request on a fresh connection (`Connection: close`), body read to EOF.
pub fn request(addr: SocketAddr, method: &str, path: &str, body: Option<&[u8]>, headers: &[(&str, &str)]) -> Response {
    let mut s = send_request(addr, method, path, body, headers, Duration::from_secs(20));
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read response");
    parse_response(&raw)
}

pub fn post_json(addr: SocketAddr, path: &str, body: &serde_json::Value) -> Response {
    request(addr, "POST", path, Some(body.to_string().as_bytes()), &[])
}

pub fn parse_response(raw: &[u8]) -> Response {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("response head");
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let mut lines = head.split("\r\n");
    let status = lines.next().and_then(|l| l.split(' ').nth(1)).and_then(|s| s.parse().ok()).expect("status");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':').map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned())))
        .collect();
    let rest = &raw[split + 4..];
    let chunked = headers.iter().any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
    let body = if chunked { dechunk(rest) } else { rest.to_vec() };
    Response { status, headers, body }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = b.windows(2).position(|w| w == b"\r\n") else { return out };
        let size = usize::from_str_radix(std::str::from_utf8(&b[..eol]).expect("chunk size").trim(), 16).expect("hex");
        b = &b[eol + 2..];
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&b[..size]);
        b = &b[size + 2..];
    }
}

/// Sends `POST path` with `body` (`connection: close`) and reads the whole
/// answer in 16 KiB reads, sleeping `pause(bytes read so far)` after each:
/// a client far slower than the server writes.
pub fn read_slowly(addr: SocketAddr, path: &str, body: &str, pause: impl Fn(usize) -> Duration) -> Response {
    use std::io::{Read, Write};
    let mut s = TcpStream::connect(addr).unwrap();
    let req =
        format!("POST {path} HTTP/1.1\r\nhost: t\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}", body.len());
    s.write_all(req.as_bytes()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut raw = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e) => panic!("slow reader: {e}"),
        }
        std::thread::sleep(pause(raw.len()));
    }
    parse_response(&raw)
}

/// Polls `check` until it holds or `within` passes.
pub fn eventually(within: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

// ---------------------------------------------------------------------------
// Multi-node configs, signals, the admin API, timed streaming clients.
// ---------------------------------------------------------------------------

pub const ADMIN_TOKEN: &str = "e2e-admin-token";

/// Registration token of node `id` in a [`pool_config`].
pub fn node_token(id: &str) -> String {
    format!("{id}-token")
}

/// A `[[nodes]]` entry with one in-process mock provider `mock` that streams
/// `tokens` tokens, one every `interval_ms`.
pub fn mock_node(id: &str, capacity: u32, long_capacity: u32, tokens: u32, interval_ms: u32) -> String {
    format!(
        r#"
[[nodes]]
id = "{id}"
token = "{token}"
[[nodes.providers]]
id = "mock"
kind = "mock"
capacity = {capacity}
long_capacity = {long_capacity}
[nodes.providers.mock]
tokens = {tokens}
token_interval_ms = {interval_ms}
"#,
        token = node_token(id)
    )
}

/// A `[[models]]` group `name` served by provider `mock` of each node in
/// `targets`; `extra` holds model keys (e.g. `max_waiters = 1`).
pub fn mock_model(name: &str, targets: &[&str], extra: &str) -> String {
    let mut s = format!("\n[[models]]\nname = \"{name}\"\n{extra}\n");
    for t in targets {
        s.push_str(&format!("[[models.targets]]\nnode = \"{t}\"\nprovider = \"mock\"\nmodel = \"mock-{name}\"\n"));
    }
    s
}

/// A whole edge config with the admin API on: `nodes` and `models` are
/// concatenated entries, `tail` is appended (e.g. a `[testing]` table).
pub fn pool_config(nodes: &[String], models: &[String], tail: &str) -> String {
    pool_config_with("", "", nodes, models, tail)
}

/// [`pool_config`] with extra `[http]` and `[node_listener]` keys.
pub fn pool_config_with(http: &str, node_listener: &str, nodes: &[String], models: &[String], tail: &str) -> String {
    format!(
        r#"admin_token = "{ADMIN_TOKEN}"
workers = 2
[http]
listen = "127.0.0.1:0"
{http}
[node_listener]
listen = "127.0.0.1:0"
{node_listener}
{}
{}
{tail}
"#,
        nodes.concat(),
        models.concat()
    )
}

/// Sends `sig` (a name such as `HUP`, `STOP`, `TERM`) to a process with
/// the `kill` command (the workspace forbids `unsafe`, so no libc::kill).
pub fn signal_pid(pid: u32, sig: &str) {
    let out = Command::new("kill").arg(format!("-{sig}")).arg(pid.to_string()).output().expect("run kill");
    assert!(out.status.success(), "kill -{sig} {pid}: {}", String::from_utf8_lossy(&out.stderr));
}

impl Proc {
    /// Resident set size from `/proc/<pid>/status`, in KiB.
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).expect("proc status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS")
    }

    /// Sends `sig` (e.g. `TERM`) to the process.
    pub fn signal(&self, sig: &str) {
        signal_pid(self.child.id(), sig);
    }

    /// `kill -9`, and reaps the process.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// `kill -STOP`; the returned guard continues the process when dropped
    /// (also on a failing test), unless it was already continued.
    pub fn stop(&self) -> Stopped {
        self.signal("STOP");
        Stopped { pid: self.child.id(), continued: false }
    }
}

/// A process stopped with SIGSTOP; dropping this sends SIGCONT.
pub struct Stopped {
    pid: u32,
    continued: bool,
}

impl Stopped {
    /// `kill -CONT`.
    pub fn cont(mut self) {
        self.resume();
    }

    fn resume(&mut self) {
        if !self.continued {
            self.continued = true;
            let _ = Command::new("kill").arg("-CONT").arg(self.pid.to_string()).status();
        }
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        self.resume();
    }
}

impl Edge {
    /// Asks the edge to re-read its config file.
    pub fn sighup(&self) {
        self.proc.signal("HUP");
    }

    /// Replaces the edge's config file (apply it with [`Edge::sighup`]).
    pub fn rewrite_config(&self, text: &str) {
        let tmp = self.config_path.with_extension("toml.new");
        std::fs::write(&tmp, text).expect("write config");
        std::fs::rename(&tmp, &self.config_path).expect("replace config");
    }

    /// An admin request with the admin token.
    pub fn admin(&self, path: &str) -> Response {
        request(self.http, "GET", path, None, &[("authorization", &format!("Bearer {ADMIN_TOKEN}"))])
    }

    /// `GET /admin/v1/nodes`.
    pub fn snapshot(&self) -> serde_json::Value {
        let r = self.admin("/admin/v1/nodes");
        assert_eq!(r.status, 200, "snapshot: {}", String::from_utf8_lossy(&r.body));
        r.json()
    }

    /// Polls the snapshot until `check` holds; returns the snapshot that did.
    pub fn wait_snapshot(
        &self,
        within: Duration,
        what: &str,
        check: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = Instant::now() + within;
        loop {
            let snap = self.snapshot();
            if check(&snap) {
                return snap;
            }
            assert!(Instant::now() < deadline, "timed out waiting for: {what}; last snapshot:\n{snap:#}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits until provider `node/provider` has `n` leases in use.
    pub fn wait_in_use(&self, node: &str, provider: &str, n: u64) -> serde_json::Value {
        self.wait_snapshot(Duration::from_secs(5), &format!("{node}/{provider} leases_in_use == {n}"), |s| {
            provider_of(s, node, provider)["leases_in_use"] == n
        })
    }

    /// Waits until model `name` has `n` waiters and every target's owner
    /// core has published them (the model counter moves first).
    pub fn wait_model_waiters(&self, name: &str, n: u64) -> serde_json::Value {
        self.wait_snapshot(Duration::from_secs(5), &format!("model {name} waiters == {n}"), |s| {
            let m = model_of(s, name);
            m["waiters"] == n
                && m["targets"].as_array().is_some_and(|ts| {
                    ts.iter().all(|t| {
                        let p = provider_of(s, t["node"].as_str().unwrap_or(""), t["provider"].as_str().unwrap_or(""));
                        p["health"] == "offline" || p["waiters"].as_u64().unwrap_or(0) >= n
                    })
                })
        })
    }

    /// Invariant 2: waits until every counter of every provider and model is
    /// zero; returns that snapshot.
    pub fn assert_idle(&self) -> serde_json::Value {
        self.wait_snapshot(Duration::from_secs(3), "every lease and waiter counter back to 0", |s| {
            counters_zero(s).is_ok()
        })
    }

    /// Opens `GET /admin/v1/events`; returns once `: connected` arrived.
    pub fn events(&self) -> Events {
        Events::open(self.http)
    }
}

/// `Err(description)` naming the first non-zero counter.
pub fn counters_zero(snap: &serde_json::Value) -> Result<(), String> {
    for n in snap["nodes"].as_array().expect("nodes") {
        for p in n["providers"].as_array().expect("providers") {
            for (k, v) in [
                ("normal.in_use", &p["normal"]["in_use"]),
                ("long.in_use", &p["long"]["in_use"]),
                ("leases_in_use", &p["leases_in_use"]),
                ("live_leases", &p["live_leases"]),
                ("waiters", &p["waiters"]),
            ] {
                if v != 0 {
                    return Err(format!("{}/{} {k} = {v}", n["id"], p["id"]));
                }
            }
        }
    }
    for m in snap["models"].as_array().expect("models") {
        if m["waiters"] != 0 {
            return Err(format!("model {} waiters = {}", m["name"], m["waiters"]));
        }
    }
    Ok(())
}

/// The node `id` of a snapshot.
pub fn node_of<'a>(snap: &'a serde_json::Value, id: &str) -> &'a serde_json::Value {
    snap["nodes"]
        .as_array()
        .and_then(|ns| ns.iter().find(|n| n["id"] == id))
        .unwrap_or_else(|| panic!("no node {id} in snapshot:\n{snap:#}"))
}

/// Provider `provider` of node `node` in a snapshot.
pub fn provider_of<'a>(snap: &'a serde_json::Value, node: &str, provider: &str) -> &'a serde_json::Value {
    node_of(snap, node)["providers"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["id"] == provider))
        .unwrap_or_else(|| panic!("no provider {node}/{provider} in snapshot:\n{snap:#}"))
}

/// Model group `name` in a snapshot.
pub fn model_of<'a>(snap: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    snap["models"]
        .as_array()
        .and_then(|ms| ms.iter().find(|m| m["name"] == name))
        .unwrap_or_else(|| panic!("no model {name} in snapshot:\n{snap:#}"))
}

/// Asserts invariant 7 for an offline node: listed, disconnected, every
/// provider unavailable/offline with effective capacity 0.
pub fn assert_offline(snap: &serde_json::Value, node: &str) {
    let n = node_of(snap, node);
    assert_eq!(n["connected"], false, "{snap:#}");
    assert_eq!(n["ready"], false, "{snap:#}");
    for p in n["providers"].as_array().expect("providers") {
        assert_eq!(p["status"], "unavailable", "{snap:#}");
        assert_eq!(p["health"], "offline", "{snap:#}");
        assert_eq!(p["normal"]["effective"], 0, "{snap:#}");
        assert_eq!(p["long"]["effective"], 0, "{snap:#}");
    }
}

/// Reads an HTTP/1.1 chunked body incrementally.
struct Chunked<R> {
    inner: R,
    left: usize,
    done: bool,
}

impl<R: BufRead> Read for Chunked<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.done || buf.is_empty() {
            return Ok(0);
        }
        if self.left == 0 {
            let mut line = String::new();
            if self.inner.read_line(&mut line)? == 0 {
                self.done = true; // connection closed without a last chunk
                return Ok(0);
            }
            let size = line.trim().split(';').next().unwrap_or("").trim().to_owned();
            let size = usize::from_str_radix(&size, 16).map_err(|e| {
                std::io::Error::new(std::io::ErrorKind::InvalidData, format!("chunk size {line:?}: {e}"))
            })?;
            if size == 0 {
                self.done = true;
                return Ok(0);
            }
            self.left = size;
        }
        let n = buf.len().min(self.left);
        let got = self.inner.read(&mut buf[..n])?;
        if got == 0 {
            self.done = true;
            return Ok(0);
        }
        self.left -= got;
        if self.left == 0 {
            let mut crlf = [0u8; 2];
            self.inner.read_exact(&mut crlf)?;
        }
        Ok(got)
    }
}

/// The connection, status, headers and body reader of [`open_stream`].
type Opened = (TcpStream, u16, Vec<(String, String)>, Box<dyn BufRead + Send>);

/// Writes a request on a fresh connection and reads the response head;
/// returns status, headers and a reader of the (de-chunked) body.
fn open_stream(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
    headers: &[(&str, &str)],
    read_timeout: Duration,
) -> Opened {
    let s = send_request(addr, method, path, body, headers, read_timeout);
    let mut rd = BufReader::new(s.try_clone().expect("clone stream"));
    let mut status_line = String::new();
    rd.read_line(&mut status_line).expect("status line");
    let status = status_line.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        panic!("bad status line {status_line:?}");
    });
    let mut hdrs = Vec::new();
    loop {
        let mut line = String::new();
        rd.read_line(&mut line).expect("header line");
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            hdrs.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
        }
    }
    let chunked = hdrs.iter().any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
    let len = hdrs.iter().find(|(k, _)| k == "content-length").and_then(|(_, v)| v.parse::<u64>().ok());
    let body: Box<dyn BufRead + Send> = if chunked {
        Box::new(BufReader::new(Chunked { inner: rd, left: 0, done: false }))
    } else if let Some(len) = len {
        Box::new(BufReader::new(rd.take(len)))
    } else {
        Box::new(rd)
    };
    (s, status, hdrs, body)
}

/// A finished chat request with the arrival time of every SSE `data:` line.
#[derive(Debug)]
pub struct Timed {
    pub resp: Response,
    /// `data:` payloads with their arrival times (streams only).
    pub data: Vec<(Instant, String)>,
    /// When the body ended (EOF).
    pub ended: Instant,
}

impl Timed {
    /// Arrival of the first content token.
    pub fn first_content(&self) -> Instant {
        self.data
            .iter()
            .find(|(_, d)| d.contains("\"content\":\"tok"))
            .map(|(t, _)| *t)
            .unwrap_or_else(|| panic!("no content token in {:?}", self.resp_text()))
    }

    /// The concatenated content deltas of a stream.
    pub fn content(&self) -> String {
        self.data
            .iter()
            .filter_map(|(_, d)| serde_json::from_str::<serde_json::Value>(d).ok())
            .filter_map(|v| v["choices"][0]["delta"]["content"].as_str().map(str::to_owned))
            .collect()
    }

    /// The last `data:` payload and its arrival time.
    pub fn last(&self) -> &(Instant, String) {
        self.data.last().unwrap_or_else(|| panic!("no data events: {:?}", self.resp_text()))
    }

    pub fn resp_text(&self) -> String {
        format!("{} {}", self.resp.status, String::from_utf8_lossy(&self.resp.body))
    }
}

/// A chat completion running on a background thread.
pub struct Chat {
    handle: std::thread::JoinHandle<Timed>,
    progress: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Chat {
    /// Starts `POST /v1/chat/completions` for `model` with one user message.
    /// `max_tokens` 0 = unset.
    pub fn start(addr: SocketAddr, model: &str, content: &str, stream: bool, max_tokens: u32) -> Chat {
        let mut body = serde_json::json!({"model": model, "stream": stream,
            "messages": [{"role": "user", "content": content}]});
        if max_tokens > 0 {
            body["max_tokens"] = max_tokens.into();
        }
        let (tx, progress) = mpsc::channel();
        let handle = std::thread::spawn(move || {
            let bytes = body.to_string();
            let (_s, status, headers, mut rd) =
                open_stream(addr, "POST", "/v1/chat/completions", Some(bytes.as_bytes()), &[], Duration::from_secs(15));
            let mut raw = Vec::new();
            let mut data = Vec::new();
            loop {
                let mut line = Vec::new();
                match rd.read_until(b'\n', &mut line) {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) => {
                        panic!("reading the response body: {e} (got so far: {:?})", String::from_utf8_lossy(&raw))
                    }
                }
                raw.extend_from_slice(&line);
                let text = String::from_utf8_lossy(&line);
                if let Some(d) = text.trim_end().strip_prefix("data: ") {
                    data.push((Instant::now(), d.to_owned()));
                    let _ = tx.send(d.to_owned());
                }
            }
            Timed { resp: Response { status, headers, body: raw }, data, ended: Instant::now() }
        });
        Chat { handle, progress, seen: Vec::new() }
    }

    /// A slow streamed request for `model`.
    pub fn stream(addr: SocketAddr, model: &str) -> Chat {
        Chat::start(addr, model, "hi", true, 0)
    }

    /// Waits until a `data:` line containing `needle` arrived.
    pub fn wait_data(&mut self, needle: &str, within: Duration) {
        let deadline = Instant::now() + within;
        while !self.seen.iter().any(|d| d.contains(needle)) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.progress.recv_timeout(left) {
                Ok(d) => self.seen.push(d),
                Err(_) => panic!("no data event containing {needle:?} within {within:?}; seen {:?}", self.seen),
            }
        }
    }

    pub fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }

    /// Waits for the request to finish (at most `within`).
    pub fn join_within(self, within: Duration) -> Timed {
        let deadline = Instant::now() + within;
        while !self.handle.is_finished() {
            assert!(Instant::now() < deadline, "chat request did not finish within {within:?}; seen {:?}", self.seen);
            std::thread::sleep(Duration::from_millis(5));
        }
        match self.handle.join() {
            Ok(t) => t,
            Err(e) => std::panic::resume_unwind(e),
        }
    }

    pub fn join(self) -> Timed {
        self.join_within(Duration::from_secs(15))
    }
}

/// `GET /admin/v1/events` read on a background thread.
pub struct Events {
    rx: mpsc::Receiver<serde_json::Value>,
    stream: TcpStream,
    /// Every event received so far, in order.
    pub seen: Vec<serde_json::Value>,
    /// Index in `seen` after the last match of [`Events::wait`].
    cursor: usize,
}

impl Events {
    fn open(addr: SocketAddr) -> Events {
        let auth = format!("Bearer {ADMIN_TOKEN}");
        let (stream, status, _h, mut rd) =
            open_stream(addr, "GET", "/admin/v1/events", None, &[("authorization", &auth)], Duration::from_secs(60));
        assert_eq!(status, 200, "events stream status");
        // The subscription exists once `: connected` arrived.
        let mut first = String::new();
        rd.read_line(&mut first).expect("first events line");
        assert_eq!(first.trim_end(), ": connected", "events stream must start with `: connected`");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            loop {
                line.clear();
                match rd.read_line(&mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                if let Some(d) = line.trim_end().strip_prefix("data: ") {
                    let v: serde_json::Value =
                        serde_json::from_str(d).unwrap_or_else(|e| panic!("event is not JSON ({e}): {d}"));
                    if tx.send(v).is_err() {
                        break;
                    }
                }
            }
        });
        Events { rx, stream, seen: Vec::new(), cursor: 0 }
    }

    /// Waits for the next event (after the previous match) of type `kind`
    /// for which `check` holds; returns it.
    pub fn wait(
        &mut self,
        kind: &str,
        within: Duration,
        check: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = Instant::now() + within;
        loop {
            if let Some(i) =
                (self.cursor..self.seen.len()).find(|&i| self.seen[i]["type"] == kind && check(&self.seen[i]))
            {
                self.cursor = i + 1;
                return self.seen[i].clone();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(v) => self.seen.push(v),
                Err(_) => panic!(
                    "no matching `{kind}` event within {within:?}; events after the cursor: {:#?}",
                    &self.seen[self.cursor..]
                ),
            }
        }
    }
}

impl Drop for Events {
    fn drop(&mut self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}
