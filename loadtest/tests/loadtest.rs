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
