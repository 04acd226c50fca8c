//! A run's events sliced from their frame by hand: what a node sends for
//! each read of its provider (a `RunEvents` frame) or for a lone token of
//! a paced stream (a `RunEvent` frame holding a short text), so the edge's
//! most frequent frames. prost would grow a vector of events push by push,
//! or make a string of a lone token, and go through its generic field
//! merging for each; here the frame is walked once to check and count it,
//! and its events are handed out as slices of it, one by one (nothing
//! allocated). Anything but the plain shapes is left to prost, so every
//! verdict stays prost's.

use bytes::Bytes;
use prost::encoding::{decode_key, decode_varint, WireType};

use super::pb::{self, envelope::Body, Envelope, RunEvents};

// Envelope.run_events = 24; RunEvents.run_id = 1, .seq = 2, .events = 3.
const RUN_EVENTS: u32 = 24;
const RUN_ID: u32 = 1;
const SEQ: u32 = 2;
const EVENT: u32 = 3;
// Envelope.run_event = 21 (RunEvent.run_id = 1, .seq = 2 as above).
const RUN_EVENT: u32 = 21;

/// A run's consecutive events as one frame brought them: slices of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunFrame {
    /// The run id's bytes (UTF-8 unless the node is broken).
    pub run_id: Bytes,
    /// The first event's sequence number.
    pub seq: u64,
    /// The frame's payload.
    payload: Bytes,
    /// Where its events are: a `RunEvents` message's fields (events among
    /// them), or a lone event's bytes.
    at: usize,
    /// How many events.
    count: usize,
    /// A `RunEvent` frame: its one event is `payload[at..]`.
    lone: bool,
}

impl RunFrame {
    /// How many events the frame holds.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether the frame holds no event.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The events in order, each an encoded `RunEvent` with no id and
    /// sequence number 0, sliced from the frame.
    pub fn events(&self) -> Events<'_> {
        Events { frame: self, at: self.at, left: self.count }
    }

    /// The envelope prost decodes from the same frame.
    pub fn into_envelope(self) -> Envelope {
        let body = if self.lone {
            let kind = super::event::short_text_parts(&self.payload[self.at..]).and_then(|(kind, text)| {
                let text = std::str::from_utf8(text).ok()?.to_owned();
                Some(match kind {
                    crate::exec::TextKind::Content => pb::run_event::Kind::Delta(pb::TextDelta { text }),
                    crate::exec::TextKind::Reasoning => pb::run_event::Kind::ReasoningDelta(pb::TextDelta { text }),
                })
            });
            Body::RunEvent(pb::RunEvent { run_id: self.run_id, seq: self.seq, kind, ..Default::default() })
        } else {
            let mut events = Vec::with_capacity(self.count);
            events.extend(self.events());
            Body::RunEvents(RunEvents { run_id: self.run_id, seq: self.seq, events })
        };
        Envelope { correlation_id: 0, body: Some(body) }
    }
}

/// The events of a [`RunFrame`], in order.
pub struct Events<'a> {
    frame: &'a RunFrame,
    at: usize,
    left: usize,
}

impl Iterator for Events<'_> {
    type Item = Bytes;

    fn next(&mut self) -> Option<Bytes> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let payload = &self.frame.payload;
        if self.frame.lone {
            return Some(payload.slice(self.at..));
        }
        // Checked when the frame was read: every field is of the plain shape.
        let mut event = None;
        walk_from(payload, &mut self.at, |field| {
            if let Field::Event(range) = field {
                event = Some(range);
                return false;
            }
            true
        });
        match event {
            Some(range) => Some(payload.slice(range)),
            None => {
                self.left = 0;
                None
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for Events<'_> {}

/// The run events of `payload` (a frame without its length prefix) when
/// it is a `RunEvents` of the plain shape, or a `RunEvent` of a short text
/// and nothing else, as prost would decode them; `None` for anything else,
/// which prost must decode (and judge).
pub fn run_frame_by_hand(payload: &Bytes) -> Option<RunFrame> {
    // Field 24 or 21, length-delimited, as prost writes its key: two bytes tell.
    let lone = match payload.get(..2)? {
        [0xc2, 0x01] => false,
        [0xaa, 0x01] => true,
        _ => return None,
    };
    let mut buf = &payload[..];
    let want = if lone { RUN_EVENT } else { RUN_EVENTS };
    if decode_key(&mut buf).ok()? != (want, WireType::LengthDelimited) {
        return None;
    }
    let len = usize::try_from(decode_varint(&mut buf).ok()?).ok()?;
    if len != buf.len() {
        return None;
    }
    let mut at = payload.len() - len;
    let (mut run_id, mut seq, mut count) = (None, 0, 0usize);
    if lone {
        // The id and number, then the event: exactly one short text.
        while let Some(&key @ (RUN_ID_KEY | SEQ_KEY)) = payload.get(at) {
            at += 1;
            match field(payload, key, &mut at)? {
                Field::RunId(range) => run_id = Some(range),
                Field::Seq(n) => seq = n,
                Field::Event(_) | Field::Other => return None,
            }
        }
        let (_, text) = super::event::short_text_parts(&payload[at..])?;
        // prost refuses a text that is not UTF-8 (the frame, not the run).
        std::str::from_utf8(text).ok()?;
        count = 1;
    } else {
        let mut ok = true;
        let mut from = at;
        walk_from(payload, &mut from, |field| {
            match field {
                Field::RunId(range) => run_id = Some(range),
                Field::Seq(n) => seq = n,
                Field::Event(_) => count += 1,
                Field::Other => ok = false,
            }
            ok
        });
        if !ok || from != payload.len() {
            return None;
        }
    }
    let run_id = run_id.map_or_else(Bytes::new, |r| payload.slice(r));
    Some(RunFrame { run_id, seq, payload: payload.clone(), at, count, lone })
}

/// [`run_frame_by_hand`] as the envelope prost decodes.
pub fn run_events_by_hand(payload: &Bytes) -> Option<Envelope> {
    run_frame_by_hand(payload).map(RunFrame::into_envelope)
}

/// One field of the `RunEvents` message.
enum Field {
    RunId(std::ops::Range<usize>),
    Seq(u64),
    Event(std::ops::Range<usize>),
    /// Not of the plain shape (or cut short).
    Other,
}

// The keys of the three fields, each one byte as prost writes them; any
// other encoding is prost's to read.
const RUN_ID_KEY: u8 = (RUN_ID << 3) as u8 | 2;
const SEQ_KEY: u8 = (SEQ << 3) as u8;
const EVENT_KEY: u8 = (EVENT << 3) as u8 | 2;

/// Hands each field of the `RunEvents` message from `*at` to the payload's
/// end to `each`, until it answers false; `*at` is left after the last
/// field handed. A field not of the plain shape is [`Field::Other`].
fn walk_from(payload: &[u8], at: &mut usize, mut each: impl FnMut(Field) -> bool) {
    while let Some(&key) = payload.get(*at) {
        let mut next = *at + 1;
        let field = field(payload, key, &mut next).unwrap_or(Field::Other);
        let other = matches!(field, Field::Other);
        if !other {
            *at = next;
        }
        if !each(field) || other {
            return;
        }
    }
}

/// The field whose key `key` was at `*at - 1`; `*at` is left after it.
fn field(payload: &[u8], key: u8, at: &mut usize) -> Option<Field> {
    Some(match key {
        SEQ_KEY => Field::Seq(varint(payload, at)?),
        RUN_ID_KEY | EVENT_KEY => {
            let len = usize::try_from(varint(payload, at)?).ok()?;
            let end = at.checked_add(len).filter(|&end| end <= payload.len())?;
            let range = *at..end;
            *at = end;
            if key == RUN_ID_KEY {
                Field::RunId(range)
            } else {
                Field::Event(range)
            }
        }
        _ => return None,
    })
}

/// The varint at `at` (one byte on the common path, else prost's reading).
fn varint(payload: &[u8], at: &mut usize) -> Option<u64> {
    let first = *payload.get(*at)?;
    if first < 0x80 {
        *at += 1;
        return Some(u64::from(first));
    }
    let mut rest = payload.get(*at..)?;
    let before = rest.len();
    let n = decode_varint(&mut rest).ok()?;
    *at += before - rest.len();
    Some(n)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use proptest::prelude::*;
    use prost::Message;

    use super::*;

    fn batch(run_id: &[u8], seq: u64, events: &[&[u8]]) -> Bytes {
        let body = RunEvents {
            run_id: Bytes::copy_from_slice(run_id),
            seq,
            events: events.iter().map(|e| Bytes::copy_from_slice(e)).collect(),
        };
        Bytes::from(Envelope { correlation_id: 0, body: Some(Body::RunEvents(body)) }.encode_to_vec())
    }

    /// Whatever the hand decodes, prost decodes the same.
    fn agrees(payload: &Bytes) -> bool {
        let Some(env) = run_events_by_hand(payload) else { return false };
        assert_eq!(Envelope::decode(payload.clone()).ok(), Some(env));
        true
    }

    #[test]
    fn a_batch_as_a_node_writes_it() {
        let payload = batch(b"run-1", 7, &[b"\x5a\x03\x0a\x01a", b"", b"\x5a\x03\x0a\x01b"]);
        assert!(agrees(&payload));
        let Some(Body::RunEvents(b)) = run_events_by_hand(&payload).and_then(|e| e.body) else { panic!() };
        assert_eq!((&b.run_id[..], b.seq, b.events.len()), (&b"run-1"[..], 7, 3));
        assert_eq!(b.events.capacity(), 3, "sized at once");
        // The events are slices of the frame, not copies.
        assert!(payload.as_ptr_range().contains(&b.events[0].as_ptr()));
        // Empty fields are left out by prost's encoder: still the same.
        assert!(agrees(&batch(b"", 0, &[])));
    }

    /// A lone event's frame as a node writes it (see `encode_run_event`).
    fn lone(run_id: &str, seq: u64, ev: &crate::exec::ExecEvent) -> Bytes {
        let mut out = bytes::BytesMut::new();
        crate::wire::encode_run_event(run_id, &ev.clone().into_wire_unnamed(seq), &mut out, 1 << 20).unwrap();
        Bytes::from(out).slice(4..)
    }

    #[test]
    fn a_lone_token_is_its_frames_one_event() {
        use crate::exec::ExecEvent;
        for seq in [0, 1, 300, u64::MAX] {
            let payload = lone("run-1", seq, &ExecEvent::content("hé"));
            assert!(agrees(&payload));
            let run = run_frame_by_hand(&payload).unwrap();
            assert_eq!((&run.run_id[..], run.seq, run.len()), (&b"run-1"[..], seq, 1));
            let events: Vec<Bytes> = run.events().collect();
            assert_eq!(events, [Bytes::from(ExecEvent::content("hé").into_wire_unnamed(0).encode_to_vec())]);
            assert!(payload.as_ptr_range().contains(&events[0].as_ptr()), "a slice, not a copy");
        }
        // Anything but a short text (a long one, a terminal), or a text
        // prost refuses (not UTF-8), is prost's.
        let long = lone("r", 2, &ExecEvent::content("x".repeat(200)));
        let done = lone("r", 2, &ExecEvent::Complete { finish_reason: "stop".into(), usage: None });
        let mut bad = lone("r", 2, &ExecEvent::content("ab")).to_vec();
        let last = bad.len() - 1;
        bad[last] = 0xff;
        for payload in [long, done, Bytes::from(bad)] {
            assert!(run_frame_by_hand(&payload).is_none(), "{payload:?}");
        }
    }

    #[test]
    fn a_batchs_events_are_handed_out_one_by_one() {
        let payload = batch(b"r", 3, &[b"\x5a\x03\x0a\x01a", b"", b"\x5a\x03\x0a\x01b"]);
        let run = run_frame_by_hand(&payload).unwrap();
        let mut events = run.events();
        assert_eq!(events.len(), 3);
        assert_eq!(events.next().as_deref(), Some(&b"\x5a\x03\x0a\x01a"[..]));
        assert_eq!(events.len(), 2);
        assert_eq!(events.next().as_deref(), Some(&b""[..]));
        assert_eq!(events.next().as_deref(), Some(&b"\x5a\x03\x0a\x01b"[..]));
        assert_eq!(events.next(), None);
    }

    #[test]
    fn anything_else_is_left_to_prost() {
        let good = batch(b"r", 1, &[b"x"]);
        // Another body, a correlation id, a truncated or longer frame, an
        // unknown field inside, a field of the wrong wire type.
        let other = Envelope { correlation_id: 0, body: Some(Body::NodeDraining(Default::default())) };
        let with_cid = Envelope { correlation_id: 5, ..Envelope::decode(good.clone()).unwrap() };
        let cases = [
            Bytes::from(other.encode_to_vec()),
            Bytes::from(with_cid.encode_to_vec()),
            good.slice(..good.len() - 1),
            Bytes::from([&good[..], b"\x08\x01"].concat()),
            Bytes::from_static(b"\xc2\x01\x02\x20\x01"),
            Bytes::from_static(b"\xc2\x01\x02\x10\x01\x02"),
            Bytes::from_static(b"\xc2\x01\x02\x12\x01"),
        ];
        for payload in cases {
            assert!(run_events_by_hand(&payload).is_none(), "{payload:?}");
        }
    }

    proptest! {
        #[test]
        fn a_lone_event_the_same_as_prost(
            text in ".{0,130}",
            reasoning in any::<bool>(),
            seq in any::<u64>(),
            cut in any::<prop::sample::Index>(),
            flip in any::<prop::sample::Index>(),
            byte in any::<u8>(),
        ) {
            use crate::exec::{Delta, ExecEvent, Part};
            let part = if reasoning { Part::Reasoning(text) } else { Part::Content(text) };
            let payload = lone("run", seq, &ExecEvent::Delta(Delta { choice: 0, part, logprobs: None }));
            agrees(&payload);
            let cut = payload.slice(..cut.index(payload.len() + 1));
            agrees(&cut);
            let mut changed = payload.to_vec();
            changed[flip.index(payload.len())] = byte;
            agrees(&Bytes::from(changed));
        }

        #[test]
        fn the_same_as_prost(
            run_id in proptest::collection::vec(any::<u8>(), 0..12),
            seq in any::<u64>(),
            events in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..20), 0..20),
            cut in any::<prop::sample::Index>(),
            flip in any::<prop::sample::Index>(),
            byte in any::<u8>(),
        ) {
            let events: Vec<&[u8]> = events.iter().map(Vec::as_slice).collect();
            let payload = batch(&run_id, seq, &events);
            prop_assert!(agrees(&payload));
            let sliced: Vec<Bytes> = run_frame_by_hand(&payload).unwrap().events().collect();
            prop_assert_eq!(sliced, events.iter().map(|e| Bytes::copy_from_slice(e)).collect::<Vec<_>>());
            // Cut short or with one byte changed: the same verdict, or prost's.
            let cut = payload.slice(..cut.index(payload.len() + 1));
            agrees(&cut);
            let mut changed = payload.to_vec();
            if !changed.is_empty() {
                changed[flip.index(payload.len())] = byte;
            }
            agrees(&Bytes::from(changed));
        }
    }
}
