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

use super::ollama_stream::{ChatLine, MessageLine};

/// The line's fields, or `None`: serde must read it.
pub(super) fn parse(line: &[u8]) -> Option<ChatLine<'_>> {
    // Checked once for the whole line rather than per string: UTF-8, no
    // control character (none may stand in a string; a tab or CR between
    // tokens is rare enough to leave to serde), and no backslash (outside
    // a string it is an error, inside one an escape: serde's either way),
    // so a string ends at the next quote.
    let text = std::str::from_utf8(line).ok()?;
    // A fold, not `any`: without the early exit it is vectorized.
    if line.iter().fold(false, |seen, &b| seen | (b < 0x20) | (b == b'\\')) {
        return None;
    }
    if let Some(token) = token_line(text) {
        return Some(token);
    }
    let mut c = Cursor { s: text, b: line, i: 0 };
    let mut out = ChatLine::default();
    let mut seen = 0u8;
    c.object(|c, key| {
        let bit = match key {
            "model" => 1,
            "message" => 2,
            "done" => 4,
            "done_reason" => 8,
            "prompt_eval_count" => 16,
            "eval_count" => 32,
            // Its value is any JSON: serde's.
            "error" => return None,
            _ => return c.skip_value(),
        };
        if seen & bit != 0 {
            // serde refuses a repeated field.
            return None;
        }
        seen |= bit;
        match key {
            "model" => out.model = c.opt(Cursor::plain_str)?.map(Cow::Borrowed),
            "message" => out.message = c.opt(message)?,
            "done" => out.done = c.opt(Cursor::bool)?,
            "done_reason" => out.done_reason = c.opt(Cursor::plain_str)?.map(Cow::Borrowed),
            "prompt_eval_count" => out.prompt_eval_count = c.opt(Cursor::u64)?,
            _ => out.eval_count = c.opt(Cursor::u64)?,
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
    message.content = Some(content.to_owned());
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
    let mut seen = 0u8;
    c.object(|c, key| {
        let bit = match key {
            "content" => 1,
            "thinking" => 2,
            "tool_calls" => return None,
            _ => return c.skip_value(),
        };
        if seen & bit != 0 {
            return None;
        }
        seen |= bit;
        let text = c.opt(Cursor::plain_str)?.map(str::to_owned);
        if bit == 1 {
            m.content = text;
        } else {
            m.thinking = text;
        }
        Some(())
    })?;
    Some(m)
}

/// A line known to be UTF-8 with no control character.
struct Cursor<'a> {
    s: &'a str,
    b: &'a [u8],
    i: usize,
}

/// Bytes of a string looked at a word at a time before a search takes
/// over (most strings here are short, where a search's setup costs more).
const SHORT_STRING: usize = 32;

/// Where the first `"` of `b` is: eight bytes at a time (a quote byte is a
/// zero byte of the word xor quotes; the lowest one found this way is
/// exact), then, past [`SHORT_STRING`], by `memchr`.
fn find_quote(b: &[u8]) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let mut i = 0;
    while i < SHORT_STRING {
        let Some(word) = b.get(i..i + 8).and_then(|w| <[u8; 8]>::try_from(w).ok()) else {
            return b[i..].iter().position(|&c| c == b'"').map(|p| i + p);
        };
        let x = u64::from_le_bytes(word) ^ (ONES * u64::from(b'"'));
        let zeros = x.wrapping_sub(ONES) & !x & HIGHS;
        if zeros != 0 {
            return Some(i + (zeros.trailing_zeros() / 8) as usize);
        }
        i += 8;
    }
    memchr::memchr(b'"', &b[i..]).map(|p| i + p)
}

impl<'a> Cursor<'a> {
    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.b.get(self.i) {
            self.i += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.b.get(self.i).copied()
    }

    fn eat(&mut self, byte: u8) -> Option<()> {
        (self.peek()? == byte).then(|| self.i += 1)
    }

    fn word(&mut self, w: &[u8]) -> Option<()> {
        self.b[self.i..].starts_with(w).then(|| self.i += w.len())
    }

    /// `{ "key": value, … }`, each value read by `field` after its key.
    fn object(&mut self, mut field: impl FnMut(&mut Self, &'a str) -> Option<()>) -> Option<()> {
        self.eat(b'{')?;
        if self.peek()? == b'}' {
            self.i += 1;
            return Some(());
        }
        loop {
            let key = self.plain_str()?;
            self.eat(b':')?;
            field(self, key)?;
            match self.peek()? {
                b',' => self.i += 1,
                b'}' => {
                    self.i += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// `null` as `None`, else the value `read` reads.
    fn opt<T>(&mut self, read: impl FnOnce(&mut Self) -> Option<T>) -> Option<Option<T>> {
        if self.peek()? == b'n' {
            return self.word(b"null").map(|()| None);
        }
        read(self).map(Some)
    }

    /// A string (the line has no backslash, no control character and is
    /// UTF-8: any slice between two quotes is a string).
    fn plain_str(&mut self) -> Option<&'a str> {
        self.eat(b'"')?;
        let start = self.i;
        let len = find_quote(&self.b[start..])?;
        self.i = start + len + 1;
        self.s.get(start..start + len)
    }

    fn bool(&mut self) -> Option<bool> {
        match self.peek()? {
            b't' => self.word(b"true").map(|()| true),
            b'f' => self.word(b"false").map(|()| false),
            _ => None,
        }
    }

    /// Plain digits (no sign, fraction or exponent), as serde reads a u64.
    fn u64(&mut self) -> Option<u64> {
        self.ws();
        let digits = self.b[self.i..].iter().take_while(|b| b.is_ascii_digit()).count();
        let text = &self.b[self.i..self.i + digits];
        if digits == 0 || (digits > 1 && text[0] == b'0') {
            return None;
        }
        let n = self.s.get(self.i..self.i + digits)?.parse().ok()?;
        self.i += digits;
        // A fraction or exponent after the digits is serde's to judge.
        match self.b.get(self.i) {
            Some(b'.' | b'e' | b'E') => None,
            _ => Some(n),
        }
    }

    /// A value of an ignored field: a plain string, a number or a literal
    /// (an array or object is serde's).
    fn skip_value(&mut self) -> Option<()> {
        match self.peek()? {
            b'"' => self.plain_str().map(drop),
            b't' => self.word(b"true"),
            b'f' => self.word(b"false"),
            b'n' => self.word(b"null"),
            b'-' | b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    /// JSON's number grammar: `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`.
    fn number(&mut self) -> Option<()> {
        let digits = |c: &mut Self| {
            let n = c.b[c.i..].iter().take_while(|b| b.is_ascii_digit()).count();
            c.i += n;
            n
        };
        if self.b.get(self.i) == Some(&b'-') {
            self.i += 1;
        }
        match self.b.get(self.i) {
            Some(b'0') => self.i += 1,
            Some(b'1'..=b'9') => {
                digits(self);
            }
            _ => return None,
        }
        if self.b.get(self.i) == Some(&b'.') {
            self.i += 1;
            if digits(self) == 0 {
                return None;
            }
        }
        if let Some(b'e' | b'E') = self.b.get(self.i) {
            self.i += 1;
            if let Some(b'+' | b'-') = self.b.get(self.i) {
                self.i += 1;
            }
            if digits(self) == 0 {
                return None;
            }
        }
        Some(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn the_first_quote_is_found_wherever_it_is() {
        // Every length up to past the word loop, the quote at every place
        // (and none), with bytes around it that a word's borrow could
        // confuse (a quote minus one, and high bytes).
        for len in 0..80 {
            for at in (0..len).map(Some).chain([None]) {
                for fill in [b'!', b'a', 0xff] {
                    let mut b = vec![fill; len];
                    if let Some(at) = at {
                        b[at] = b'"';
                        if at + 1 < len {
                            b[at + 1] = b'"';
                        }
                    }
                    assert_eq!(find_quote(&b), b.iter().position(|&c| c == b'"'), "{len} {at:?} {fill}");
                }
            }
        }
    }

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
            r#"{"x":[1]}"#,
            r#"{"x":01}"#,
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
        prop_oneof![
            Just("null".to_owned()),
            Just("true".to_owned()),
            Just("false".to_owned()),
            Just("{}".to_owned()),
            Just("[]".to_owned()),
            "-?[0-9]{1,21}(\\.[0-9]{0,2})?([eE][+-]?[0-9]{0,2})?",
            "\"[a-z \\\\\"\\t\u{e9}]{0,6}\"",
            "\\{(\"(content|thinking|role|tool_calls|x)\":(null|\"[a-z]{0,3}\"|1|\\[\\]),?){0,3}\\}",
        ]
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
