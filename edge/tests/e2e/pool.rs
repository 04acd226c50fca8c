//! Capacity pools shared by model aliases, normal vs long leases, queue
//! admission limits (max_waiters, queue_timeout).

use std::time::{Duration, Instant};

use serde_json::json;

use crate::harness::*;

const SECS5: Duration = Duration::from_secs(5);

/// Arrival of the last content token of a finished stream.
fn last_content(t: &Timed) -> Instant {
    t.data.iter().rev().find(|(_, d)| d.contains("\"content\":\"tok")).map(|(i, _)| *i).expect("content tokens")
}

/// When the token before the last one arrived. A run that waited for
/// another's lease starts once that run ended on the edge, which may be
/// before its client thread read the last token (each client reads on its
/// own thread, in whatever order a loaded machine runs them); the tokens
/// before the last are a token interval older, well clear of that.
fn content_before_last(t: &Timed) -> Instant {
    let mut contents = t.data.iter().rev().filter(|(_, d)| d.contains("\"content\":\"tok")).map(|(i, _)| *i);
    contents.nth(1).expect("two content tokens")
}

fn tokens(n: u32) -> String {
    (0..n).map(|i| format!("tok{i} ")).collect()
}

#[test]
fn two_aliases_share_one_provider_of_capacity_one() {
    let edge = Edge::start(&pool_config(
        &[mock_node("n1", 1, 0, 10, 30)],
        &[mock_model("alpha", &["n1"], ""), mock_model("beta", &["n1"], "")],
        "",
    ));
    let mut ev = edge.events();
    let _n1 = edge.start_node("n1", "");
    edge.wait_nodes_ready(1);

    let mut a = Chat::stream(edge.http, "alpha");
    a.wait_data("tok0", SECS5);
    edge.wait_in_use("n1", "mock", 1);
    let b = Chat::stream(edge.http, "beta");
    // beta has no room on the shared provider: it queues.
    let snap = edge.wait_model_waiters("beta", 1);
    assert_eq!(provider_of(&snap, "n1", "mock")["leases_in_use"], 1, "{snap:#}");
    assert_eq!(provider_of(&snap, "n1", "mock")["waiters"], 1, "{snap:#}");

    let a = a.join();
    let b = b.join();
    for t in [&a, &b] {
        assert_eq!(t.resp.status, 200, "{}", t.resp_text());
        assert_eq!(t.content(), tokens(10));
        assert_eq!(t.last().1, "[DONE]");
    }
    // beta's run started only after alpha's had streamed everything.
    assert!(
        b.first_content() > content_before_last(&a),
        "beta's first token arrived {:?} before alpha's last but one",
        content_before_last(&a).saturating_duration_since(b.first_content())
    );
    let first = ev.wait("run_terminal", SECS5, |e| e["model"] == "alpha");
    let second = ev.wait("run_terminal", SECS5, |e| e["model"] == "beta");
    assert_eq!(first["outcome"], "complete");
    assert_eq!(second["outcome"], "complete");
    assert_ne!(first["run_id"], second["run_id"]);
    edge.assert_idle();
}

#[test]
fn long_and_normal_requests_use_separate_pools() {
    let edge = Edge::start(&pool_config(
        &[mock_node("n1", 1, 1, 15, 30)],
        &[mock_model("m", &["n1"], "long_context_threshold = 20")],
        "",
    ));
    let _n1 = edge.start_node("n1", "");
    edge.wait_nodes_ready(1);
    // ceil((4 + 200) / 4) = 51 estimated tokens > 20: long. "hi" is normal.
    let long = "x".repeat(200);

    let mut l1 = Chat::start(edge.http, "m", &long, true, 0);
    l1.wait_data("tok0", SECS5);
    let snap = edge.wait_in_use("n1", "mock", 1);
    assert_eq!(provider_of(&snap, "n1", "mock")["long"]["in_use"], 1, "{snap:#}");
    let mut n = Chat::start(edge.http, "m", "hi", true, 0);
    n.wait_data("tok0", SECS5);
    let l2 = Chat::start(edge.http, "m", &long, true, 0);
    // The model counter moves first; the owner core publishes the queue right after.
    let snap = edge.wait_snapshot(std::time::Duration::from_secs(5), "l2 queued on n1/mock", |s| {
        model_of(s, "m")["waiters"] == 1 && provider_of(s, "n1", "mock")["waiters"] == 1
    });
    let p = provider_of(&snap, "n1", "mock");
    assert_eq!(p["normal"]["in_use"], 1, "{snap:#}");
    assert_eq!(p["long"]["in_use"], 1, "{snap:#}");
    assert_eq!(p["leases_in_use"], 2, "{snap:#}");
    assert_eq!(p["live_leases"], 2, "{snap:#}");
    assert_eq!(p["waiters"], 1, "{snap:#}");

    let l1 = l1.join();
    let n = n.join();
    let l2 = l2.join();
    for t in [&l1, &n, &l2] {
        assert_eq!(t.resp.status, 200, "{}", t.resp_text());
        assert_eq!(t.content(), tokens(15));
    }
    // The normal request ran beside the first long one...
    assert!(n.first_content() < last_content(&l1), "normal request did not run concurrently with the long one");
    // ...the second long one only after the first long one ended.
    assert!(
        l2.first_content() > content_before_last(&l1),
        "second long request started {:?} before the first long one's last token but one",
        content_before_last(&l1).saturating_duration_since(l2.first_content())
    );
    edge.assert_idle();
}

#[test]
fn full_queue_is_429() {
    let edge =
        Edge::start(&pool_config(&[mock_node("n1", 1, 0, 20, 25)], &[mock_model("m", &["n1"], "max_waiters = 1")], ""));
    let _n1 = edge.start_node("n1", "");
    edge.wait_nodes_ready(1);

    let mut a = Chat::stream(edge.http, "m");
    a.wait_data("tok0", SECS5);
    let b = Chat::start(edge.http, "m", "hi", false, 0);
    edge.wait_model_waiters("m", 1);
    let started = Instant::now();
    let r = post_json(
        edge.http,
        "/v1/chat/completions",
        &json!({"model": "m", "messages": [{"role": "user", "content": "x"}]}),
    );
    assert_eq!(r.status, 429, "{}", String::from_utf8_lossy(&r.body));
    assert!(started.elapsed() < Duration::from_millis(300), "429 should be immediate, took {:?}", started.elapsed());
    let v = r.json();
    assert!(v["error"]["message"].is_string(), "{v}");
    assert!(v["error"]["type"].is_string(), "{v}");
    assert!(!a.is_finished(), "first request should still be running");

    assert_eq!(a.join().resp.status, 200);
    let b = b.join();
    assert_eq!(b.resp.status, 200, "{}", b.resp_text());
    assert_eq!(b.resp.json()["choices"][0]["message"]["content"], tokens(20));
    edge.assert_idle();
}

#[test]
fn queue_timeout_is_503_with_retry_after() {
    let edge = Edge::start(&pool_config(
        &[mock_node("n1", 1, 0, 60, 25)],
        &[mock_model("m", &["n1"], "queue_timeout_ms = 300")],
        "",
    ));
    let _n1 = edge.start_node("n1", "");
    edge.wait_nodes_ready(1);

    let mut a = Chat::stream(edge.http, "m");
    a.wait_data("tok0", SECS5);
    let started = Instant::now();
    let r = post_json(
        edge.http,
        "/v1/chat/completions",
        &json!({"model": "m", "messages": [{"role": "user", "content": "x"}]}),
    );
    let waited = started.elapsed();
    assert_eq!(r.status, 503, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    assert!(v["error"]["message"].is_string(), "{v}");
    assert!(v["error"]["type"].is_string(), "{v}");
    let retry = r.header("retry-after").expect("Retry-After header on a queue timeout");
    assert!(retry.parse::<u64>().is_ok(), "Retry-After {retry:?}");
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_millis(1000),
        "queue timeout of 300 ms answered after {waited:?}"
    );
    // The timed-out waiter left the queue while the first run still streams.
    assert!(!a.is_finished(), "first request should still be running");
    let snap = edge.snapshot();
    assert_eq!(model_of(&snap, "m")["waiters"], 0, "{snap:#}");
    assert_eq!(provider_of(&snap, "n1", "mock")["waiters"], 0, "{snap:#}");

    let a = a.join();
    assert_eq!(a.resp.status, 200);
    assert_eq!(a.content(), tokens(60));
    edge.assert_idle();
}

#[test]
fn client_leaving_the_queue_frees_its_place() {
    use std::io::Write;
    let edge =
        Edge::start(&pool_config(&[mock_node("n1", 1, 0, 40, 25)], &[mock_model("m", &["n1"], "max_waiters = 1")], ""));
    let _n1 = edge.start_node("n1", "");
    edge.wait_nodes_ready(1);

    let mut a = Chat::stream(edge.http, "m");
    a.wait_data("tok0", SECS5);
    // A raw client queues, then hangs up while waiting.
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "x"}]}).to_string();
    let mut s = std::net::TcpStream::connect(edge.http).unwrap();
    let req = format!("POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\ncontent-length: {}\r\n\r\n{body}", body.len());
    s.write_all(req.as_bytes()).unwrap();
    edge.wait_model_waiters("m", 1);
    drop(s);
    // Its place is free at once (max_waiters = 1 would refuse a new waiter
    // otherwise), long before the running request ends.
    edge.wait_snapshot(Duration::from_secs(1), "the departed waiter left every queue", |s| {
        model_of(s, "m")["waiters"] == 0 && provider_of(s, "n1", "mock")["waiters"] == 0
    });
    let b = Chat::start(edge.http, "m", "hi", false, 0);
    edge.wait_model_waiters("m", 1);
    assert!(!a.is_finished(), "the first request should still be running");
    assert_eq!(a.join().resp.status, 200);
    let b = b.join();
    assert_eq!(b.resp.status, 200, "{}", b.resp_text());
    edge.assert_idle();
}
