//! Suspect links: a node frozen with SIGSTOP (links open, nothing sent)
//! stops getting new work within a second or two instead of after the
//! 45 s heartbeat wait; its runs go on when it resumes; a live node whose
//! first token takes long (a long prefill) answers the probes and is never
//! suspect.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::harness::*;

/// Probe a link silent for 300 ms with runs in flight; 200 ms to answer.
const PROBE: &str = "suspect_after_ms = 300\nprobe_timeout_ms = 200";
const SECS5: Duration = Duration::from_secs(5);

/// A short chat completion on `m`: its status, its time and the node the
/// `run_terminal` event says it ran on.
fn short(edge: &Edge, ev: &mut Events) -> (u16, Duration, String) {
    let started = Instant::now();
    let r = post_json(
        edge.http,
        "/v1/chat/completions",
        &json!({"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]}),
    );
    let took = started.elapsed();
    let run = r.header("x-request-id").unwrap_or_default().to_owned();
    let end = ev.wait("run_terminal", SECS5, |e| e["run_id"] == run.as_str());
    (r.status, took, end["node"].as_str().unwrap_or_default().to_owned())
}

#[test]
fn a_frozen_node_gets_no_new_work_and_takes_it_again_once_it_answers() {
    // Without suspicion n1 is preferred: least loaded by share of capacity
    // (1 of 8 in use against 1 of 2), and first on ties.
    // (Affinity off: the prompts' prefix would otherwise pick the target.)
    let nodes = [mock_node("n1", 8, 0, 200, 25), mock_node("n2", 2, 0, 200, 25)];
    let models = [mock_model("m", &["n1", "n2"], "")];
    let edge = Edge::start(&pool_config_with("", PROBE, &nodes, &models, "[affinity]\nenabled = false\n"));
    let mut ev = edge.events();
    let n1 = edge.start_node("n1", "");
    let _n2 = edge.start_node("n2", "");
    edge.wait_nodes_ready(2);

    let mut a = Chat::stream(edge.http, "m");
    a.wait_data("tok1", SECS5);
    edge.wait_in_use("n1", "mock", 1);
    let mut b = Chat::stream(edge.http, "m");
    b.wait_data("tok1", SECS5);
    edge.wait_in_use("n2", "mock", 1);
    // The setup steers new work to n1, so the test can fail.
    let (status, _, node) = short(&edge, &mut ev);
    assert_eq!((status, node.as_str()), (200, "n1"));

    let stopped = n1.stop();
    let frozen = Instant::now();
    let suspect = ev.wait("link_suspect", SECS5, |e| e["node"] == "n1");
    println!("n1 link {} suspect {:?} after SIGSTOP ({suspect})", suspect["link"], frozen.elapsed());
    // The node's flag and its provider's (published by the provider's
    // owner core, a moment apart).
    let snap = edge.wait_snapshot(SECS5, "n1 suspect", |s| {
        node_of(s, "n1")["suspect"] == true && provider_of(s, "n1", "mock")["suspect"] == true
    });
    println!("n1 suspect in the snapshot {:?} after SIGSTOP", frozen.elapsed());
    let p = provider_of(&snap, "n1", "mock");
    assert_eq!((&p["suspect"], &p["status"], &p["health"]), (&json!(true), &json!("unavailable"), &json!("online")));
    // Nothing is closed: the node is still connected, its run still counted.
    assert_eq!(node_of(&snap, "n1")["connected"], true, "{snap:#}");
    assert_eq!(p["normal"]["in_use"], 1, "{snap:#}");
    let metrics = String::from_utf8_lossy(&edge.admin("/metrics").body).into_owned();
    assert!(metrics.contains("iop_edge_node_links_suspect{node=\"n1\"} 2"), "{metrics}");
    assert!(!metrics.contains("iop_edge_link_suspect_total 0"), "{metrics}");

    // New work goes to n2 at once.
    for _ in 0..4 {
        let (status, took, node) = short(&edge, &mut ev);
        assert_eq!((status, node.as_str()), (200, "n2"), "a request went to the frozen node");
        assert!(took < Duration::from_secs(2), "a request took {took:?} while n1 was frozen");
    }

    stopped.cont();
    ev.wait("link_responsive", SECS5, |e| e["node"] == "n1");
    edge.wait_snapshot(SECS5, "n1 answers", |s| {
        node_of(s, "n1")["suspect"] == false && provider_of(s, "n1", "mock")["status"] == "available"
    });
    // Its run went on, whole.
    let a = a.join_within(Duration::from_secs(15));
    assert_eq!(a.resp.status, 200, "{}", a.resp_text());
    assert_eq!(a.content(), (0..200).map(|i| format!("tok{i} ")).collect::<String>());
    // And it takes new work again.
    let (status, _, node) = short(&edge, &mut ev);
    assert_eq!((status, node.as_str()), (200, "n1"));
    assert_eq!(b.join_within(Duration::from_secs(15)).resp.status, 200);
    edge.assert_idle();
}

#[test]
fn a_long_first_token_never_makes_a_node_suspect() {
    // The first token takes 2 s (a long prefill): the link owes a run and
    // sends nothing, is probed several times, and answers each probe.
    let node = format!("{}first_token_delay_ms = 2000\n", mock_node("n1", 4, 0, 3, 0));
    let edge = Edge::start(&pool_config_with("", PROBE, &[node], &[mock_model("m", &["n1"], "")], ""));
    let mut ev = edge.events();
    let _n1 = edge.start_node("n1", "");
    edge.wait_nodes_ready(1);
    let started = Instant::now();
    let slow = Chat::start(edge.http, "m", "x", true, 0);
    let done = slow.join_within(Duration::from_secs(10));
    assert_eq!(done.resp.status, 200, "{}", done.resp_text());
    let prefill = done.first_content().saturating_duration_since(started);
    assert!(prefill >= Duration::from_millis(1900), "the first token came after {prefill:?}");
    let end = ev.wait("run_terminal", SECS5, |_| true);
    assert_eq!(end["outcome"], "complete", "{end}");
    assert!(ev.seen.iter().all(|e| e["type"] != "link_suspect"), "a live node was suspected: {:#?}", ev.seen);
    let metrics = String::from_utf8_lossy(&edge.admin("/metrics").body).into_owned();
    assert!(metrics.contains("iop_edge_link_suspect_total 0"), "{metrics}");
}
