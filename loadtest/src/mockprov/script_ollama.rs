//! Scripted answers on Ollama's `POST /api/chat` (`--script`): the scripts,
//! markers, cursors and answers of [`super::script`] (one set for both
//! APIs), rendered as Ollama renders a chat answer, so a provider of kind
//! `ollama` can run the edge's staged coordinator against the mock.
//!
//! The stage comes from `format`, where Ollama carries a JSON schema
//! without its name ([`Stage::of_ollama`]). Streamed (`stream` true or
//! absent, Ollama's default) the answer is NDJSON: the content in a few
//! lines, the tool calls whole in one line (as Ollama parses them), then the
//! final line with `done: true`, `done_reason` (`length` when the answer's
//! `finish_reason` is `length`, else `stop`, tool calls included), the
//! counts and the timings. `stream: false`: one object, the whole message
//! and the final fields. A call's `arguments` is an object; a scripted raw
//! string that is not one is sent as a JSON string (a malformed call). An
//! `error` answer is that status with Ollama's `{"error": "..."}`, and so is
//! an exhausted stage's 500.

use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use super::clock::Timestamp;
use super::errors;
use super::json::json_str;
use super::ollama_chat::{final_fields, line_json, message_json, metrics_json};
use super::reply::{Action, Env, Flavor, Frame, Phase, Reply, Script, Stream, Timing, Whole, OLLAMA_JSON};
use super::script::{pick, pieces, prompt_chars, Answer, Call, Message, Scripts, Stage};
use super::tool_calls;

/// The fields of an `/api/chat` request a scripted answer reads.
#[derive(Debug, Deserialize)]
struct ScriptedRequest {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    messages: Vec<Message>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    format: Option<Value>,
    /// Not Ollama's; read in case a client sends the OpenAI field.
    #[serde(default)]
    response_format: Option<Value>,
}

/// The scripted reply to an `/api/chat` request, or `None` when it is not
/// scripted (no marker, or a marker naming no script, or a body that does
/// not parse: the endpoint answers it as ever).
pub fn reply(scripts: &Scripts, body: &[u8], env: &Env<'_>) -> Option<Reply> {
    let req: ScriptedRequest = serde_json::from_slice(body).ok()?;
    let stage = Stage::of_ollama(req.format.as_ref(), req.response_format.as_ref());
    let answer = match pick(scripts, &req.messages, stage)? {
        Ok(answer) => answer,
        Err(message) => return Some(error(500, &message, Duration::ZERO)),
    };
    let delay = Duration::from_millis(answer.delay_ms);
    if let Some(e) = &answer.error {
        return Some(error(e.status, &e.message, delay));
    }
    let model = req.model.filter(|m| !m.is_empty()).unwrap_or_else(|| env.config.model.clone());
    let ids = scripts.call_ids(answer.tool_calls.len());
    let scripted = Scripted::new(answer, &ids, model, prompt_chars(&req.messages), delay);
    let action = if req.stream.unwrap_or(true) {
        Action::Stream(Stream {
            content_type: "application/x-ndjson",
            headers: Vec::new(),
            // Ollama sends its head with the first line; a delay is a silent upstream.
            eager_head: false,
            timing: Timing {
                ttft: delay,
                interval: Duration::ZERO,
                abort_after: None,
                stall_after: None,
                hold_open: false,
                burst: 1,
            },
            script: Box::new(scripted.into_stream()),
        })
    } else {
        let mut whole = Whole::json(200, OLLAMA_JSON, scripted.whole(env.now.plus(delay)));
        whole.delay = delay;
        Action::Whole(whole)
    };
    Some(Reply::new(Flavor::Ollama, action))
}

/// `status` with Ollama's error body, after `delay`.
fn error(status: u16, message: &str, delay: Duration) -> Reply {
    let mut whole = Whole::json(status, OLLAMA_JSON, errors::ollama_error_body(message));
    whole.delay = delay;
    Reply::new(Flavor::Ollama, Action::Whole(whole))
}

/// A call's `arguments` as Ollama sends them: the scripted value's text
/// when it is a JSON object (compact: one line), else that text as a JSON
/// string, which a client must refuse or decode itself.
pub fn arguments_json(call: &Call) -> String {
    let text = call.arguments_text();
    match serde_json::from_str::<Value>(&text) {
        Ok(object @ Value::Object(_)) => object.to_string(),
        _ => json_str(&text),
    }
}

/// A scripted answer with everything it is rendered from.
#[derive(Debug)]
struct Scripted {
    model: String,
    content: String,
    /// `message.tool_calls` (the JSON array), when there are calls.
    calls: Option<String>,
    /// What a final line has after `done`.
    last: String,
}

impl Scripted {
    fn new(a: &Answer, ids: &[String], model: String, prompt_chars: usize, delay: Duration) -> Self {
        let calls = (!a.tool_calls.is_empty()).then(|| {
            let list: Vec<String> = (0u64..)
                .zip(ids.iter().zip(&a.tool_calls))
                .map(|(i, (id, c))| tool_calls::ollama_call_with(id, &c.name, i, &arguments_json(c)))
                .collect();
            format!("[{}]", list.join(","))
        });
        let done_reason = if a.finish_reason.as_deref() == Some("length") { "length" } else { "stop" };
        let (prompt_tokens, eval_count) = a.counts(prompt_chars);
        let last = final_fields(done_reason, &metrics_json(prompt_tokens, eval_count, delay, Duration::ZERO));
        Self { model, content: a.content.clone().unwrap_or_default(), calls, last }
    }

    /// The `stream: false` answer.
    fn whole(&self, now: Timestamp) -> String {
        line_json(&self.model, now, &message_json(&self.content, "", self.calls.as_deref()), Some(&self.last))
    }

    /// The NDJSON answer: the content in at most three lines, the calls in
    /// one, the final line.
    fn into_stream(self) -> ScriptedStream {
        let mut steps: Vec<(Phase, String, bool)> =
            pieces(&self.content).iter().map(|piece| (Phase::FOLLOW, message_json(piece, "", None), false)).collect();
        if let Some(calls) = &self.calls {
            steps.push((Phase::FOLLOW, message_json("", "", Some(calls)), false));
        }
        steps.push((Phase::Tail, message_json("", "", None), true));
        steps.reverse();
        ScriptedStream { model: self.model, last: self.last, steps }
    }
}

/// A streamed scripted answer: its messages rendered up front, last first,
/// each line stamped when it is written.
#[derive(Debug)]
struct ScriptedStream {
    model: String,
    last: String,
    /// Phase, `message` object and whether it is the final line.
    steps: Vec<(Phase, String, bool)>,
}

impl Script for ScriptedStream {
    fn next_phase(&self) -> Option<Phase> {
        self.steps.last().map(|(phase, _, _)| *phase)
    }

    fn render_next(&mut self, now: Timestamp, frames: &mut Vec<Frame>) {
        if let Some((_, message, done)) = self.steps.pop() {
            frames.push(Frame::Line(line_json(&self.model, now, &message, done.then_some(self.last.as_str()))));
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#[path = "script_ollama_tests.rs"]
mod tests;
