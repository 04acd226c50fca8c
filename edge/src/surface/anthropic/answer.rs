//! What the streamed and the whole Messages answer share: the stop reason
//! told by an OpenAI finish reason, the usage object, and the ids made up
//! for tool calls the provider left unnamed.

use bytes::{BufMut, BytesMut};
use iop_core::{exec::Usage, http::put_decimal};

use crate::surface::openai::chunk::json_str;

/// What a run ended with, as Anthropic says it: `stop_reason` and
/// `stop_sequence`, from the OpenAI `finish` reason of choice 0 and the
/// stop sequence the provider said matched (`matched`: vLLM names it).
///
/// A refusal seen makes it `refusal` whatever the finish reason. A plain
/// `stop` beside tool calls is `tool_use` (OpenAI answers `stop` when
/// `tool_choice` names the function; Anthropic's clients run tools on
/// `tool_use`). A finish reason that is not one of OpenAI's and equals one
/// of `stop_sequences` (some servers send the sequence itself) is reported
/// as the sequence too.
pub(super) fn stop_reason<'a>(
    finish: &'a str,
    matched: Option<&'a str>,
    refusal: bool,
    tool_calls: bool,
    stop_sequences: &[String],
) -> (&'static str, Option<&'a str>) {
    if refusal {
        return ("refusal", None);
    }
    let reason = match finish {
        "stop" if tool_calls => return ("tool_use", None),
        "stop" => return matched.map_or(("end_turn", None), |m| ("stop_sequence", Some(m))),
        "length" => "max_tokens",
        "tool_calls" | "function_call" => "tool_use",
        "content_filter" => "refusal",
        other if stop_sequences.iter().any(|s| s == other) => return ("stop_sequence", Some(other)),
        _ => "end_turn",
    };
    if reason == "end_turn" && tool_calls {
        return ("tool_use", None);
    }
    (reason, None)
}

/// Appends `"stop_reason":…,"stop_sequence":…`.
pub(super) fn stop_fields(out: &mut BytesMut, (reason, sequence): (&str, Option<&str>)) {
    out.put_slice(b"\"stop_reason\":");
    json_str(out, reason);
    out.put_slice(b",\"stop_sequence\":");
    match sequence {
        Some(s) => json_str(out, s),
        None => out.put_slice(b"null"),
    }
}

/// Appends an Anthropic `usage` object for the provider's report.
/// Anthropic's `input_tokens` leaves out the cache reads (its total input is
/// their sum) where OpenAI's `prompt_tokens` counts them, so they are taken
/// off; output tokens include reasoning in both.
pub(super) fn usage_json(out: &mut BytesMut, u: &Usage) {
    out.put_slice(b"{\"input_tokens\":");
    put_decimal(out, u.input_tokens.saturating_sub(u.cached_input_tokens.unwrap_or(0)));
    out.put_slice(b",\"output_tokens\":");
    put_decimal(out, u.output_tokens);
    if let Some(c) = u.cached_input_tokens {
        out.put_slice(b",\"cache_read_input_tokens\":");
        put_decimal(out, c);
    }
    out.put_slice(b"}");
}

/// Ids for tool calls that came without one: `toolu_<run id>_<index>`, the
/// run id being the message id without its `msg_` prefix. Kept escaped so
/// each id is written without allocating.
pub(super) struct ToolIds {
    /// `"toolu_<run id>_` as a JSON string literal without its closing quote.
    prefix: Vec<u8>,
}

impl ToolIds {
    pub(super) fn new(message_id: &str) -> Self {
        let run = message_id.strip_prefix("msg_").unwrap_or(message_id);
        let mut lit = BytesMut::with_capacity(run.len() + 16);
        json_str(&mut lit, &["toolu_", run, "_"].concat());
        let mut prefix = lit.to_vec();
        prefix.pop();
        Self { prefix }
    }

    /// Appends the id of tool call `index` as a JSON string.
    pub(super) fn write(&self, out: &mut BytesMut, index: u32) {
        out.put_slice(&self.prefix);
        put_decimal(out, u64::from(index));
        out.put_slice(b"\"");
    }
}

/// Appends the id of a tool call: the provider's `id`, else one made up.
pub(super) fn tool_id(out: &mut BytesMut, ids: &ToolIds, id: &str, index: u32) {
    if id.is_empty() {
        ids.write(out, index);
    } else {
        json_str(out, id);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn finish_reasons_become_stop_reasons() {
        let seqs = vec!["END".to_owned(), "stop".to_owned()];
        let cases = [
            ("stop", false, false, ("end_turn", None)),
            ("length", false, false, ("max_tokens", None)),
            ("tool_calls", false, false, ("tool_use", None)),
            ("function_call", false, false, ("tool_use", None)),
            ("content_filter", false, false, ("refusal", None)),
            ("whatever", false, false, ("end_turn", None)),
            ("", false, false, ("end_turn", None)),
            // A refusal seen wins; `stop` beside tool calls is a tool turn.
            ("stop", true, false, ("refusal", None)),
            ("length", true, true, ("refusal", None)),
            ("stop", false, true, ("tool_use", None)),
            ("length", false, true, ("max_tokens", None)),
            // The sequence itself as the finish reason; OpenAI's own reasons stay theirs.
            ("END", false, false, ("stop_sequence", Some("END"))),
            ("END", false, true, ("stop_sequence", Some("END"))),
        ];
        for (finish, refusal, tools, want) in cases {
            assert_eq!(stop_reason(finish, None, refusal, tools, &seqs), want, "{finish} {refusal} {tools}");
        }
        // The sequence the provider named ends a plain stop, whichever it is.
        assert_eq!(stop_reason("stop", Some("###"), false, false, &seqs), ("stop_sequence", Some("###")));
        assert_eq!(stop_reason("stop", Some("###"), true, false, &seqs), ("refusal", None));
        assert_eq!(stop_reason("stop", Some("###"), false, true, &seqs), ("tool_use", None));
        assert_eq!(stop_reason("length", Some("###"), false, false, &seqs), ("max_tokens", None));
    }

    #[test]
    fn made_up_ids_are_escaped_json() {
        let ids = ToolIds::new("msg_r\"1");
        let mut out = BytesMut::new();
        tool_id(&mut out, &ids, "", 3);
        out.put_slice(b" ");
        tool_id(&mut out, &ids, "call_9", 3);
        assert_eq!(&out[..], br#""toolu_r\"1_3" "call_9""#);
    }

    #[test]
    fn usage_takes_cache_reads_off_the_input() {
        let mut out = BytesMut::new();
        let u = Usage { input_tokens: 10, output_tokens: 4, reasoning_tokens: Some(2), cached_input_tokens: Some(3) };
        usage_json(&mut out, &u);
        assert_eq!(&out[..], br#"{"input_tokens":7,"output_tokens":4,"cache_read_input_tokens":3}"#);
        out.clear();
        usage_json(&mut out, &Usage { input_tokens: 1, output_tokens: 2, ..Default::default() });
        assert_eq!(&out[..], br#"{"input_tokens":1,"output_tokens":2}"#);
    }
}
