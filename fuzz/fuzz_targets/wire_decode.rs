//! `wire::decode` over arbitrary bytes fed in arbitrary chunks.
//!
//! Input: `[max selector, split seed, bytes...]`.
//! Invariants: never panics; `Ok(None)` leaves the buffer untouched;
//! `FrameTooLarge` consumes nothing; a decoded frame consumed exactly its
//! prefix + payload and has a body; every decoded envelope re-encodes and
//! decodes to the same value (and re-encoding is stable); chunked feeding
//! gives the same frames and error as feeding everything at once; a
//! payload the hand decoder of `RunEvents` frames accepts is what prost
//! decodes from it (the bytes after the two parameters taken as one
//! payload). Values
//! are compared by their encoding: a float may be NaN, which never equals
//! itself (`fuzz/regressions/wire_decode/`).
#![no_main]

use bytes::{Bytes, BytesMut};
use iop_core::wire::{
    decode, encode,
    pb::{envelope::Body, Envelope},
    run_frame_by_hand, WireError, DEFAULT_MAX_FRAME_BYTES,
};
use prost::Message;
use iop_fuzz::{chunks, params};
use libfuzzer_sys::fuzz_target;

const MAXES: [usize; 8] = [0, 1, 8, 64, 512, 4096, 65536, DEFAULT_MAX_FRAME_BYTES];

#[derive(Debug, PartialEq)]
struct Outcome {
    /// Each decoded frame, re-encoded.
    frames: Vec<Vec<u8>>,
    /// Display of the first error, which ends the session.
    error: Option<String>,
    /// Bytes left over when no error happened.
    leftover: Vec<u8>,
}

/// Re-encodes `env`, decodes that and encodes again: both encodings must
/// be the same bytes (the same value, NaN included). Returns the encoding.
fn roundtrip(env: &Envelope) -> Vec<u8> {
    let mut wire = BytesMut::new();
    encode(env, &mut wire, usize::MAX).expect("re-encode a decoded envelope");
    let encoded = wire.to_vec();
    let back = decode(&mut wire, usize::MAX).expect("decode re-encoded").expect("complete frame");
    assert!(wire.is_empty(), "re-encoded frame left bytes");
    let mut again = BytesMut::new();
    encode(&back, &mut again, usize::MAX).expect("encode twice");
    assert_eq!(&again[..], &encoded[..], "re-encoded envelope decodes differently");
    encoded
}

fn run(pieces: &[&[u8]], max: usize) -> Outcome {
    let mut buf = BytesMut::new();
    let mut frames = Vec::new();
    for piece in pieces {
        buf.extend_from_slice(piece);
        loop {
            let before = buf.to_vec();
            match decode(&mut buf, max) {
                Ok(Some(env)) => {
                    let declared = u32::from_be_bytes([before[0], before[1], before[2], before[3]]) as usize;
                    assert!(declared <= max);
                    assert_eq!(before.len() - buf.len(), 4 + declared, "consumed != prefix + payload");
                    assert_eq!(&before[4 + declared..], &buf[..]);
                    assert!(env.body.is_some(), "decoded envelope without body");
                    frames.push(roundtrip(&env));
                }
                Ok(None) => {
                    assert_eq!(&buf[..], &before[..], "Ok(None) touched the buffer");
                    break;
                }
                Err(e) => {
                    let msg = e.to_string();
                    assert!(!msg.is_empty());
                    match e {
                        WireError::FrameTooLarge { len, max: m } => {
                            assert_eq!(m, max);
                            assert!(len > max);
                            assert_eq!(&buf[..], &before[..], "FrameTooLarge consumed bytes");
                        }
                        WireError::Malformed(_) | WireError::EmptyEnvelope => {
                            let declared = u32::from_be_bytes([before[0], before[1], before[2], before[3]]) as usize;
                            assert_eq!(before.len() - buf.len(), 4 + declared, "bad frame not consumed");
                        }
                        WireError::Encode(_) => panic!("decode returned an encode error"),
                    }
                    return Outcome { frames, error: Some(msg), leftover: Vec::new() };
                }
            }
        }
    }
    Outcome { frames, error: None, leftover: buf.to_vec() }
}

fuzz_target!(|input: &[u8]| {
    let Some(([max_sel, split], data)) = params::<2>(input) else { return };
    let max = MAXES[usize::from(max_sel % 8)];
    let whole = run(&[data], max);
    let split = run(&chunks(split, data), max);
    assert_eq!(whole, split, "chunked feeding changed the result");
    let payload = Bytes::copy_from_slice(data);
    if let Some(run) = run_frame_by_hand(&payload) {
        // The slices handed out are the events prost decodes, in order.
        let sliced: Vec<Bytes> = run.events().collect();
        assert_eq!(sliced.len(), run.len());
        let env = run.into_envelope();
        match &env.body {
            Some(Body::RunEvents(b)) => assert_eq!(b.events, sliced),
            Some(Body::RunEvent(_)) => assert_eq!(sliced.len(), 1),
            other => panic!("a run frame became {other:?}"),
        }
        assert_eq!(Envelope::decode(payload).ok(), Some(env), "the hand decoder and prost differ");
    }
});
