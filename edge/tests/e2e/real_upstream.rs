//! Against a real model server: llama.cpp's OpenAI-compatible server with
//! SmolLM2-135M, and the official `openai` Python SDK, both installed by
//! `scripts/fetch-test-model.sh`. These tests need that setup, so they are
//! `#[ignore]`d (listed as ignored, never a silent pass); CI installs the
//! prerequisites and runs them with `--ignored`. When run without their
//! prerequisites they fail and say what is missing.

use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::json;

use crate::harness::*;

struct Llama(Child);

impl Drop for Llama {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_llama(model: &str) -> (Llama, u16) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/llama_server.py");
    let mut child = Command::new("python3")
        .args([script, model, &port.to_string(), "smollm2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("python3");
    let stdout = child.stdout.take().unwrap();
    let llama = Llama(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let line =
            rx.recv_timeout(deadline.saturating_duration_since(Instant::now())).expect("llama server never came up");
        if line.starts_with("llama-server ready") {
            return (llama, port);
        }
    }
}

/// The GGUF model from `IOP_E2E_LLAMA_MODEL`; a test that needs it fails without it.
fn llama_model() -> String {
    std::env::var("IOP_E2E_LLAMA_MODEL").unwrap_or_else(|_| {
        panic!(
            "IOP_E2E_LLAMA_MODEL is not set: run `export IOP_E2E_LLAMA_MODEL=$(bash scripts/fetch-test-model.sh | tail -n 1)` \
             (python3 with pip and network access; it also installs xllamacpp and the openai SDK)"
        )
    })
}

#[test]
#[ignore = "needs llama.cpp (xllamacpp) and a GGUF model: IOP_E2E_LLAMA_MODEL from scripts/fetch-test-model.sh; CI runs it"]
fn real_llama_cpp_upstream_streams_and_completes() {
    let model = llama_model();
    let (_llama, port) = start_llama(&model);
    let edge = Edge::start(&edge_config(&format!("http://127.0.0.1:{port}/v1"), ""));
    let _node = edge.node(NODE_TOKEN, &[]);
    edge.wait_nodes_ready(1);
    let ask = |stream: bool| {
        post_json(
            edge.http,
            "/v1/chat/completions",
            &json!({"model": "gpt-test", "stream": stream, "stream_options": {"include_usage": true},
                    "temperature": 0, "max_tokens": 8,
                    "messages": [{"role": "user", "content": "Name three colors."}]}),
        )
    };
    let r = ask(true);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let data = r.sse_data();
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<serde_json::Value> =
        data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).unwrap()).collect();
    let streamed: String =
        chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect::<Vec<_>>().concat();
    assert!(!streamed.trim().is_empty(), "no content streamed: {data:?}");
    assert_eq!(chunks.iter().find_map(|c| c["choices"][0]["finish_reason"].as_str()), Some("length"));
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(usage["completion_tokens"], 8, "{usage}");
    assert!(usage["prompt_tokens"].as_u64().unwrap() > 0);

    // Greedy decoding: the aggregated answer is the same text.
    let r = ask(false);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    assert_eq!(v["choices"][0]["message"]["content"].as_str(), Some(streamed.as_str()), "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 8);

    // Through the tunnel the answer is llama.cpp's own: the same fields
    // as asking it directly (ids and timings aside).
    let direct = post_json(
        format!("127.0.0.1:{port}").parse().unwrap(),
        "/v1/chat/completions",
        &json!({"model": "mock-upstream", "stream": false, "temperature": 0, "max_tokens": 8,
                "messages": [{"role": "user", "content": "Name three colors."}]}),
    )
    .json();
    let keys = |o: &serde_json::Value| {
        let mut k: Vec<String> = o.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    };
    assert_eq!(keys(&v), keys(&direct), "through: {v:#}\ndirect: {direct:#}");
    assert_eq!(v["choices"], direct["choices"]);
    assert_eq!(v["usage"], direct["usage"]);
    assert_eq!((&v["model"], &v["system_fingerprint"]), (&direct["model"], &direct["system_fingerprint"]));
}

#[test]
#[ignore = "needs python3 with the openai SDK, installed by scripts/fetch-test-model.sh; CI runs it"]
fn official_openai_python_sdk_streams_and_completes() {
    // The fetch script installs the SDK; its variable says it ran.
    llama_model();
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../configs/quickstart.toml")).unwrap();
    let edge = Edge::start(&text.replace("127.0.0.1:8080", "127.0.0.1:0"));
    edge.wait_nodes_ready(1);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/openai_sdk_check.py");
    let out =
        Command::new("python3").args([script, &format!("http://{}/v1", edge.http), "mock"]).output().expect("python3");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["stream_text"], "tok0 tok1 tok2 tok3 tok4 tok5 ", "{v}");
    assert_eq!(v["stream_finish"], "length", "{v}");
    assert_eq!(v["stream_usage"]["completion_tokens"], 6, "{v}");
    assert!(v["text"].as_str().unwrap().starts_with("tok0 tok1 "), "{v}");
    assert_eq!(v["finish"], "stop", "{v}");
    assert!(v["usage"]["total_tokens"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(v["models"], json!(["mock"]), "{v}");
    assert_eq!(v["not_found_status"], 404, "{v}");
}

#[test]
#[ignore = "needs llama.cpp (xllamacpp), a GGUF model (IOP_E2E_LLAMA_MODEL) and the anthropic SDK, from scripts/fetch-test-model.sh; CI runs it"]
fn real_llama_cpp_serves_the_messages_api_natively_and_translated() {
    use crate::messages::anthropic_flows;
    let model = llama_model();
    let (_llama, port) = start_llama(&model);
    let base = format!("http://127.0.0.1:{port}/v1");
    // What a small model answers reliably: text, streamed and not, a system
    // prompt, stop sequences, a cap, errors and a token count.
    // (A block type llama.cpp does not know it ignores: natively that is
    // the provider's call; translated, the edge refuses it.)
    let mut counts = Vec::new();
    for native in [true, false] {
        let flows = if native {
            "text,text_stream,system,stop_sequences,max_tokens,error_not_found,count_tokens"
        } else {
            "text,text_stream,system,stop_sequences,max_tokens,error_not_found,error_invalid,count_tokens"
        };
        let extra = if native { "native_apis = [\"messages\"]" } else { "native_apis = []" };
        let edge = Edge::start(&one_provider_config("openai_compat", &base, extra, "smollm2"));
        let _node = edge.node(NODE_TOKEN, &[]);
        edge.wait_nodes_ready(1);
        let v = anthropic_flows(&format!("http://{}", edge.http), "m", flows);
        let what = if native { "native" } else { "translated" };
        let failed: Vec<String> = v
            .as_object()
            .unwrap()
            .iter()
            .filter_map(|(flow, r)| r.get("exception").map(|e| format!("{flow}: {e}")))
            .collect();
        assert!(failed.is_empty(), "{what}: {failed:#?}");
        let text = v["text"]["content"].as_array().and_then(|c| c.last()).cloned().unwrap_or_default();
        assert_eq!(text["type"], "text", "{what}: {v:#}");
        assert!(!text["text"].as_str().unwrap_or("").is_empty(), "{what}: {v:#}");
        assert!(v["text"]["usage"]["input_tokens"].as_u64().unwrap() > 0, "{what}: {v:#}");
        assert_eq!(v["max_tokens"]["stop_reason"], "max_tokens", "{what}");
        assert_eq!(v["error_not_found"]["status"], 404, "{what}");
        assert_eq!(v["count_tokens"]["positive"], true, "{what}");
        // Both counts are llama.cpp's own tokenizer's: natively its
        // count_tokens, translated its /apply-template and /tokenize.
        let ask = json!({"model": "m", "messages": [{"role": "user", "content": "hello there, how are you today?"}]});
        let r = request(edge.http, "POST", "/v1/messages/count_tokens", Some(ask.to_string().as_bytes()), &[]);
        assert_eq!(r.status, 200, "{what}: {}", String::from_utf8_lossy(&r.body));
        assert_eq!(r.header("iop-token-count"), None, "{what}: counted, not estimated");
        counts.push(r.json()["input_tokens"].as_u64().unwrap());
    }
    // The same prompt through the same chat template: the same count, give
    // or take the generation prompt's tokens.
    assert!(counts[0].abs_diff(counts[1]) <= 8, "native vs translated count: {counts:?}");
}
