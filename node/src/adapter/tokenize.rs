//! Counting a prompt's tokens with the provider's own tokenizer, for the
//! Anthropic `count_tokens` route on an OpenAI-compatible server that does
//! not serve the Messages API. The run's body is the prompt as an OpenAI
//! chat request; two forms of the server-root `/tokenize` are known:
//!
//! - vLLM: `{"model","messages","tools"}` in, `{"count",...}` out, the
//!   chat template applied;
//! - llama.cpp's server: `/tokenize` reads only `content` (it answers
//!   `{"tokens":[]}` to messages), so the prompt is first rendered by its
//!   `/apply-template` and then tokenized.
//!
//! The answer is a `Complete` whose usage holds the count as input
//! tokens. A server with neither (a 404) fails the run, and the edge
//! answers with its estimate instead.

use bytes::Bytes;
use iop_core::exec::{codes, ExecEvent, FailureSource, RunFailure, Usage};
use serde_json::{json, Map, Value};

use super::{
    openai_compat::OpenAiCompatAdapter,
    openai_stream::{protocol, retry_after_ms, status_failure},
};
use crate::run::{EventSink, RunSpec};

/// Most of a tokenizer's answer read (a token list of a long prompt).
const MAX_ANSWER: usize = 32 * 1024 * 1024;

/// Counts the tokens of `spec`'s prompt and emits the answer (or the
/// failure) as the run's events.
pub async fn execute<S: EventSink>(adapter: &OpenAiCompatAdapter, spec: RunSpec, sink: &mut S) {
    let counted = iop_core::rt::time::timeout(adapter.request_timeout, count(adapter, &spec)).await;
    let ev = match counted {
        Ok(Ok(tokens)) => {
            if sink.emit(ExecEvent::Start { model: spec.target.clone() }).await.is_err() {
                return;
            }
            let usage = Usage { input_tokens: tokens, ..Default::default() };
            ExecEvent::Complete { finish_reason: "stop".into(), usage: Some(usage) }
        }
        Ok(Err(f)) => ExecEvent::Error(f),
        Err(_) => ExecEvent::Error(RunFailure::new(
            codes::UPSTREAM_TIMEOUT,
            504,
            FailureSource::Provider,
            "the provider's tokenizer did not answer in time",
        )),
    };
    let _ = sink.emit(ev).await;
}

/// The failure for a provider kind without a tokenizer endpoint.
pub fn unsupported(provider: &str) -> RunFailure {
    RunFailure::new(
        codes::INVALID_REQUEST,
        400,
        FailureSource::Client,
        format!("provider `{provider}` has no tokenizer endpoint"),
    )
}

/// The prompt's token count, in the vLLM form or else the llama.cpp one.
async fn count(adapter: &OpenAiCompatAdapter, spec: &RunSpec) -> Result<u64, RunFailure> {
    let chat: Map<String, Value> = serde_json::from_slice(&spec.body)
        .map_err(|e| RunFailure::new(codes::INVALID_REQUEST, 400, FailureSource::Client, e.to_string()))?;
    let mut prompt = Map::new();
    prompt.insert("model".into(), Value::String(spec.target.clone()));
    for key in ["messages", "tools"] {
        if let Some(v) = chat.get(key) {
            prompt.insert(key.into(), v.clone());
        }
    }
    drop(chat);
    let root = root_of(&adapter.url.path_prefix);
    let answer = post(adapter, spec, &format!("{root}/tokenize"), &Value::Object(prompt.clone())).await?;
    if let Some(n) = answer.get("count").and_then(Value::as_u64) {
        return Ok(n);
    }
    if answer.get("tokens").is_none() {
        return Err(protocol("the provider's /tokenize answer has neither `count` nor `tokens`"));
    }
    // llama.cpp: the chat template first, then its text.
    let rendered = post(adapter, spec, &format!("{root}/apply-template"), &Value::Object(prompt)).await?;
    let Some(text) = rendered.get("prompt").and_then(Value::as_str) else {
        return Err(protocol("the provider's /apply-template answer has no `prompt`"));
    };
    let body = json!({"content": text, "add_special": true});
    let answer = post(adapter, spec, &format!("{root}/tokenize"), &body).await?;
    match answer.get("tokens").and_then(Value::as_array) {
        Some(tokens) => Ok(tokens.len() as u64),
        None => Err(protocol("the provider's /tokenize answer has no `tokens`")),
    }
}

/// The server's root path: `base_url`'s path without its `/v1` (vLLM and
/// llama.cpp serve `/tokenize` beside `/v1`, not under it).
fn root_of(prefix: &str) -> &str {
    let p = prefix.trim_end_matches('/');
    p.strip_suffix("/v1").unwrap_or(p)
}

/// POSTs `body` as JSON to `target` and reads a JSON object back.
async fn post(
    adapter: &OpenAiCompatAdapter,
    spec: &RunSpec,
    target: &str,
    body: &Value,
) -> Result<Map<String, Value>, RunFailure> {
    let body = Bytes::from(body.to_string());
    let mut headers: Vec<(&str, &[u8])> = vec![("content-type", b"application/json")];
    if let Some(auth) = spec.credential.as_ref().or(adapter.authorization.as_ref()) {
        headers.push(("authorization", auth.expose().as_bytes()));
    }
    let req = crate::upstream::Request {
        method: "POST",
        host: &adapter.url.host,
        port: adapter.url.port,
        target,
        headers: &headers,
        body: &body,
        tls: adapter.tls.as_ref(),
    };
    let mut resp = super::send_upstream(&adapter.client, &req, &adapter.id, &spec.run_id).await?;
    let status = resp.status();
    let (answer, truncated) = resp.read_to_end(MAX_ANSWER).await.map_err(|e| protocol(e.to_string()))?;
    if !(200..=299).contains(&status) {
        let retry = retry_after_ms(resp.header("retry-after-ms"), resp.header("retry-after"));
        return Err(status_failure(status, &answer, retry));
    }
    if truncated {
        return Err(protocol("the provider's tokenizer answer is too large"));
    }
    serde_json::from_slice(&answer).map_err(|e| protocol(format!("the provider's tokenizer answer: {e}")))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use std::time::Duration;

    use iop_core::config::UpstreamUrl;

    use super::*;
    use crate::{
        adapter::tests::{spec_body, VecSink},
        run::Operation,
        upstream::{
            test_server::{with_body, Event, Reply, TestServer},
            UpstreamClient,
        },
    };

    const PROMPT: &str = r#"{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"hi"}],
        "tools":[{"type":"function","function":{"name":"f"}}]}"#;

    fn run(server: &TestServer, prefix: &str) -> Vec<ExecEvent> {
        let url =
            UpstreamUrl { tls: false, host: "127.0.0.1".into(), port: server.addr.port(), path_prefix: prefix.into() };
        let a = OpenAiCompatAdapter::new("up".into(), url, None, 4, Duration::from_secs(10), UpstreamClient::default());
        let spec = RunSpec { operation: Operation::Tokenize, ..spec_body("served", PROMPT) };
        iop_core::rt::block_on_current(async {
            let mut sink = VecSink::default();
            execute(&a, spec, &mut sink).await;
            sink.events
        })
        .unwrap()
    }

    fn request(server: &TestServer) -> (String, Value) {
        loop {
            if let Event::Request { head, body, .. } = server.next_event() {
                return (head.lines().next().unwrap_or_default().to_owned(), serde_json::from_slice(&body).unwrap());
            }
        }
    }

    fn counted(evs: &[ExecEvent]) -> u64 {
        match evs {
            [ExecEvent::Start { .. }, ExecEvent::Complete { usage: Some(u), .. }] => u.input_tokens,
            other => panic!("not a count: {other:?}"),
        }
    }

    #[test]
    fn vllm_counts_the_messages_at_the_server_root() {
        let server = TestServer::start(vec![Reply::keep(with_body(
            200,
            "application/json",
            r#"{"count":17,"max_model_len":4096,"tokens":[1,2]}"#,
        ))]);
        assert_eq!(counted(&run(&server, "/v1")), 17);
        let (line, body) = request(&server);
        assert_eq!(line, "POST /tokenize HTTP/1.1");
        assert_eq!(body["model"], "served");
        assert_eq!(body["messages"][0]["content"], "hi");
        assert_eq!(body["tools"][0]["function"]["name"], "f");
        assert!(body.get("max_tokens").is_none(), "{body}");
    }

    #[test]
    fn llama_cpp_renders_the_template_then_tokenizes_its_text() {
        let server = TestServer::start(vec![
            Reply::keep(with_body(200, "application/json", r#"{"tokens":[]}"#)),
            Reply::keep(with_body(200, "application/json", r#"{"prompt":"<|user|>hi<|assistant|>"}"#)),
            Reply::keep(with_body(200, "application/json", r#"{"tokens":[5,6,7,8]}"#)),
        ]);
        assert_eq!(counted(&run(&server, "/proxy/v1/")), 4);
        assert_eq!(request(&server).0, "POST /proxy/tokenize HTTP/1.1");
        let (line, body) = request(&server);
        assert_eq!(
            (line.as_str(), &body["messages"][0]["content"]),
            ("POST /proxy/apply-template HTTP/1.1", &json!("hi"))
        );
        let (line, body) = request(&server);
        assert_eq!(
            (line.as_str(), &body["content"]),
            ("POST /proxy/tokenize HTTP/1.1", &json!("<|user|>hi<|assistant|>"))
        );
    }

    #[test]
    fn a_server_without_a_tokenizer_fails_the_run() {
        let server = TestServer::start(vec![
            Reply::keep(with_body(404, "application/json", r#"{"detail":"Not Found"}"#)),
            Reply::keep(with_body(200, "application/json", r#"{"other":1}"#)),
        ]);
        for want in [404, 502] {
            match &run(&server, "/v1")[..] {
                [ExecEvent::Error(f)] => assert_eq!(f.status, want, "{f:?}"),
                other => panic!("{other:?}"),
            }
        }
    }
}
