//! The members of a JSON object's top level, found without parsing their
//! values: a byte scan that only balances brackets and skips strings, so
//! reading one small member (the usage) out of a large answer costs a pass
//! over its bytes, not a parse of the whole document.
//!
//! Not a validator: what it returns is only as well-formed as the input
//! (the caller parses the member it wants). A key is compared as written:
//! one spelled with escapes does not match.

/// The values of `keys` among the top-level members of the object in
/// `json` (the first of each), as slices of `json`; `None` when `json` is
/// no object as far as the scan can tell.
pub fn members<'a, const N: usize>(json: &'a [u8], keys: [&[u8]; N]) -> Option<[Option<&'a [u8]>; N]> {
    let mut found = [None; N];
    let mut i = skip_ws(json, 0);
    if json.get(i) != Some(&b'{') {
        return None;
    }
    i = skip_ws(json, i + 1);
    if json.get(i) == Some(&b'}') {
        return Some(found);
    }
    loop {
        if json.get(i) != Some(&b'"') {
            return None;
        }
        let key_end = string_end(json, i)?;
        let key = &json[i + 1..key_end - 1];
        i = skip_ws(json, key_end);
        if json.get(i) != Some(&b':') {
            return None;
        }
        let start = skip_ws(json, i + 1);
        let end = value_end(json, start)?;
        if let Some(slot) = keys.iter().position(|k| *k == key) {
            found[slot].get_or_insert(&json[start..end]);
        }
        i = skip_ws(json, end);
        match json.get(i) {
            Some(b',') => i = skip_ws(json, i + 1),
            Some(b'}') => return Some(found),
            _ => return None,
        }
    }
}

/// The value of the *last* top-level member named `key` of the object in
/// `json`, found by scanning from the object's end: an answer reports its
/// usage at or near its end, so this reads a few members, not the whole
/// body. The last, as JSON parsers in JavaScript and Python take a
/// repeated key. `None` when the object has no such member or the scan
/// finds no object.
///
/// Backwards, a `"` closes a string unless an odd number of backslashes
/// precede it, and no unescaped `"` lies inside one: so strings are
/// skipped whole and the brackets in them are never counted.
pub fn last_member<'a>(json: &'a [u8], key: &[u8]) -> Option<&'a [u8]> {
    let open = skip_ws(json, 0);
    if json.get(open) != Some(&b'{') {
        return None;
    }
    // `at`: the position of the `}` or `,` after the member to read next.
    let mut at = skip_ws_back(json, json.len())?;
    if json[at] != b'}' {
        return None;
    }
    loop {
        let value_last = skip_ws_back(json, at)?;
        if value_last <= open {
            return None; // `{}`
        }
        let value_start = value_start(json, value_last)?;
        let colon = skip_ws_back(json, value_start)?;
        if json[colon] != b':' {
            return None;
        }
        let key_last = skip_ws_back(json, colon)?;
        if json[key_last] != b'"' {
            return None;
        }
        let key_start = string_start(json, key_last)?;
        if &json[key_start + 1..key_last] == key {
            return Some(&json[value_start..=value_last]);
        }
        // A `,` before another member; anything else (the object's own `{`
        // once every member was read) ends the scan.
        at = skip_ws_back(json, key_start).filter(|&b| json[b] == b',')?;
    }
}

/// The last non-space byte before `i`.
fn skip_ws_back(b: &[u8], i: usize) -> Option<usize> {
    b.get(..i)?.iter().rposition(|c| !matches!(c, b' ' | b'\t' | b'\n' | b'\r'))
}

/// The opening quote of the string whose closing quote is `b[i]`.
fn string_start(b: &[u8], i: usize) -> Option<usize> {
    let mut j = i;
    loop {
        j = memchr::memrchr(b'"', b.get(..j)?)?;
        let slashes = b[..j].iter().rev().take_while(|&&c| c == b'\\').count();
        if slashes % 2 == 0 {
            return Some(j);
        }
    }
}

/// Where the value that ends at `b[i]` (its last byte) starts.
fn value_start(b: &[u8], i: usize) -> Option<usize> {
    match *b.get(i)? {
        b'"' => string_start(b, i),
        b'}' | b']' => {
            let mut depth = 0usize;
            let mut j = i;
            loop {
                match *b.get(j)? {
                    b'"' => j = string_start(b, j)?,
                    b'}' | b']' => depth += 1,
                    b'{' | b'[' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(j);
                        }
                    }
                    _ => {}
                }
                j = j.checked_sub(1)?;
            }
        }
        // A number, `true`, `false` or `null`: back to what precedes it.
        _ => {
            let len = b[..=i].iter().rev().position(|c| {
                matches!(c, b':' | b',' | b'{' | b'[' | b'}' | b']' | b'"' | b' ' | b'\t' | b'\n' | b'\r')
            });
            let start = i + 1 - len?;
            (start <= i).then_some(start)
        }
    }
}

/// Whether `value` is `null`.
pub fn is_null(value: &[u8]) -> bool {
    value == b"null"
}

/// Whether `value` is an empty array.
pub fn is_empty_array(value: &[u8]) -> bool {
    value.first() == Some(&b'[') && value.last() == Some(&b']') && value[1..value.len() - 1].trim_ascii().is_empty()
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while matches!(b.get(i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        i += 1;
    }
    i
}

/// Just past the string that opens at `b[i]` (a quote).
fn string_end(b: &[u8], i: usize) -> Option<usize> {
    let mut j = i + 1;
    loop {
        j += memchr::memchr2(b'"', b'\\', b.get(j..)?)?;
        if b[j] == b'"' {
            return Some(j + 1);
        }
        // An escape: the next byte is part of it, whatever it is.
        j += 2;
    }
}

/// Just past the value that starts at `b[i]`.
fn value_end(b: &[u8], i: usize) -> Option<usize> {
    match *b.get(i)? {
        b'"' => string_end(b, i),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut j = i;
            loop {
                match *b.get(j)? {
                    b'"' => {
                        j = string_end(b, j)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
        }
        // A number, `true`, `false` or `null`: up to what ends it.
        _ => {
            let len = b[i..].iter().position(|c| matches!(c, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'));
            let end = i + len.unwrap_or(b.len() - i);
            (end > i).then_some(end)
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn get<'a>(json: &'a str, key: &str) -> Option<&'a str> {
        let [v] = members(json.as_bytes(), [key.as_bytes()])?;
        v.map(|v| std::str::from_utf8(v).unwrap())
    }

    #[test]
    fn finds_top_level_members_and_skips_everything_else() {
        let doc = r#" { "id" : "x\"usage\":1" , "choices":[{"message":{"content":"} ] { [ \\"}},{"usage":2}],
            "usage":{"prompt_tokens":2,"details":{"a":[1,2]}},"n":-1.5e3,"t":true,"z":null } "#;
        assert_eq!(get(doc, "usage"), Some(r#"{"prompt_tokens":2,"details":{"a":[1,2]}}"#));
        assert_eq!(get(doc, "n"), Some("-1.5e3"));
        assert_eq!(get(doc, "t"), Some("true"));
        assert_eq!(get(doc, "z"), Some("null"));
        assert_eq!(get(doc, "id"), Some(r#""x\"usage\":1""#));
        assert_eq!(get(doc, "content"), None, "not a top-level member");
        assert_eq!(get(r#"{"usage":1,"usage":2}"#, "usage"), Some("1"), "the first one");
        assert_eq!(get("{}", "usage"), None);
        let [a, b] = members(br#"{"a":[],"b":[ 1 ]}"#, [b"a", b"b"]).unwrap();
        assert!(is_empty_array(a.unwrap()) && !is_empty_array(b.unwrap()));
        assert!(is_empty_array(b"[ \n ]") && !is_empty_array(b"["));
    }

    #[test]
    fn the_last_member_is_found_from_the_end_as_from_the_start() {
        let docs = [
            r#" { "id" : "x\"usage\":1" , "choices":[{"message":{"content":"} ] { [ \\"}},{"usage":2}],
            "usage":{"prompt_tokens":2,"details":{"a":[1,2]}},"n":-1.5e3,"t":true,"z":null } "#,
            r#"{"usage":{"q":"\\\"}"},"s":"ends in a backslash \\","e":"","a":[[],{}],"o":{}}"#,
            r#"{"k\"ey":1,"usage":"{\"usage\":[\"}","x":[1,"]",{"y":"["}]}"#,
            "{\"a\":\t1\n,\r\"b\" :\"2\"}",
        ];
        for doc in docs {
            for key in ["usage", "id", "choices", "n", "t", "z", "s", "e", "a", "o", "x", "b", "k\\\"ey", "absent"] {
                let back = last_member(doc.as_bytes(), key.as_bytes()).map(|v| std::str::from_utf8(v).unwrap());
                assert_eq!(back, get(doc, key), "{key} in {doc}");
            }
        }
        assert_eq!(last_member(br#"{"usage":1,"usage":2}"#, b"usage"), Some(&b"2"[..]), "the last one");
        for none in ["{}", " { } ", "{\"a\":1}", "[\"usage\",1]", "{\"usage\":1 \"b\":2}", "\"usage\":1}"] {
            assert_eq!(last_member(none.as_bytes(), b"usage"), None, "{none}");
        }
    }

    #[test]
    fn what_is_no_object_is_none() {
        for bad in [
            "",
            " ",
            "[]",
            "\"s\"",
            "1",
            "{",
            "{\"a\"",
            "{\"a\":",
            "{\"a\":1",
            "{\"a\":1,",
            "{\"a\" 1}",
            "{a:1}",
            "{\"a\":{\"b\":1}",
            "{\"a\":\"open}",
            "{\"a\":1 \"b\":2}",
            "{\"a\":\"\\",
            "{\"a\":}",
        ] {
            assert!(members(bad.as_bytes(), [b"a"]).is_none(), "{bad:?}");
            assert!(last_member(bad.as_bytes(), b"a").is_none(), "{bad:?}");
        }
    }

    #[test]
    fn any_bytes_are_scanned_without_a_panic() {
        // Every prefix and every one-byte corruption of a real answer.
        let doc = br#"{"id":"c","choices":[{"index":0,"message":{"role":"assistant","content":"h\u00e9 \"q\""}}],"usage":{"prompt_tokens":5}}"#;
        for cut in 0..=doc.len() {
            let _ = members(&doc[..cut], [&b"usage"[..], b"choices"]);
            for c in [b'"', b'\\', b'{', b'}', b'[', b']', b':', b',', 0xff] {
                let mut bad = doc.to_vec();
                if cut < bad.len() {
                    bad[cut] = c;
                }
                let _ = members(&bad, [&b"usage"[..]]);
                let _ = last_member(&bad, b"usage");
                let _ = last_member(&doc[cut..], b"usage");
            }
        }
    }
}
