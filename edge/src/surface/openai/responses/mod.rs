//! The Responses API answer of a normalized run: streamed as its typed
//! events ([`stream::ResponsesEncoder`]) or whole as one `response` object
//! ([`object::ResponseAggregate`]).
//!
//! Both drive the same `State`: a run's events become output items in
//! arrival order (a `reasoning` item, a `message` item with `output_text`
//! and `refusal` parts, a `function_call` item per tool call), each step
//! told to a sink (the stream renders it as events; the aggregate ignores
//! it), and both write the `response` object with the same writer
//! (`write_response`), so the whole answer is what a client makes of the
//! stream. Only choice 0 counts.

pub mod normalized;
pub mod object;
pub mod socket;
pub mod stream;

use bytes::{BufMut, BytesMut};
use iop_core::{
    exec::{codes, ExecEvent, FailureSource, Part, RunFailure, TextKind, ToolCallDelta, Usage},
    http::put_decimal,
};

use crate::surface::{
    failures::{node_cancelled, protocol},
    openai::{
        chunk::json_str,
        error::{clip_to, MAX_MESSAGE_BYTES},
    },
};

/// Largest answer kept (the whole output is carried by the last event):
/// as the other aggregates.
const MAX_OUTPUT_BYTES: usize = 64 * 1024 * 1024;

/// The request fields a `response` object echoes (read by the translation).
pub use iop_core::responses::Echo;

/// What the answer says besides the run's events.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ResponseMeta {
    /// `resp_<run id>`.
    pub id: String,
    /// The model to name when the provider's start names none.
    pub model: String,
    /// Unix seconds.
    pub created_at: u64,
    /// The request fields the response echoes.
    pub echo: Echo,
    /// Flattened function names → (namespace, name): `(flat, namespace, name)`.
    pub namespaced: Vec<(String, String, String)>,
}

/// The run id and `_`, escaped for a JSON string: every item and call id
/// is `"<kind><run id>_<n>"` (no allocation per event, one per response).
struct RunIds(Vec<u8>);

impl RunIds {
    fn new(run: &str) -> Self {
        let mut lit = BytesMut::with_capacity(run.len() + 8);
        json_str(&mut lit, run);
        // Without the quotes.
        let mut bytes = lit.get(1..lit.len().saturating_sub(1)).unwrap_or_default().to_vec();
        bytes.push(b'_');
        Self(bytes)
    }

    /// Appends the id `n` of `kind` (`rs_`, `msg_`, `fc_`, `call_`: no
    /// escaping needed) as a JSON string.
    fn write(&self, out: &mut BytesMut, kind: &[u8], n: u64) {
        out.put_slice(b"\"");
        out.put_slice(kind);
        out.put_slice(&self.0);
        put_decimal(out, n);
        out.put_slice(b"\"");
    }
}

/// The meta, rendered once: what every `response` object and event repeats.
pub(super) struct Head {
    id: String,
    /// The model named: the request's, or the provider's start's.
    pub(super) model: String,
    created_at: u64,
    /// `,"instructions":…,"metadata":…`: the echoed request fields.
    echo: Vec<u8>,
    namespaced: Vec<(String, String, String)>,
    ids: RunIds,
}

impl Head {
    pub(super) fn new(meta: ResponseMeta) -> Self {
        let run = meta.id.strip_prefix("resp_").unwrap_or(&meta.id);
        Self {
            echo: echo_json(&meta.echo),
            ids: RunIds::new(run),
            id: meta.id,
            model: meta.model,
            created_at: meta.created_at,
            namespaced: meta.namespaced,
        }
    }

    /// Appends the id of the item at output `index`.
    fn item_id(&self, out: &mut BytesMut, item: &Item, index: usize) {
        let kind: &[u8] = match item {
            Item::Texts { reasoning: true, .. } => b"rs_",
            Item::Texts { .. } => b"msg_",
            Item::Call(_) => b"fc_",
        };
        self.ids.write(out, kind, index as u64);
    }

    /// `(namespace, name)` of a flattened function name.
    fn restore<'a>(&'a self, name: &'a str) -> (Option<&'a str>, &'a str) {
        match self.namespaced.iter().find(|(flat, _, _)| flat == name) {
            Some((_, namespace, original)) => (Some(namespace), original),
            None => (None, name),
        }
    }
}

/// The echoed fields as JSON members, each after a comma. Written into a
/// `Vec` (a `BytesMut` writer costs a reserve per piece serde writes), the
/// defaults of fields the request did not set as constants.
fn echo_json(e: &Echo) -> Vec<u8> {
    let mut out = Vec::with_capacity(320);
    member(&mut out, "instructions", &e.instructions);
    member(&mut out, "max_output_tokens", &e.max_output_tokens);
    member(&mut out, "parallel_tool_calls", &e.parallel_tool_calls);
    member(&mut out, "previous_response_id", &e.previous_response_id);
    // `or_default`: what a request that did not set the field means.
    or_default(&mut out, "reasoning", &e.reasoning, br#"{"effort":null,"summary":null}"#);
    member(&mut out, "store", &e.store);
    member(&mut out, "temperature", &e.temperature);
    or_default(&mut out, "text", &e.text, br#"{"format":{"type":"text"}}"#);
    or_default(&mut out, "tool_choice", &e.tool_choice, br#""auto""#);
    or_default(&mut out, "tools", &e.tools, b"[]");
    member(&mut out, "top_p", &e.top_p);
    member(&mut out, "user", &e.user);
    or_default(&mut out, "metadata", &e.metadata, b"{}");
    out
}

/// Appends `,"<key>":<value>`.
fn member(out: &mut Vec<u8>, key: &str, value: &impl serde::Serialize) {
    member_key(out, key);
    // Writing to a Vec cannot fail; a non-finite float is null.
    let _ = serde_json::to_writer(&mut *out, value);
}

/// Appends `,"<key>":<value>`, `default` when `value` is null.
fn or_default(out: &mut Vec<u8>, key: &str, value: &serde_json::Value, default: &[u8]) {
    if value.is_null() {
        member_key(out, key);
        out.extend_from_slice(default);
    } else {
        member(out, key, value);
    }
}

/// Appends `,"<key>":` (our keys need no escaping).
fn member_key(out: &mut Vec<u8>, key: &str) {
    out.extend_from_slice(b",\"");
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(b"\":");
}

/// What a piece of text is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Text {
    /// `reasoning_text` of a reasoning item.
    Reasoning,
    /// `output_text` of a message.
    Output,
    /// `refusal` of a message.
    Refusal,
}

/// Where an item is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Status {
    InProgress,
    Completed,
    /// Cut by the output limit or a content filter.
    Incomplete,
}

impl Status {
    fn json(self) -> &'static [u8] {
        match self {
            Status::InProgress => b"\"in_progress\"",
            Status::Completed => b"\"completed\"",
            Status::Incomplete => b"\"incomplete\"",
        }
    }
}

/// A function call item.
pub(super) struct Call {
    /// The call's position among the choice's tool calls.
    index: u32,
    /// The provider's id; empty: one is made up from `index`. Fixed by the
    /// first fragment: clients know a call by it.
    call_id: String,
    /// As the provider named it (flattened when namespaced).
    name: String,
    /// The JSON arguments, reassembled from their fragments.
    arguments: String,
    status: Status,
}

/// One output item.
pub(super) enum Item {
    /// A reasoning item (one `reasoning_text` part) or a message (its
    /// `output_text` and `refusal` parts).
    Texts {
        reasoning: bool,
        parts: Vec<(Text, String)>,
        status: Status,
    },
    Call(Box<Call>),
}

impl Item {
    fn status_mut(&mut self) -> &mut Status {
        match self {
            Item::Texts { status, .. } => status,
            Item::Call(c) => &mut c.status,
        }
    }

    /// Its last part, while it has one (a function call has none).
    fn last_part(&self) -> Option<&(Text, String)> {
        match self {
            Item::Texts { parts, .. } => parts.last(),
            Item::Call(_) => None,
        }
    }
}

/// What changed in the output: each is one or a few events of the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step<'a> {
    /// The item at this output index was added (no part yet, no arguments).
    Added(usize),
    /// The item got a new, empty, last part.
    PartAdded(usize),
    /// A piece of the item's last part, or of its arguments.
    Delta(usize, &'a str),
    /// The item's last part ended (a part of another kind follows).
    PartDone(usize),
    /// The item ended (its last part with it).
    Done(usize),
}

/// Pushes `x`, the first one into room for one: most answers are one
/// message of one part, and a stream holds its output while it is open
/// (room for four of each was a fifth of a KiB per open stream).
fn push_first_exact<T>(v: &mut Vec<T>, x: T) {
    if v.capacity() == 0 {
        v.reserve_exact(1);
    }
    v.push(x);
}

/// The output items so far.
#[derive(Default)]
pub(super) struct Output {
    items: Vec<Item>,
    /// The reasoning or message item being written.
    current: Option<usize>,
    /// Tool-call index → its item's output index.
    calls: Vec<(u32, usize)>,
    /// Bytes kept.
    bytes: usize,
}

impl Output {
    pub(super) fn items(&self) -> &[Item] {
        &self.items
    }

    /// Ends the reasoning or message item being written, if any.
    fn close_current(&mut self, status: Status, sink: &mut impl FnMut(&Output, Step<'_>)) {
        if let Some(at) = self.current.take() {
            *self.items[at].status_mut() = status;
            sink(self, Step::Done(at));
        }
    }

    /// A piece of text: onto the item being written when it is of its kind
    /// (a new part when a message turns from text to refusal or back), else
    /// a new item. Empty pieces (servers open with `content: ""`) open none.
    fn text(&mut self, kind: Text, t: &str, sink: &mut impl FnMut(&Output, Step<'_>)) {
        if t.is_empty() {
            return;
        }
        self.bytes += t.len();
        let reasoning = kind == Text::Reasoning;
        let same_item =
            self.current.filter(|at| matches!(self.items[*at], Item::Texts { reasoning: r, .. } if r == reasoning));
        let at = match same_item {
            Some(at) => {
                if self.items[at].last_part().map(|(k, _)| *k) != Some(kind) {
                    sink(self, Step::PartDone(at));
                    self.push_part(at, kind, sink);
                }
                at
            }
            None => {
                self.close_current(Status::Completed, sink);
                let at = self.items.len();
                push_first_exact(
                    &mut self.items,
                    Item::Texts { reasoning, parts: Vec::new(), status: Status::InProgress },
                );
                self.current = Some(at);
                sink(self, Step::Added(at));
                self.push_part(at, kind, sink);
                at
            }
        };
        if let Item::Texts { parts, .. } = &mut self.items[at] {
            if let Some((_, text)) = parts.last_mut() {
                text.push_str(t);
            }
        }
        sink(self, Step::Delta(at, t));
    }

    fn push_part(&mut self, at: usize, kind: Text, sink: &mut impl FnMut(&Output, Step<'_>)) {
        if let Item::Texts { parts, .. } = &mut self.items[at] {
            push_first_exact(parts, (kind, String::new()));
        }
        sink(self, Step::PartAdded(at));
    }

    /// A tool-call fragment onto its call's item (a new item for a new call,
    /// ending the reasoning or message being written). Calls stay open to
    /// the end of the run: a provider may interleave their fragments, and
    /// a call's `done` must carry its whole arguments.
    fn tool_call(&mut self, c: ToolCallDelta, sink: &mut impl FnMut(&Output, Step<'_>)) {
        self.bytes += c.arguments.len() + c.name.len() + c.id.len();
        let known = self.calls.iter().find(|(call, _)| *call == c.index).map(|(_, at)| *at);
        let at = match known {
            Some(at) => {
                // Later fragments carry no name; one that does fills a gap.
                if let Item::Call(call) = &mut self.items[at] {
                    if call.name.is_empty() {
                        call.name = c.name;
                    }
                }
                at
            }
            None => {
                self.close_current(Status::Completed, sink);
                let at = self.items.len();
                let call = Call {
                    index: c.index,
                    call_id: c.id,
                    name: c.name,
                    arguments: String::new(),
                    status: Status::InProgress,
                };
                push_first_exact(&mut self.items, Item::Call(Box::new(call)));
                self.calls.push((c.index, at));
                sink(self, Step::Added(at));
                at
            }
        };
        if c.arguments.is_empty() {
            return;
        }
        if let Item::Call(call) = &mut self.items[at] {
            call.arguments.push_str(&c.arguments);
        }
        sink(self, Step::Delta(at, &c.arguments));
    }

    /// Ends every open item, in output order: `Incomplete` when the output
    /// was `cut` short.
    fn finish(&mut self, cut: bool, sink: &mut impl FnMut(&Output, Step<'_>)) {
        let status = if cut { Status::Incomplete } else { Status::Completed };
        self.current = None;
        for at in 0..self.items.len() {
            let s = self.items[at].status_mut();
            if *s == Status::InProgress {
                *s = status;
                sink(self, Step::Done(at));
            }
        }
    }
}

/// How a run's event left it.
pub(super) enum Outcome {
    /// More to come.
    Going,
    /// Completed: every item is ended.
    Ended,
    /// Failed (or too big to keep).
    Failed(RunFailure),
}

/// A run's answer so far.
#[derive(Default)]
pub(super) struct State {
    /// The model the provider's start named (empty: it named none).
    model: String,
    output: Output,
    /// Choice 0's finish reason.
    finish: Option<String>,
    usage: Option<Usage>,
    /// The run completed.
    completed: bool,
}

impl State {
    pub(super) fn model(&self) -> &str {
        &self.model
    }

    /// Takes one event, telling `sink` each step of the output.
    pub(super) fn apply(&mut self, ev: ExecEvent, sink: &mut impl FnMut(&Output, Step<'_>)) -> Outcome {
        if let Some(f) = self.too_large() {
            return Outcome::Failed(f);
        }
        match ev {
            ExecEvent::Start { model } => {
                if self.model.is_empty() {
                    self.model = model;
                }
            }
            ExecEvent::Delta(d) if d.choice == 0 => match d.part {
                Part::Content(t) => self.output.text(Text::Output, &t, sink),
                Part::Reasoning(t) => self.output.text(Text::Reasoning, &t, sink),
                Part::Refusal(t) => self.output.text(Text::Refusal, &t, sink),
                Part::ToolCall(c) => self.output.tool_call(*c, sink),
            },
            ExecEvent::Delta(_) => {}
            ExecEvent::ChoiceFinish { choice: 0, finish_reason, .. } => self.finish = Some(finish_reason),
            ExecEvent::ChoiceFinish { .. } => {}
            ExecEvent::Embeddings(_) => {
                return Outcome::Failed(protocol("the provider answered a responses request with embeddings"))
            }
            ExecEvent::Complete { finish_reason, usage } => {
                let finish = self.finish.get_or_insert(finish_reason);
                let cut = incomplete_reason(finish).is_some();
                self.usage = usage;
                self.completed = true;
                self.output.finish(cut, sink);
                return Outcome::Ended;
            }
            ExecEvent::Error(f) => return Outcome::Failed(f),
            ExecEvent::Cancelled { reason } => return Outcome::Failed(node_cancelled(&reason)),
        }
        Outcome::Going
    }

    /// [`Self::apply`] of a token of choice 0, read where it arrived.
    pub(super) fn apply_text(&mut self, kind: TextKind, t: &str, sink: &mut impl FnMut(&Output, Step<'_>)) -> Outcome {
        if let Some(f) = self.too_large() {
            return Outcome::Failed(f);
        }
        let kind = match kind {
            TextKind::Content => Text::Output,
            TextKind::Reasoning => Text::Reasoning,
        };
        self.output.text(kind, t, sink);
        Outcome::Going
    }

    /// The failure of a response grown past what one may hold.
    fn too_large(&self) -> Option<RunFailure> {
        (self.output.bytes > MAX_OUTPUT_BYTES).then(|| {
            let msg = format!("the response exceeds {MAX_OUTPUT_BYTES} bytes");
            RunFailure::new(codes::INTERNAL, 502, FailureSource::Edge, msg)
        })
    }

    /// Where the response is: in progress until the run completed, then
    /// told by choice 0's finish reason.
    pub(super) fn status(&self) -> Phase<'static> {
        match (self.completed, self.finish.as_deref().and_then(incomplete_reason)) {
            (false, _) => Phase::InProgress,
            (true, Some(reason)) => Phase::Incomplete(reason),
            (true, None) => Phase::Completed,
        }
    }
}

/// `incomplete_details.reason` told by an OpenAI finish reason.
fn incomplete_reason(finish: &str) -> Option<&'static str> {
    match finish {
        "length" => Some("max_output_tokens"),
        "content_filter" => Some("content_filter"),
        _ => None,
    }
}

/// A response's `status`.
#[derive(Debug, Clone, Copy)]
pub(super) enum Phase<'a> {
    InProgress,
    Completed,
    /// With `incomplete_details.reason`.
    Incomplete(&'static str),
    Failed(&'a RunFailure),
}

impl Phase<'_> {
    /// The terminal event that carries a response in this phase.
    pub(super) fn event(&self) -> &'static [u8] {
        match self {
            Phase::InProgress => b"response.in_progress",
            Phase::Completed => b"response.completed",
            Phase::Incomplete(_) => b"response.incomplete",
            Phase::Failed(_) => b"response.failed",
        }
    }
}

/// The `error.code` of a failed response: one of the codes the Responses
/// API defines (its clients' types list them): the provider's own when it
/// is one, else `rate_limit_exceeded` for a 429 and `server_error`.
fn error_code(f: &RunFailure) -> &str {
    const KNOWN: &[&str] = &["server_error", "rate_limit_exceeded", "invalid_prompt"];
    match f.provider.as_deref().and_then(|p| p.code.as_deref()) {
        Some(code) if KNOWN.contains(&code) => code,
        _ if f.status == 429 => "rate_limit_exceeded",
        _ => "server_error",
    }
}

/// Appends the `response` object: the run's model (else the meta's), its
/// output items and usage, in `phase`.
pub(super) fn write_response(out: &mut BytesMut, head: &Head, state: &State, phase: Phase<'_>) {
    out.reserve(state.output.bytes + 256 * state.output.items.len() + head.echo.len() + 512);
    out.put_slice(b"{\"id\":");
    json_str(out, &head.id);
    out.put_slice(b",\"object\":\"response\",\"created_at\":");
    put_decimal(out, head.created_at);
    out.put_slice(b",\"status\":");
    out.put_slice(match phase {
        Phase::InProgress => b"\"in_progress\"",
        Phase::Completed => b"\"completed\"",
        Phase::Incomplete(_) => b"\"incomplete\"",
        Phase::Failed(_) => b"\"failed\"",
    });
    out.put_slice(b",\"background\":false,\"error\":");
    match phase {
        Phase::Failed(f) => {
            out.put_slice(b"{\"code\":");
            json_str(out, error_code(f));
            out.put_slice(b",\"message\":");
            json_str(out, &clip_to(&f.message, MAX_MESSAGE_BYTES));
            out.put_slice(b"}");
        }
        _ => out.put_slice(b"null"),
    }
    out.put_slice(b",\"incomplete_details\":");
    match phase {
        Phase::Incomplete(reason) => {
            out.put_slice(b"{\"reason\":\"");
            out.put_slice(reason.as_bytes());
            out.put_slice(b"\"}");
        }
        _ => out.put_slice(b"null"),
    }
    out.put_slice(b",\"model\":");
    json_str(out, if state.model.is_empty() { &head.model } else { &state.model });
    out.put_slice(&head.echo);
    out.put_slice(b",\"output\":[");
    // A failed response carries no output (as OpenAI's): the items went out
    // as they came, and the failure cut them.
    let items = if matches!(phase, Phase::Failed(_)) { &[][..] } else { &state.output.items[..] };
    for (at, item) in items.iter().enumerate() {
        if at > 0 {
            out.put_slice(b",");
        }
        write_item(out, head, at, item);
    }
    out.put_slice(b"],\"usage\":");
    match &state.usage {
        Some(u) => usage_json(out, u),
        None => out.put_slice(b"null"),
    }
    out.put_slice(b"}");
}

/// Appends the item at output `index` as it is now.
pub(super) fn write_item(out: &mut BytesMut, head: &Head, index: usize, item: &Item) {
    out.put_slice(b"{\"id\":");
    head.item_id(out, item, index);
    match item {
        // A reasoning item's status is not reported (OpenAI's have none).
        Item::Texts { reasoning: true, parts, .. } => {
            out.put_slice(b",\"type\":\"reasoning\",\"summary\":[],\"content\":[");
            write_parts(out, parts);
            out.put_slice(b"]}");
        }
        Item::Texts { parts, status, .. } => {
            out.put_slice(b",\"type\":\"message\",\"status\":");
            out.put_slice(status.json());
            out.put_slice(b",\"content\":[");
            write_parts(out, parts);
            out.put_slice(b"],\"role\":\"assistant\"}");
        }
        Item::Call(c) => {
            out.put_slice(b",\"type\":\"function_call\",\"status\":");
            out.put_slice(c.status.json());
            out.put_slice(b",\"arguments\":");
            json_str(out, &c.arguments);
            out.put_slice(b",\"call_id\":");
            if c.call_id.is_empty() {
                head.ids.write(out, b"call_", u64::from(c.index));
            } else {
                json_str(out, &c.call_id);
            }
            let (namespace, name) = head.restore(&c.name);
            out.put_slice(b",\"name\":");
            json_str(out, name);
            if let Some(ns) = namespace {
                out.put_slice(b",\"namespace\":");
                json_str(out, ns);
            }
            out.put_slice(b"}");
        }
    }
}

fn write_parts(out: &mut BytesMut, parts: &[(Text, String)]) {
    for (n, (kind, text)) in parts.iter().enumerate() {
        if n > 0 {
            out.put_slice(b",");
        }
        write_part(out, *kind, text);
    }
}

/// Appends a content part holding `text`.
pub(super) fn write_part(out: &mut BytesMut, kind: Text, text: &str) {
    match kind {
        Text::Reasoning => out.put_slice(b"{\"type\":\"reasoning_text\",\"text\":"),
        Text::Output => out.put_slice(b"{\"type\":\"output_text\",\"annotations\":[],\"logprobs\":[],\"text\":"),
        Text::Refusal => out.put_slice(b"{\"type\":\"refusal\",\"refusal\":"),
    }
    json_str(out, text);
    out.put_slice(b"}");
}

/// Appends a Responses `usage` object. Unreported details are 0 (the
/// object requires them); cache writes are never reported by the run.
fn usage_json(out: &mut BytesMut, u: &Usage) {
    out.put_slice(b"{\"input_tokens\":");
    put_decimal(out, u.input_tokens);
    out.put_slice(b",\"input_tokens_details\":{\"cached_tokens\":");
    put_decimal(out, u.cached_input_tokens.unwrap_or(0));
    out.put_slice(b",\"cache_write_tokens\":0},\"output_tokens\":");
    put_decimal(out, u.output_tokens);
    out.put_slice(b",\"output_tokens_details\":{\"reasoning_tokens\":");
    put_decimal(out, u.reasoning_tokens.unwrap_or(0));
    out.put_slice(b"},\"total_tokens\":");
    put_decimal(out, u.input_tokens.saturating_add(u.output_tokens));
    out.put_slice(b"}");
}
