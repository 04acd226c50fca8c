//! Scripted chat answers (`--script PATH`), for tests of the edge's staged
//! coordinator. A chat request whose messages hold `[script:NAME]` gets the
//! next answer of that script's stage instead of a generated one; the stage
//! is the request's `response_format.json_schema.name` (`iop_plan`: plan,
//! `iop_review`: review, anything else: work). Every (script, stage) pair
//! has its own cursor, and a stage that runs out answers a 500, so a test
//! that asks more than it scripted fails loudly.
//!
//! This module renders the answers as OpenAI chat completions
//! (`/v1/chat/completions`); [`super::script_ollama`] renders the same
//! scripts, cursors and answers on Ollama's `/api/chat`, where the stage
//! comes from the `format` schema ([`Stage::of_ollama`]).
//!
//! File: `{"scripts": {"NAME": {"plan": [ANSWER], "work": [..], "review": [..]}}}`;
//! an ANSWER has any of `content`, `tool_calls` (`[{"name", "arguments"}]`,
//! an object serialized, a string sent as is), `finish_reason`, `error`
//! (`{"status", "message"}`), `delay_ms` and `usage`. Unknown keys are
//! refused when the file is read, as `mock` overrides are.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use super::chat::{self, Plan, StreamOptions};
use super::chat_body::usage_json;
use super::chat_stream::Chunks;
use super::clock::Timestamp;
use super::errors;
use super::json::json_str;
use super::overrides::{content_chars, content_text, prompt_tokens, valid_error_status};
use super::reply::{Action, Env, Flavor, Frame, Phase, Reply, Script, Stream, Timing, Whole};
use super::reply::{SERVICE_TIER, SYSTEM_FINGERPRINT};
use super::tool_calls;

/// What a request's messages hold to be scripted: `[script:NAME]`.
pub const MARKER: &str = "[script:";

/// Most content (or argument) deltas one streamed piece of text is cut into.
const MAX_DELTAS: usize = 3;

/// The stage of the coordinator a chat request belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// `response_format.json_schema.name == "iop_plan"`.
    Plan,
    /// Anything else (the tool-calling conversation).
    Work,
    /// `response_format.json_schema.name == "iop_review"`.
    Review,
}

impl Stage {
    /// The stage of a request with this `response_format`.
    pub fn of(response_format: Option<&Value>) -> Self {
        match response_format.and_then(|rf| rf["json_schema"]["name"].as_str()) {
            Some("iop_plan") => Self::Plan,
            Some("iop_review") => Self::Review,
            _ => Self::Work,
        }
    }

    /// The stage of an Ollama `/api/chat` request, which carries the
    /// schema without its name (`format: <schema>`): plan when `format`'s
    /// `properties` has `plan`, review when it has `verdict`; else the
    /// OpenAI names of a `response_format` sent beside it ([`Stage::of`]).
    pub fn of_ollama(format: Option<&Value>, response_format: Option<&Value>) -> Self {
        let properties = format.and_then(|f| f.get("properties")).and_then(Value::as_object);
        match properties {
            Some(p) if p.contains_key("plan") => Self::Plan,
            Some(p) if p.contains_key("verdict") => Self::Review,
            _ => Self::of(response_format),
        }
    }

    /// Its key in the script file.
    pub fn name(self) -> &'static str {
        match self {
            Self::Plan => "plan",
            Self::Work => "work",
            Self::Review => "review",
        }
    }

    fn index(self) -> usize {
        match self {
            Self::Plan => 0,
            Self::Work => 1,
            Self::Review => 2,
        }
    }
}

/// One scripted answer.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Answer {
    /// The assistant content.
    #[serde(default)]
    pub content: Option<String>,
    /// Tool calls, after the content.
    #[serde(default)]
    pub tool_calls: Vec<Call>,
    /// Default `stop`, or `tool_calls` when there are tool calls.
    #[serde(default)]
    pub finish_reason: Option<String>,
    /// Answer with this error instead.
    #[serde(default)]
    pub error: Option<ScriptedError>,
    /// Wait this long before answering (nothing is sent meanwhile).
    #[serde(default)]
    pub delay_ms: u64,
    /// Reported usage.
    #[serde(default)]
    pub usage: Option<Usage>,
}

/// A scripted tool call.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Call {
    /// Function name.
    pub name: String,
    /// A JSON value serialized as the arguments, or a string sent as is (so
    /// tests can send malformed arguments); none: `{}`.
    #[serde(default)]
    pub arguments: Option<Value>,
}

impl Answer {
    /// `(prompt tokens, completion tokens)` of this answer to messages of
    /// `prompt_chars` characters: as scripted, else as generated answers
    /// count them, a token per four characters (of the content and the
    /// arguments' text).
    pub fn counts(&self, prompt_chars: usize) -> (u64, u64) {
        let out_chars = self.content.as_deref().map_or(0, |c| c.chars().count())
            + self.tool_calls.iter().map(|c| c.arguments_text().chars().count()).sum::<usize>();
        let usage = self.usage.unwrap_or_default();
        (
            usage.prompt_tokens.unwrap_or_else(|| prompt_tokens(prompt_chars)),
            usage.completion_tokens.unwrap_or_else(|| prompt_tokens(out_chars)),
        )
    }
}

impl Call {
    /// The `arguments` text as sent.
    pub fn arguments_text(&self) -> String {
        match &self.arguments {
            None => "{}".to_owned(),
            Some(Value::String(raw)) => raw.clone(),
            Some(v) => v.to_string(),
        }
    }
}

/// A scripted error answer (OpenAI-shaped).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedError {
    /// HTTP status, 400..=599.
    pub status: u16,
    /// `error.message`.
    #[serde(default = "default_error_message")]
    pub message: String,
}

fn default_error_message() -> String {
    errors::MOCK_ERROR_MESSAGE.to_owned()
}

/// Scripted usage; a missing count is computed as for generated answers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Usage {
    /// `usage.prompt_tokens`.
    #[serde(default)]
    pub prompt_tokens: Option<u64>,
    /// `usage.completion_tokens`.
    #[serde(default)]
    pub completion_tokens: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptFile {
    scripts: HashMap<String, StageLists>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct StageLists {
    #[serde(default)]
    plan: Vec<Answer>,
    #[serde(default)]
    work: Vec<Answer>,
    #[serde(default)]
    review: Vec<Answer>,
}

/// One script: its answers and cursors, indexed by [`Stage::index`].
#[derive(Debug)]
struct Loaded {
    answers: [Vec<Answer>; 3],
    cursors: [AtomicUsize; 3],
}

/// A (script, stage) pair that has given all its answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exhausted;

/// A script file that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("script file {path}: {problem}")]
pub struct ScriptError {
    /// The file as given.
    pub path: String,
    /// What is wrong with it.
    pub problem: String,
}

/// The scripts of one server. Cursors are atomics, so one set can serve
/// any number of threads.
#[derive(Debug)]
pub struct Scripts {
    scripts: HashMap<String, Loaded>,
    /// Tool-call ids are `call_<n>` over the whole server, so they stay
    /// unique along a conversation.
    calls: AtomicU64,
}

impl Scripts {
    /// Reads and checks `path`.
    pub fn load(path: &Path) -> Result<Self, ScriptError> {
        let fail = |problem: String| ScriptError { path: path.display().to_string(), problem };
        let text = std::fs::read_to_string(path).map_err(|e| fail(format!("cannot read it: {e}")))?;
        Self::parse(&text).map_err(fail)
    }

    /// Parses and checks a script file's text.
    pub fn parse(text: &str) -> Result<Self, String> {
        let file: ScriptFile = serde_json::from_str(text).map_err(|e| format!("not a script file: {e}"))?;
        let mut scripts = HashMap::with_capacity(file.scripts.len());
        for (name, lists) in file.scripts {
            // A name with `]` (or none) could never be named by a marker.
            if name.is_empty() || name.contains(']') {
                return Err(format!("script name {} cannot be written as a marker", json_str(&name)));
            }
            let answers = [lists.plan, lists.work, lists.review];
            for (stage, list) in [Stage::Plan, Stage::Work, Stage::Review].iter().zip(&answers) {
                for (i, a) in list.iter().enumerate() {
                    check(a).map_err(|p| format!("script {} {}[{i}]: {p}", json_str(&name), stage.name()))?;
                }
            }
            scripts.insert(name, Loaded { answers, cursors: Default::default() });
        }
        Ok(Self { scripts, calls: AtomicU64::new(0) })
    }

    /// The next answer of `name`'s `stage`; `None` when there is no such script.
    pub fn next(&self, name: &str, stage: Stage) -> Option<Result<&Answer, Exhausted>> {
        let s = self.scripts.get(name)?;
        let n = s.cursors[stage.index()].fetch_add(1, Ordering::Relaxed);
        Some(s.answers[stage.index()].get(n).ok_or(Exhausted))
    }

    /// `count` fresh tool-call ids.
    pub(super) fn call_ids(&self, count: usize) -> Vec<String> {
        let first = self.calls.fetch_add(count as u64, Ordering::Relaxed) + 1;
        (first..).take(count).map(|n| format!("call_{n}")).collect()
    }
}

/// What makes an answer unusable.
fn check(a: &Answer) -> Result<(), String> {
    if let Some(e) = &a.error {
        if !valid_error_status(e.status) {
            return Err(format!("error.status {} is not in 400..=599", e.status));
        }
    }
    if a.tool_calls.iter().any(|c| c.name.is_empty()) {
        return Err("a tool call has no name".to_owned());
    }
    if a.finish_reason.as_deref() == Some("") {
        return Err("finish_reason is empty".to_owned());
    }
    Ok(())
}

/// The script named by the first marker in `text`.
pub fn marker(text: &str) -> Option<&str> {
    text.match_indices(MARKER).find_map(|(at, _)| {
        let rest = text.get(at + MARKER.len()..)?;
        rest.split_once(']').map(|(name, _)| name).filter(|n| !n.is_empty())
    })
}

/// The fields of a chat request a scripted answer reads.
#[derive(Debug, Deserialize)]
struct ScriptedRequest {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    messages: Vec<Message>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    response_format: Option<Value>,
}

/// A request message, as far as scripting reads it (OpenAI's and Ollama's).
#[derive(Debug, Deserialize)]
pub(super) struct Message {
    #[serde(default)]
    pub(super) content: Value,
}

/// The next answer of the script the first marker in `messages` names, at
/// `stage`: `None` when they are not scripted (no marker, or a marker naming
/// no script); `Err` with the message of the 500 when that stage is exhausted.
pub(super) fn pick<'a>(scripts: &'a Scripts, messages: &[Message], stage: Stage) -> Option<Result<&'a Answer, String>> {
    let name = messages.iter().find_map(|m| marker(&content_text(&m.content)).map(str::to_owned))?;
    match scripts.next(&name, stage)? {
        Ok(answer) => Some(Ok(answer)),
        Err(Exhausted) => {
            tracing::warn!(script = %name, stage = stage.name(), "script stage exhausted");
            Some(Err(format!("script {name} stage {} exhausted", stage.name())))
        }
    }
}

/// Characters of the messages' text (the prompt a generated answer counts).
pub(super) fn prompt_chars(messages: &[Message]) -> usize {
    messages.iter().map(|m| content_chars(&m.content)).sum()
}

/// The scripted reply to a chat request, or `None` when it is not scripted
/// (no marker, or a marker naming no script). A body that does not parse is
/// not scripted either: the chat endpoint answers it its 400.
pub fn reply(scripts: &Scripts, body: &[u8], env: &Env<'_>) -> Option<Reply> {
    let req: ScriptedRequest = serde_json::from_slice(body).ok()?;
    let stage = Stage::of(req.response_format.as_ref());
    let answer = match pick(scripts, &req.messages, stage)? {
        Ok(answer) => answer,
        Err(message) => {
            let body = errors::error_body(&message, "server_error", &json_str("script_exhausted"));
            return Some(Reply::new(Flavor::OpenAi, Action::Whole(Whole::json(500, "application/json", body))));
        }
    };
    let delay = Duration::from_millis(answer.delay_ms);
    if let Some(e) = &answer.error {
        let (kind, code) = errors::error_kind(e.status);
        let mut whole =
            Whole::json(e.status, "application/json", errors::error_body(&e.message, kind, &json_str(code)));
        whole.delay = delay;
        return Some(Reply::new(Flavor::OpenAi, Action::Whole(whole)));
    }
    let counts = answer.counts(prompt_chars(&req.messages));
    let scripted = Scripted::new(answer, scripts.call_ids(answer.tool_calls.len()), &req, counts, env);
    let action = if req.stream.unwrap_or(false) {
        Action::Stream(Stream {
            content_type: "text/event-stream",
            headers: vec![("cache-control", "no-cache".to_owned())],
            // Nothing before the delay: a scripted delay is a silent upstream.
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
        let mut whole = Whole::json(200, "application/json", scripted.completion_body());
        whole.delay = delay;
        Action::Whole(whole)
    };
    Some(Reply::new(Flavor::OpenAi, action))
}

/// A scripted answer with everything it is rendered from.
#[derive(Debug)]
struct Scripted {
    /// Carries what the shared chunk shapes read: id, created, model,
    /// `include_usage` and the usage counts.
    frame: Plan,
    content: Option<String>,
    /// Id, name and arguments text of every call.
    calls: Vec<(String, String, String)>,
    finish_reason: String,
}

impl Scripted {
    fn new(a: &Answer, ids: Vec<String>, req: &ScriptedRequest, counts: (u64, u64), env: &Env<'_>) -> Self {
        let calls: Vec<(String, String, String)> =
            ids.into_iter().zip(&a.tool_calls).map(|(id, c)| (id, c.name.clone(), c.arguments_text())).collect();
        let finish_reason =
            a.finish_reason.clone().unwrap_or_else(|| if calls.is_empty() { "stop" } else { "tool_calls" }.to_owned());
        let frame = Plan {
            id: format!("chatcmpl-mock-{}", env.seq),
            seq: env.seq,
            model: req.model.clone().filter(|m| !m.is_empty()).unwrap_or_else(|| env.config.model.clone()),
            created: env.now.secs,
            stream: req.stream.unwrap_or(false),
            include_usage: req.stream_options.as_ref().and_then(|s| s.include_usage).unwrap_or(false),
            prompt_tokens: counts.0,
            reasoning: 0,
            content: counts.1,
            finish_reason: "stop",
            stop_reason: None,
            answer: chat::Answer::Tokens,
            choices: 1,
            logprobs: None,
            ttft: Duration::ZERO,
            interval: Duration::ZERO,
            abort_after: None,
            stall_after: None,
            hold_open: false,
            burst: 1,
            error_status: None,
            token_bytes: 0,
            hangup: false,
            tag: None,
        };
        Self { frame, content: a.content.clone(), calls, finish_reason }
    }

    /// `message.content`: the text, else `null` beside tool calls, else `""`.
    fn content_json(&self) -> String {
        match (&self.content, self.calls.is_empty()) {
            (Some(text), _) => json_str(text),
            (None, false) => "null".to_owned(),
            (None, true) => "\"\"".to_owned(),
        }
    }

    /// The whole `chat.completion` body, shaped as generated ones are.
    fn completion_body(&self) -> String {
        let p = &self.frame;
        let calls = if self.calls.is_empty() {
            String::new()
        } else {
            let list: Vec<String> =
                self.calls.iter().map(|(id, name, args)| tool_calls::openai_call_with(id, name, args)).collect();
            format!(",\"tool_calls\":[{}]", list.join(","))
        };
        format!(
            "{{\"id\":{},\"object\":\"chat.completion\",\"created\":{},\"model\":{},\"choices\":[{{\"index\":0,\
             \"message\":{{\"role\":\"assistant\",\"content\":{},\"refusal\":null{calls},\"annotations\":[]}},\
             \"logprobs\":null,\"finish_reason\":{}}}],\"usage\":{},\"service_tier\":{},\"system_fingerprint\":{}}}",
            json_str(&p.id),
            p.created,
            json_str(&p.model),
            self.content_json(),
            json_str(&self.finish_reason),
            usage_json(p),
            json_str(SERVICE_TIER),
            json_str(SYSTEM_FINGERPRINT)
        )
    }

    /// The SSE answer: the role chunk, the content in a few deltas, each
    /// call as a head delta and a few argument deltas, then the finish
    /// chunk, the usage chunk when asked for, and `[DONE]`.
    fn into_stream(self) -> ScriptedStream {
        let c = Chunks::new(&self.frame);
        let mut steps = Vec::new();
        let role = if self.content.is_none() && !self.calls.is_empty() {
            chat::Answer::ToolCalls { calls: 0, name: String::new() }
        } else {
            chat::Answer::Tokens
        };
        steps.push((Phase::FOLLOW, vec![Frame::Data(c.role(0, &role))]));
        for piece in pieces(self.content.as_deref().unwrap_or_default()) {
            steps.push((Phase::FOLLOW, vec![Frame::Data(c.content(0, &piece, None))]));
        }
        for (i, (id, name, args)) in (0u64..).zip(&self.calls) {
            steps.push((Phase::FOLLOW, vec![Frame::Data(c.tool_call(0, &tool_calls::openai_head_delta(id, name, i)))]));
            for piece in pieces(args) {
                let delta = tool_calls::openai_fragment_delta(i, &piece);
                steps.push((Phase::FOLLOW, vec![Frame::Data(c.tool_call(0, &delta))]));
            }
        }
        let mut tail = vec![Frame::Data(c.finish(0, &self.finish_reason, None))];
        if self.frame.include_usage {
            tail.push(Frame::Data(c.usage(&self.frame)));
        }
        tail.push(Frame::Done);
        steps.push((Phase::Tail, tail));
        steps.reverse();
        ScriptedStream { steps }
    }
}

/// `text` in at most [`MAX_DELTAS`] pieces of about equal length, cut at
/// character boundaries, so a client has to join deltas as with real servers.
pub(super) fn pieces(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    if chars.is_empty() {
        return Vec::new();
    }
    chars.chunks(chars.len().div_ceil(MAX_DELTAS)).map(|c| c.iter().collect()).collect()
}

/// A streamed scripted answer. Its few steps are rendered up front (they
/// carry no time stamps), last step first, so each is popped in order.
#[derive(Debug)]
struct ScriptedStream {
    steps: Vec<(Phase, Vec<Frame>)>,
}

impl Script for ScriptedStream {
    fn next_phase(&self) -> Option<Phase> {
        self.steps.last().map(|(phase, _)| *phase)
    }

    fn render_next(&mut self, _now: Timestamp, frames: &mut Vec<Frame>) {
        if let Some((_, step)) = self.steps.pop() {
            frames.extend(step);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#[path = "script_tests.rs"]
mod tests;
