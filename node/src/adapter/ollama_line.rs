//! The fast path of an Ollama `/api/chat` line, in two steps. A token's
//! line as Ollama writes it (`model`, `created_at`, `message` with the
//! assistant's `content`, `done` false, in that order) is matched whole
//! against its fixed parts (`token_line`: no key is read). Any other line
//! of the common shape (`message` with `role` and `content` or `thinking`,
//! `done`, and on the last line `done_reason` and the counts) goes through
//! a hand scanner. Both only take lines with no backslash and no control
//! character, so a string ends at the next quote (found a word at a time).
//! serde's derive took about 300 ns for the mock's 125-byte line, the
//! scanner about 160; matching the token's line whole saves the node
//! another 1 300 instructions a line (callgrind, loadtest/README.md).
//!
//! Both give up (`None`) at anything else: an escape, a nested array or
//! object other than `message`, `tool_calls`, `error`, a repeated field,
//! a value of an unexpected type, malformed JSON. The caller then parses
//! the line with serde, so every answer, and every error, stays serde's.
//! What they accept, they read exactly as serde would (checked by property
//! tests and the `ollama_ndjson` fuzz target).

use std::borrow::Cow;

use super::{
    json_scan::{find_quote, plain, Cursor},
    ollama_stream::{ChatLine, MessageLine},
};

/// The line's fields, or `None`: serde must read it.
pub(super) fn parse(line: &[u8]) -> Option<ChatLine<'_>> {
    // Checked once for the whole line rather than per string: UTF-8, no
    // control character (none may stand in a string; a tab or CR between
    // tokens is rare enough to leave to serde), and no backslash (outside
    // a string it is an error, inside one an escape: serde's either way),
    // so a string ends at the next quote.
    let text = plain(line)?;
    if let Some(token) = token_line(text) {
        return Some(token);
    }
    let mut c = Cursor::new(text);
    let mut out = ChatLine::default();
    let keys = ["model", "message", "done", "done_reason", "prompt_eval_count", "eval_count", "error"];
    c.fields(&keys, |c, i| {
        match i {
            0 => out.model = c.opt(Cursor::plain_str)?.map(Cow::Borrowed),
            1 => out.message = c.opt(message)?,
            2 => out.done = c.opt(Cursor::bool)?,
            3 => out.done_reason = c.opt(Cursor::plain_str)?.map(Cow::Borrowed),
            4 => out.prompt_eval_count = c.opt(Cursor::u64)?,
            5 => out.eval_count = c.opt(Cursor::u64)?,
            // An error's value is any JSON: serde's.
            _ => return None,
        }
        Some(())
    })?;
    c.ws();
    // Trailing characters are serde's error to report.
    (c.i == line.len()).then_some(out)
}

/// A token's line exactly as Ollama writes it (its fields in its order,
/// the assistant's text and nothing else, `done` false), read by matching
/// the line's fixed parts in order: no key is read. `text` has no
/// backslash and no control character, so each string ends at the next
/// quote. Anything else is the scanner's.
fn token_line(text: &str) -> Option<ChatLine<'_>> {
    // Cuts `rest` after `fixed`, then at the next quote: what was between.
    fn string<'a>(rest: &mut &'a str, fixed: &str) -> Option<&'a str> {
        let after = rest.strip_prefix(fixed)?;
        let len = find_quote(after.as_bytes())?;
        let (s, tail) = (after.get(..len)?, after.get(len + 1..)?);
        *rest = tail;
        Some(s)
    }
    let mut rest = text;
    let model = string(&mut rest, "{\"model\":\"")?;
    string(&mut rest, ",\"created_at\":\"")?;
    let content = string(&mut rest, ",\"message\":{\"role\":\"assistant\",\"content\":\"")?;
    // Whitespace after the object is serde's to allow, as the scanner does.
    let rest = rest.strip_prefix("},\"done\":false}")?;
    if !rest.bytes().all(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r')) {
        return None;
    }
    let mut message = MessageLine::default();
    message.content = Some(crate::spare::text(content));
    Some(ChatLine {
        model: Some(Cow::Borrowed(model)),
        message: Some(message),
        done: Some(false),
        ..ChatLine::default()
    })
}

/// `message`: its texts (and `role`, skipped); `tool_calls` is serde's.
fn message<'a>(c: &mut Cursor<'a>) -> Option<MessageLine<'a>> {
    let mut m = MessageLine::default();
    c.fields(&["content", "thinking", "tool_calls"], |c, i| {
        let text = match i {
            0 | 1 => c.opt(Cursor::plain_str)?.map(crate::spare::text),
            _ => return None,
        };
        if i == 0 {
            m.content = text;
        } else {
            m.thinking = text;
        }
        Some(())
    })?;
    Some(m)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn serde(line: &[u8]) -> Option<String> {
        serde_json::from_slice::<ChatLine>(line).ok().map(|l| format!("{l:?}"))
    }

    fn fast(line: &[u8]) -> Option<String> {
        parse(line).map(|l| format!("{l:?}"))
    }

    /// What the fast path reads is what serde reads.
    fn agrees(line: &str) {
        if let Some(f) = fast(line.as_bytes()) {
            assert_eq!(Some(f), serde(line.as_bytes()), "{line}");
        }
    }

    #[test]
    fn the_common_lines_take_the_fast_path() {
        let lines = [
            r#"{"model":"mock","created_at":"2026-12-05T16:57:08.740836063Z","message":{"role":"assistant","content":"tok0 "},"done":false}"#,
            r#"{"model":"qwen3","message":{"role":"assistant","content":"","thinking":"hmm"},"done":false}"#,
            r#"{"model":"m","created_at":"t","message":{"role":"assistant","content":""},"done":true,"done_reason":"stop","total_duration":4100000,"load_duration":1000000,"prompt_eval_count":1,"prompt_eval_duration":100000,"eval_count":3,"eval_duration":3000000}"#,
            r#" { "model" : null , "message" : null , "done" : null , "x" : -1.5e+3 } "#,
            "{}",
            r#"{"message":{},"eval_count":0,"prompt_eval_count":18446744073709551615}"#,
            r#"{"model":"ünïcödé","message":{"content":"日本"}}"#,
            // An ignored field's nested value, checked as serde checks it.
            r#"{"x":[1,{"y":[]}],"model":"m"}"#,
        ];
        for line in lines {
            assert!(fast(line.as_bytes()).is_some(), "slow: {line}");
            agrees(line);
        }
    }

    #[test]
    fn anything_else_goes_to_serde() {
        let lines = [
            r#"{"message":{"content":"a\"b"}}"#,
            r#"{"message":{"content":"a","tool_calls":[{"function":{"name":"f","arguments":{}}}]}}"#,
            r#"{"error":"boom"}"#,
            r#"{"model":"a","model":"b"}"#,
            r#"{"done":"yes"}"#,
            r#"{"eval_count":1.0}"#,
            r#"{"eval_count":18446744073709551616}"#,
            r#"{"eval_count":-1}"#,
            r#"{"eval_count":01}"#,
            r#"{"x":01}"#,
            r#"{"x":[1,]}"#,
            r#"{"x":1.}"#,
            r#"{"model":"a"} x"#,
            r#"{"model":"a",}"#,
            r#"{"model":"a""#,
            "{\"model\":\"a\tb\"}",
            r#"{"mod\u0065l":"a"}"#,
            r#"{"done":tru}"#,
            r#"[1]"#,
        ];
        for line in lines {
            assert_eq!(fast(line.as_bytes()), None, "fast: {line}");
        }
        assert_eq!(parse(b"{\"model\":\"\xff\"}").map(|l| format!("{l:?}")), None);
    }

    fn value() -> impl Strategy<Value = String> {
        super::super::json_scan::strategies::value("content|thinking|role|tool_calls|x")
    }

    fn key() -> impl Strategy<Value = String> {
        "(model|message|done|done_reason|prompt_eval_count|eval_count|error|created_at|x|mod\\\\u0065l)"
    }

    #[test]
    fn a_token_line_is_matched_whole_and_near_misses_are_scanned() {
        let token = r#"{"model":"mock","created_at":"2026-12-05T16:57:08.740836063Z","message":{"role":"assistant","content":"tok0 "},"done":false}"#;
        assert!(token_line(token).is_some());
        agrees(token);
        assert!(token_line(&format!("{token} \r\n")).is_some(), "whitespace after it is serde's to allow");
        let near = [
            // Another role, another order, a field more or less, done true,
            // a character after the object.
            token.replace("assistant", "user"),
            token.replace(r#""created_at":"2026-12-05T16:57:08.740836063Z","#, ""),
            token.replace(r#""done":false"#, r#""done":false,"x":1"#),
            token.replace(r#""done":false"#, r#""done":true"#),
            format!("{token}x"),
            token.replace(r#""model":"mock","created_at""#, r#""created_at":"x","model":"mock","y""#),
        ];
        for line in &near {
            assert!(token_line(line).is_none(), "{line}");
            agrees(line);
        }
    }

    proptest! {
        #[test]
        fn a_token_line_reads_what_serde_reads(
            model in "[a-z:.ü\"\\\\ ]{0,12}",
            at in "[0-9TZ:.\"-]{0,30}",
            content in "[a-z é😀\"\\\\{},:]{0,20}",
            tail in "[ }x\n]{0,2}",
        ) {
            let line = format!(
                r#"{{"model":"{model}","created_at":"{at}","message":{{"role":"assistant","content":"{content}"}},"done":false}}{tail}"#
            );
            agrees(&line);
        }

        #[test]
        fn the_fast_path_reads_what_serde_reads(
            fields in proptest::collection::vec((key(), value(), "[ ]{0,1}", "[,]{0,2}"), 0..6),
            tail in "[ }x]{0,2}",
        ) {
            let mut line = String::from("{");
            for (i, (k, v, ws, comma)) in fields.iter().enumerate() {
                if i > 0 {
                    line.push_str(if comma.is_empty() { "," } else { comma });
                }
                line.push_str(&format!("{ws}\"{k}\"{ws}:{ws}{v}"));
            }
            line.push('}');
            line.push_str(&tail);
            agrees(&line);
        }
    }
}
