//! Node faults: kill -9 mid-stream, restart with a queued request, the last
//! candidate going away, heartbeat timeouts, graceful SIGTERM drain.
//! After every fault all lease and waiter counters must be back at 0.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::harness::*;

const SECS5: Duration = Duration::from_secs(5);

const FAST_HEARTBEAT: &str = "[testing]\nheartbeat_interval_ms = 100\nheartbeat_wait_ms = 400\n";

/// The last event of a stream is an OpenAI error object, with no `[DONE]`.
fn assert_error_terminal(t: &Timed) {
    assert_eq!(t.resp.status, 200, "{}", t.resp_text());
    let last: serde_json::Value = serde_json::from_str(&t.last().1)
        .unwrap_or_else(|_| panic!("last event is not an error object: {}", t.resp_text()));
    assert!(last["error"]["message"].is_string(), "last event should be an error: {}", t.resp_text());
    assert!(!t.data.iter().any(|(_, d)| d == "[DONE]"), "no [DONE] after an error: {}", t.resp_text());
}

#[test]
fn kill_9_mid_stream_ends_the_stream_with_an_error_and_releases_everything() {
    let edge = Edge::start(&pool_config(&[mock_node("n1", 2, 1, 1000, 20)], &[mock_model("m", &["n1"], "")], ""));
    let mut n1 = edge.start_node("n1", "");
    edge.wait_nodes_ready(1);

    let mut a = Chat::stream(edge.http, "m");
    a.wait_data("tok2", SECS5);
    let snap = edge.wait_in_use("n1", "mock", 1);
    assert_eq!(node_of(&snap, "n1")["connected"], true, "{snap:#}");
    n1.kill9();
    let killed = Instant::now();
    let a = a.join_within(Duration::from_secs(5));
    assert_error_terminal(&a);
    let after = a.last().0.saturating_duration_since(killed);
    println!("error terminal {after:?} after kill -9");
    assert!(after < Duration::from_secs(1), "error terminal only {after:?} after kill -9");

    let snap = edge.wait_snapshot(SECS5, "n1 disconnected", |s| node_of(s, "n1")["connected"] == false);
    assert_offline(&snap, "n1");
    let p = provider_of(&snap, "n1", "mock");
    assert_eq!(p["normal"]["configured"], 2, "{snap:#}");
    assert_eq!(p["long"]["configured"], 1, "{snap:#}");
    let snap = edge.assert_idle();
    assert_offline(&snap, "n1");
}

#[test]
fn restarted_node_serves_the_queued_request_at_once() {
    let edge = Edge::start(&pool_config(
        &[mock_node("n1", 1, 0, 60, 50), mock_node("n2", 1, 0, 60, 50)],
        &[mock_model("m", &["n1", "n2"], "")],
        "",
    ));
    let mut ev = edge.events();
    let mut n1 = edge.start_node("n1", "");
    let _n2 = edge.start_node("n2", "");
    edge.wait_nodes_ready(2);
    let gen1 = ev.wait("node_ready", SECS5, |e| e["node"] == "n1")["generation"].as_u64().expect("generation");

    // Both providers busy with 3 s streams, a third request queued.
    let mut a = Chat::stream(edge.http, "m");
    a.wait_data("tok0", SECS5);
    let mut b = Chat::stream(edge.http, "m");
    b.wait_data("tok0", SECS5);
    edge.wait_in_use("n1", "mock", 1);
    edge.wait_in_use("n2", "mock", 1);
    let c = Chat::start(edge.http, "m", "hi", true, 3);
    edge.wait_model_waiters("m", 1);

    n1.kill9();
    let killed = Instant::now();
    let deadline = killed + Duration::from_secs(2);
    while !a.is_finished() && !b.is_finished() {
        assert!(Instant::now() < deadline, "no client got an error after kill -9 of n1");
        std::thread::sleep(Duration::from_millis(5));
    }
    let (dead, survivor) = if a.is_finished() { (a, b) } else { (b, a) };
    let dead = dead.join();
    assert_error_terminal(&dead);
    assert!(dead.last().0.saturating_duration_since(killed) < Duration::from_secs(1));
    ev.wait("node_disconnected", SECS5, |e| e["node"] == "n1" && e["generation"] == gen1);
    let snap = edge.wait_snapshot(SECS5, "n1 offline", |s| node_of(s, "n1")["connected"] == false);
    assert_offline(&snap, "n1");
    // n2 is alive: the queued request keeps waiting. (n1's links close one
    // by one: it may have been granted the capacity `a` freed through n1's
    // other, dying link, and be asking again, or replaying before commit,
    // avoiding n1's dead connection but not a new one.)
    edge.wait_model_waiters("m", 1);
    if c.is_finished() {
        panic!("queued request ended although n2 is still a candidate: {}", c.join().resp_text());
    }

    let _n1 = edge.start_node("n1", "");
    let restarted = Instant::now();
    let ready = ev.wait("node_ready", SECS5, |e| e["node"] == "n1");
    assert!(ready["generation"].as_u64().expect("generation") > gen1, "{ready}");
    let c = c.join_within(SECS5);
    assert_eq!(c.resp.status, 200, "{}", c.resp_text());
    assert_eq!(c.content(), "tok0 tok1 tok2 ");
    assert_eq!(c.last().1, "[DONE]");
    let took = c.ended.saturating_duration_since(restarted);
    println!("queued request finished {took:?} after n1 was restarted");
    assert!(took < Duration::from_millis(1500), "queued request finished only {took:?} after the restart");
    assert!(!survivor.is_finished(), "the queued request should not have waited for n2's stream to end");

    let survivor = survivor.join();
    assert_eq!(survivor.resp.status, 200, "{}", survivor.resp_text());
    assert_eq!(survivor.last().1, "[DONE]");
    let snap = edge.assert_idle();
    assert_eq!(node_of(&snap, "n1")["connected"], true, "{snap:#}");
}

#[test]
fn waiter_without_a_live_candidate_is_unavailable_at_once() {
    let edge = Edge::start(&pool_config(
        &[mock_node("n1", 1, 0, 1000, 20)],
        &[mock_model("m", &["n1"], "queue_timeout_ms = 30000")],
        "",
    ));
    let mut n1 = edge.start_node("n1", "");
    edge.wait_nodes_ready(1);

    let mut a = Chat::stream(edge.http, "m");
    a.wait_data("tok0", SECS5);
    let b = Chat::start(edge.http, "m", "hi", false, 0);
    edge.wait_model_waiters("m", 1);
    n1.kill9();
    let killed = Instant::now();
    let b = b.join_within(SECS5);
    let took = b.ended.saturating_duration_since(killed);
    println!("queued request answered {took:?} after its only candidate died");
    // The node's links close one by one: when the link carrying `a` is seen
    // closed first, `b` may be granted `a`'s capacity through the other,
    // already dying link, and end as that node's disconnect (a 502 the
    // client gets as promptly; there is no other provider to replay on).
    let v = b.resp.json();
    let disconnected = b.resp.status == 502 && v["error"]["code"] == "node_disconnected";
    assert!(b.resp.status == 503 || disconnected, "{}", b.resp_text());
    assert!(v["error"]["message"].is_string(), "{v}");
    assert!(took < Duration::from_secs(1), "queued request answered only {took:?} after the kill");
    assert_error_terminal(&a.join_within(SECS5));

    let snap = edge.assert_idle();
    assert_offline(&snap, "n1");
}

#[test]
fn heartbeat_timeout_marks_a_stopped_node_offline_and_it_comes_back() {
    let edge =
        Edge::start(&pool_config(&[mock_node("n1", 1, 0, 3, 0)], &[mock_model("m", &["n1"], "")], FAST_HEARTBEAT));
    let mut ev = edge.events();
    let n1 = edge.start_node("n1", FAST_HEARTBEAT);
    let gen1 = ev.wait("node_ready", SECS5, |e| e["node"] == "n1")["generation"].as_u64().expect("generation");
    edge.wait_nodes_ready(1);

    let stopped = n1.stop();
    let at = Instant::now();
    // Every link times out; the last one ends the generation.
    let gone = ev.wait("node_disconnected", Duration::from_secs(3), |e| e["node"] == "n1" && e["current"] == true);
    let took = at.elapsed();
    println!("heartbeat timeout noticed after {took:?}");
    assert_eq!(gone["reason"], "heartbeat_timeout", "{gone}");
    assert_eq!(gone["generation"], gen1, "{gone}");
    assert_eq!(gone["current"], true, "{gone}");
    assert!(took < Duration::from_millis(1500), "heartbeat timeout took {took:?}");
    let snap = edge.wait_snapshot(Duration::from_secs(1), "n1 offline", |s| node_of(s, "n1")["connected"] == false);
    assert_offline(&snap, "n1");
    edge.assert_idle();

    stopped.cont();
    let back = ev.wait("node_ready", Duration::from_secs(6), |e| e["node"] == "n1");
    assert!(back["generation"].as_u64().expect("generation") > gen1, "{back}");
    edge.wait_nodes_ready(1);
    let r = post_json(
        edge.http,
        "/v1/chat/completions",
        &json!({"model": "m", "messages": [{"role": "user", "content": "x"}]}),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let snap = edge.assert_idle();
    assert_eq!(node_of(&snap, "n1")["connected"], true, "{snap:#}");
    assert_eq!(provider_of(&snap, "n1", "mock")["health"], "online", "{snap:#}");
}

#[test]
fn sigterm_drains_the_in_flight_stream_and_exits_0() {
    let edge = Edge::start(&pool_config(&[mock_node("n1", 1, 0, 20, 50)], &[mock_model("m", &["n1"], "")], ""));
    let mut n1 = edge.start_node("n1", "shutdown_grace_sec = 5\n");
    edge.wait_nodes_ready(1);

    let mut a = Chat::stream(edge.http, "m");
    a.wait_data("tok1", SECS5);
    n1.signal("TERM");
    let a = a.join_within(SECS5);
    assert_eq!(a.resp.status, 200, "{}", a.resp_text());
    assert_eq!(a.content(), (0..20).map(|i| format!("tok{i} ")).collect::<String>(), "{}", a.resp_text());
    assert_eq!(a.last().1, "[DONE]", "{}", a.resp_text());
    assert_eq!(n1.wait_exit(SECS5), Some(0), "node log:\n{}", n1.log_text());
    let snap = edge.wait_snapshot(SECS5, "n1 offline", |s| node_of(s, "n1")["connected"] == false);
    assert_offline(&snap, "n1");
    edge.assert_idle();
}

#[test]
fn a_draining_node_gets_no_new_runs() {
    // Two targets; n1 is told to shut down mid-stream: it finishes that run,
    // and new requests go to n2 instead of failing on n1.
    let edge = Edge::start(&pool_config(
        &[mock_node("n1", 4, 0, 30, 50), mock_node("n2", 1, 0, 2, 20)],
        &[mock_model("m", &["n1", "n2"], "")],
        "",
    ));
    let mut ev = edge.events();
    let mut n1 = edge.start_node("n1", "shutdown_grace_sec = 10\n");
    let _n2 = edge.start_node("n2", "");
    edge.wait_nodes_ready(2);

    let mut a = Chat::stream(edge.http, "m"); // least loaded, ties to n1 (first target)
    a.wait_data("tok1", SECS5);
    n1.signal("TERM");
    ev.wait("node_draining", SECS5, |e| e["node"] == "n1");
    // n1 still has room for three more, n2 for one: without the drain fence
    // most of these would land on n1 and fail; with it they queue for n2.
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let http = edge.http;
            std::thread::spawn(move || {
                post_json(
                    http,
                    "/v1/chat/completions",
                    &json!({"model": "m", "messages": [{"role": "user", "content": "x"}]}),
                )
            })
        })
        .collect();
    for c in clients {
        let r = c.join().unwrap();
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        assert_eq!(r.json()["choices"][0]["message"]["content"], "tok0 tok1 ", "served by n2");
    }
    let snap = edge.snapshot();
    assert_eq!(provider_of(&snap, "n1", "mock")["status"], "unavailable", "{snap:#}");
    let a = a.join_within(SECS5);
    assert_eq!(a.last().1, "[DONE]", "{}", a.resp_text());
    assert_eq!(a.content().matches("tok").count(), 30);
    assert_eq!(n1.wait_exit(SECS5), Some(0), "node log:\n{}", n1.log_text());
    edge.assert_idle();
}
