//! A request's cache-affinity key ([`crate::pool::affinity`]), from the
//! first of: the `[affinity] header`, OpenAI's `prompt_cache_key`, then
//! `user`, Anthropic's `metadata.user_id`; else a hash of the prompt's
//! first `prefix_bytes` (the system prompt, then the conversation's leading
//! system messages and its first other one). The values are those the
//! top-level scan found ([`iop_core::request::AffinitySpans`]): the body is
//! not parsed again, nothing is allocated, and only the hash is kept.
//!
//! The prefix stops after the first non-system message so that every turn
//! of one conversation (which resends it, then more) has the same key; a
//! conversation whose first messages are longer than `prefix_bytes` is
//! cut there, which is as stable. Values are hashed as sent (JSON text): a
//! client that spells the same prompt with other escapes gets another key.

use std::cell::Cell;

use iop_core::{config::AffinitySettings, http::RequestHead, request::AffinitySpans};
use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use crate::pool::affinity::{hash, AffinityKey, Hasher, KeySource, PREFIX_SEED, SESSION_SEED};

/// Longest session value hashed, in bytes (a longer one is cut: two such
/// values alike that far share a target, which is harmless).
const MAX_SESSION_BYTES: usize = 1024;

/// The key of a request with `head` and `body` (whose top-level scan found
/// `spans`); None with affinity off or nothing to key on.
pub fn key(settings: &AffinitySettings, head: &RequestHead, body: &[u8], spans: &AffinitySpans) -> Option<AffinityKey> {
    if !settings.enabled {
        return None;
    }
    let session = |source: KeySource, value: &[u8]| {
        (!value.is_empty())
            .then(|| AffinityKey { hash: hash(SESSION_SEED, &value[..value.len().min(MAX_SESSION_BYTES)]), source })
    };
    if let Some(k) = settings.header.as_deref().and_then(|h| head.header(h)).and_then(|v| session(KeySource::Header, v))
    {
        return Some(k);
    }
    let field = |span: &Option<std::ops::Range<usize>>| span.clone().and_then(|r| body.get(r)).and_then(string);
    if let Some(k) = field(&spans.prompt_cache_key).and_then(|v| session(KeySource::PromptCacheKey, v)) {
        return Some(k);
    }
    if let Some(k) = field(&spans.user).and_then(|v| session(KeySource::User, v)) {
        return Some(k);
    }
    let metadata = spans.metadata.clone().and_then(|r| body.get(r));
    if let Some(k) = metadata.and_then(user_id).and_then(|v| session(KeySource::MetadataUserId, v)) {
        return Some(k);
    }
    if settings.prefix_bytes == 0 {
        return None;
    }
    let present = |span: &Option<std::ops::Range<usize>>| {
        span.clone().and_then(|r| body.get(r)).filter(|v| !v.is_empty() && *v != b"null")
    };
    let (system, conversation) = (present(&spans.system), present(&spans.conversation));
    if system.is_none() && conversation.is_none() {
        return None;
    }
    let mut left = settings.prefix_bytes;
    let mut h = Hasher::new(PREFIX_SEED);
    if let Some(s) = system {
        let take = &s[..s.len().min(left)];
        h.write(take);
        left -= take.len();
    }
    if let Some(c) = conversation.filter(|_| left > 0) {
        h.write(&c[..conversation_prefix(c, left)]);
    }
    Some(AffinityKey { hash: h.finish(), source: KeySource::Prefix })
}

/// The key of a request for `group` (None when it has one target: there
/// is nothing to choose, so nothing is hashed).
pub fn for_group(
    worker: &crate::ctx::Ctx,
    group: &iop_core::config::ModelGroup,
    head: &RequestHead,
    body: &[u8],
    spans: &AffinitySpans,
) -> Option<AffinityKey> {
    if group.targets.len() < 2 {
        return None;
    }
    key(&worker.config.borrow().affinity, head, body, spans)
}

/// The inside of a JSON string as sent (escapes kept); None for any other value.
fn string(raw: &[u8]) -> Option<&[u8]> {
    match raw {
        [b'"', inner @ .., b'"'] => Some(inner),
        _ => None,
    }
}

/// `metadata.user_id`'s string, when `metadata` is an object that has one.
fn user_id(metadata: &[u8]) -> Option<&[u8]> {
    #[derive(serde::Deserialize)]
    struct Metadata<'a> {
        #[serde(borrow, default)]
        user_id: Option<&'a RawValue>,
    }
    let m: Metadata<'_> = serde_json::from_slice(metadata).ok()?;
    let raw = m.user_id?.get().as_bytes();
    // A sub-slice of `metadata`'s own bytes.
    let start = (raw.as_ptr() as usize).checked_sub(metadata.as_ptr() as usize)?;
    metadata.get(start..start + raw.len()).and_then(string)
}

/// How many bytes of `conversation` (a JSON array of messages, a string or
/// anything else) the prefix takes, at most `limit`: for an array, through
/// its leading `system`/`developer` messages and the first other element;
/// else all of it.
fn conversation_prefix(conversation: &[u8], limit: usize) -> usize {
    if conversation.first() != Some(&b'[') {
        return conversation.len().min(limit);
    }
    let end = Cell::new(0);
    // Only the elements needed are read: returning early ends the scan
    // (serde_json then reports the rest as unread, which is ignored).
    let scan = Leading { base: conversation.as_ptr() as usize, limit, end: &end };
    let _ = serde_json::Deserializer::from_slice(conversation).deserialize_seq(scan);
    end.get().min(limit)
}

/// Walks an array's elements while they are system messages.
struct Leading<'c> {
    base: usize,
    limit: usize,
    /// Where the last element read ends.
    end: &'c Cell<usize>,
}

impl<'de> Visitor<'de> for Leading<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an array")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(element) = seq.next_element::<&'de RawValue>()? {
            let text = element.get();
            let end = (text.as_ptr() as usize).saturating_sub(self.base) + text.len();
            self.end.set(end);
            if end >= self.limit || !is_system(text) {
                break;
            }
        }
        Ok(())
    }
}

/// Whether a message's `role` is `system` or `developer`.
fn is_system(message: &str) -> bool {
    let system = Cell::new(false);
    let _ = serde_json::Deserializer::from_str(message).deserialize_map(Role(&system));
    system.get()
}

/// Reads an object's keys up to `role`.
struct Role<'c>(&'c Cell<bool>);

impl<'de> Visitor<'de> for Role<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a message")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        // Borrowed: a key or role spelled with escapes reads as "not system".
        while let Some(k) = map.next_key::<&'de str>()? {
            if k == "role" {
                let role = map.next_value::<&'de str>()?;
                self.0.set(role == "system" || role == "developer");
                return Ok(());
            }
            map.next_value::<IgnoredAny>()?;
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use iop_core::request::Top;

    use super::*;

    fn head(headers: &[(&str, &str)]) -> RequestHead {
        let mut raw = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n".to_vec();
        for (n, v) in headers {
            raw.extend_from_slice(format!("{n}: {v}\r\n").as_bytes());
        }
        raw.extend_from_slice(b"\r\n");
        let mut buf = bytes::BytesMut::from(&raw[..]);
        iop_core::http::parse_request_head(&mut buf, &iop_core::http::Limits::default()).unwrap().unwrap()
    }

    fn key_of(settings: &AffinitySettings, headers: &[(&str, &str)], body: &serde_json::Value) -> Option<AffinityKey> {
        let body = body.to_string();
        let top = Top::parse(body.as_bytes()).unwrap();
        key(settings, &head(headers), body.as_bytes(), &top.affinity)
    }

    fn on() -> AffinitySettings {
        AffinitySettings::default()
    }

    fn session(source: KeySource, value: &str) -> Option<AffinityKey> {
        Some(AffinityKey { hash: hash(SESSION_SEED, value.as_bytes()), source })
    }

    #[test]
    fn session_keys_in_order_of_precedence() {
        use serde_json::json;
        let all = json!({"model": "m", "prompt_cache_key": "pck", "user": "u", "metadata": {"user_id": "a"},
                         "messages": [{"role": "user", "content": "hi"}]});
        let s = on();
        assert_eq!(key_of(&s, &[("X-Session-Affinity", "h")], &all), session(KeySource::Header, "h"));
        assert_eq!(key_of(&s, &[], &all), session(KeySource::PromptCacheKey, "pck"));
        let chat = json!({"model": "m", "user": "u", "messages": [{"role": "user", "content": "hi"}]});
        assert_eq!(key_of(&s, &[], &chat), session(KeySource::User, "u"));
        let anthropic = json!({"model": "m", "max_tokens": 5, "metadata": {"user_id": "user_1_session_2"},
                               "messages": [{"role": "user", "content": "hi"}]});
        assert_eq!(key_of(&s, &[], &anthropic), session(KeySource::MetadataUserId, "user_1_session_2"));
        // One value names one session whichever field carries it.
        assert_eq!(
            key_of(&s, &[("x-session-affinity", "u")], &json!({"model": "m"})).unwrap().hash,
            key_of(&s, &[], &chat).unwrap().hash
        );
        // Empty or non-string values are skipped; the header name is configured.
        let odd = json!({"model": "m", "prompt_cache_key": "", "user": 5, "metadata": "x"});
        assert_eq!(key_of(&s, &[("x-session-affinity", "")], &odd), None);
        let other = AffinitySettings { header: Some("x-conv".into()), ..on() };
        assert_eq!(key_of(&other, &[("x-conv", "c")], &chat), session(KeySource::Header, "c"));
        assert_eq!(key_of(&other, &[("x-session-affinity", "h")], &chat), session(KeySource::User, "u"));
        let off = AffinitySettings { enabled: false, ..on() };
        assert_eq!(key_of(&off, &[("x-session-affinity", "h")], &all), None);
    }

    #[test]
    fn the_prefix_is_the_same_for_every_turn_of_a_conversation() {
        use serde_json::json;
        let s = on();
        let turn1 = json!({"model": "m", "messages": [
            {"role": "system", "content": "You are terse."}, {"role": "user", "content": "first question"}]});
        let turn2 = json!({"model": "m", "messages": [
            {"role": "system", "content": "You are terse."}, {"role": "user", "content": "first question"},
            {"role": "assistant", "content": "answer"}, {"role": "user", "content": "second"}]});
        let other = json!({"model": "m", "messages": [
            {"role": "system", "content": "You are terse."}, {"role": "user", "content": "another question"}]});
        let k1 = key_of(&s, &[], &turn1).unwrap();
        assert_eq!(k1.source, KeySource::Prefix);
        assert_eq!(Some(k1), key_of(&s, &[], &turn2));
        assert_ne!(Some(k1), key_of(&s, &[], &other));
        // Anthropic: `system` beside the messages.
        let a1 = json!({"model": "m", "system": "S", "messages": [{"role": "user", "content": "q"}]});
        let a2 = json!({"model": "m", "system": "S", "messages": [{"role": "user", "content": "q"},
            {"role": "assistant", "content": "a"}, {"role": "user", "content": "q2"}]});
        let a3 = json!({"model": "m", "system": "T", "messages": [{"role": "user", "content": "q"}]});
        assert_eq!(key_of(&s, &[], &a1), key_of(&s, &[], &a2));
        assert_ne!(key_of(&s, &[], &a1), key_of(&s, &[], &a3));
        // Responses: `instructions` and an `input` list or string.
        let r1 = json!({"model": "m", "instructions": "I", "input": [{"type": "message", "role": "developer",
            "content": "d"}, {"type": "message", "role": "user", "content": "q"}]});
        let r2 = json!({"model": "m", "instructions": "I", "input": [{"type": "message", "role": "developer",
            "content": "d"}, {"type": "message", "role": "user", "content": "q"}, {"type": "message",
            "role": "assistant", "content": "a"}]});
        assert_eq!(key_of(&s, &[], &r1), key_of(&s, &[], &r2));
        let text = json!({"model": "m", "input": "hello\nthere"});
        assert_eq!(key_of(&s, &[], &text).unwrap().source, KeySource::Prefix);
        // Completions' prompt.
        assert!(key_of(&s, &[], &json!({"model": "m", "prompt": "p"})).is_some());
        // Nothing to key on, or the prefix off.
        assert_eq!(key_of(&s, &[], &json!({"model": "m"})), None);
        assert_eq!(key_of(&s, &[], &json!({"model": "m", "messages": null})), None);
        assert_eq!(key_of(&AffinitySettings { prefix_bytes: 0, ..on() }, &[], &turn1), None);
    }

    #[test]
    fn the_prefix_is_bounded() {
        use serde_json::json;
        let s = AffinitySettings { prefix_bytes: 64, ..on() };
        let long = "x".repeat(200);
        let a = json!({"model": "m", "messages": [{"role": "user", "content": format!("{long}a")}]});
        let b = json!({"model": "m", "messages": [{"role": "user", "content": format!("{long}b")}]});
        assert_eq!(key_of(&s, &[], &a), key_of(&s, &[], &b), "only the first 64 bytes count");
        // A system prompt longer than the bound leaves nothing of the messages.
        let sys = json!({"model": "m", "system": long, "messages": [{"role": "user", "content": "a"}]});
        let sys2 = json!({"model": "m", "system": long, "messages": [{"role": "user", "content": "b"}]});
        assert_eq!(key_of(&s, &[], &sys), key_of(&s, &[], &sys2));
        assert_eq!(conversation_prefix(br#"[{"role":"system","content":"s"},{"role":"user"},{"x":1}]"#, 1000), 48);
        assert_eq!(conversation_prefix(br#"[{"content":"c","role":"user"}]"#, 1000), 30);
        assert_eq!(conversation_prefix(br#"["a","b"]"#, 1000), 4);
        assert_eq!(conversation_prefix(br#""text""#, 3), 3);
        assert_eq!(conversation_prefix(b"[]", 100), 0);
    }
}
