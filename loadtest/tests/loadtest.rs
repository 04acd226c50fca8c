//! `iop-loadtest` against a real `iop-mockprov` process, both spawned from
//! their binaries; the mock listens on port 0 and announces its address.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::MockProv;

use std::process::{Command, Stdio};

use serde_json::Value;

/// Runs `iop-loadtest --json` with `args`; returns the report.
fn loadtest(args: &[&str]) -> Value {
    loadtest_on(args, false)
}

/// `legacy` forces monoio's epoll driver in the load generator.
fn loadtest_on(args: &[&str], legacy: bool) -> Value {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_iop-loadtest"));
    if legacy {
        cmd.env("MONOIO_FORCE_LEGACY_DRIVER", "1");
    } else {
        cmd.env_remove("MONOIO_FORCE_LEGACY_DRIVER");
    }
    let out = cmd.args(args).arg("--json").stderr(Stdio::inherit()).output().expect("run iop-loadtest");
    assert!(out.status.success(), "iop-loadtest failed: {:?}", out.status);
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 1, "one JSON line expected: {stdout}");
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

fn assert_latencies(report: &Value, stream: bool) {
    let l = &report["latency_us"];
    let completed = report["completed"].as_u64().unwrap();
    assert_eq!(l["total"]["count"].as_u64(), Some(completed));
    assert_eq!(l["ttfb"]["count"].as_u64(), Some(completed));
    for name in ["ttfb", "total"] {
        let s = &l[name];
        assert!(s["p50"].as_u64() <= s["p90"].as_u64() && s["p90"].as_u64() <= s["p99"].as_u64(), "{s}");
        assert!(s["p99"].as_u64() <= s["max"].as_u64(), "{s}");
        assert!(s["max"].as_u64().unwrap() > 0, "{s}");
    }
    if stream {
        assert_eq!(l["ttft"]["count"].as_u64(), Some(completed));
        assert!(l["ttft"]["p50"].as_u64() <= l["total"]["p50"].as_u64());
    } else {
        assert_eq!(l["ttft"]["count"], 0);
        assert_eq!(l["itl"]["count"], 0);
    }
}

#[test]
fn streams_against_mockprov_io_uring() {
    streams_against_mockprov(false);
}

#[test]
fn streams_against_mockprov_epoll() {
    streams_against_mockprov(true);
}

fn streams_against_mockprov(legacy: bool) {
    let mock = MockProv::start(&["--tokens", "5"]);
    let r = loadtest_on(&["--url", &mock.url(), "--requests", "200", "--concurrency", "8", "--workers", "2"], legacy);
    if legacy {
        assert_eq!(r["driver"], "epoll");
    }
    assert_eq!(r["requests"], 200, "{r}");
    assert_eq!(r["completed"], 200, "{r}");
    assert_eq!(r["errors"]["total"], 0, "{r}");
    assert_eq!(r["tokens"], 200 * 5, "{r}");
    assert_eq!(r["usage_completion_tokens"], 200 * 5, "{r}");
    assert_eq!(r["stream"], true);
    assert_eq!(r["url"], format!("{}/v1/chat/completions", mock.url()));
    // Keep-alive: one connection per slot.
    assert_eq!(r["connections"], 8, "{r}");
    assert_eq!(r["latency_us"]["itl"]["count"], 200 * 4, "{r}");
    assert!(r["requests_per_sec"].as_f64().unwrap() > 0.0);
    assert!(r["command"].as_str().unwrap().contains("--requests 200"));
    assert_latencies(&r, true);
}

#[test]
fn json_answers_and_max_tokens() {
    let mock = MockProv::start(&["--tokens", "5"]);
    let r = loadtest(&["--url", &mock.url(), "--requests", "200", "--concurrency", "8", "--no-stream"]);
    assert_eq!((r["completed"].as_u64(), r["errors"]["total"].as_u64()), (Some(200), Some(0)), "{r}");
    assert_eq!(r["tokens"], 200 * 5, "{r}");
    assert_latencies(&r, false);

    let r = loadtest(&["--url", &mock.url(), "--requests", "20", "--concurrency", "2", "--max-tokens", "3"]);
    assert_eq!((r["completed"].as_u64(), r["tokens"].as_u64()), (Some(20), Some(60)), "{r}");
}

#[test]
fn status_errors_are_counted() {
    let mock = MockProv::start(&["--error-status", "500"]);
    let r = loadtest(&["--url", &mock.url(), "--requests", "200", "--concurrency", "8"]);
    assert_eq!(r["requests"], 200, "{r}");
    assert_eq!(r["completed"], 0, "{r}");
    assert_eq!(r["errors"]["total"], 200, "{r}");
    assert_eq!(r["errors"]["status"]["500"], 200, "{r}");
    assert_eq!(r["tokens"], 0);
    // Error answers are complete responses: the connections stay open.
    assert_eq!(r["connections"], 8, "{r}");
}

#[test]
fn broken_streams_and_dead_servers_are_counted() {
    let mock = MockProv::start(&["--tokens", "10", "--abort-after", "3"]);
    let r = loadtest(&["--url", &mock.url(), "--requests", "20", "--concurrency", "4"]);
    assert_eq!((r["completed"].as_u64(), r["errors"]["protocol"]["closed"].as_u64()), (Some(0), Some(20)), "{r}");

    // Nothing listens on a port just released.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let r = loadtest(&["--url", &format!("http://127.0.0.1:{port}"), "--requests", "5", "--concurrency", "2"]);
    assert_eq!((r["requests"].as_u64(), r["errors"]["connect"].as_u64()), (Some(5), Some(5)), "{r}");
}

#[test]
fn duration_bound_stops_by_itself() {
    let mock = MockProv::start(&["--tokens", "2", "--token-interval-ms", "5"]);
    let started = std::time::Instant::now();
    let r = loadtest(&["--url", &mock.url(), "--duration-sec", "1", "--concurrency", "4"]);
    assert!(started.elapsed().as_secs_f64() < 5.0);
    let elapsed = r["elapsed_sec"].as_f64().unwrap();
    assert!((1.0..2.0).contains(&elapsed), "{r}");
    assert_eq!(r["errors"]["total"], 0, "{r}");
    assert!(r["completed"].as_u64().unwrap() > 10, "{r}");
    assert_eq!(r["request_limit"], Value::Null);
    assert_eq!(r["duration_limit_sec"], 1);
}

#[test]
fn bad_flags_exit_2() {
    let out = Command::new(env!("CARGO_BIN_EXE_iop-loadtest"))
        .args(["--url", "https://127.0.0.1:1", "--requests", "1"])
        .output()
        .expect("run iop-loadtest");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("only http://"));
}

/// `events` and `body_bytes` count what the mock wrote: every SSE event
/// (`[DONE]` too) and every entity byte, as its `/log` records them.
#[test]
fn events_and_body_bytes_match_what_the_mock_wrote() {
    for stream in [true, false] {
        let mock = MockProv::start(&["--tokens", "5"]);
        let mode = if stream { "--stream" } else { "--no-stream" };
        let r = loadtest(&["--url", &mock.url(), "--requests", "20", "--concurrency", "2", mode]);
        assert_eq!((r["completed"].as_u64(), r["errors"]["total"].as_u64()), (Some(20), Some(0)), "{r}");
        let log = mock.get_json("/log");
        let log = log.as_array().unwrap();
        assert_eq!(log.len(), 20);
        let written: u64 = log.iter().map(|e| e["response_body_bytes"].as_u64().unwrap()).sum();
        assert_eq!(r["body_bytes"].as_u64(), Some(written), "{r}");
        // Role chunk, 5 tokens, finish chunk, usage chunk, [DONE].
        assert_eq!(r["events"].as_u64(), Some(if stream { 20 * 9 } else { 0 }), "{r}");
        let secs = r["elapsed_sec"].as_f64().unwrap();
        let per_sec = r["body_bytes_per_sec"].as_f64().unwrap();
        // elapsed_sec is rounded to the ms, so it is off by at most half a ms
        // from the time the rate was computed with (a run of a few ms here).
        assert!((per_sec * secs - written as f64).abs() <= per_sec * 0.0005 + 1.0, "{r}");
    }
}

/// `--rate` starts requests on a schedule, not when the previous one ends.
#[test]
fn rate_is_an_open_loop() {
    let mock = MockProv::start(&["--tokens", "2"]);
    let r = loadtest(&["--url", &mock.url(), "--rate", "20", "--requests", "10", "--concurrency", "4", "--no-stream"]);
    assert_eq!((r["completed"].as_u64(), r["rate"].as_f64()), (Some(10), Some(20.0)), "{r}");
    // The last slot is 9 / 20 s after the start.
    assert!(r["elapsed_sec"].as_f64().unwrap() >= 0.45, "{r}");

    let r = loadtest(&["--url", &mock.url(), "--rate", "10", "--duration-sec", "1", "--concurrency", "2"]);
    assert!((8..=10).contains(&r["completed"].as_u64().unwrap()), "slots 0..0.9 s: {r}");
    assert_eq!(r["errors"]["total"], 0, "{r}");

    // One connection, 50 ms answers, a slot every 10 ms: the later ones start late.
    let slow = MockProv::start(&["--tokens", "2", "--token-interval-ms", "50"]);
    let r = loadtest(&["--url", &slow.url(), "--rate", "100", "--requests", "5", "--concurrency", "1"]);
    assert_eq!(r["completed"], 5, "{r}");
    assert!(r["late_starts"].as_u64().unwrap() >= 3, "{r}");
}

/// `--ramp-ms` spreads the connections' first requests over the ramp.
#[test]
fn a_ramp_staggers_the_first_requests() {
    // Each answer takes a second, so each connection sends exactly one request.
    let slow = MockProv::start(&["--tokens", "2", "--token-interval-ms", "1000"]);
    let url = slow.url();
    let run = |extra: &[&str]| {
        let mut args = vec!["--url", url.as_str(), "--requests", "4", "--concurrency", "4", "--workers", "2"];
        args.extend_from_slice(extra);
        loadtest(&args)
    };
    let together = run(&[]);
    let spread = run(&["--ramp-ms", "600"]);
    for r in [&together, &spread] {
        assert_eq!((r["completed"].as_u64(), r["connections"].as_u64()), (Some(4), Some(4)), "{r}");
    }
    assert_eq!(spread["ramp_ms"], 600, "{spread}");
    // The last connection starts 3/4 of the ramp (450 ms) after the first.
    let secs = |r: &Value| r["elapsed_sec"].as_f64().unwrap();
    assert!(secs(&together) < 1.4 && secs(&spread) >= 1.45, "{together}\n{spread}");
}

/// `--prompt-bytes-max` cycles through 4 prompt sizes.
#[test]
fn prompt_sizes_vary_up_to_the_max() {
    let mock = MockProv::start(&["--tokens", "1"]);
    let r = loadtest(&[
        "--url",
        &mock.url(),
        "--requests",
        "8",
        "--concurrency",
        "1",
        "--prompt-bytes",
        "1000",
        "--prompt-bytes-max",
        "4000",
    ]);
    assert_eq!((r["completed"].as_u64(), r["prompt_bytes_max"].as_u64()), (Some(8), Some(4000)), "{r}");
    let mut sizes: Vec<usize> = mock
        .get_json("/log")
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let body: Value = serde_json::from_str(e["request_body"].as_str().unwrap()).unwrap();
            body["messages"][0]["content"].as_str().unwrap().len()
        })
        .collect();
    sizes.sort_unstable();
    assert_eq!(sizes, [1000, 1000, 2000, 2000, 3000, 3000, 4000, 4000]);
}

/// `--disconnect-after` cuts every stream after n tokens and stamps the
/// instant; the mock sees each close afterwards and lists it under the
/// request's tag, so the two stamps measure how fast a close travels.
#[test]
fn disconnects_are_tagged_and_seen_by_the_mock() {
    let mock = MockProv::start(&["--tokens", "1000", "--token-interval-ms", "10", "--no-record"]);
    let r = loadtest(&["--url", &mock.url(), "--disconnect-after", "3", "--requests", "20", "--concurrency", "4"]);
    assert_eq!((r["completed"].as_u64(), r["errors"]["total"].as_u64()), (Some(20), Some(0)), "{r}");
    assert_eq!(r["connections"], 20, "a cut connection is not reused: {r}");
    let cut = r["disconnects"].as_array().unwrap();
    assert_eq!(cut.len(), 20, "{r}");
    let mut tags: Vec<&str> = cut.iter().map(|d| d["tag"].as_str().unwrap()).collect();
    tags.sort_unstable();
    tags.dedup();
    assert_eq!(tags.len(), 20, "unique tags");
    assert!(r["tokens"].as_u64().unwrap() >= 60, "{r}");
    // The mock has seen (or is about to see) every close.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let closes = loop {
        let closes = mock.get_json("/closes");
        if closes.as_array().unwrap().len() >= 20 || std::time::Instant::now() > deadline {
            break closes;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    let closes = closes.as_array().unwrap();
    assert_eq!(closes.len(), 20, "{closes:?}");
    for d in cut {
        let c = closes.iter().find(|c| c["tag"] == d["tag"]).unwrap_or_else(|| panic!("no close for {d}"));
        let (left, seen) = (d["unix_ns"].as_u64().unwrap(), c["closed_unix_ns"].as_u64().unwrap());
        assert!(seen >= left && seen - left < 1_000_000_000, "{d} {c}");
    }
}

/// The chart titles of the HTML report, in page order.
const CHARTS: [&str; 4] = ["Latency CDF", "TTFT histogram", "Inter-token gap histogram", "Throughput over time"];

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("iop-loadtest-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A self-contained page: its charts inline, nothing it would fetch.
fn assert_self_contained(html: &str, urls: &[&str]) {
    assert!(html.starts_with("<!doctype html>") && html.trim_end().ends_with("</html>"), "{html}");
    for tag in ["<script", "<link", "<img", "<iframe", " src=", " href=", "url(", "@import"] {
        assert!(!html.contains(tag), "{tag} in the page");
    }
    // The only URLs: the SVG namespace, and the targets as text.
    let mut rest = html.replace("xmlns=\"http://www.w3.org/2000/svg\"", "");
    for url in urls {
        rest = rest.replace(url, "");
    }
    assert!(!rest.contains("http://") && !rest.contains("https://"), "a URL in the page");
}

/// `--html` writes the report as one page with the four charts; the JSON
/// report carries the distributions and the timeline they come from.
#[test]
fn html_report_has_every_chart_and_fetches_nothing() {
    let mock = MockProv::start(&["--tokens", "5"]);
    let dir = scratch("html");
    let page = dir.join("run.html");
    let r =
        loadtest(&["--url", &mock.url(), "--requests", "200", "--concurrency", "8", "--html", page.to_str().unwrap()]);
    assert_eq!(r["completed"], 200, "{r}");
    let html = std::fs::read_to_string(&page).unwrap();
    assert_self_contained(&html, &[&mock.url()]);
    assert_eq!(html.matches("<svg").count(), CHARTS.len(), "{html}");
    for title in CHARTS {
        assert!(html.contains(&format!("\n{title}\n</text>")), "no chart {title:?}");
    }
    assert!(html.contains("<td>200</td>"), "the table has the run: {html}");
    let series = &r["series"];
    for h in ["ttfb", "ttft", "total", "itl"] {
        assert!(series[h].as_str().unwrap().starts_with("HISTFAAA"), "{h}: {series}");
    }
    let per_sec = series["timeline"]["completed"].as_array().unwrap();
    assert_eq!(per_sec.iter().map(|n| n.as_u64().unwrap()).sum::<u64>(), 200, "{series}");
    assert_eq!(series["timeline"]["bucket_sec"], 1);

    // A path that cannot be written fails before the run.
    let out = Command::new(env!("CARGO_BIN_EXE_iop-loadtest"))
        .args(["--url", &mock.url(), "--requests", "1", "--html", dir.join("no/such/dir.html").to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--html"), "{out:?}");
    std::fs::remove_dir_all(&dir).ok();
}

/// `iop-loadtest report` puts saved runs on the same charts, one line each.
#[test]
fn report_puts_saved_runs_side_by_side() {
    let (fast, slow) = (MockProv::start(&["--tokens", "5"]), MockProv::start(&["--tokens", "5", "--ttft-ms", "20"]));
    let dir = scratch("report");
    let mut inputs = Vec::new();
    for (name, mock) in [("fast-mock", &fast), ("slow-mock", &slow)] {
        let r = loadtest(&["--url", &mock.url(), "--requests", "40", "--concurrency", "4"]);
        let path = dir.join(format!("{name}.json"));
        std::fs::write(&path, r.to_string()).unwrap();
        inputs.push(path);
    }
    let page = dir.join("both.html");
    let out = Command::new(env!("CARGO_BIN_EXE_iop-loadtest"))
        .args(["report", "--title", "fast <vs> slow", "--html", page.to_str().unwrap()])
        .args(&inputs)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let html = std::fs::read_to_string(&page).unwrap();
    // The commands, with their URLs, are listed as text.
    assert_self_contained(&html, &[&fast.url(), &slow.url()]);
    assert!(html.contains("<title>fast &lt;vs&gt; slow</title>"), "{html}");
    assert_eq!(html.matches("<svg").count(), CHARTS.len());
    for title in CHARTS {
        assert!(html.contains(&format!("\n{title}\n</text>")), "no chart {title:?}");
    }
    // Both runs in the table and in the legends (the TTFT histogram's, the CDF's).
    for name in ["fast-mock", "slow-mock"] {
        assert!(html.contains(&format!("<td>{name}</td>")), "{name} not in the table");
        assert!(html.matches(&format!("\n{name}\n</text>")).count() >= 2, "{name} not in the legends");
    }
    // The slow mock's 20 ms TTFT shows in its row.
    let row = html.split("<td>slow-mock</td>").nth(1).unwrap().split("</tr>").next().unwrap();
    let ttft_p50: f64 = row.split("<td>").nth(7).unwrap().trim_end_matches("</td>").parse().unwrap();
    assert!(ttft_p50 >= 20.0, "{row}");

    // An input that is not a report names itself; the exit code is 1.
    let bad = dir.join("bad.json");
    std::fs::write(&bad, "{\"runs\": []}").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_iop-loadtest"))
        .args(["report", "--html", page.to_str().unwrap(), bad.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("bad.json: neither"), "{out:?}");
    // Load flags and the subcommand do not mix.
    let out = Command::new(env!("CARGO_BIN_EXE_iop-loadtest"))
        .args(["--requests", "1", "report", "--html", "x.html", "y.json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    std::fs::remove_dir_all(&dir).ok();
}

/// The progress line is for people at a terminal: none when stderr is a
/// pipe; on a terminal (script(1) gives the run one) it is rewritten about
/// once a second and erased at the end.
#[test]
fn the_progress_line_is_for_terminals_only() {
    let mock = MockProv::start(&["--tokens", "2", "--token-interval-ms", "5"]);
    let args = ["--url", &mock.url(), "--duration-sec", "2", "--concurrency", "2"];
    let out = Command::new(env!("CARGO_BIN_EXE_iop-loadtest")).args(args).output().unwrap();
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains('\r') && !stderr.contains("req/s"), "progress on a pipe: {stderr:?}");

    let cmd = format!("{} {} --json", env!("CARGO_BIN_EXE_iop-loadtest"), args.join(" "));
    let out = Command::new("script")
        .args(["-q", "-e", "-c", &cmd, "/dev/null"])
        .stdin(Stdio::null())
        .output()
        .expect("script(1) (util-linux) runs the load on a terminal");
    assert!(out.status.success(), "{out:?}");
    let tty = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = tty.split('\r').filter(|l| l.contains("req/s")).collect();
    assert!(!lines.is_empty(), "no progress line on a terminal: {tty:?}");
    // The first tick is due 1 s in ("1s/2s"; later on a machine too busy to wake it on time).
    assert!(lines[0].contains("s/2s  ") && lines[0].contains(" ok  0 errors  "), "{lines:?}");
    assert!(lines[0].contains("ttft p50 "), "{lines:?}");
    assert!(tty.contains("\r\x1b[K{"), "the line is erased before the report: {tty:?}");
}
