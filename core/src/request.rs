//! The few top-level fields of an OpenAI-shaped request body the gateway
//! needs (`model`, `stream`, `stream_options.include_usage`, and where the
//! values cache affinity reads sit), read in one pass without building a
//! JSON tree, and the byte-level edits made to the
//! body: the `model` value, `stream`, and `include_usage` for streams.
//! Everything else stays exactly as the client sent it (key order, spacing,
//! numbers of any size, unknown fields).

use std::{borrow::Cow, ops::Range};

use bytes::{Bytes, BytesMut};
use serde::Deserialize;
use serde_json::value::RawValue;

/// The top-level fields, with where their values sit in the body.
#[derive(Debug)]
pub struct Top {
    /// The requested public model name.
    pub model: String,
    model_span: Range<usize>,
    /// `"stream": true`.
    pub stream: bool,
    /// Where the `stream` value sits, when the key is there.
    stream_span: Option<Range<usize>>,
    /// `stream_options`: its span and what `include_usage` says in it.
    stream_options: Option<StreamOptions>,
    /// Offset of the closing `}` of the top-level object.
    end: usize,
    /// `"encoding_format": "base64"` (embeddings).
    encoding_base64: bool,
    /// Where the values that may tie the request to a target's prompt
    /// cache sit (read in the same pass; see [`AffinitySpans`]).
    pub affinity: AffinitySpans,
    /// Every top-level field's place, when read with [`Top::parse_keeping`].
    pub fields: Option<TopFields>,
}

/// Where each top-level field sits in the body, in the order sent (a key
/// given twice kept twice): what a translation of the request reads
/// again without walking the body a second time (a prompt can be
/// megabytes).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopFields(pub(crate) Vec<(FieldKey, Range<usize>)>);

/// A top-level key: where it sits (without its quotes), or, when it was
/// written with an escape, the key itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FieldKey {
    At(Range<usize>),
    Escaped(Box<str>),
}

/// Where the top-level values cache affinity reads sit in the body, each
/// as sent (JSON text, quotes included); the edge picks the key from them
/// only when it needs one. Spans, not values: nothing is copied.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct AffinitySpans {
    /// OpenAI `prompt_cache_key`.
    pub prompt_cache_key: Option<Range<usize>>,
    /// OpenAI `user`.
    pub user: Option<Range<usize>>,
    /// Anthropic `metadata` (its `user_id` is read from it when needed).
    pub metadata: Option<Range<usize>>,
    /// Anthropic `system`, or the Responses API's `instructions`.
    pub system: Option<Range<usize>>,
    /// The conversation: `messages`, else `input` (Responses), else
    /// `prompt` (completions).
    pub conversation: Option<Range<usize>>,
}

#[derive(Debug)]
struct StreamOptions {
    span: Range<usize>,
    /// `include_usage`'s value and span, when the key is there.
    include_usage: Option<(Option<bool>, Range<usize>)>,
}

/// A top-level value kept raw, `null` included (an `Option` would turn a
/// `null` into "absent").
#[derive(Default)]
struct Field<'a>(Option<&'a RawValue>);

impl<'de: 'a, 'a> Deserialize<'de> for Field<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        <&'a RawValue>::deserialize(d).map(|v| Field(Some(v)))
    }
}

#[derive(Deserialize, Default)]
struct RawTop<'a> {
    #[serde(borrow, default)]
    model: Field<'a>,
    #[serde(borrow, default)]
    stream: Field<'a>,
    #[serde(borrow, default)]
    stream_options: Field<'a>,
    #[serde(default)]
    encoding_format: Option<String>,
    #[serde(borrow, default)]
    prompt_cache_key: Field<'a>,
    #[serde(borrow, default)]
    user: Field<'a>,
    #[serde(borrow, default)]
    metadata: Field<'a>,
    #[serde(borrow, default)]
    system: Field<'a>,
    #[serde(borrow, default)]
    instructions: Field<'a>,
    #[serde(borrow, default)]
    messages: Field<'a>,
    #[serde(borrow, default)]
    input: Field<'a>,
    #[serde(borrow, default)]
    prompt: Field<'a>,
}

#[derive(Deserialize)]
struct RawStreamOptions<'a> {
    #[serde(borrow, default)]
    include_usage: Option<&'a RawValue>,
}

/// Refuses a body that is empty or does not start as an object (serde
/// would also read a struct from an array, by position).
fn an_object(body: &[u8]) -> Result<(), String> {
    if body.is_empty() {
        return Err("request body is empty; expected a JSON object".into());
    }
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err("invalid request body: expected a JSON object".into());
    }
    Ok(())
}

/// Where `inner` (a sub-slice of `outer`) lies in `outer`.
fn span_in(outer: &[u8], inner: &str) -> Range<usize> {
    let start = (inner.as_ptr() as usize).saturating_sub(outer.as_ptr() as usize);
    start..start + inner.len()
}

impl Top {
    /// Parses the top level of `body`; the error is a client-facing message.
    /// Duplicate top-level keys are refused (the provider might read the
    /// other one).
    pub fn parse(body: &[u8]) -> Result<Self, String> {
        an_object(body)?;
        let raw: RawTop = serde_json::from_slice(body).map_err(|e| format!("invalid request body: {e}"))?;
        Self::read(body, raw)
    }

    /// [`Top::parse`], keeping every top-level field's place in
    /// [`Top::fields`] (for a request the edge may translate).
    pub fn parse_keeping(body: &[u8]) -> Result<Self, String> {
        an_object(body)?;
        let mut de = serde_json::Deserializer::from_slice(body);
        let all = crate::translate::top::all_fields(&mut de).map_err(|e| format!("invalid request body: {e}"))?;
        de.end().map_err(|e| format!("invalid request body: {e}"))?;
        let mut raw = RawTop::default();
        for (key, value) in &all {
            let slot = match key.as_ref() {
                "model" => &mut raw.model,
                "stream" => &mut raw.stream,
                "stream_options" => &mut raw.stream_options,
                "prompt_cache_key" => &mut raw.prompt_cache_key,
                "user" => &mut raw.user,
                "metadata" => &mut raw.metadata,
                "system" => &mut raw.system,
                "instructions" => &mut raw.instructions,
                "messages" => &mut raw.messages,
                "input" => &mut raw.input,
                "prompt" => &mut raw.prompt,
                "encoding_format" => {
                    // As the derived reading reads it.
                    if raw.encoding_format.is_some() {
                        return Err("invalid request body: duplicate field `encoding_format`".into());
                    }
                    raw.encoding_format = serde_json::from_str::<Option<String>>(value.get())
                        .map_err(|_| "invalid request body: `encoding_format` must be a string".to_owned())?;
                    continue;
                }
                _ => continue,
            };
            if slot.0.is_some() {
                return Err(format!("invalid request body: duplicate field `{key}`"));
            }
            slot.0 = Some(value);
        }
        let fields = all
            .iter()
            .map(|(key, value)| {
                let key = match key {
                    Cow::Borrowed(k) => FieldKey::At(span_in(body, k)),
                    Cow::Owned(k) => FieldKey::Escaped(k.as_str().into()),
                };
                (key, span_in(body, value.get()))
            })
            .collect();
        let mut top = Self::read(body, raw)?;
        top.fields = Some(TopFields(fields));
        Ok(top)
    }

    /// The fields the gateway reads, from the top level read raw.
    fn read(body: &[u8], raw: RawTop<'_>) -> Result<Self, String> {
        let model_raw = raw.model.0.ok_or("`model` is required")?;
        let model: String = serde_json::from_str(model_raw.get()).map_err(|_| "`model` must be a string")?;
        if model.is_empty() {
            return Err("`model` must not be empty".into());
        }
        let model_span = span_in(body, model_raw.get());
        let (stream, stream_span) = match raw.stream.0 {
            None => (false, None),
            Some(v) if v.get() == "null" => (false, Some(span_in(body, v.get()))),
            Some(v) => {
                let stream: bool = serde_json::from_str(v.get()).map_err(|_| "`stream` must be a boolean")?;
                (stream, Some(span_in(body, v.get())))
            }
        };
        let stream_options = match raw.stream_options.0 {
            None => None,
            Some(so) => {
                let span = span_in(body, so.get());
                let include_usage = if so.get() == "null" {
                    None
                } else if !so.get().starts_with('{') {
                    return Err("`stream_options` must be an object".into());
                } else {
                    let opts: RawStreamOptions =
                        serde_json::from_str(so.get()).map_err(|_| "`stream_options` must be an object".to_owned())?;
                    opts.include_usage.map(|v| (serde_json::from_str::<bool>(v.get()).ok(), span_in(body, v.get())))
                };
                Some(StreamOptions { span, include_usage })
            }
        };
        // The body parsed as an object, so its last non-space byte is `}`.
        let end = body.iter().rposition(|b| !b.is_ascii_whitespace()).unwrap_or(0);
        let encoding_base64 = raw.encoding_format.as_deref() == Some("base64");
        let span = |f: Field<'_>| f.0.map(|v| span_in(body, v.get()));
        let affinity = AffinitySpans {
            prompt_cache_key: span(raw.prompt_cache_key),
            user: span(raw.user),
            metadata: span(raw.metadata),
            system: span(raw.system).or_else(|| span(raw.instructions)),
            conversation: span(raw.messages).or_else(|| span(raw.input)).or_else(|| span(raw.prompt)),
        };
        Ok(Self {
            model,
            model_span,
            stream,
            stream_span,
            stream_options,
            end,
            encoding_base64,
            affinity,
            fields: None,
        })
    }

    /// Embeddings asked as base64 (`encoding_format`).
    pub fn encoding_base64(&self) -> bool {
        self.encoding_base64
    }

    /// The client asked for the usage chunk of a stream.
    pub fn include_usage(&self) -> bool {
        self.stream_options.as_ref().and_then(|o| o.include_usage.as_ref()).is_some_and(|(v, _)| *v == Some(true))
    }

    /// `body` with `model` set to `target` and nothing else changed.
    pub fn with_model(&self, body: &Bytes, target: &str) -> Bytes {
        apply(body, vec![self.model_edit(target)])
    }

    /// `body` with `model` set to `target` and, for a stream whose client
    /// did not ask for usage, `stream_options.include_usage` set to true
    /// (so usage can be accounted). Returns the new body and whether the
    /// usage chunk must be kept from the client.
    pub fn rewrite(&self, body: &Bytes, target: &str) -> (Bytes, bool) {
        self.rewrite_as(body, target, false)
    }

    /// [`Top::rewrite`], turned into a stream when `force_stream` (an
    /// adapter that always reads the provider's answer as SSE).
    pub fn rewrite_as(&self, body: &Bytes, target: &str, force_stream: bool) -> (Bytes, bool) {
        let mut edits: Vec<(Range<usize>, String)> = vec![self.model_edit(target)];
        if force_stream && !self.stream {
            match &self.stream_span {
                Some(span) => edits.push((span.clone(), "true".into())),
                None => edits.push((self.end..self.end, ",\"stream\":true".into())),
            }
        }
        let mut hide = false;
        if (self.stream || force_stream) && !self.include_usage() {
            hide = true;
            match &self.stream_options {
                None => edits.push((self.end..self.end, ",\"stream_options\":{\"include_usage\":true}".into())),
                Some(StreamOptions { span, include_usage: None }) if &body[span.clone()] == b"null" => {
                    edits.push((span.clone(), "{\"include_usage\":true}".into()));
                }
                Some(StreamOptions { span, include_usage: None }) => {
                    // After the object's `{`; a comma when it has members.
                    let open = span.start + 1;
                    let inner_empty = body[open..span.end - 1].iter().all(u8::is_ascii_whitespace);
                    let text = if inner_empty { "\"include_usage\":true" } else { "\"include_usage\":true," };
                    edits.push((open..open, text.into()));
                }
                Some(StreamOptions { include_usage: Some((Some(false), value)), .. }) => {
                    edits.push((value.clone(), "true".into()));
                }
                // A non-boolean include_usage goes to the provider as sent.
                Some(_) => hide = false,
            }
        }
        (apply(body, edits), hide)
    }

    fn model_edit(&self, target: &str) -> (Range<usize>, String) {
        (self.model_span.clone(), serde_json::to_string(target).unwrap_or_else(|_| "\"\"".into()))
    }
}

/// `body` with each `(range, text)` replaced (ranges do not overlap;
/// empty ranges insert).
fn apply(body: &Bytes, mut edits: Vec<(Range<usize>, String)>) -> Bytes {
    // An edit that writes what is there already (the client named the
    // provider's own model) changes nothing: with none left, the body goes
    // on as received, not copied (a prompt can be megabytes).
    edits.retain(|(r, t)| body.get(r.clone()) != Some(t.as_bytes()));
    if edits.is_empty() {
        return body.clone();
    }
    // Insertions at the same offset keep their order.
    edits.sort_by_key(|(r, _)| r.start);
    // Exact: one allocation, never a regrowth (which could double it).
    let removed: usize = edits.iter().map(|(r, _)| r.len()).sum();
    let added: usize = edits.iter().map(|(_, t)| t.len()).sum();
    let mut out = BytesMut::with_capacity((body.len() + added).saturating_sub(removed));
    let mut at = 0;
    for (range, text) in edits {
        out.extend_from_slice(&body[at..range.start]);
        out.extend_from_slice(text.as_bytes());
        at = range.end;
    }
    out.extend_from_slice(&body[at..]);
    out.freeze()
}

/// The non-empty stop strings of an OpenAI request's `stop` (a string or
/// a list of them; anything else asks for none).
pub fn stop_strings(stop: Option<&serde_json::Value>) -> Vec<&str> {
    let all = match stop {
        Some(serde_json::Value::String(s)) => vec![s.as_str()],
        Some(serde_json::Value::Array(a)) => a.iter().filter_map(serde_json::Value::as_str).collect(),
        _ => Vec::new(),
    };
    all.into_iter().filter(|s| !s.is_empty()).collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn rewrite(body: &str, target: &str) -> (String, bool) {
        let top = Top::parse(body.as_bytes()).unwrap();
        let (out, hide) = top.rewrite(&Bytes::copy_from_slice(body.as_bytes()), target);
        let out = String::from_utf8(out.to_vec()).unwrap();
        // Whatever the edit, the result is valid JSON.
        serde_json::from_str::<serde_json::Value>(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
        (out, hide)
    }

    #[test]
    fn only_the_model_changes_and_everything_else_is_kept() {
        let body = r#"{ "z": 1, "model" : "public",  "messages":[{"role":"user","content":"hé \"q\""}],
            "n": 123456789012345678901234567890, "temperature": 1.0000000000000001, "a": {"y":2,"x":1} }"#;
        let (out, hide) = rewrite(body, "upstream/\"m\"");
        assert_eq!(out, body.replace(r#""public""#, r#""upstream/\"m\"""#));
        assert!(!hide);
    }

    #[test]
    fn streams_get_include_usage_and_hide_it_when_the_client_did_not_ask() {
        let cases = [
            (
                r#"{"model":"m","stream":true}"#,
                r#"{"model":"t","stream":true,"stream_options":{"include_usage":true}}"#,
                true,
            ),
            (
                r#"{"model":"m","stream":true,"stream_options":{}}"#,
                r#"{"model":"t","stream":true,"stream_options":{"include_usage":true}}"#,
                true,
            ),
            (
                r#"{"model":"m","stream":true,"stream_options":{"continuous_usage_stats":true}}"#,
                r#"{"model":"t","stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}}"#,
                true,
            ),
            (
                r#"{"model":"m","stream":true,"stream_options":{"include_usage":false}}"#,
                r#"{"model":"t","stream":true,"stream_options":{"include_usage":true}}"#,
                true,
            ),
            (
                r#"{"model":"m","stream":true,"stream_options":null}"#,
                r#"{"model":"t","stream":true,"stream_options":{"include_usage":true}}"#,
                true,
            ),
            (
                r#"{"model":"m","stream":true,"stream_options":{"include_usage":true}}"#,
                r#"{"model":"t","stream":true,"stream_options":{"include_usage":true}}"#,
                false,
            ),
            (r#"{"model":"m","stream":false}"#, r#"{"model":"t","stream":false}"#, false),
            (
                "{\"stream\":true,\"model\":\"m\"}\n  ",
                "{\"stream\":true,\"model\":\"t\",\"stream_options\":{\"include_usage\":true}}\n  ",
                true,
            ),
        ];
        for (body, want, want_hide) in cases {
            assert_eq!(rewrite(body, "t"), (want.to_owned(), want_hide), "{body}");
        }
    }

    #[test]
    fn forced_streams_and_model_only() {
        let force = |body: &str| {
            let top = Top::parse(body.as_bytes()).unwrap();
            let (out, hide) = top.rewrite_as(&Bytes::copy_from_slice(body.as_bytes()), "t", true);
            (String::from_utf8(out.to_vec()).unwrap(), hide)
        };
        assert_eq!(
            force(r#"{"model":"m"}"#),
            (r#"{"model":"t","stream":true,"stream_options":{"include_usage":true}}"#.into(), true)
        );
        assert_eq!(
            force(r#"{"model":"m","stream":false,"x":1}"#),
            (r#"{"model":"t","stream":true,"x":1,"stream_options":{"include_usage":true}}"#.into(), true)
        );
        assert_eq!(
            force(r#"{"model":"m","stream":null}"#),
            (r#"{"model":"t","stream":true,"stream_options":{"include_usage":true}}"#.into(), true)
        );
        let body = r#"{"model":"m","stream":true,"n":1e400}"#;
        let top = Top::parse(body.as_bytes()).unwrap();
        let out = top.with_model(&Bytes::from_static(body.as_bytes()), "x");
        assert_eq!(&out[..], br#"{"model":"x","stream":true,"n":1e400}"#);
    }

    #[test]
    fn a_body_that_needs_no_edit_is_passed_on_not_copied() {
        let body = Bytes::from_static(br#"{"model":"t","stream":true,"stream_options":{"include_usage":true}}"#);
        let top = Top::parse(&body).unwrap();
        let (out, hide) = top.rewrite(&body, "t");
        assert_eq!((out.as_ptr(), out.len(), hide), (body.as_ptr(), body.len(), false));
        assert_eq!(top.with_model(&body, "t").as_ptr(), body.as_ptr());
        // The same name spelled with an escape is written as the provider's.
        let escaped = Bytes::from_static(br#"{"model":"\u0074"}"#);
        let out = Top::parse(&escaped).unwrap().with_model(&escaped, "t");
        assert_eq!(&out[..], br#"{"model":"t"}"#);
    }

    #[test]
    fn affinity_values_are_found_in_the_same_pass() {
        let body = br#"{"model":"m","user":"u","prompt_cache_key":"k","metadata":{"user_id":"a"},
            "system":"s","messages":[{"role":"user","content":"q"}]}"#;
        let a = Top::parse(body).unwrap().affinity;
        let text = |r: Option<Range<usize>>| std::str::from_utf8(&body[r.unwrap()]).unwrap().to_owned();
        assert_eq!(text(a.user.clone()), "\"u\"");
        assert_eq!(text(a.prompt_cache_key.clone()), "\"k\"");
        assert_eq!(text(a.metadata.clone()), r#"{"user_id":"a"}"#);
        assert_eq!(text(a.system.clone()), "\"s\"");
        assert_eq!(text(a.conversation.clone()), r#"[{"role":"user","content":"q"}]"#);
        // The Responses API's names; any value type is taken as sent.
        let body = br#"{"model":"m","instructions":"i","input":"q","user":5}"#;
        let a = Top::parse(body).unwrap().affinity;
        let text = |r: Option<Range<usize>>| std::str::from_utf8(&body[r.unwrap()]).unwrap().to_owned();
        assert_eq!((text(a.system), text(a.conversation), text(a.user)), ("\"i\"".into(), "\"q\"".into(), "5".into()));
        assert_eq!(Top::parse(br#"{"model":"m"}"#).unwrap().affinity, AffinitySpans::default());
    }

    #[test]
    fn refusals() {
        for (body, needle) in [
            ("", "empty"),
            ("[1]", "invalid request body"),
            ("{\"messages\":[]}", "`model` is required"),
            ("{\"model\":5}", "`model` must be a string"),
            ("{\"model\":\"\"}", "must not be empty"),
            ("{\"model\":\"a\",\"model\":\"b\"}", "duplicate field"),
            ("{\"model\":\"a\",\"stream\":\"yes\"}", "`stream` must be a boolean"),
            ("{\"model\":\"a\",\"stream_options\":[1]}", "must be an object"),
            ("{\"model\":\"a\"", "invalid request body"),
        ] {
            let e = Top::parse(body.as_bytes()).unwrap_err();
            assert!(e.contains(needle), "{body}: {e}");
            let e = Top::parse_keeping(body.as_bytes()).unwrap_err();
            assert!(e.contains(needle), "keeping {body}: {e}");
        }
    }

    #[test]
    fn keeping_the_places_reads_the_same_top() {
        for body in [
            r#"{"model":"m","stream":true,"stream_options":{"include_usage":false},"messages":[1],"user":"u"}"#,
            r#" {"x":1,"x":2,"mod\u0065l":"m","instructions":"i","input":"q","encoding_format":"base64"} "#,
            r#"{"model":"m","prompt_cache_key":"k","metadata":{"user_id":"a"},"system":"s","stream":null}"#,
        ] {
            let a = Top::parse(body.as_bytes()).unwrap();
            let mut b = Top::parse_keeping(body.as_bytes()).unwrap();
            let fields = b.fields.take().unwrap();
            assert_eq!(format!("{a:?}"), format!("{b:?}"), "{body}");
            // Every field, in order, a key given twice kept twice.
            let keys: Vec<String> = fields
                .0
                .iter()
                .map(|(k, _)| match k {
                    FieldKey::At(r) => body[r.clone()].to_owned(),
                    FieldKey::Escaped(k) => format!("({k})"),
                })
                .collect();
            let values: Vec<&str> = fields.0.iter().map(|(_, v)| &body[v.clone()]).collect();
            if body.contains("\"x\":1") {
                assert_eq!(keys, ["x", "x", "(model)", "instructions", "input", "encoding_format"]);
                assert_eq!(values, ["1", "2", "\"m\"", "\"i\"", "\"q\"", "\"base64\""]);
            }
        }
    }
}
