//! The end-of-run report: text for people, one JSON object for scripts.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use super::args::Settings;
use super::series::Series;
use super::Outcome;

/// Percentiles of one histogram, in µs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Values recorded.
    pub count: u64,
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// Largest value (to histogram precision).
    pub max: u64,
}

impl Summary {
    /// The summary of `h` (zeros when empty).
    pub fn of(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return Self { count: 0, mean: 0.0, p50: 0, p90: 0, p99: 0, max: 0 };
        }
        Self {
            count: h.len(),
            mean: (h.mean() * 10.0).round() / 10.0,
            p50: h.value_at_quantile(0.50),
            p90: h.value_at_quantile(0.90),
            p99: h.value_at_quantile(0.99),
            max: h.max(),
        }
    }
}

/// Latency summaries, µs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Latencies {
    /// Request written to the first response byte.
    pub ttfb: Summary,
    /// Request written to the first token (streams).
    pub ttft: Summary,
    /// Whole request.
    pub total: Summary,
    /// Gaps between tokens (streams).
    pub itl: Summary,
}

/// Errors by class.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ErrorReport {
    /// All failed requests.
    pub total: u64,
    /// TCP connect failures.
    pub connect: u64,
    /// Requests over the timeout.
    pub timeout: u64,
    /// Read/write failures.
    pub io: u64,
    /// Non-200 answers by status code.
    pub status: BTreeMap<String, u64>,
    /// Invalid responses by reason.
    pub protocol: BTreeMap<String, u64>,
}

/// Everything a run reports.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// The command line, shell-quoted.
    pub command: String,
    /// `http://authority/path`.
    pub url: String,
    /// `model` sent.
    pub model: String,
    /// The API spoken.
    pub api: super::api::Api,
    /// SSE stream requested.
    pub stream: bool,
    /// Connections.
    pub concurrency: usize,
    /// Worker threads.
    pub workers: usize,
    /// `--requests` (or the default), if the run was bounded by count.
    pub request_limit: Option<u64>,
    /// `--duration-sec`, if given.
    pub duration_limit_sec: Option<u64>,
    /// `max_tokens` sent.
    pub max_tokens: Option<u64>,
    /// User message bytes (the smallest, with `prompt_bytes_max`).
    pub prompt_bytes: usize,
    /// `--prompt-bytes-max`: requests cycle through sizes up to this.
    pub prompt_bytes_max: Option<usize>,
    /// `--rate`: open-loop requests per second.
    pub rate: Option<f64>,
    /// `--ramp-ms`: the first requests spread over this many milliseconds.
    pub ramp_ms: Option<u64>,
    /// `--disconnect-after`: streams are cut after this many tokens.
    pub disconnect_after: Option<u64>,
    /// monoio driver of the workers.
    pub driver: &'static str,
    /// Wall time from the first request to the last response, seconds.
    pub elapsed_sec: f64,
    /// Requests started.
    pub requests: u64,
    /// Valid 200 responses.
    pub completed: u64,
    /// Failed requests.
    pub errors: ErrorReport,
    /// TCP connections opened.
    pub connections: u64,
    /// Tokens in the completed responses (stream deltas, or usage for JSON).
    pub tokens: u64,
    /// Sum of `usage.completion_tokens` reported by the server.
    pub usage_completion_tokens: u64,
    /// SSE events in the completed responses (`data: [DONE]` included).
    pub events: u64,
    /// Response body bytes of the completed requests (chunk framing removed).
    pub body_bytes: u64,
    /// Completed requests per second.
    pub requests_per_sec: f64,
    /// Tokens per second.
    pub tokens_per_sec: f64,
    /// SSE events per second.
    pub events_per_sec: f64,
    /// Body bytes per second.
    pub body_bytes_per_sec: f64,
    /// Open loop: requests that started 10 ms or more after their slot
    /// (every connection was busy).
    pub late_starts: u64,
    /// Latencies in µs, completed requests only.
    pub latency_us: Latencies,
    /// `--disconnect-after`: every stream the client cut, with its tag and
    /// the wall-clock instant of the close.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disconnects: Option<Vec<Disconnect>>,
    /// The distributions and the timeline, for plots (`--html`, `iop-loadtest report`).
    pub series: Series,
}

/// One stream the client cut on purpose.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Disconnect {
    /// The request's tag (`"mock": {"tag": ...}`).
    pub tag: String,
    /// Unix time in ns just before the close.
    pub unix_ns: u64,
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

impl Report {
    /// Builds the report of a finished run.
    pub fn new(settings: &Settings, outcome: &Outcome, command: String) -> Self {
        let r = &outcome.recorder;
        let secs = outcome.elapsed.as_secs_f64();
        let rate = |n: u64| if secs > 0.0 { round2(n as f64 / secs) } else { 0.0 };
        let t = &settings.target;
        Self {
            command,
            url: format!("http://{}{}", t.authority, t.path),
            model: settings.model.clone(),
            api: settings.api,
            stream: settings.stream,
            concurrency: settings.concurrency.get(),
            workers: settings.workers.get(),
            request_limit: settings.bounds.requests,
            duration_limit_sec: settings.bounds.duration.map(|d| d.as_secs()),
            max_tokens: settings.max_tokens,
            prompt_bytes: settings.prompt_bytes,
            prompt_bytes_max: settings.prompt_bytes_max,
            rate: settings.rate,
            ramp_ms: settings.ramp.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            disconnect_after: settings.disconnect_after,
            driver: outcome.driver,
            elapsed_sec: (secs * 1000.0).round() / 1000.0,
            requests: r.requests,
            completed: r.completed,
            errors: ErrorReport {
                total: r.errors.total(),
                connect: r.errors.connect,
                timeout: r.errors.timeout,
                io: r.errors.io,
                status: r.errors.status.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
                protocol: r.errors.protocol.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect(),
            },
            connections: r.connections,
            tokens: r.tokens,
            usage_completion_tokens: r.usage_tokens,
            events: r.events,
            body_bytes: r.body_bytes,
            requests_per_sec: rate(r.completed),
            tokens_per_sec: rate(r.tokens),
            events_per_sec: rate(r.events),
            body_bytes_per_sec: rate(r.body_bytes),
            late_starts: r.late_starts,
            latency_us: Latencies {
                ttfb: Summary::of(&r.ttfb),
                ttft: Summary::of(&r.ttft),
                total: Summary::of(&r.total),
                itl: Summary::of(&r.itl),
            },
            disconnects: settings.tag_prefix.as_ref().map(|prefix| {
                let mut all: Vec<Disconnect> = r
                    .disconnects
                    .iter()
                    .map(|&(n, unix_ns)| Disconnect { tag: super::args::tag(prefix, n), unix_ns })
                    .collect();
                all.sort_by_key(|d| d.unix_ns);
                all
            }),
            series: Series::of(r),
        }
    }

    /// One JSON object.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"cannot serialize the report: {e}\"}}"))
    }

    /// The human-readable report.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "command      {}", self.command);
        let bound = match (self.request_limit, self.duration_limit_sec) {
            (Some(n), Some(d)) => format!("{n} requests or {d} s"),
            (Some(n), None) => format!("{n} requests"),
            (None, Some(d)) => format!("{d} s"),
            (None, None) => "unbounded".to_owned(),
        };
        let prompt = match self.prompt_bytes_max {
            Some(max) => format!("{}-{max}", self.prompt_bytes),
            None => self.prompt_bytes.to_string(),
        };
        let _ = writeln!(
            s,
            "target       {} api={} model={} {} max_tokens={} prompt_bytes={prompt}",
            self.url,
            self.api.name(),
            self.model,
            if self.stream { "stream" } else { "no-stream" },
            self.max_tokens.map_or_else(|| "-".to_owned(), |n| n.to_string()),
        );
        let mut load = format!(
            "load         concurrency={} workers={} driver={} bound={bound}",
            self.concurrency, self.workers, self.driver
        );
        if let Some(rate) = self.rate {
            let _ = write!(load, " rate={rate}/s late_starts={}", self.late_starts);
        }
        if let Some(ms) = self.ramp_ms {
            let _ = write!(load, " ramp={ms}ms");
        }
        if let Some(n) = self.disconnect_after {
            let cut = self.disconnects.as_ref().map_or(0, Vec::len);
            let _ = write!(load, " disconnect_after={n} cut={cut}");
        }
        let _ = writeln!(s, "{load}");
        let _ = writeln!(
            s,
            "requests     {} in {:.3} s: {} ok, {} errors; {:.1} req/s; {} connections",
            self.requests, self.elapsed_sec, self.completed, self.errors.total, self.requests_per_sec, self.connections
        );
        let per = if self.completed > 0 { self.tokens as f64 / self.completed as f64 } else { 0.0 };
        let _ = writeln!(
            s,
            "tokens       {} ({per:.1}/request, usage says {}); {:.1} tokens/s",
            self.tokens, self.usage_completion_tokens, self.tokens_per_sec
        );
        let _ = writeln!(
            s,
            "body         {} events, {:.1} events/s; {} bytes, {:.2} MB/s",
            self.events,
            self.events_per_sec,
            self.body_bytes,
            self.body_bytes_per_sec / 1e6
        );
        let e = &self.errors;
        if e.total > 0 {
            let mut parts = Vec::new();
            for (name, n) in [("connect", e.connect), ("timeout", e.timeout), ("io", e.io)] {
                if n > 0 {
                    parts.push(format!("{name}={n}"));
                }
            }
            parts.extend(e.status.iter().map(|(k, v)| format!("status_{k}={v}")));
            parts.extend(e.protocol.iter().map(|(k, v)| format!("protocol_{k}={v}")));
            let _ = writeln!(s, "errors       {}", parts.join(" "));
        }
        let _ = writeln!(
            s,
            "latency (ms) {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "p50", "p90", "p99", "max", "mean", "count"
        );
        let l = &self.latency_us;
        for (name, sum) in [("ttfb", &l.ttfb), ("ttft", &l.ttft), ("total", &l.total), ("itl", &l.itl)] {
            if sum.count == 0 {
                let _ = writeln!(s, "  {name:<10} {:>9}", "n/a");
                continue;
            }
            let ms = |us: u64| us as f64 / 1000.0;
            let _ = writeln!(
                s,
                "  {name:<10} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9}",
                ms(sum.p50),
                ms(sum.p90),
                ms(sum.p99),
                ms(sum.max),
                sum.mean / 1000.0,
                sum.count
            );
        }
        s
    }
}

/// Joins arguments into a command a POSIX shell would parse back the same.
pub fn command_line(args: impl IntoIterator<Item = String>) -> String {
    args.into_iter().map(|a| shell_quote(&a)).collect::<Vec<_>>().join(" ")
}

fn shell_quote(arg: &str) -> String {
    let plain = !arg.is_empty() && arg.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-./:=@%+,".contains(&b));
    if plain {
        arg.to_owned()
    } else {
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use std::time::Duration;

    use clap::Parser;

    use super::*;
    use crate::load::args::LoadArgs;
    use crate::load::stats::{Failure, Measure, Recorder};

    #[test]
    fn quotes_command_lines() {
        let args = ["iop-loadtest", "--url", "http://h:1/x", "--model", "a b", "it's", ""].map(String::from);
        assert_eq!(command_line(args), r"iop-loadtest --url http://h:1/x --model 'a b' 'it'\''s' ''");
    }

    #[test]
    fn report_shapes() {
        let settings = Settings::from_args(&LoadArgs::parse_from([
            "iop-loadtest",
            "--url",
            "http://127.0.0.1:1",
            "--requests",
            "3",
        ]))
        .unwrap();
        let mut recorder = Recorder::new().unwrap();
        recorder.connections = 1;
        recorder.ok(&Measure {
            ttfb: Some(Duration::from_micros(900)),
            ttft: Some(Duration::from_millis(1)),
            total: Duration::from_millis(3),
            gaps_us: vec![1000, 1000],
            tokens: 3,
            usage_tokens: Some(3),
            events: 5,
            body_bytes: 400,
            cut: false,
        });
        recorder.fail(Failure::Status(429));
        recorder.fail(Failure::Protocol("missing_done"));
        let outcome = Outcome { recorder, elapsed: Duration::from_millis(500), driver: "epoll" };
        let report = Report::new(&settings, &outcome, "iop-loadtest --requests 3".into());
        let v: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
        assert_eq!(v["requests"], 3);
        assert_eq!(v["completed"], 1);
        assert_eq!(v["errors"]["total"], 2);
        assert_eq!(v["errors"]["status"]["429"], 1);
        assert_eq!(v["errors"]["protocol"]["missing_done"], 1);
        assert_eq!(v["tokens"], 3);
        assert_eq!(v["requests_per_sec"], 2.0);
        assert_eq!(v["tokens_per_sec"], 6.0);
        assert_eq!((v["events"].as_u64(), v["events_per_sec"].as_f64()), (Some(5), Some(10.0)));
        assert_eq!((v["body_bytes"].as_u64(), v["body_bytes_per_sec"].as_f64()), (Some(400), Some(800.0)));
        assert!(v.get("disconnects").is_none(), "only with --disconnect-after");
        assert_eq!((&v["rate"], &v["late_starts"]), (&serde_json::Value::Null, &serde_json::json!(0)));
        assert_eq!(v["latency_us"]["itl"]["count"], 2);
        assert_eq!(v["latency_us"]["ttft"]["p50"], 1000);
        assert_eq!(v["url"], "http://127.0.0.1:1/v1/chat/completions");
        let text = report.to_text();
        assert!(text.contains("status_429=1 protocol_missing_done=1"), "{text}");
        assert!(text.contains("  ttft"), "{text}");
        assert!(text.contains("body         5 events, 10.0 events/s; 400 bytes, 0.00 MB/s"), "{text}");

        let settings = Settings::from_args(&LoadArgs::parse_from([
            "iop-loadtest",
            "--url",
            "http://127.0.0.1:1",
            "--disconnect-after",
            "2",
            "--rate",
            "5",
        ]))
        .unwrap();
        let mut recorder = Recorder::new().unwrap();
        recorder.disconnects = vec![(7, 300), (1, 200)];
        let outcome = Outcome { recorder, elapsed: Duration::from_millis(500), driver: "epoll" };
        let v: serde_json::Value =
            serde_json::from_str(&Report::new(&settings, &outcome, String::new()).to_json()).unwrap();
        let prefix = settings.tag_prefix.unwrap();
        assert_eq!(
            v["disconnects"],
            serde_json::json!([
                {"tag": format!("{prefix}-0000000000000001"), "unix_ns": 200},
                {"tag": format!("{prefix}-0000000000000007"), "unix_ns": 300},
            ])
        );
        assert_eq!((v["rate"].as_f64(), v["disconnect_after"].as_u64()), (Some(5.0), Some(2)));
    }
}
