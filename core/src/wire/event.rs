//! One run event encoded straight from an [`ExecEvent`], as a batch carries
//! it (no run id, sequence number 0): the streamed pieces (text,
//! reasoning, refusal and tool-call deltas) without first building the
//! 300-byte `pb::RunEvent` they would become; every other kind through it.
//! Byte for byte what prost writes for `into_wire_unnamed(0)` (tested).

use bytes::BufMut;
use prost::{
    encoding::{encode_key, encode_varint, encoded_len_varint, key_len, WireType},
    Message,
};

use crate::exec::{Delta, ExecEvent, Part, TextKind, ToolCallDelta};

// RunEvent's fields: the `kind` variants of a delta, then `choice` and
// `logprobs_json`; TextDelta.text = 1; ToolCallDelta index = 1, id = 2,
// type = 3, name = 4, arguments = 5.
const DELTA: u32 = 11;
const REASONING: u32 = 12;
const TOOL_CALL: u32 = 16;
const REFUSAL: u32 = 17;
const CHOICE: u32 = 21;
const LOGPROBS: u32 = 22;
const TEXT: u32 = 1;

/// Bytes of a length-delimited field of `len` bytes.
fn field_len(tag: u32, len: usize) -> usize {
    key_len(tag) + encoded_len_varint(len as u64) + len
}

/// A proto3 string or bytes field: absent when empty.
fn opt_len(tag: u32, len: usize) -> usize {
    if len == 0 {
        0
    } else {
        field_len(tag, len)
    }
}

fn opt_u32_len(tag: u32, v: u32) -> usize {
    if v == 0 {
        0
    } else {
        key_len(tag) + encoded_len_varint(u64::from(v))
    }
}

fn put_opt(out: &mut impl BufMut, tag: u32, bytes: &[u8]) {
    if !bytes.is_empty() {
        encode_key(tag, WireType::LengthDelimited, out);
        encode_varint(bytes.len() as u64, out);
        out.put_slice(bytes);
    }
}

fn put_opt_u32(out: &mut impl BufMut, tag: u32, v: u32) {
    if v != 0 {
        encode_key(tag, WireType::Varint, out);
        encode_varint(u64::from(v), out);
    }
}

fn tool_fields(c: &ToolCallDelta) -> [(u32, &[u8]); 4] {
    [(2, c.id.as_bytes()), (3, c.kind.as_bytes()), (4, c.name.as_bytes()), (5, c.arguments.as_bytes())]
}

/// The `kind` field of a delta: its tag and the length of its message.
fn kind_of(part: &Part) -> (u32, usize) {
    match part {
        Part::Content(t) => (DELTA, opt_len(TEXT, t.len())),
        Part::Reasoning(t) => (REASONING, opt_len(TEXT, t.len())),
        Part::Refusal(t) => (REFUSAL, opt_len(TEXT, t.len())),
        Part::ToolCall(c) => (
            TOOL_CALL,
            opt_u32_len(1, c.index) + tool_fields(c).iter().map(|(t, b)| opt_len(*t, b.len())).sum::<usize>(),
        ),
    }
}

fn delta_len(d: &Delta) -> usize {
    let (tag, inner) = kind_of(&d.part);
    field_len(tag, inner)
        + opt_u32_len(CHOICE, d.choice)
        + opt_len(LOGPROBS, d.logprobs.as_ref().map_or(0, |l| l.len()))
}

fn put_delta(d: &Delta, out: &mut impl BufMut) {
    let (tag, inner) = kind_of(&d.part);
    encode_key(tag, WireType::LengthDelimited, out);
    encode_varint(inner as u64, out);
    match &d.part {
        Part::Content(t) | Part::Reasoning(t) | Part::Refusal(t) => put_opt(out, TEXT, t.as_bytes()),
        Part::ToolCall(c) => {
            put_opt_u32(out, 1, c.index);
            for (t, b) in tool_fields(c) {
                put_opt(out, t, b);
            }
        }
    }
    put_opt_u32(out, CHOICE, d.choice);
    put_opt(out, LOGPROBS, d.logprobs.as_deref().unwrap_or_default());
}

/// The length of `ev` encoded as a batch's event.
pub(super) fn encoded_len(ev: &ExecEvent) -> usize {
    match ev {
        ExecEvent::Delta(d) => delta_len(d),
        // Once or twice a run: through the generated type.
        other => other.clone().into_wire_unnamed(0).encoded_len(),
    }
}

/// A token of choice 0 with no log probabilities, as field `tag` of the
/// batch, when every key and length is one byte: those six bytes, written
/// at once (what the field-by-field writing gives), and the text.
fn short_head(tag: u32, ev: &ExecEvent) -> Option<([u8; 6], &[u8])> {
    let ExecEvent::Delta(Delta { choice: 0, part, logprobs }) = ev else { return None };
    if logprobs.as_ref().is_some_and(|l| !l.is_empty()) || tag >= 16 {
        return None;
    }
    let (kind, text) = match part {
        Part::Content(t) => (DELTA_KEY, t.as_bytes()),
        Part::Reasoning(t) => (REASONING_KEY, t.as_bytes()),
        _ => return None,
    };
    // An empty text is left out of its message (proto3); the lengths below
    // are one byte each up to this.
    let len = u8::try_from(text.len()).ok().filter(|&n| n > 0 && n <= 123)?;
    let field_key = (tag << 3) as u8 | 2;
    Some(([field_key, len + 4, kind, len + 2, TEXT_KEY, len], text))
}

/// Writes `ev` as field `tag` of the batch: key, length, event.
pub(super) fn encode_field(tag: u32, ev: &ExecEvent, out: &mut impl BufMut) {
    if let Some((head, text)) = short_head(tag, ev) {
        out.put_slice(&head);
        out.put_slice(text);
        return;
    }
    encode_key(tag, WireType::LengthDelimited, out);
    match ev {
        ExecEvent::Delta(d) => {
            encode_varint(delta_len(d) as u64, out);
            put_delta(d, out);
        }
        // Converted once for its length and body together.
        other => {
            let wire = other.clone().into_wire_unnamed(0);
            encode_varint(wire.encoded_len() as u64, out);
            wire.encode_raw(out);
        }
    }
}

/// Decodes one event of a batch as [`ExecEvent::from_wire`] of prost's
/// decoding would (`Ok(None)`: no kind), a text, reasoning or refusal
/// delta by hand, straight into its `ExecEvent` (the streamed case: no
/// 300-byte message on the way); anything else through prost.
pub fn decode_event(raw: bytes::Bytes) -> Result<Option<ExecEvent>, prost::DecodeError> {
    match delta_by_hand(&raw) {
        Some(ev) => Ok(Some(ev)),
        None => Ok(ExecEvent::from_wire(crate::wire::pb::RunEvent::decode(raw)?)),
    }
}

/// The kind's key and the text's key, each one byte as prost writes them.
const DELTA_KEY: u8 = (DELTA << 3) as u8 | 2;
const REASONING_KEY: u8 = (REASONING << 3) as u8 | 2;
const TEXT_KEY: u8 = (TEXT << 3) as u8 | 2;

/// The streamed event in its shortest form, as a node writes a token of
/// choice 0 with no log probabilities: the kind's key, its length, the
/// text's key, its length (each length one byte), the text, nothing else.
/// Read by position (the text not yet checked to be UTF-8); any other form
/// is left to the field-by-field reading.
pub fn short_text_parts(raw: &[u8]) -> Option<(TextKind, &[u8])> {
    let [kind, inner, TEXT_KEY, len, text @ ..] = raw else { return None };
    // A one-byte length is below 128; each length covers exactly the rest.
    if usize::from(*inner) != text.len() + 2 || usize::from(*len) != text.len() || *inner >= 0x80 {
        return None;
    }
    let kind = match *kind {
        DELTA_KEY => TextKind::Content,
        REASONING_KEY => TextKind::Reasoning,
        _ => return None,
    };
    Some((kind, text))
}

/// [`short_text_parts`] as the event it is.
fn short_text(raw: &[u8]) -> Option<ExecEvent> {
    let (kind, text) = short_text_parts(raw)?;
    let text = std::str::from_utf8(text).ok()?.to_owned();
    Some(ExecEvent::Delta(Delta { choice: 0, part: kind.part(text), logprobs: None }))
}

/// A plain delta (its kind once, `choice`, `logprobs_json`; ids and
/// sequence numbers allowed), else `None` for prost to judge.
fn delta_by_hand(raw: &bytes::Bytes) -> Option<ExecEvent> {
    use prost::encoding::{decode_key, decode_varint};
    if let Some(ev) = short_text(raw) {
        return Some(ev);
    }
    let mut buf = &raw[..];
    // The kind's tag and message, the choice, the log probabilities.
    let mut part: Option<(u32, &[u8])> = None;
    let (mut choice, mut logprobs) = (0u32, None::<&[u8]>);
    let len_delimited = |buf: &mut &[u8]| -> Option<(usize, usize)> {
        let len = usize::try_from(decode_varint(buf).ok()?).ok()?;
        (len <= buf.len()).then_some((raw.len() - buf.len(), len))
    };
    while !buf.is_empty() {
        let (tag, wire) = decode_key(&mut buf).ok()?;
        match (tag, wire) {
            (DELTA | REASONING | REFUSAL, WireType::LengthDelimited) if part.is_none() => {
                let (at, len) = len_delimited(&mut buf)?;
                part = Some((tag, &raw[at..at + len]));
                buf = &buf[len..];
            }
            (CHOICE, WireType::Varint) => choice = decode_varint(&mut buf).ok()? as u32,
            (LOGPROBS, WireType::LengthDelimited) => {
                let (at, len) = len_delimited(&mut buf)?;
                logprobs = Some(&raw[at..at + len]);
                buf = &buf[len..];
            }
            // The batch's own id and number (empty in a batch).
            (1, WireType::LengthDelimited) => {
                let (_, len) = len_delimited(&mut buf)?;
                buf = &buf[len..];
            }
            (2, WireType::Varint) => {
                decode_varint(&mut buf).ok()?;
            }
            _ => return None,
        }
    }
    let (tag, mut inner) = part?;
    // TextDelta: `text` at most once (else prost's rules apply).
    let mut text: &[u8] = &[];
    if !inner.is_empty() {
        let (t, w) = decode_key(&mut inner).ok()?;
        if t != TEXT || w != WireType::LengthDelimited {
            return None;
        }
        let len = usize::try_from(decode_varint(&mut inner).ok()?).ok()?;
        if len != inner.len() {
            return None;
        }
        text = inner;
    }
    // Not UTF-8: prost's error.
    let text = std::str::from_utf8(text).ok()?.to_owned();
    let part = match tag {
        DELTA => Part::Content(text),
        REASONING => Part::Reasoning(text),
        _ => Part::Refusal(text),
    };
    let logprobs = logprobs.filter(|l| !l.is_empty()).map(|l| raw.slice_ref(l));
    Some(ExecEvent::Delta(Delta { choice, part, logprobs }))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use bytes::Bytes;
    use proptest::prelude::*;
    use prost::Message;

    use super::*;
    use crate::wire::pb::{self, run_event::Kind};

    /// What the edge did before: prost, then `from_wire`.
    fn by_prost(raw: Bytes) -> Result<Option<ExecEvent>, ()> {
        pb::RunEvent::decode(raw).map(ExecEvent::from_wire).map_err(|_| ())
    }

    fn kind(k: u8, text: String) -> Option<Kind> {
        let t = pb::TextDelta { text };
        match k {
            0 => Some(Kind::Delta(t)),
            1 => Some(Kind::ReasoningDelta(t)),
            2 => Some(Kind::RefusalDelta(t)),
            3 => Some(Kind::Complete(pb::RunComplete { finish_reason: t.text })),
            4 => Some(Kind::ToolCall(pb::ToolCallDelta { arguments: t.text, ..Default::default() })),
            _ => None,
        }
    }

    proptest! {
        #[test]
        fn decodes_what_prost_decodes(
            k in 0u8..6,
            text in ".{0,30}",
            choice in any::<u32>(),
            logprobs in proptest::collection::vec(any::<u8>(), 0..8),
            seq in any::<u64>(),
            id in proptest::collection::vec(any::<u8>(), 0..4),
            tail in proptest::collection::vec(any::<u8>(), 0..6),
        ) {
            let ev = pb::RunEvent {
                run_id: id.into(),
                seq,
                kind: kind(k, text),
                choice,
                logprobs_json: logprobs.into(),
                ..Default::default()
            };
            let raw = Bytes::from(ev.encode_to_vec());
            prop_assert_eq!(decode_event(raw.clone()).map_err(|_| ()), by_prost(raw.clone()));
            // Whatever follows (another field, a repeat, garbage): the same verdict.
            let mut more = raw.to_vec();
            more.extend_from_slice(&tail);
            let more = Bytes::from(more);
            prop_assert_eq!(decode_event(more.clone()).map_err(|_| ()), by_prost(more));
        }

        #[test]
        fn short_tokens_decode_as_prost_decodes(k in 0u8..3, text in ".{0,130}", tail in proptest::collection::vec(any::<u8>(), 0..3)) {
            let ev = pb::RunEvent { kind: kind(k, text), ..Default::default() };
            let mut raw = ev.encode_to_vec();
            let whole = Bytes::from(raw.clone());
            prop_assert_eq!(decode_event(whole.clone()).map_err(|_| ()), by_prost(whole));
            raw.extend_from_slice(&tail);
            let more = Bytes::from(raw);
            prop_assert_eq!(decode_event(more.clone()).map_err(|_| ()), by_prost(more));
        }

        #[test]
        fn any_bytes_get_prost_verdict(raw in proptest::collection::vec(any::<u8>(), 0..40)) {
            let raw = Bytes::from(raw);
            prop_assert_eq!(decode_event(raw.clone()).map_err(|_| ()), by_prost(raw));
        }
    }

    #[test]
    fn invalid_utf8_text_is_prost_error() {
        // RunEvent.delta (11) holding TextDelta.text (1) of one byte 0xff.
        let raw = Bytes::from_static(&[0x5a, 0x03, 0x0a, 0x01, 0xff]);
        assert!(decode_event(raw.clone()).is_err());
        assert!(by_prost(raw).is_err());
    }
}
