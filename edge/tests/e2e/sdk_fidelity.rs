//! What the official `openai` Python SDK sees, through iop and without it.
//! `scripts/openai_fidelity.py` runs application-style flows (tool-call
//! helpers, a two-turn agent loop, `n = 2` with logprobs, refusals, errors,
//! embeddings, completions, the Responses API) and prints the parsed
//! objects with per-request ids scrubbed.
//!
//! - Tunnel: the same flows straight against `iop-mockprov` and through
//!   edge → node → the same mock must print the same JSON.
//! - Normalized path (the in-process mock provider): the SDK must find
//!   every part the run events carry, in OpenAI's shape.
//!
//! They need python3 with the SDK, so they are `#[ignore]`d; CI installs it
//! (scripts/fetch-test-model.sh) and runs them with `--ignored`.

use std::process::Command;

use serde_json::{json, Value};

use crate::harness::*;

const TUNNEL_FLOWS: &str = "tools_stream,tools,agent_loop,choices,choices_stream,refusal,refusal_stream,error_429,\
                            embeddings,embeddings_base64,completions,completions_stream,responses,responses_stream";

/// Runs `flows` with the SDK against `base_url` (…/v1) asking for `model`.
pub fn sdk_flows(base_url: &str, model: &str, flows: &str) -> Value {
    sdk_flows_with(base_url, model, flows, &[])
}

/// [`sdk_flows`] with extra environment (`IOP_TEST_CA`: the CA an https
/// base URL is verified against).
pub fn sdk_flows_with(base_url: &str, model: &str, flows: &str, envs: &[(&str, &str)]) -> Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/openai_fidelity.py");
    let mut cmd = Command::new("python3");
    cmd.args([script, base_url, model, flows]);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap_or_else(|e| {
        panic!("python3: {e} (install the SDK with scripts/fetch-test-model.sh)");
    });
    assert!(out.status.success(), "openai_fidelity.py failed:\n{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Panics naming every flow that raised where it should not have.
fn assert_no_exceptions(what: &str, v: &Value) {
    let failed: Vec<String> = v
        .as_object()
        .unwrap()
        .iter()
        .filter_map(|(flow, r)| r.get("exception").map(|e| format!("{flow}: {e}")))
        .collect();
    assert!(failed.is_empty(), "{what}: flows failed:\n{}", failed.join("\n"));
}

#[test]
#[ignore = "needs python3 with the openai SDK, installed by scripts/fetch-test-model.sh; CI runs it"]
fn the_sdk_sees_the_same_through_the_tunnel_as_from_the_provider() {
    let mock = MockProv::start(&["--tokens", "4"]);
    let edge = Edge::start(&edge_config(&mock.base_url(), ""));
    let _node = edge.node(NODE_TOKEN, &[]);
    edge.wait_nodes_ready(1);
    // The edge maps gpt-test to the provider's mock-upstream; asked for
    // directly, the provider answers as mock-upstream too.
    let direct = sdk_flows(&mock.base_url(), "mock-upstream", TUNNEL_FLOWS);
    let through = sdk_flows(&format!("http://{}/v1", edge.http), "gpt-test", TUNNEL_FLOWS);
    assert_no_exceptions("direct", &direct);
    for flow in TUNNEL_FLOWS.split(',') {
        assert_eq!(
            through[flow], direct[flow],
            "flow {flow}: the SDK saw something else through iop\nthrough: {:#}\ndirect: {:#}",
            through[flow], direct[flow]
        );
    }
    // The flows did exercise what they are named for.
    assert_eq!(through["tools_stream"]["arguments"], json!([{"city": "Paris", "n": 0}, {"city": "Paris", "n": 1}]));
    assert_eq!(through["agent_loop"]["answer"], "tool said: sunny 1");
    assert_eq!(through["error_429"]["retry_after"], "7");
    assert_eq!(through["refusal_stream"]["refusal"], "I can't help with that");
}

fn normalized_edge() -> Edge {
    let nodes = [mock_node("n1", 8, 8, 3, 0)];
    Edge::start(&pool_config(&nodes, &[mock_model("m", &["n1"], "")], ""))
}

#[test]
#[ignore = "needs python3 with the openai SDK, installed by scripts/fetch-test-model.sh; CI runs it"]
fn the_sdk_finds_every_part_on_the_normalized_path() {
    let edge = normalized_edge();
    let _node = edge.start_node("n1", "");
    edge.wait_nodes_ready(1);
    let flows =
        "tools_stream,tools,agent_loop,choices,choices_stream,refusal,refusal_stream,embeddings,embeddings_base64";
    let v = sdk_flows(&format!("http://{}/v1", edge.http), "m", flows);
    assert_no_exceptions("normalized", &v);
    assert_tool_flows(&v, "mock-m");
    assert_choice_and_refusal_flows(&v);
    assert_embedding_flows(&v);
}

#[test]
#[ignore = "needs python3 with the openai SDK, installed by scripts/fetch-test-model.sh; CI runs it"]
fn the_sdk_finds_every_part_through_the_ollama_adapter() {
    let mock = MockProv::start(&["--tokens", "3"]);
    let node = format!(
        "\n[[nodes]]\nid = \"n1\"\ntoken = \"{}\"\n[[nodes.providers]]\nid = \"ol\"\nkind = \"ollama\"\nbase_url = \"http://{}\"\ncapacity = 4\n",
        node_token("n1"),
        mock.addr
    );
    let model = "\n[[models]]\nname = \"llama\"\nnode = \"n1\"\nprovider = \"ol\"\nupstream_model = \"mock-llama\"\n";
    let edge = Edge::start(&pool_config(&[node], &[model.into()], ""));
    let _node = edge.start_node("n1", "");
    edge.wait_nodes_ready(1);
    let flows = "tools_stream,tools,agent_loop,embeddings,embeddings_base64,error_429";
    let v = sdk_flows(&format!("http://{}/v1", edge.http), "llama", flows);
    assert_no_exceptions("ollama", &v);
    assert_tool_flows(&v, "mock-llama");
    assert_embedding_flows(&v);
    let e = &v["error_429"];
    assert_eq!((&e["raised"], &e["status"]), (&json!("RateLimitError"), &json!(429)), "{e:#}");
    assert!(e["body"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{e:#}");
    // Ollama has no n, logprobs or refusals: asked for, they are refused
    // in OpenAI's words, never silently dropped.
    let v = sdk_flows(&format!("http://{}/v1", edge.http), "llama", "choices,choices_stream");
    for flow in ["choices", "choices_stream"] {
        let e = v[flow]["exception"].as_str().unwrap_or_default();
        assert!(e.starts_with("BadRequestError") && e.contains("`n`"), "{flow}: {e}");
    }
}

/// What the tool-call flows must show, whichever adapter served them
/// (`model` is the name the provider answered with).
pub fn assert_tool_flows(v: &Value, model: &str) {
    let args = json!([{"city": "Paris", "n": 0}, {"city": "Paris", "n": 1}]);
    // Streamed tool calls, accumulated by the SDK's helper.
    let ts = &v["tools_stream"];
    assert_eq!(ts["arguments"], args, "{ts:#}");
    let msg = &ts["final"]["choices"][0];
    assert_eq!(msg["finish_reason"], "tool_calls", "{ts:#}");
    let calls = msg["message"]["tool_calls"].as_array().unwrap();
    assert!(calls.iter().all(|c| c["type"] == "function" && c["function"]["name"] == "get_weather"), "{ts:#}");
    assert!(ts["event_types"].as_array().unwrap().contains(&json!("tool_calls.function.arguments.done")), "{ts:#}");
    assert_eq!(ts["final"]["model"], model);
    // Not streamed.
    let t = &v["tools"];
    assert_eq!(t["arguments"], args, "{t:#}");
    assert_eq!(t["response"]["choices"][0]["finish_reason"], "tool_calls", "{t:#}");
    assert_eq!(t["response"]["object"], "chat.completion");
    assert!(t["response"]["usage"]["completion_tokens"].as_u64().unwrap() > 0, "{t:#}");
    // The agent loop: the tool results go back, the answer comes.
    let a = &v["agent_loop"];
    assert_eq!((&a["first_finish"], &a["calls"]), (&json!("tool_calls"), &json!(2)), "{a:#}");
    assert_eq!(a["answer"], "tool said: sunny 1", "{a:#}");
    assert_eq!(a["second"]["choices"][0]["finish_reason"], "stop", "{a:#}");
}

/// `n = 2` with logprobs and refusals, streamed and not.
pub fn assert_choice_and_refusal_flows(v: &Value) {
    // n = 2 with logprobs, aggregated.
    let c = &v["choices"]["response"];
    let choices = c["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 2, "{c:#}");
    for (i, ch) in choices.iter().enumerate() {
        assert_eq!(ch["index"], i, "{c:#}");
        assert!(ch["message"]["content"].as_str().unwrap().starts_with("tok0"), "{c:#}");
        let lp = ch["logprobs"]["content"].as_array().unwrap();
        assert!(!lp.is_empty() && lp[0]["top_logprobs"].as_array().unwrap().len() == 2, "{c:#}");
        assert!(lp[0]["token"].as_str().unwrap().starts_with("tok0"), "{c:#}");
    }
    // n = 2 with logprobs, streamed.
    let cs = &v["choices_stream"];
    for i in ["0", "1"] {
        assert!(cs["texts"][i].as_str().unwrap().starts_with("tok0"), "{cs:#}");
        assert!(cs["finishes"][i].is_string(), "{cs:#}");
        assert!(!cs["logprobs"][i].as_array().unwrap().is_empty(), "{cs:#}");
    }
    // Refusals, both ways.
    let r = &v["refusal"]["response"]["choices"][0]["message"];
    assert_eq!(r["refusal"], "I can't help with that", "{r:#}");
    assert_eq!(r["content"], Value::Null, "{r:#}");
    assert_eq!(v["refusal_stream"]["refusal"], "I can't help with that");
}

/// Embeddings as floats and as base64.
pub fn assert_embedding_flows(v: &Value) {
    let e = &v["embeddings"]["response"];
    let data = e["data"].as_array().unwrap();
    assert_eq!(data.len(), 2, "{e:#}");
    assert!(data
        .iter()
        .enumerate()
        .all(|(i, d)| d["index"] == i && d["embedding"].as_array().is_some_and(|x| !x.is_empty())));
    let b = &v["embeddings_base64"]["response"]["data"][0]["embedding"];
    assert!(b.as_str().is_some_and(|s| !s.is_empty()), "{b}");
}
