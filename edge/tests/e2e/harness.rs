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

fn scratch(name: &str) -> PathBuf {
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
        let log = scratch(&format!("{name}.log"));
        let stderr = std::fs::File::create(&log).expect("log file");
        let mut cmd = Command::new(bin(name));
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
}

pub struct Edge {
    pub proc: Proc,
    pub http: SocketAddr,
    pub nodes: SocketAddr,
}

pub const NODE_TOKEN: &str = "e2e-node-token";

/// Edge config with one node `n1` whose provider `up` is openai_compat at `upstream`.
pub fn edge_config(upstream: &str, extra: &str) -> String {
    format!(
        r#"
workers = 2
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
        let path = scratch("edge.toml");
        std::fs::write(&path, config).expect("write config");
        let proc = Proc::spawn("iop-edge", &["--config", path.to_str().expect("utf8")], envs);
        let line = proc.line("iop-edge ready ");
        let field = |k: &str| -> SocketAddr {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(k))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no {k} in `{line}`"))
        };
        Edge { http: field("http="), nodes: field("nodes="), proc }
    }

    /// Starts an `iop-node` for this edge with `token`.
    pub fn node(&self, token: &str, envs: &[(&str, &str)]) -> Proc {
        let path = scratch("node.toml");
        let cfg = format!(
            "edge = \"{}\"\ntoken = \"{token}\"\n[reconnect]\nmax_attempts = 3\ninterval_sec = 1\n",
            self.nodes
        );
        std::fs::write(&path, cfg).expect("write node config");
        Proc::spawn("iop-node", &["--config", path.to_str().expect("utf8")], envs)
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

/// One request on a fresh connection (`Connection: close`), body read to EOF.
pub fn request(addr: SocketAddr, method: &str, path: &str, body: Option<&[u8]>, headers: &[(&str, &str)]) -> Response {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
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

/// Polls `check` until it holds or `within` passes.
pub fn eventually(within: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}
