//! A hand scanner of JSON for the fast paths of provider lines (Ollama's
//! NDJSON, OpenAI's SSE chunks). It reads only text with no backslash and
//! no control character ([`plain`]), so a string ends at the next quote,
//! and gives up (`None`) at anything it does not read exactly as serde
//! would; the caller then leaves the text to serde.

/// `line` as text the scanner reads: UTF-8, no control character (none may
/// stand in a string; a tab or CR between tokens is rare enough to leave
/// to serde), and no backslash (outside a string it is an error, inside
/// one an escape: serde's either way). Checked once for the whole line
/// rather than per string.
pub(super) fn plain(line: &[u8]) -> Option<&str> {
    let text = std::str::from_utf8(line).ok()?;
    // A fold, not `any`: without the early exit it is vectorized.
    if line.iter().fold(false, |seen, &b| seen | (b < 0x20) | (b == b'\\')) {
        return None;
    }
    Some(text)
}

/// Arrays and objects an ignored value may nest (serde allows 128).
const MAX_SKIP_DEPTH: usize = 32;

/// A line known to be UTF-8 with no control character.
pub(super) struct Cursor<'a> {
    s: &'a str,
    b: &'a [u8],
    /// Where it is.
    pub(super) i: usize,
    /// Arrays and objects skipped around it.
    depth: u8,
}

/// Bytes of a string looked at a word at a time before a search takes
/// over (most strings here are short, where a search's setup costs more).
const SHORT_STRING: usize = 32;

/// Where the first `"` of `b` is: eight bytes at a time (a quote byte is a
/// zero byte of the word xor quotes; the lowest one found this way is
/// exact), then, past [`SHORT_STRING`], by `memchr`.
pub(super) fn find_quote(b: &[u8]) -> Option<usize> {
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
    /// At the start of `text` (see [`plain`]).
    pub(super) fn new(text: &'a str) -> Self {
        Self { s: text, b: text.as_bytes(), i: 0, depth: 0 }
    }

    pub(super) fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.b.get(self.i) {
            self.i += 1;
        }
    }

    pub(super) fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.b.get(self.i).copied()
    }

    pub(super) fn eat(&mut self, byte: u8) -> Option<()> {
        (self.peek()? == byte).then(|| self.i += 1)
    }

    pub(super) fn word(&mut self, w: &[u8]) -> Option<()> {
        self.b[self.i..].starts_with(w).then(|| self.i += w.len())
    }

    /// `open item, … close`, each item read by `item` (none: `open close`).
    fn list(&mut self, open: u8, close: u8, mut item: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.eat(open)?;
        if self.peek()? == close {
            self.i += 1;
            return Some(());
        }
        loop {
            item(self)?;
            match self.peek()? {
                b',' => self.i += 1,
                b if b == close => {
                    self.i += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// `{ "key": value, … }`, each value read by `field` after its key.
    pub(super) fn object(&mut self, mut field: impl FnMut(&mut Self, &'a str) -> Option<()>) -> Option<()> {
        self.list(b'{', b'}', |c| {
            let key = c.plain_str()?;
            c.eat(b':')?;
            field(c, key)
        })
    }

    /// `[ value, … ]`, each value read by `item`.
    pub(super) fn array(&mut self, item: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.list(b'[', b']', item)
    }

    /// `{ … }` as serde's derive reads a struct: the value of each of
    /// `keys` read by `field` (given the key's index) at most once (serde
    /// refuses a repeated field), any other key's value skipped.
    pub(super) fn fields(
        &mut self,
        keys: &[&str],
        mut field: impl FnMut(&mut Self, usize) -> Option<()>,
    ) -> Option<()> {
        let mut seen = 0u64;
        self.object(|c, key| {
            let Some(i) = keys.iter().position(|k| *k == key) else { return c.skip_value() };
            let bit = 1u64.checked_shl(u32::try_from(i).ok()?)?;
            if seen & bit != 0 {
                return None;
            }
            seen |= bit;
            field(c, i)
        })
    }

    /// `null` as `None`, else the value `read` reads.
    pub(super) fn opt<T>(&mut self, read: impl FnOnce(&mut Self) -> Option<T>) -> Option<Option<T>> {
        if self.peek()? == b'n' {
            return self.word(b"null").map(|()| None);
        }
        read(self).map(Some)
    }

    /// A string (the line has no backslash, no control character and is
    /// UTF-8: any slice between two quotes is a string).
    pub(super) fn plain_str(&mut self) -> Option<&'a str> {
        self.eat(b'"')?;
        let start = self.i;
        let len = find_quote(&self.b[start..])?;
        self.i = start + len + 1;
        self.s.get(start..start + len)
    }

    pub(super) fn bool(&mut self) -> Option<bool> {
        match self.peek()? {
            b't' => self.word(b"true").map(|()| true),
            b'f' => self.word(b"false").map(|()| false),
            _ => None,
        }
    }

    /// Plain digits (no sign, fraction or exponent), as serde reads a u64.
    pub(super) fn u64(&mut self) -> Option<u64> {
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

    /// A value of an ignored field, checked as serde checks what it
    /// ignores (nested deeper than [`MAX_SKIP_DEPTH`]: serde's).
    pub(super) fn skip_value(&mut self) -> Option<()> {
        match self.peek()? {
            b'"' => self.plain_str().map(drop),
            b't' => self.word(b"true"),
            b'f' => self.word(b"false"),
            b'n' => self.word(b"null"),
            b'-' | b'0'..=b'9' => self.number(),
            b'[' => self.nested(|c| c.array(Self::skip_value)),
            b'{' => self.nested(|c| c.object(|c, _| c.skip_value())),
            _ => None,
        }
    }

    /// `skip` one level deeper.
    fn nested(&mut self, skip: impl FnOnce(&mut Self) -> Option<()>) -> Option<()> {
        if usize::from(self.depth) >= MAX_SKIP_DEPTH {
            return None;
        }
        self.depth += 1;
        let skipped = skip(self);
        self.depth -= 1;
        skipped
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

    #[test]
    fn ignored_values_are_checked_as_serde_checks_them() {
        let skips = |v: &str| {
            let mut c = Cursor::new(v);
            c.skip_value().is_some() && {
                c.ws();
                c.i == v.len()
            }
        };
        for v in [r#"{"a":[1,{"b":null},"x",[]],"c":{}}"#, "[ ]", " { } ", "[[[[1]]]]", "-0.5e-3"] {
            assert!(serde_json::from_str::<serde::de::IgnoredAny>(v).is_ok());
            assert!(skips(v), "{v}");
        }
        for v in ["[1,]", r#"{"a"}"#, r#"{"a":1,}"#, "[1 2]", "{1:2}", "[", "01"] {
            assert!(!skips(v), "{v}");
        }
        let deep = "[".repeat(MAX_SKIP_DEPTH + 1) + &"]".repeat(MAX_SKIP_DEPTH + 1);
        assert!(!skips(&deep), "too deep: serde's");
        let fits = "[".repeat(MAX_SKIP_DEPTH) + &"]".repeat(MAX_SKIP_DEPTH);
        assert!(skips(&fits));
    }
}

/// Values the fast paths' property tests build their lines from.
#[cfg(test)]
#[allow(clippy::expect_used)]
pub(super) mod strategies {
    use proptest::prelude::*;

    /// Any JSON value the scanners meet, or nearly: literals, numbers
    /// (some malformed), strings (some with escapes or a tab), nested
    /// arrays, and objects of `keys` (a regex alternation) with plain values.
    pub(in crate::adapter) fn value(keys: &'static str) -> BoxedStrategy<String> {
        prop_oneof![
            Just("null".to_owned()),
            Just("true".to_owned()),
            Just("false".to_owned()),
            Just("{}".to_owned()),
            Just("[]".to_owned()),
            Just("[1,[2],{\"a\":null}]".to_owned()),
            "-?[0-9]{1,21}(\\.[0-9]{0,2})?([eE][+-]?[0-9]{0,2})?",
            "\"[a-z \\\\\"\\t\u{e9}]{0,6}\"",
            proptest::string::string_regex(&format!(
                "\\{{(\"({keys})\":(null|\"[a-z]{{0,3}}\"|1|\\[\\]),?){{0,3}}\\}}"
            ))
            .expect("a regex"),
        ]
        .boxed()
    }
}
