//! Command line of `iop-loadtest` and its validated form.

use std::net::{SocketAddr, ToSocketAddrs};
use std::num::NonZeroUsize;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use iop_core::http::write_request_head;

use super::api::Api;

/// Requests sent when neither `--requests` nor `--duration-sec` is given.
pub const DEFAULT_REQUESTS: u64 = 1000;
/// Distinct prompt sizes of a `--prompt-bytes-max` run.
pub const PROMPT_SIZES: usize = 4;
/// Largest `--prompt-bytes` / `--prompt-bytes-max`.
pub const MAX_PROMPT_BYTES: usize = 64 << 20;
/// Largest `--ramp-ms` (one hour).
pub const MAX_RAMP_MS: u64 = 3_600_000;
/// Largest `--sessions`.
pub const MAX_SESSIONS: usize = 100_000;
/// Hex digits of the request number in a tag.
const TAG_DIGITS: usize = 16;

/// `iop-loadtest` flags.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "iop-loadtest",
    version,
    args_conflicts_with_subcommands = true,
    disable_help_subcommand = true,
    about = "SSE load generator for OpenAI chat completions, the Responses API and the Anthropic Messages API (iop-edge, iop-mockprov, vLLM, ...)"
)]
pub struct LoadArgs {
    /// Server: `http://host:port` (the path defaults to the API's:
    /// /v1/chat/completions, /v1/messages or /v1/responses) or a full
    /// endpoint URL `http://host:port/some/path`.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// The API requests speak: its body, and how its answer is read.
    #[arg(long, value_enum, default_value_t = Api::Chat)]
    pub api: Api,
    /// `model` sent in every request.
    #[arg(long, default_value = "mock")]
    pub model: String,
    /// Connections, each running one request at a time (HTTP/1.1 keep-alive).
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Requests to send in total (errors included). Without this and without
    /// --duration-sec, 1000.
    #[arg(long)]
    pub requests: Option<u64>,
    /// Stop starting requests after this many seconds; requests in flight finish.
    #[arg(long)]
    pub duration_sec: Option<u64>,
    /// Ask for an SSE stream (the default).
    #[arg(long, overrides_with = "no_stream")]
    pub stream: bool,
    /// Ask for one JSON answer (a `chat.completion`, a `message` or a `response`) instead of a stream.
    #[arg(long, overrides_with = "stream")]
    pub no_stream: bool,
    /// `max_tokens` (`max_output_tokens` for responses) sent in every
    /// request (omitted when not given; 4096 for messages, which require it).
    #[arg(long)]
    pub max_tokens: Option<u64>,
    /// Size of the user message, in bytes.
    #[arg(long, default_value_t = 64)]
    pub prompt_bytes: usize,
    /// Vary the user message from --prompt-bytes up to this size: requests
    /// cycle through 4 sizes spread evenly over the range.
    #[arg(long)]
    pub prompt_bytes_max: Option<usize>,
    /// Spread requests over this many sessions: request n belongs to
    /// session n mod N, whose user message starts with its own words (its
    /// own prompt prefix, as every turn of one conversation resends), so a
    /// server's prefix cache and a gateway's cache affinity tell them apart.
    #[arg(long)]
    pub sessions: Option<usize>,
    /// Open loop: start this many requests per second, whether or not
    /// earlier ones have finished (at most --concurrency at once). Without
    /// it, each connection sends its next request when the last one ends.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Closed loop: start the connections' first requests spread evenly over
    /// this many milliseconds (connection i of N at i × ramp / N) instead of
    /// all at once. When every request lasts about as long (paced streams),
    /// a common start keeps them in step: requests then arrive in bursts of
    /// --concurrency, and latency percentiles measure how fast a burst
    /// drains rather than the steady load.
    #[arg(long)]
    pub ramp_ms: Option<u64>,
    /// Streams only: close the connection once this many token deltas have
    /// arrived, and record the instant (wall clock) with a per-request tag
    /// sent as `"mock": {"tag": ...}` (iop-mockprov reports when it saw the
    /// close at `GET /closes`).
    #[arg(long)]
    pub disconnect_after: Option<u64>,
    /// Threads, one monoio runtime each (default: cores, at most --concurrency).
    #[arg(long)]
    pub workers: Option<usize>,
    /// Give up on one request after this many seconds (counted as `timeout`).
    #[arg(long, default_value_t = 60)]
    pub timeout_sec: u64,
    /// Sent as `Authorization: Bearer <key>`.
    #[arg(long)]
    pub api_key: Option<String>,
    /// Print one JSON object instead of the text report.
    #[arg(long)]
    pub json: bool,
    /// Also write the report as a self-contained HTML page with plots
    /// (latency CDF, TTFT and inter-token gap histograms, throughput over time).
    #[arg(long, value_name = "PATH")]
    pub html: Option<std::path::PathBuf>,
    /// `report`: render saved reports instead of running a load.
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// Subcommands (without one, `iop-loadtest` runs a load).
#[derive(Debug, Clone, clap::Subcommand)]
pub enum Command {
    /// Render saved `--json` reports as one HTML page, the runs side by side.
    Report(ReportArgs),
}

/// `iop-loadtest report` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct ReportArgs {
    /// The HTML file to write.
    #[arg(long, value_name = "PATH")]
    pub html: std::path::PathBuf,
    /// The page's title (default: "iop-loadtest report").
    #[arg(long)]
    pub title: Option<String>,
    /// JSON files: reports of `iop-loadtest --json` (each one run, named
    /// after its file), or a report set (`{"title", "sections": [{"title",
    /// "note", "runs": [{"label", "reports": [...]}]}]}`, as the benchmark's
    /// `compare --html` writes).
    #[arg(required = true, value_name = "JSON")]
    pub inputs: Vec<std::path::PathBuf>,
}

/// Where requests go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// `host[:port]` as written in the URL (sent as `Host`).
    pub authority: String,
    /// Host part without brackets.
    pub host: String,
    /// Port (80 when the URL has none).
    pub port: u16,
    /// Request target, e.g. `/v1/chat/completions`.
    pub path: String,
}

impl Target {
    /// Parses `http://host[:port][/path]`, the path `default_path` when
    /// absent. Only plain `http` is supported.
    pub fn parse(url: &str, default_path: &str) -> Result<Self, String> {
        let rest =
            url.strip_prefix("http://").ok_or_else(|| format!("--url {url:?}: only http:// URLs are supported"))?;
        let (authority, path) = match rest.find(['/', '?', '#']) {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        if path.contains('#') {
            return Err(format!("--url {url:?}: a fragment is not allowed"));
        }
        if authority.is_empty() || authority.contains('@') {
            return Err(format!("--url {url:?}: expected http://host[:port][/path]"));
        }
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (host, after) = v6.split_once(']').ok_or_else(|| format!("--url {url:?}: unclosed '['"))?;
            let port = match after {
                "" => None,
                p => Some(p.strip_prefix(':').ok_or_else(|| format!("--url {url:?}: bad port"))?),
            };
            (host, port)
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (authority, None),
            }
        };
        let port = match port {
            None => 80,
            Some(p) => p.parse::<u16>().map_err(|_| format!("--url {url:?}: bad port {p:?}"))?,
        };
        if host.is_empty() {
            return Err(format!("--url {url:?}: empty host"));
        }
        let path = match path {
            "" | "/" => default_path.to_owned(),
            p if p.starts_with('?') => format!("{default_path}{p}"),
            p => p.to_owned(),
        };
        Ok(Self { authority: authority.to_owned(), host: host.to_owned(), port, path })
    }

    /// The first address the host resolves to (blocking; done once at start).
    pub fn resolve(&self) -> Result<SocketAddr, String> {
        (self.host.as_str(), self.port)
            .to_socket_addrs()
            .map_err(|e| format!("cannot resolve {}: {e}", self.authority))?
            .next()
            .ok_or_else(|| format!("{} resolves to no address", self.authority))
    }
}

/// How the run ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// At most this many requests.
    pub requests: Option<u64>,
    /// Start no request after this long.
    pub duration: Option<Duration>,
}

/// Validated settings of one run.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Where requests go.
    pub target: Target,
    /// The API they speak.
    pub api: Api,
    /// Resolved address of `target`.
    pub addr: SocketAddr,
    /// `model`.
    pub model: String,
    /// Connections in total.
    pub concurrency: NonZeroUsize,
    /// Worker threads.
    pub workers: NonZeroUsize,
    /// Request count and/or duration.
    pub bounds: Bounds,
    /// SSE stream or one JSON body.
    pub stream: bool,
    /// `max_tokens`.
    pub max_tokens: Option<u64>,
    /// User message size (the smallest, with `prompt_bytes_max`).
    pub prompt_bytes: usize,
    /// Largest user message, when the sizes vary.
    pub prompt_bytes_max: Option<usize>,
    /// Sessions the requests cycle through (1: every request alike).
    pub sessions: usize,
    /// Open-loop request rate (requests per second).
    pub rate: Option<f64>,
    /// Closed loop: the first requests spread over this long.
    pub ramp: Option<Duration>,
    /// Close each stream after this many tokens.
    pub disconnect_after: Option<u64>,
    /// Prefix of the request tags (unique per run), when requests are tagged.
    pub tag_prefix: Option<String>,
    /// Per-request limit.
    pub timeout: Duration,
    /// Bearer token.
    pub api_key: Option<String>,
    /// Show the progress line on stderr (the binary sets it when stderr is a terminal).
    pub progress: bool,
}

impl Settings {
    /// Checks the flags and resolves the host.
    pub fn from_args(args: &LoadArgs) -> Result<Self, String> {
        let target = Target::parse(&args.url, args.api.default_path())?;
        let concurrency = NonZeroUsize::new(args.concurrency).ok_or("--concurrency must be at least 1")?;
        let cores = std::thread::available_parallelism().map_or(1, NonZeroUsize::get);
        let workers = match args.workers {
            Some(0) => return Err("--workers must be at least 1".into()),
            Some(n) => n.min(concurrency.get()),
            None => cores.min(concurrency.get()),
        };
        let workers = NonZeroUsize::new(workers).ok_or("--workers must be at least 1")?;
        if args.requests == Some(0) {
            return Err("--requests must be at least 1".into());
        }
        if args.duration_sec == Some(0) {
            return Err("--duration-sec must be at least 1".into());
        }
        if args.timeout_sec == 0 {
            return Err("--timeout-sec must be at least 1".into());
        }
        if args.model.is_empty() {
            return Err("--model must not be empty".into());
        }
        if args.prompt_bytes > MAX_PROMPT_BYTES {
            return Err(format!("--prompt-bytes must be at most {MAX_PROMPT_BYTES}"));
        }
        if let Some(max) = args.prompt_bytes_max {
            if max > MAX_PROMPT_BYTES {
                return Err(format!("--prompt-bytes-max must be at most {MAX_PROMPT_BYTES}"));
            }
            if max < args.prompt_bytes {
                return Err("--prompt-bytes-max must be at least --prompt-bytes".into());
            }
        }
        let sessions = match args.sessions {
            Some(n) if !(1..=MAX_SESSIONS).contains(&n) => {
                return Err(format!("--sessions must be from 1 to {MAX_SESSIONS}"))
            }
            n => n.unwrap_or(1),
        };
        if let Some(rate) = args.rate {
            if !(rate.is_finite() && (0.001..=1e7).contains(&rate)) {
                return Err("--rate must be a number of requests per second in [0.001, 10000000]".into());
            }
        }
        match args.ramp_ms {
            Some(_) if args.rate.is_some() => return Err("--ramp-ms is for a closed loop: not with --rate".into()),
            Some(ms) if ms > MAX_RAMP_MS => return Err(format!("--ramp-ms must be at most {MAX_RAMP_MS}")),
            _ => {}
        }
        match args.disconnect_after {
            Some(0) => return Err("--disconnect-after must be at least 1".into()),
            Some(_) if args.no_stream => return Err("--disconnect-after needs --stream".into()),
            _ => {}
        }
        let bounds = match (args.requests, args.duration_sec) {
            (None, None) => Bounds { requests: Some(DEFAULT_REQUESTS), duration: None },
            (r, d) => Bounds { requests: r, duration: d.map(Duration::from_secs) },
        };
        let addr = target.resolve()?;
        Ok(Self {
            target,
            api: args.api,
            addr,
            model: args.model.clone(),
            concurrency,
            workers,
            bounds,
            stream: !args.no_stream,
            max_tokens: args.max_tokens,
            prompt_bytes: args.prompt_bytes,
            prompt_bytes_max: args.prompt_bytes_max,
            sessions,
            rate: args.rate,
            ramp: args.ramp_ms.filter(|&ms| ms > 0).map(Duration::from_millis),
            disconnect_after: args.disconnect_after,
            tag_prefix: args.disconnect_after.map(|_| tag_prefix()),
            timeout: Duration::from_secs(args.timeout_sec),
            api_key: args.api_key.clone().filter(|k| !k.is_empty()),
            progress: false,
        })
    }

    /// The JSON request body with a user message of `prompt_bytes` bytes
    /// (and the placeholder tag of request 0, when requests are tagged).
    pub fn body_of(&self, prompt_bytes: usize) -> String {
        self.session_body(prompt_bytes, None)
    }

    /// [`Self::body_of`] for `session` (its words first), if any.
    fn session_body(&self, prompt_bytes: usize, session: Option<usize>) -> String {
        let text = match session {
            None => prompt(prompt_bytes),
            Some(s) => {
                let mut t = format!("session {s}: ");
                t.push_str(&prompt(prompt_bytes.saturating_sub(t.len())));
                t
            }
        };
        let mut body = self.api.body(&self.model, &text, self.stream, self.max_tokens);
        if let Some(prefix) = &self.tag_prefix {
            body["mock"] = serde_json::json!({"tag": tag(prefix, 0)});
        }
        body.to_string()
    }

    /// The JSON request body (of the smallest prompt).
    pub fn body(&self) -> String {
        self.body_of(self.prompt_bytes)
    }

    /// The user message sizes, in the order requests cycle through them.
    pub fn prompt_sizes(&self) -> Vec<usize> {
        match self.prompt_bytes_max {
            None => vec![self.prompt_bytes],
            Some(max) => {
                let (min, steps) = (self.prompt_bytes, PROMPT_SIZES - 1);
                (0..PROMPT_SIZES).map(|i| min + (max - min) * i / steps).collect()
            }
        }
    }

    /// The whole request (head and body) for every prompt size and
    /// session (sessions vary fastest); request `n` sends
    /// `requests[n % len]` (its tag, if any, patched in).
    pub fn requests(&self) -> Vec<RequestBytes> {
        let sessions = self.sessions;
        let mut out = Vec::with_capacity(self.prompt_sizes().len() * sessions);
        for size in self.prompt_sizes() {
            for s in 0..sessions {
                let body = self.session_body(size, (sessions > 1).then_some(s));
                out.push(self.request_with(body));
            }
        }
        out
    }

    /// The whole request (head and body) of the smallest prompt.
    pub fn request_bytes(&self) -> Bytes {
        self.request_of(self.prompt_bytes).bytes
    }

    fn request_of(&self, prompt_bytes: usize) -> RequestBytes {
        self.request_with(self.body_of(prompt_bytes))
    }

    fn request_with(&self, body: String) -> RequestBytes {
        let auth = self.api_key.as_ref().map(|k| format!("Bearer {k}"));
        let mut headers: Vec<(&str, &str)> = vec![
            ("content-type", "application/json"),
            ("accept", if self.stream { "text/event-stream" } else { "application/json" }),
            ("user-agent", "iop-loadtest"),
        ];
        if let Some(auth) = &auth {
            headers.push(("authorization", auth));
        }
        let mut out = BytesMut::with_capacity(256 + body.len());
        write_request_head(
            &mut out,
            "POST",
            &self.target.path,
            (&self.target.authority, None),
            &headers,
            Some(body.len()),
        );
        let body_at = out.len();
        out.extend_from_slice(body.as_bytes());
        // The tag is the only place the placeholder occurs (the prompt is words).
        let tag_at = self.tag_prefix.as_ref().and_then(|prefix| {
            let placeholder = tag(prefix, 0);
            memchr::memmem::find(&out[body_at..], placeholder.as_bytes())
                .map(|i| body_at + i + placeholder.len() - TAG_DIGITS)
        });
        RequestBytes { bytes: out.freeze(), tag_at }
    }

    /// Connections of worker `index`: the concurrency split as evenly as possible.
    pub fn connections_of(&self, index: usize) -> usize {
        let (c, w) = (self.concurrency.get(), self.workers.get());
        c / w + usize::from(index < c % w)
    }

    /// How long after the start connection `j` of worker `index` sends its
    /// first request: zero without a ramp; with one, the run's connections
    /// numbered across workers and spread evenly over it.
    pub fn first_request_after(&self, index: usize, j: usize) -> Duration {
        let Some(ramp) = self.ramp else {
            return Duration::ZERO;
        };
        let global = (0..index).map(|i| self.connections_of(i)).sum::<usize>() + j;
        let share = global as f64 / self.concurrency.get() as f64;
        ramp.mul_f64(share.min(1.0))
    }
}

/// One request as sent, with where its tag's number goes.
#[derive(Debug, Clone)]
pub struct RequestBytes {
    /// Head and body (the tag of request 0, when tagged).
    pub bytes: Bytes,
    /// Offset of the tag's [`TAG_DIGITS`] hex digits, when tagged.
    pub tag_at: Option<usize>,
}

impl RequestBytes {
    /// The bytes of request number `n`: shared when untagged, a copy with
    /// the number patched in otherwise.
    pub fn for_request(&self, n: u64) -> Bytes {
        let Some(at) = self.tag_at else {
            return self.bytes.clone();
        };
        let mut out = BytesMut::from(&self.bytes[..]);
        if let Some(digits) = out.get_mut(at..at + TAG_DIGITS) {
            digits.copy_from_slice(format!("{n:016x}").as_bytes());
        }
        out.freeze()
    }
}

/// The tag of request `n`: `<prefix>-<n as 16 hex digits>`.
pub fn tag(prefix: &str, n: u64) -> String {
    format!("{prefix}-{n:016x}")
}

/// A prefix that makes this run's tags differ from other runs' (process id
/// and start time).
fn tag_prefix() -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
    format!("lt{:x}{:08x}", std::process::id(), (nanos as u64) & 0xffff_ffff)
}

/// ASCII words filling exactly `bytes` bytes.
pub fn prompt(bytes: usize) -> String {
    const WORDS: &str = "the quick brown fox jumps over the lazy dog ";
    WORDS.chars().cycle().take(bytes).collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use clap::Parser;

    use super::*;

    fn args(extra: &[&str]) -> LoadArgs {
        LoadArgs::parse_from(["iop-loadtest"].iter().chain(extra))
    }

    #[test]
    fn parses_urls() {
        const DEFAULT_PATH: &str = "/v1/chat/completions";
        let t = Target::parse("http://127.0.0.1:8080", DEFAULT_PATH).unwrap();
        assert_eq!(
            (t.authority.as_str(), t.host.as_str(), t.port, t.path.as_str()),
            ("127.0.0.1:8080", "127.0.0.1", 8080, DEFAULT_PATH)
        );
        let t = Target::parse("http://localhost/", DEFAULT_PATH).unwrap();
        assert_eq!((t.port, t.path.as_str()), (80, DEFAULT_PATH));
        let t = Target::parse("http://[::1]:9000/v1/chat/completions?x=1", DEFAULT_PATH).unwrap();
        assert_eq!((t.host.as_str(), t.port, t.path.as_str()), ("::1", 9000, "/v1/chat/completions?x=1"));
        for bad in
            ["https://x", "x:80", "http://", "http://:80", "http://h:99999", "http://u@h", "http://[::1", "http://h/#f"]
        {
            assert!(Target::parse(bad, DEFAULT_PATH).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_ramp_spreads_first_requests_across_workers() {
        let s = Settings::from_args(&args(&["--url", "http://127.0.0.1:1", "--concurrency", "5", "--workers", "2"]))
            .unwrap();
        assert_eq!(s.first_request_after(1, 1), Duration::ZERO);
        let s = Settings::from_args(&args(&[
            "--url",
            "http://127.0.0.1:1",
            "--concurrency",
            "5",
            "--workers",
            "2",
            "--ramp-ms",
            "1000",
        ]))
        .unwrap();
        // Worker 0 holds connections 0-2, worker 1 holds 3-4.
        let at = |i, j| s.first_request_after(i, j).as_millis();
        assert_eq!([at(0, 0), at(0, 1), at(0, 2), at(1, 0), at(1, 1)], [0, 200, 400, 600, 800]);
    }

    #[test]
    fn validates_flags() {
        let s = Settings::from_args(&args(&["--url", "http://127.0.0.1:1", "--concurrency", "5", "--workers", "2"]))
            .unwrap();
        assert!(s.stream);
        assert_eq!(s.bounds, Bounds { requests: Some(DEFAULT_REQUESTS), duration: None });
        assert_eq!((s.connections_of(0), s.connections_of(1)), (3, 2));
        let s = Settings::from_args(&args(&["--url", "http://127.0.0.1:1", "--concurrency", "2", "--workers", "8"]))
            .unwrap();
        assert_eq!(s.workers.get(), 2);
        let s =
            Settings::from_args(&args(&["--url", "http://127.0.0.1:1", "--duration-sec", "3", "--no-stream"])).unwrap();
        assert_eq!(s.bounds, Bounds { requests: None, duration: Some(Duration::from_secs(3)) });
        assert!(!s.stream);
        let s = Settings::from_args(&args(&["--url", "http://127.0.0.1:1", "--no-stream", "--stream"])).unwrap();
        assert!(s.stream);
        for bad in [
            &["--concurrency", "0"][..],
            &["--workers", "0"],
            &["--requests", "0"],
            &["--duration-sec", "0"],
            &["--timeout-sec", "0"],
            &["--model", ""],
            &["--prompt-bytes", "10", "--prompt-bytes-max", "9"],
            &["--prompt-bytes-max", "67108865"],
            &["--rate", "0"],
            &["--rate=-1"],
            &["--rate", "NaN"],
            &["--rate", "inf"],
            &["--disconnect-after", "0"],
            &["--disconnect-after", "3", "--no-stream"],
            &["--ramp-ms", "100", "--rate", "10"],
            &["--ramp-ms", "3600001"],
        ] {
            let mut a = vec!["--url", "http://127.0.0.1:1"];
            a.extend_from_slice(bad);
            assert!(Settings::from_args(&args(&a)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn builds_the_request() {
        let s = Settings::from_args(&args(&[
            "--url",
            "http://127.0.0.1:1",
            "--model",
            "m",
            "--max-tokens",
            "7",
            "--prompt-bytes",
            "10",
            "--api-key",
            "k",
        ]))
        .unwrap();
        let raw = s.request_bytes();
        let text = std::str::from_utf8(&raw).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:1\r\n"), "{head}");
        assert!(head.contains("authorization: Bearer k"));
        assert!(head.contains(&format!("content-length: {}", body.len())));
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["model"], "m");
        assert_eq!(v["max_tokens"], 7);
        assert_eq!(v["stream"], true);
        assert_eq!(v["stream_options"]["include_usage"], true);
        assert_eq!(v["messages"][0]["content"], "the quick ");
        assert!(v.get("mock").is_none());
        assert_eq!(prompt(0), "");
        assert_eq!(s.requests().len(), 1);
        assert_eq!(s.requests()[0].for_request(5), raw, "untagged requests are shared");
    }

    #[test]
    fn varies_prompt_sizes() {
        let s = Settings::from_args(&args(&[
            "--url",
            "http://127.0.0.1:1",
            "--prompt-bytes",
            "100",
            "--prompt-bytes-max",
            "400",
        ]))
        .unwrap();
        assert_eq!(s.prompt_sizes(), [100, 200, 300, 400]);
        let contents: Vec<usize> = s
            .requests()
            .iter()
            .map(|r| {
                let text = std::str::from_utf8(&r.bytes).unwrap();
                let v: serde_json::Value = serde_json::from_str(text.split_once("\r\n\r\n").unwrap().1).unwrap();
                v["messages"][0]["content"].as_str().unwrap().len()
            })
            .collect();
        assert_eq!(contents, [100, 200, 300, 400]);
        let s = Settings::from_args(&args(&[
            "--url",
            "http://127.0.0.1:1",
            "--prompt-bytes",
            "7",
            "--prompt-bytes-max",
            "7",
        ]))
        .unwrap();
        assert_eq!(s.prompt_sizes(), [7, 7, 7, 7]);
    }

    #[test]
    fn sessions_have_prefixes_of_their_own() {
        let s = Settings::from_args(&args(&["--url", "http://127.0.0.1:1", "--sessions", "3", "--prompt-bytes", "40"]))
            .unwrap();
        let contents: Vec<String> = s
            .requests()
            .iter()
            .map(|r| {
                let text = std::str::from_utf8(&r.bytes).unwrap();
                let v: serde_json::Value = serde_json::from_str(text.split_once("\r\n\r\n").unwrap().1).unwrap();
                v["messages"][0]["content"].as_str().unwrap().to_owned()
            })
            .collect();
        assert_eq!(contents.len(), 3);
        for (i, c) in contents.iter().enumerate() {
            assert!(c.starts_with(&format!("session {i}: the quick")), "{c}");
            assert_eq!(c.len(), 40);
        }
        assert!(Settings::from_args(&args(&["--url", "http://127.0.0.1:1", "--sessions", "0"])).is_err());
        let one = Settings::from_args(&args(&["--url", "http://127.0.0.1:1"])).unwrap();
        assert_eq!((one.sessions, one.requests().len()), (1, 1));
    }

    #[test]
    fn tags_each_request() {
        let s = Settings::from_args(&args(&["--url", "http://127.0.0.1:1", "--disconnect-after", "3"])).unwrap();
        let prefix = s.tag_prefix.clone().unwrap();
        let r = &s.requests()[0];
        for n in [0, 1, 0xabc, u64::MAX] {
            let raw = r.for_request(n);
            let text = std::str::from_utf8(&raw).unwrap();
            let (head, body) = text.split_once("\r\n\r\n").unwrap();
            assert!(head.contains(&format!("content-length: {}", body.len())));
            let v: serde_json::Value = serde_json::from_str(body).unwrap();
            assert_eq!(v["mock"]["tag"], tag(&prefix, n));
        }
        assert_eq!(tag("p", 0xabc), "p-0000000000000abc");
        let other = Settings::from_args(&args(&["--url", "http://127.0.0.1:1", "--disconnect-after", "3"])).unwrap();
        assert!(other.tag_prefix.unwrap().starts_with("lt"));
    }
}
