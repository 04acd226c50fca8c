//! `POST /v1/messages` and `POST /v1/messages/count_tokens`: Anthropic's
//! Messages API. One `message` whose content is a `thinking` block (when the
//! request enables thinking), then a `text` block, or one `tool_use` block per
//! tool call. Streamed (`"stream": true`) by [`super::messages_stream`].
//!
//! Both routes count input tokens with [`input_tokens`], so `count_tokens`
//! always agrees with the `usage.input_tokens` of the answer to the same body.

use serde::Deserialize;
use serde_json::Value;

use super::chat::Answer;
use super::json::{json_opt_str, json_str};
use super::messages_stream::MessagesScript;
use super::overrides::{self, content_text, split_words, BadRequest, Knobs, MockOverrides};
use super::reply::{self, Action, Env, Flavor, Reply, Stream, Timing, Whole};
use super::{tool_calls, MockConfig};

/// Thinking tokens of a request that enables thinking when neither the
/// request's `mock.reasoning` nor `--reasoning` says how many.
pub const DEFAULT_THINKING: u64 = 4;

#[derive(Debug, Deserialize)]
struct MessagesRequest {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    messages: Option<Vec<Message>>,
    #[serde(default)]
    system: Option<Value>,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    tools: Option<Vec<Value>>,
    #[serde(default)]
    thinking: Option<Value>,
    #[serde(default)]
    tool_choice: Option<Value>,
    #[serde(default)]
    mock: Option<MockOverrides>,
}

#[derive(Debug, Deserialize)]
struct Message {
    #[serde(default)]
    role: Option<String>,
    #[serde(default)]
    content: Value,
}

/// Everything needed to answer one Messages request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessagesPlan {
    /// `msg_mock_<seq>`.
    pub id: String,
    /// Number of the request (tool-use ids, the thinking signature).
    pub seq: u64,
    /// The request's model, echoed.
    pub model: String,
    /// `"stream": true`.
    pub stream: bool,
    /// `usage.input_tokens` ([`input_tokens`]).
    pub input_tokens: u64,
    /// Thinking tokens (after the `max_tokens` cap); 0: no thinking block.
    pub thinking: u64,
    /// Counted units: text tokens or pieces, or tool-use argument fragments
    /// (after the cap).
    pub content: u64,
    /// The kind of answer.
    pub answer: Answer,
    /// `end_turn`, `max_tokens`, `tool_use` or `refusal`.
    pub stop_reason: &'static str,
    /// The merged knobs.
    pub knobs: Knobs,
}

/// One content block of the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Block {
    /// `thinking`, with a signature.
    Thinking,
    /// `text`.
    Text,
    /// `tool_use` number `i`.
    ToolUse(u64),
}

/// Input tokens of a request: one per four characters of its text (the
/// `system` prompt, every `text` block or string content, and what tool
/// results say), at least one. The one count both routes report.
fn input_tokens(system: Option<&Value>, messages: &[Message]) -> u64 {
    let chars = system.map_or(0, text_chars) + messages.iter().map(|m| text_chars(&m.content)).sum::<usize>();
    overrides::prompt_tokens(chars)
}

/// Characters of text in a string or a list of content blocks (a
/// `tool_result`'s `content` is itself either).
fn text_chars(value: &Value) -> usize {
    match value {
        Value::String(s) => s.chars().count(),
        Value::Array(blocks) => blocks
            .iter()
            .map(|b| {
                let text = b.get("text").and_then(Value::as_str).map_or(0, |t| t.chars().count());
                // serde_json caps nesting (128 levels), so this recursion is bounded.
                text + b.get("content").map_or(0, text_chars)
            })
            .sum(),
        _ => 0,
    }
}

/// Whether `thinking` asks for a thinking block (`enabled`, or `adaptive`
/// as the newer models take it).
fn thinking_on(thinking: Option<&Value>) -> Result<bool, BadRequest> {
    let Some(t) = thinking.filter(|t| !t.is_null()) else { return Ok(false) };
    match t.get("type").and_then(Value::as_str) {
        Some("enabled" | "adaptive") => Ok(true),
        Some("disabled") => Ok(false),
        _ => Err(BadRequest("thinking.type: must be one of 'enabled', 'adaptive', 'disabled'".into())),
    }
}

/// The text of the `tool_result` blocks of `message`, joined, if it has any.
fn tool_results(message: &Message) -> Option<String> {
    let Value::Array(blocks) = &message.content else { return None };
    let said: Vec<String> = blocks
        .iter()
        .filter(|b| b.get("type").and_then(Value::as_str) == Some("tool_result"))
        .map(|b| b.get("content").map(content_text).unwrap_or_default())
        .collect();
    (!said.is_empty()).then(|| said.join("; "))
}

fn parse(body: &[u8]) -> Result<(MessagesRequest, String, Vec<Message>), BadRequest> {
    let mut req: MessagesRequest =
        serde_json::from_slice(body).map_err(|e| BadRequest(format!("invalid request body: {e}")))?;
    let model = req.model.take().filter(|m| !m.is_empty()).ok_or_else(|| BadRequest("model: Field required".into()))?;
    let messages = req.messages.take().ok_or_else(|| BadRequest("messages: Field required".into()))?;
    if messages.is_empty() {
        return Err(BadRequest("messages: at least one message is required".into()));
    }
    Ok((req, model, messages))
}

/// Validates a Messages request and plans the answer.
pub fn plan(body: &[u8], config: &MockConfig, seq: u64) -> Result<MessagesPlan, BadRequest> {
    let (req, model, messages) = parse(body)?;
    let cap = match req.max_tokens {
        None => return Err(BadRequest("max_tokens: Field required".into())),
        Some(0) => return Err(BadRequest("max_tokens: must be at least 1".into())),
        Some(n) => n,
    };
    let thinking_on = thinking_on(req.thinking.as_ref())?;
    // A name the request's `mock` gives wins; else the model calls the
    // first tool it was offered, as a real one would.
    let explicit_name = req.mock.as_ref().and_then(|m| m.tool_name.clone());
    let k = Knobs::resolve(req.mock, config)?;
    let declared = req.tools.as_ref().and_then(|t| t.first()).and_then(|t| t.get("name")).and_then(Value::as_str);
    // A forced `tool_choice` (`any`, or `tool` naming one) is one call, as
    // a model obeying it makes.
    let forced = match req.tool_choice.as_ref().and_then(|c| c.get("type")).and_then(Value::as_str) {
        Some("any") => Some(None),
        Some("tool") => Some(req.tool_choice.as_ref().and_then(|c| c.get("name")).and_then(Value::as_str)),
        _ => None,
    };
    let forced_name = forced.flatten().map(str::to_owned);
    let tool_name =
        explicit_name.or(forced_name).or_else(|| declared.map(str::to_owned)).unwrap_or_else(|| k.tool_name.clone());
    let tool_calls = if k.tool_calls == 0 && forced.is_some() { 1 } else { k.tool_calls };
    let thinking = match (thinking_on, k.reasoning) {
        (false, _) => 0,
        (true, 0) => DEFAULT_THINKING,
        (true, n) => n,
    };
    let last = messages.last();
    let answer = if let Some(said) = last.filter(|m| m.role.as_deref() == Some("user")).and_then(tool_results) {
        Answer::Text(split_words(&tool_calls::echo(&said)))
    } else if tool_calls > 0 {
        Answer::ToolCalls { calls: tool_calls, name: tool_name }
    } else if let Some(text) = &k.refusal {
        Answer::Refusal(split_words(text))
    } else {
        Answer::Tokens
    };
    let (answer, thinking, content, stop_reason) = match answer {
        Answer::ToolCalls { calls, name } => {
            (Answer::ToolCalls { calls, name }, thinking, calls * tool_calls::FRAGMENTS, "tool_use")
        }
        answer => {
            let (units, stop) = match &answer {
                Answer::Text(p) => (p.len() as u64, "end_turn"),
                Answer::Refusal(p) => (p.len() as u64, "refusal"),
                _ => (k.tokens, "end_turn"),
            };
            if thinking.saturating_add(units) > cap {
                let t = thinking.min(cap);
                (truncate(answer, cap - t), t, cap - t, "max_tokens")
            } else {
                (answer, thinking, units, stop)
            }
        }
    };
    Ok(MessagesPlan {
        id: format!("msg_mock_{seq}"),
        seq,
        model,
        stream: req.stream.unwrap_or(false),
        input_tokens: input_tokens(req.system.as_ref(), &messages),
        thinking,
        content,
        answer,
        stop_reason,
        knobs: k,
    })
}

/// Keeps the first `n` pieces of a text or refusal answer.
fn truncate(answer: Answer, n: u64) -> Answer {
    let n = usize::try_from(n).unwrap_or(usize::MAX);
    match answer {
        Answer::Text(mut p) => {
            p.truncate(n);
            Answer::Text(p)
        }
        Answer::Refusal(mut p) => {
            p.truncate(n);
            Answer::Refusal(p)
        }
        other => other,
    }
}

impl MessagesPlan {
    /// `usage.output_tokens`: thinking and content units.
    pub fn output_tokens(&self) -> u64 {
        self.thinking + self.content
    }

    /// Content blocks of the answer.
    pub fn blocks(&self) -> u64 {
        let said = match self.answer {
            Answer::ToolCalls { calls, .. } => calls,
            _ => u64::from(self.content > 0),
        };
        u64::from(self.thinking > 0) + said
    }

    /// Content block `b` (`b < blocks()`).
    pub fn block(&self, b: u64) -> Block {
        let first = u64::from(self.thinking > 0);
        if b < first {
            return Block::Thinking;
        }
        match self.answer {
            Answer::ToolCalls { .. } => Block::ToolUse(b - first),
            _ => Block::Text,
        }
    }

    /// Deltas of `block` in a stream.
    pub fn deltas(&self, block: Block) -> u64 {
        match block {
            Block::Thinking => self.thinking,
            Block::Text => self.content,
            Block::ToolUse(_) => tool_calls::FRAGMENTS,
        }
    }

    /// Text of thinking token `i`.
    pub fn thinking_token(&self, i: u64) -> String {
        overrides::reasoning_token(0, i)
    }

    /// Text of text unit `i`.
    pub fn text_piece(&self, i: u64) -> String {
        let at = |pieces: &[String]| usize::try_from(i).ok().and_then(|i| pieces.get(i)).cloned().unwrap_or_default();
        match &self.answer {
            Answer::Text(pieces) | Answer::Refusal(pieces) => at(pieces),
            Answer::Tokens | Answer::ToolCalls { .. } => overrides::content_token(0, i, self.knobs.token_bytes),
        }
    }

    /// The thinking block's signature: `sig-` and the first 16 hex digits
    /// of the thinking text's SHA-256, so the same thinking is signed the
    /// same on every run (a client replays it byte for byte).
    pub fn signature(&self) -> String {
        let text: String = (0..self.thinking).map(|i| self.thinking_token(i)).collect();
        let digest = super::json::sha256(text.as_bytes());
        format!("sig-{}", &super::json::hex(&digest)[..16])
    }

    /// The tool-use function name and the id of tool use `i`.
    pub fn tool_use(&self, i: u64) -> (&str, String) {
        let name = match &self.answer {
            Answer::ToolCalls { name, .. } => name.as_str(),
            _ => "",
        };
        (name, tool_calls::tool_use_id(self.seq, i))
    }

    /// The whole content block `b`.
    fn whole_block(&self, b: u64) -> String {
        match self.block(b) {
            Block::Thinking => {
                let text: String = (0..self.thinking).map(|i| self.thinking_token(i)).collect();
                format!(
                    "{{\"type\":\"thinking\",\"thinking\":{},\"signature\":{}}}",
                    json_str(&text),
                    json_str(&self.signature())
                )
            }
            Block::Text => {
                let text: String = (0..self.content).map(|i| self.text_piece(i)).collect();
                format!("{{\"type\":\"text\",\"text\":{}}}", json_str(&text))
            }
            Block::ToolUse(i) => {
                let (name, id) = self.tool_use(i);
                tool_calls::anthropic_tool_use(&id, name, &tool_calls::arguments(i))
            }
        }
    }

    /// The `usage` object.
    pub fn usage(&self, output_tokens: u64) -> String {
        format!(
            "{{\"input_tokens\":{},\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":0,\"output_tokens\":{output_tokens}}}",
            self.input_tokens
        )
    }

    /// The `message` object with `content` (a JSON array), as the whole
    /// answer has it and as `message_start` does (empty, no stop reason).
    pub fn message(&self, content: &str, stop_reason: Option<&str>, output_tokens: u64) -> String {
        format!(
            "{{\"id\":{},\"type\":\"message\",\"role\":\"assistant\",\"model\":{},\"content\":{content},\
             \"stop_reason\":{},\"stop_sequence\":null,\"usage\":{}}}",
            json_str(&self.id),
            json_str(&self.model),
            json_opt_str(stop_reason),
            self.usage(output_tokens)
        )
    }

    /// The whole non-streamed answer.
    pub fn body(&self) -> String {
        let blocks: Vec<String> = (0..self.blocks()).map(|b| self.whole_block(b)).collect();
        self.message(&format!("[{}]", blocks.join(",")), Some(self.stop_reason), self.output_tokens())
    }
}

/// `POST /v1/messages`.
pub fn reply(body: &[u8], env: &Env<'_>) -> Reply {
    let plan = match plan(body, env.config, env.seq) {
        Ok(plan) => plan,
        Err(e) => return reply::bad_request(Flavor::Anthropic, &e),
    };
    let k = &plan.knobs;
    let tag = k.tag.clone();
    if let Some(early) = reply::early_reply(Flavor::Anthropic, k.hangup, k.error_status, &plan.model) {
        return early.tagged(tag);
    }
    let action = if plan.stream {
        Action::Stream(Stream {
            content_type: "text/event-stream",
            headers: vec![("cache-control", "no-cache".to_owned())],
            eager_head: true,
            timing: Timing {
                ttft: k.ttft,
                interval: k.interval,
                abort_after: k.abort_after,
                stall_after: k.stall_after,
                hold_open: k.hold_open,
                burst: k.burst,
            },
            script: Box::new(MessagesScript::new(plan)),
        })
    } else {
        let mut whole = Whole::json(200, "application/json", plan.body());
        whole.delay = k.whole_delay(plan.output_tokens());
        whole.abort = k.abort_after.is_some_and(|n| n <= plan.content);
        Action::Whole(whole)
    };
    Reply::new(Flavor::Anthropic, action).tagged(tag)
}

/// `POST /v1/messages/count_tokens`: `{"input_tokens": N}`, N as the
/// Messages answer to the same body reports it.
pub fn count_tokens_reply(body: &[u8], env: &Env<'_>) -> Reply {
    let counted = parse(body).and_then(|(req, model, messages)| {
        let k = Knobs::resolve(req.mock, env.config)?;
        Ok((input_tokens(req.system.as_ref(), &messages), model, k))
    });
    let (n, model, k) = match counted {
        Ok(counted) => counted,
        Err(e) => return reply::bad_request(Flavor::Anthropic, &e),
    };
    if let Some(early) = reply::early_reply(Flavor::Anthropic, k.hangup, k.error_status, &model) {
        return early.tagged(k.tag);
    }
    let whole = Whole::json(200, "application/json", format!("{{\"input_tokens\":{n}}}"));
    Reply::new(Flavor::Anthropic, Action::Whole(whole)).tagged(k.tag)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::mockprov::clock::Timestamp;
    use serde_json::json;

    fn plan_of(body: &str) -> MessagesPlan {
        plan(body.as_bytes(), &MockConfig::for_tests(), 5).unwrap()
    }

    fn body_of(body: &str) -> Value {
        serde_json::from_str(&plan_of(body).body()).unwrap()
    }

    #[test]
    fn a_plain_answer_is_an_anthropic_message() {
        let v = body_of(
            r#"{"model":"claude-x","max_tokens":100,"system":"be brief","messages":[{"role":"user","content":"12345678"}],
                "mock":{"tokens":2}}"#,
        );
        assert_eq!(
            v,
            json!({"id":"msg_mock_5","type":"message","role":"assistant","model":"claude-x",
                "content":[{"type":"text","text":"tok0 tok1 "}],"stop_reason":"end_turn","stop_sequence":null,
                "usage":{"input_tokens":4,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":2}})
        );
    }

    #[test]
    fn thinking_comes_first_with_a_signature_and_max_tokens_caps_it_then_the_text() {
        let on = r#""thinking":{"type":"enabled","budget_tokens":1024}"#;
        let v = body_of(&format!(
            r#"{{"model":"m","max_tokens":100,{on},"messages":[{{"role":"user","content":"x"}}],"mock":{{"tokens":2}}}}"#
        ));
        assert_eq!(
            v["content"],
            json!([{"type":"thinking","thinking":"think0 think1 think2 think3 ","signature":"sig-21e51e89ff935043"},
                   {"type":"text","text":"tok0 tok1 "}])
        );
        assert_eq!(v["usage"]["output_tokens"], 6);
        let p = plan_of(&format!(
            r#"{{"model":"m","max_tokens":3,{on},"messages":[{{"role":"user","content":"x"}}],"mock":{{"reasoning":2}}}}"#
        ));
        assert_eq!((p.thinking, p.content, p.stop_reason, p.blocks()), (2, 1, "max_tokens", 2));
        let p = plan_of(&format!(
            r#"{{"model":"m","max_tokens":1,{on},"messages":[{{"role":"user","content":"x"}}],"mock":{{"reasoning":2}}}}"#
        ));
        assert_eq!((p.thinking, p.content, p.blocks()), (1, 0, 1), "no text block when the cap ends the thinking");
        let off = plan_of(
            r#"{"model":"m","max_tokens":9,"thinking":{"type":"disabled"},"messages":[{"role":"user","content":"x"}],"mock":{"reasoning":3}}"#,
        );
        assert_eq!(off.thinking, 0);
    }

    #[test]
    fn a_forced_tool_choice_is_one_call() {
        let tools =
            r#""tools":[{"name":"lookup","input_schema":{"type":"object"}},{"name":"other","input_schema":{}}]"#;
        for (choice, name) in [(r#"{"type":"any"}"#, "lookup"), (r#"{"type":"tool","name":"other"}"#, "other")] {
            let v = body_of(&format!(
                r#"{{"model":"m","max_tokens":5,{tools},"tool_choice":{choice},"messages":[{{"role":"user","content":"x"}}]}}"#
            ));
            assert_eq!(v["stop_reason"], "tool_use", "{choice}");
            let names: Vec<&str> =
                v["content"].as_array().unwrap().iter().map(|b| b["name"].as_str().unwrap()).collect();
            assert_eq!(names, [name], "{choice}");
        }
    }

    #[test]
    fn tool_use_names_the_first_declared_tool_and_a_result_gets_text() {
        let tools =
            r#""tools":[{"name":"lookup","input_schema":{"type":"object"}},{"name":"other","input_schema":{}}]"#;
        let v = body_of(&format!(
            r#"{{"model":"m","max_tokens":5,{tools},"messages":[{{"role":"user","content":"x"}}],"mock":{{"tool_calls":2}}}}"#
        ));
        assert_eq!(v["stop_reason"], "tool_use");
        assert_eq!(
            v["content"],
            json!([{"type":"tool_use","id":"toolu_mock_5_0","name":"lookup","input":{"city":"Paris","n":0}},
                   {"type":"tool_use","id":"toolu_mock_5_1","name":"lookup","input":{"city":"Paris","n":1}}])
        );
        assert_eq!(v["usage"]["output_tokens"], 18, "tool calls are not capped");
        let v = body_of(&format!(
            r#"{{"model":"m","max_tokens":5,{tools},"messages":[{{"role":"user","content":"x"}}],"mock":{{"tool_calls":1,"tool_name":"f"}}}}"#
        ));
        assert_eq!(v["content"][0]["name"], "f", "the request's mock.tool_name wins");
        let v = body_of(
            r#"{"model":"m","max_tokens":50,"messages":[{"role":"user","content":"x"},
                {"role":"assistant","content":[{"type":"tool_use","id":"toolu_mock_1_0","name":"f","input":{}}]},
                {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_mock_1_0","content":"11 C"}]}],
                "mock":{"tool_calls":1}}"#,
        );
        assert_eq!(
            (&v["content"], &v["stop_reason"]),
            (&json!([{"type":"text","text":"tool said: 11 C"}]), &json!("end_turn"))
        );
        let v = body_of(
            r#"{"model":"m","max_tokens":50,"messages":[{"role":"user","content":"x"}],"mock":{"refusal":"No."}}"#,
        );
        assert_eq!((&v["content"][0]["text"], &v["stop_reason"]), (&json!("No."), &json!("refusal")));
    }

    #[test]
    fn input_tokens_count_system_text_blocks_and_tool_results() {
        let p = plan_of(
            r#"{"model":"m","max_tokens":1,"system":[{"type":"text","text":"abcd"}],"messages":[
                {"role":"user","content":[{"type":"text","text":"efgh"},{"type":"image","source":{}}]},
                {"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"ijklmnop"}]}]}]}"#,
        );
        assert_eq!(p.input_tokens, 4);
        assert_eq!(
            plan_of(r#"{"model":"m","max_tokens":1,"messages":[{"role":"user","content":""}]}"#).input_tokens,
            1
        );
    }

    #[test]
    fn rejects_bad_requests_in_anthropic_shape() {
        for bad in [
            &b"not json"[..],
            br#"{"max_tokens":1,"messages":[{"role":"user","content":"x"}]}"#,
            br#"{"model":"m","messages":[{"role":"user","content":"x"}]}"#,
            br#"{"model":"m","max_tokens":0,"messages":[{"role":"user","content":"x"}]}"#,
            br#"{"model":"m","max_tokens":1,"messages":[]}"#,
            br#"{"model":"m","max_tokens":1}"#,
            br#"{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],"thinking":{"type":"on"}}"#,
            br#"{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],"mock":{"bogus":1}}"#,
        ] {
            assert!(plan(bad, &MockConfig::for_tests(), 1).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        let config = MockConfig::for_tests();
        let env = Env { config: &config, seq: 1, now: Timestamp::from_secs(0) };
        let Reply { action: Action::Whole(w), flavor, .. } = reply(b"{}", &env) else { panic!() };
        assert_eq!((w.status, flavor), (400, Flavor::Anthropic));
        let v: Value = serde_json::from_str(&w.body).unwrap();
        assert_eq!((&v["type"], &v["error"]["type"]), (&json!("error"), &json!("invalid_request_error")));
    }

    #[test]
    fn count_tokens_agrees_with_the_answer_and_errors_are_anthropic_shaped() {
        let config = MockConfig::for_tests();
        let env = Env { config: &config, seq: 1, now: Timestamp::from_secs(0) };
        let body = r#"{"model":"m","system":"0123456789","messages":[{"role":"user","content":"0123456789"}]}"#;
        let Reply { action: Action::Whole(w), .. } = count_tokens_reply(body.as_bytes(), &env) else { panic!() };
        assert_eq!((w.status, w.body.as_str()), (200, r#"{"input_tokens":5}"#));
        let with_cap = body.replacen('{', r#"{"max_tokens":3,"#, 1);
        assert_eq!(plan_of(&with_cap).input_tokens, 5);

        let failing =
            r#"{"model":"m","max_tokens":3,"messages":[{"role":"user","content":"x"}],"mock":{"error_status":529}}"#;
        let Reply { action: Action::Whole(w), .. } = reply(failing.as_bytes(), &env) else { panic!() };
        assert_eq!((w.status, w.headers.clone()), (529, vec![("retry-after", "7".to_owned())]));
        let v: Value = serde_json::from_str(&w.body).unwrap();
        assert_eq!(v, json!({"type":"error","error":{"type":"overloaded_error","message":"mock provider error"}}));
        let Reply { action: Action::Whole(w), .. } = count_tokens_reply(failing.as_bytes(), &env) else { panic!() };
        assert_eq!(w.status, 529);
    }
}
