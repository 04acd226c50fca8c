//! One model call of a stage, with no client connection of its own:
//! capacity taken on the stage's model group as any request's is (queue,
//! leases, credential leases), the chat body sent as any chat request is by
//! the provider's kind (through the tunnel to a server that speaks OpenAI's
//! API, its whole answer read here; on the normalized run otherwise, its
//! events gathered), the answer whole. Failures come back as the run's
//! error classes; nothing is retried, reselected or sent twice.

use std::{rc::Rc, time::Instant};

use iop_core::{
    exec::{codes, ExecEvent, Part, RunFailure, Usage},
    tunnel::TunnelItem,
    wire::pb,
};

use super::state::ErrorClass;
use crate::{ctx::Ctx, pool::LeaseClass};

/// Most bytes of text or of one tool call's arguments a stage takes from
/// one answer.
const MAX_ANSWER_BYTES: usize = 1 << 20;
/// Most tool calls one answer may make.
const MAX_CALLS: usize = 16;

/// One tool call of an answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Call {
    /// The model's id for it.
    pub id: String,
    /// The function's name.
    pub name: String,
    /// Its JSON arguments, as sent.
    pub arguments: String,
}

/// A stage's model answer, whole.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Answer {
    /// Content text.
    pub text: String,
    /// Tool calls, in order.
    pub calls: Vec<Call>,
    /// OpenAI `finish_reason`.
    pub finish: String,
    /// What it cost.
    pub usage: Usage,
}

impl Answer {
    /// It stopped at its output limit.
    pub fn hit_length(&self) -> bool {
        self.finish == "length"
    }
}

/// What a stage's call failed with, and why (for the logs: a closed code,
/// never content).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallFailed {
    /// The run's error class.
    pub class: ErrorClass,
    /// The failure's closed code.
    pub code: &'static str,
}

/// Runs `body` (an OpenAI chat request without `model`) on `group` and
/// gathers its answer, within `deadline`. `principal` is the client key's
/// name (for credential leases), `session_id` the client's (correlation
/// only).
pub async fn call(
    ctx: &Rc<Ctx>,
    group: &str,
    mut body: serde_json::Value,
    deadline: Instant,
    principal: &str,
    session_id: &str,
) -> Result<Answer, CallFailed> {
    let Some(group) = ctx.config.borrow().model(group).cloned() else {
        return Err(CallFailed { class: ErrorClass::Provider, code: "model_gone" });
    };
    let gathered = async {
        let admitted = crate::dispatch::admit_reachable(ctx, &group, LeaseClass::Normal, None)
            .await
            .map_err(|_| CallFailed { class: ErrorClass::Provider, code: "no_capacity" })?;
        body["model"] = serde_json::Value::String(admitted.target.upstream_model.to_string());
        let bytes = serde_json::to_vec(&body).map_err(|_| CallFailed { class: ErrorClass::Malformed, code: "body" })?;
        let (node, provider) = (&admitted.target.node, &admitted.target.provider);
        let tunnels = ctx.config.borrow().provider(node, provider).is_some_and(|p| p.kind.is_openai_compatible());
        if tunnels {
            return tunnel(ctx, &group.name, admitted, bytes, principal, session_id).await;
        }
        let req = pb::RunRequest {
            body: bytes.into(),
            operation: pb::RunOperation::Chat as i32,
            whole: true,
            principal: principal.to_owned(),
            session_id: session_id.to_owned(),
            ..Default::default()
        };
        let mut run = crate::dispatch::submit(ctx, &group.name, admitted, req)
            .map_err(|_| CallFailed { class: ErrorClass::Provider, code: "no_ready_node" })?;
        let mut answer = Gather::default();
        while let Some(ev) = run.next().await {
            if let Some(done) = answer.on_event(ev) {
                return done.map(|()| answer.answer);
            }
        }
        Err(CallFailed { class: ErrorClass::Provider, code: codes::NODE_DISCONNECTED })
    };
    match iop_core::rt::time::timeout_at(deadline, gathered).await {
        Ok(r) => r,
        // Dropping the run cancels it on the node and gives its lease back.
        Err(_) => Err(CallFailed { class: ErrorClass::Timeout, code: "stage_deadline" }),
    }
}

/// The call through the tunnel: the provider's whole `chat.completion`
/// (or its error), read here.
async fn tunnel(
    ctx: &Rc<Ctx>,
    group: &str,
    admitted: crate::pool::Admitted,
    body: Vec<u8>,
    principal: &str,
    session_id: &str,
) -> Result<Answer, CallFailed> {
    let req = pb::ProviderTunnelRequest {
        method: "POST".into(),
        path: "/chat/completions".into(),
        body: body.into(),
        principal: principal.to_owned(),
        session_id: session_id.to_owned(),
        ..Default::default()
    };
    let headers = |id: &str| {
        let h = |n: &'static [u8], v: bytes::Bytes| pb::Header { name: bytes::Bytes::from_static(n), value: v };
        vec![
            h(b"content-type", bytes::Bytes::from_static(b"application/json")),
            h(b"x-request-id", bytes::Bytes::copy_from_slice(id.as_bytes())),
        ]
    };
    let mut stream = crate::dispatch::submit_tunnel(ctx, group, admitted, req, headers)
        .map_err(|_| CallFailed { class: ErrorClass::Provider, code: "no_ready_node" })?;
    let (mut status, mut body) = (0u16, Vec::new());
    let mut take = |b: &[u8]| {
        if body.len() + b.len() > MAX_ANSWER_BYTES {
            return Err(CallFailed { class: ErrorClass::Context, code: "answer_too_large" });
        }
        body.extend_from_slice(b);
        Ok(())
    };
    while let Some(item) = stream.next().await {
        match item {
            TunnelItem::Start { status: s, .. } => status = s,
            TunnelItem::Body(b) => take(&b)?,
            TunnelItem::Parts(parts) => parts.iter().try_for_each(|b| take(b))?,
            TunnelItem::End { .. } => return read_whole(status, &body),
            TunnelItem::Whole(w) => {
                w.body.iter().try_for_each(|b| take(b))?;
                return read_whole(w.status, &body);
            }
            TunnelItem::Error(f) => return Err(failed(&f)),
        }
    }
    Err(CallFailed { class: ErrorClass::Provider, code: codes::NODE_DISCONNECTED })
}

/// A provider's whole chat answer: `choices[0]`'s text, tool calls and
/// finish reason, and the usage; or the class of its error.
fn read_whole(status: u16, body: &[u8]) -> Result<Answer, CallFailed> {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap_or(serde_json::Value::Null);
    if status != 200 {
        let message = v["error"]["message"].as_str().unwrap_or("");
        let mut f = RunFailure::new(codes::UPSTREAM_STATUS, status, iop_core::exec::FailureSource::Provider, message);
        if let Some(code) = v["error"]["code"].as_str() {
            f.provider =
                Some(Box::new(iop_core::exec::ProviderError { code: Some(code.to_owned()), ..Default::default() }));
        }
        return Err(failed(&f));
    }
    let malformed = CallFailed { class: ErrorClass::Malformed, code: "answer" };
    let choice = v["choices"].get(0).ok_or(malformed)?;
    let message = &choice["message"];
    let mut calls = Vec::new();
    for c in message["tool_calls"].as_array().map(Vec::as_slice).unwrap_or_default() {
        let (Some(id), Some(name)) = (c["id"].as_str(), c["function"]["name"].as_str()) else { return Err(malformed) };
        let arguments = c["function"]["arguments"].as_str().unwrap_or("").to_owned();
        calls.push(Call { id: id.to_owned(), name: name.to_owned(), arguments });
    }
    if calls.len() > MAX_CALLS {
        return Err(malformed);
    }
    let usage = Usage {
        input_tokens: v["usage"]["prompt_tokens"].as_u64().unwrap_or(0),
        output_tokens: v["usage"]["completion_tokens"].as_u64().unwrap_or(0),
        ..Default::default()
    };
    Ok(Answer {
        text: message["content"].as_str().unwrap_or("").to_owned(),
        calls,
        finish: choice["finish_reason"].as_str().unwrap_or("").to_owned(),
        usage,
    })
}

/// An answer being gathered from a run's events.
#[derive(Debug, Default)]
struct Gather {
    answer: Answer,
}

impl Gather {
    /// Takes one event; `Some` at the terminal.
    fn on_event(&mut self, ev: ExecEvent) -> Option<Result<(), CallFailed>> {
        let a = &mut self.answer;
        match ev {
            ExecEvent::Delta(d) if d.choice == 0 => match d.part {
                Part::Content(t) => {
                    if a.text.len() + t.len() > MAX_ANSWER_BYTES {
                        return Some(Err(CallFailed { class: ErrorClass::Context, code: "answer_too_large" }));
                    }
                    a.text.push_str(&t);
                }
                Part::ToolCall(c) => {
                    let i = c.index as usize;
                    if i >= MAX_CALLS {
                        return Some(Err(CallFailed { class: ErrorClass::Malformed, code: "too_many_calls" }));
                    }
                    if a.calls.len() <= i {
                        a.calls.resize_with(i + 1, Call::default);
                    }
                    let call = &mut a.calls[i];
                    if !c.id.is_empty() {
                        call.id = c.id;
                    }
                    if !c.name.is_empty() {
                        call.name = c.name;
                    }
                    if call.arguments.len() + c.arguments.len() > MAX_ANSWER_BYTES {
                        return Some(Err(CallFailed { class: ErrorClass::Context, code: "answer_too_large" }));
                    }
                    call.arguments.push_str(&c.arguments);
                }
                // Reasoning and refusals stay out of every stage's result.
                Part::Reasoning(_) | Part::Refusal(_) => {}
            },
            ExecEvent::ChoiceFinish { choice: 0, finish_reason, .. } => a.finish = finish_reason,
            ExecEvent::Complete { finish_reason, usage } => {
                if a.finish.is_empty() {
                    a.finish = finish_reason;
                }
                a.usage = usage.unwrap_or_default();
                return Some(Ok(()));
            }
            ExecEvent::Error(f) => return Some(Err(failed(&f))),
            ExecEvent::Cancelled { .. } => {
                return Some(Err(CallFailed { class: ErrorClass::Provider, code: "cancelled" }));
            }
            _ => {}
        }
        None
    }
}

/// The class of a failed call: out of time, a prompt past the model's
/// context, or the provider's failure.
fn failed(f: &RunFailure) -> CallFailed {
    let class = match f.code {
        codes::DEADLINE_EXCEEDED | codes::UPSTREAM_TIMEOUT | codes::RESPONSE_STALLED => ErrorClass::Timeout,
        _ if is_context(f) => ErrorClass::Context,
        _ => ErrorClass::Provider,
    };
    CallFailed { class, code: f.code }
}

/// A provider's "prompt too long" (OpenAI's `context_length_exceeded`,
/// vLLM's and llama.cpp's 400s that say so).
fn is_context(f: &RunFailure) -> bool {
    let code = f.provider.as_ref().and_then(|p| p.code.as_deref()).unwrap_or("");
    code == "context_length_exceeded"
        || (f.status == 400 && (f.message.contains("context length") || f.message.contains("context_length")))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use iop_core::exec::{Delta, FailureSource, ToolCallDelta};

    use super::*;

    fn tool(index: u32, id: &str, name: &str, args: &str) -> ExecEvent {
        ExecEvent::Delta(Delta {
            choice: 0,
            part: Part::ToolCall(Box::new(ToolCallDelta {
                index,
                id: id.into(),
                kind: String::new(),
                name: name.into(),
                arguments: args.into(),
            })),
            logprobs: None,
        })
    }

    #[test]
    fn text_and_tool_calls_are_gathered_in_order() {
        let mut g = Gather::default();
        assert!(g.on_event(ExecEvent::content("he")).is_none());
        assert!(g.on_event(ExecEvent::content("llo")).is_none());
        assert!(g.on_event(tool(0, "c1", "workspace_read", "{\"pa")).is_none());
        assert!(g.on_event(tool(0, "", "", "th\":\"a\"}")).is_none());
        assert!(g.on_event(tool(1, "c2", "workspace_list", "{}")).is_none());
        let usage = Usage { input_tokens: 3, output_tokens: 4, ..Default::default() };
        let done = g.on_event(ExecEvent::Complete { finish_reason: "tool_calls".into(), usage: Some(usage) });
        assert_eq!(done, Some(Ok(())));
        assert_eq!(g.answer.text, "hello");
        assert_eq!(g.answer.calls.len(), 2);
        assert_eq!(g.answer.calls[0].arguments, "{\"path\":\"a\"}");
        assert_eq!(g.answer.calls[1].name, "workspace_list");
        assert_eq!(g.answer.finish, "tool_calls");
        assert_eq!(g.answer.usage.output_tokens, 4);
    }

    #[test]
    fn a_whole_chat_answer_is_read_and_errors_classed() {
        let body = br#"{"choices":[{"message":{"content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"workspace_read","arguments":"{\"path\":\"a\"}"}}]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":5,"completion_tokens":2}}"#;
        let a = read_whole(200, body).unwrap();
        assert_eq!((a.text.as_str(), a.finish.as_str(), a.usage.input_tokens), ("", "tool_calls", 5));
        assert_eq!(
            a.calls,
            [Call { id: "c1".into(), name: "workspace_read".into(), arguments: "{\"path\":\"a\"}".into() }]
        );
        let text = read_whole(200, br#"{"choices":[{"message":{"content":"done"},"finish_reason":"stop"}]}"#).unwrap();
        assert_eq!(text.text, "done");
        assert_eq!(read_whole(200, b"not json").unwrap_err().class, ErrorClass::Malformed);
        let ctx = br#"{"error":{"message":"too long","code":"context_length_exceeded"}}"#;
        assert_eq!(read_whole(400, ctx).unwrap_err().class, ErrorClass::Context);
        assert_eq!(read_whole(500, b"{}").unwrap_err().class, ErrorClass::Provider);
    }

    #[test]
    fn failures_map_to_their_classes() {
        let f = |code, status, msg: &str| RunFailure::new(code, status, FailureSource::Provider, msg);
        assert_eq!(failed(&f(codes::DEADLINE_EXCEEDED, 504, "x")).class, ErrorClass::Timeout);
        assert_eq!(failed(&f(codes::RESPONSE_STALLED, 504, "x")).class, ErrorClass::Timeout);
        assert_eq!(
            failed(&f(codes::UPSTREAM_STATUS, 400, "maximum context length is 4096")).class,
            ErrorClass::Context
        );
        assert_eq!(failed(&f(codes::UPSTREAM_STATUS, 500, "boom")).class, ErrorClass::Provider);
        let mut g = Gather::default();
        assert!(matches!(
            g.on_event(tool(99, "x", "y", "")),
            Some(Err(CallFailed { class: ErrorClass::Malformed, .. }))
        ));
    }
}
