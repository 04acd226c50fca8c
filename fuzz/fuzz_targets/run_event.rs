//! `wire::decode_event` (one event of a `RunEvents` batch, a plain delta
//! decoded by hand) over arbitrary bytes.
//!
//! Input: the whole input is the event's bytes.
//! Invariant: the same verdict as prost's decoding then
//! `ExecEvent::from_wire` (the edge's way before): the same event, no kind
//! for both, or an error for both. Events are compared by their `Debug`
//! text (an embedding value may be NaN, which never equals itself).
#![no_main]

use bytes::Bytes;
use iop_core::{exec::ExecEvent, wire::{decode_event, pb}};
use libfuzzer_sys::fuzz_target;
use prost::Message;

fuzz_target!(|input: &[u8]| {
    let raw = Bytes::copy_from_slice(input);
    let by_hand = decode_event(raw.clone()).map(|e| format!("{e:?}")).map_err(|_| ());
    let by_prost = pb::RunEvent::decode(raw).map(|e| format!("{:?}", ExecEvent::from_wire(e))).map_err(|_| ());
    assert_eq!(by_hand, by_prost);
});
