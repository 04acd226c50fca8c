//! One model call of a stage, with no client connection of its own:
//! capacity taken on the stage's model group as any request's is (queue,
//! leases, credential leases), the chat body run on the normalized path
//! whatever the provider's kind (the stage reads events, not bytes), and
//! the answer gathered whole. Failures come back as the run's error
//! classes; nothing is retried, reselected or sent twice.

use std::{rc::Rc, time::Instant};

use iop_core::{
    exec::{codes, ExecEvent, Part, RunFailure, Usage},
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
/// name (for credential leases).
pub async fn call(
    ctx: &Rc<Ctx>,
    group: &str,
    mut body: serde_json::Value,
    deadline: Instant,
    principal: &str,
) -> Result<Answer, CallFailed> {
    let Some(group) = ctx.config.borrow().model(group).cloned() else {
        return Err(CallFailed { class: ErrorClass::Provider, code: "model_gone" });
    };
    let gathered = async {
        let admitted = crate::dispatch::admit_reachable(ctx, &group, LeaseClass::Normal)
            .await
            .map_err(|_| CallFailed { class: ErrorClass::Provider, code: "no_capacity" })?;
        body["model"] = serde_json::Value::String(admitted.target.upstream_model.to_string());
        let bytes = serde_json::to_vec(&body).map_err(|_| CallFailed { class: ErrorClass::Malformed, code: "body" })?;
        let req = pb::RunRequest {
            body: bytes.into(),
            operation: pb::RunOperation::Chat as i32,
            whole: true,
            principal: principal.to_owned(),
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
