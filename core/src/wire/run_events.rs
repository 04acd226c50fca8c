//! A `RunEvents` frame decoded by hand: what a node sends for each read of
//! its provider, so the edge's most frequent frame. prost grows the
//! events' vector push by push and goes through its generic field merging
//! for every event; here the frame is walked once to check and count it,
//! then once to slice its events into a vector sized at once. Anything but
//! the plain shape is left to prost, so every verdict stays prost's.

use bytes::Bytes;
use prost::encoding::{decode_key, decode_varint, WireType};

use super::pb::{envelope::Body, Envelope, RunEvents};

// Envelope.run_events = 24; RunEvents.run_id = 1, .seq = 2, .events = 3.
const RUN_EVENTS: u32 = 24;
const RUN_ID: u32 = 1;
const SEQ: u32 = 2;
const EVENT: u32 = 3;

/// The envelope of `payload` (a frame without its length prefix) when it
/// is a `RunEvents` and nothing else, as prost would decode it; `None`
/// for anything else, which prost must decode (and judge).
pub fn run_events_by_hand(payload: &Bytes) -> Option<Envelope> {
    // Field 24, length-delimited, as prost writes its key: a byte tells.
    if payload.first() != Some(&0xc2) {
        return None;
    }
    let mut buf = &payload[..];
    if decode_key(&mut buf).ok()? != (RUN_EVENTS, WireType::LengthDelimited) {
        return None;
    }
    let len = usize::try_from(decode_varint(&mut buf).ok()?).ok()?;
    if len != buf.len() {
        return None;
    }
    let at = payload.len() - len;
    let (mut run_id, mut seq, mut count) = (None, 0, 0usize);
    walk(payload, at, |field| match field {
        Field::RunId(range) => run_id = Some(range),
        Field::Seq(n) => seq = n,
        Field::Event(_) => count += 1,
    })?;
    let mut events = Vec::with_capacity(count);
    walk(payload, at, |field| {
        if let Field::Event(range) = field {
            events.push(payload.slice(range));
        }
    })?;
    let run_id = run_id.map_or_else(Bytes::new, |r| payload.slice(r));
    Some(Envelope { body: Some(Body::RunEvents(RunEvents { run_id, seq, events })), ..Default::default() })
}

/// One field of the `RunEvents` message.
enum Field {
    RunId(std::ops::Range<usize>),
    Seq(u64),
    Event(std::ops::Range<usize>),
}

// The keys of the three fields, each one byte as prost writes them; any
// other encoding is prost's to read.
const RUN_ID_KEY: u8 = (RUN_ID << 3) as u8 | 2;
const SEQ_KEY: u8 = (SEQ << 3) as u8;
const EVENT_KEY: u8 = (EVENT << 3) as u8 | 2;

/// Hands each field of the `RunEvents` message from `at` to the payload's
/// end to `each`; `None` at a field not of the plain shape.
fn walk(payload: &[u8], mut at: usize, mut each: impl FnMut(Field)) -> Option<()> {
    while let Some(&key) = payload.get(at) {
        at += 1;
        let field = match key {
            SEQ_KEY => Field::Seq(varint(payload, &mut at)?),
            RUN_ID_KEY | EVENT_KEY => {
                let len = usize::try_from(varint(payload, &mut at)?).ok()?;
                let end = at.checked_add(len).filter(|&end| end <= payload.len())?;
                let range = at..end;
                at = end;
                if key == RUN_ID_KEY {
                    Field::RunId(range)
                } else {
                    Field::Event(range)
                }
            }
            _ => return None,
        };
        each(field);
    }
    Some(())
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
