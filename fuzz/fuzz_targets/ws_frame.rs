//! `ws::Reader` over arbitrary client bytes pushed in arbitrary chunks.
//!
//! Input: `[max frame selector, max message selector, split seed, bytes...]`
//! (a selector `b` gives `b` bytes, or `(b & 0x7f) * 64` with bit 7 set).
//! Invariants: never panics; while waiting for input the caller's buffer
//! holds less than one frame (header + `max_frame_bytes`) and the reader at
//! most `max_message_bytes`; messages respect the limits, text is UTF-8,
//! control payloads are at most 125 bytes, close codes are valid; an error
//! is final; pushing in chunks and byte by byte gives the same messages and
//! error as pushing all at once; every message written back with the server
//! writers (then masked) reads back the same.
#![no_main]

use bytes::BytesMut;
use iop_core::ws::frame::{MAX_CONTROL_PAYLOAD, MAX_HEADER_BYTES};
use iop_core::ws::{close_code, write, Limits, Message, Reader, WsError};
use iop_fuzz::{chunks, params};
use libfuzzer_sys::fuzz_target;

fn limit(sel: u8) -> usize {
    if sel & 0x80 != 0 {
        usize::from(sel & 0x7f) * 64
    } else {
        usize::from(sel)
    }
}

fn check(m: &Message, lim: Limits) {
    match m {
        Message::Text(b) => {
            assert!(b.len() <= lim.max_message_bytes);
            assert!(std::str::from_utf8(b).is_ok(), "text is not UTF-8");
        }
        Message::Binary(b) => assert!(b.len() <= lim.max_message_bytes),
        Message::Ping(b) | Message::Pong(b) => {
            assert!(b.len() <= MAX_CONTROL_PAYLOAD.min(lim.max_frame_bytes));
        }
        Message::Close(c) => {
            if let Some((code, reason)) = c {
                assert!(close_code::is_valid(*code), "close code {code}");
                assert!(2 + reason.len() <= MAX_CONTROL_PAYLOAD.min(lim.max_frame_bytes));
            }
        }
    }
}

fn run(pieces: &[&[u8]], lim: Limits) -> (Vec<Message>, Option<WsError>) {
    let mut r = Reader::new(lim);
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    for piece in pieces {
        buf.extend_from_slice(piece);
        loop {
            match r.read(&mut buf) {
                Ok(Some(m)) => {
                    check(&m, lim);
                    out.push(m);
                }
                Ok(None) => {
                    assert!(
                        buf.len() < MAX_HEADER_BYTES + lim.max_frame_bytes,
                        "{} bytes left in the buffer with {lim:?}",
                        buf.len()
                    );
                    assert!(r.buffered() <= lim.max_message_bytes, "reader holds {} with {lim:?}", r.buffered());
                    break;
                }
                Err(e) => {
                    assert!(!e.to_string().is_empty());
                    assert!(matches!(e.close_code(), 1002 | 1007 | 1009));
                    assert_eq!(r.buffered(), 0, "an error keeps a partial message");
                    assert_eq!(r.read(&mut buf), Err(e.clone()), "an error is not final");
                    return (out, Some(e));
                }
            }
        }
    }
    (out, None)
}

/// The unmasked server frames in `server`, masked with `key`.
fn masked(server: &[u8], key: [u8; 4]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut rest = server;
    while let [_, b1, ..] = *rest {
        let (len, header) = match b1 & 0x7f {
            126 => (usize::from(u16::from_be_bytes([rest[2], rest[3]])), 4),
            127 => {
                let mut n = [0; 8];
                n.copy_from_slice(&rest[2..10]);
                (usize::try_from(u64::from_be_bytes(n)).expect("length"), 10)
            }
            n => (usize::from(n), 2),
        };
        assert_eq!(b1 & 0x80, 0, "a server frame is masked");
        out.extend_from_slice(&rest[..header]);
        let at = out.len();
        out[at - header + 1] |= 0x80;
        out.extend_from_slice(&key);
        out.extend(rest[header..header + len].iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
        rest = &rest[header + len..];
    }
    out
}

fn rewrite(m: &Message, key: [u8; 4]) {
    let mut out = BytesMut::new();
    match m {
        Message::Text(b) => write::text(&mut out, b),
        Message::Binary(b) => write::binary(&mut out, b),
        Message::Ping(b) => write::ping(&mut out, b),
        Message::Pong(b) => write::pong(&mut out, b),
        Message::Close(Some((code, reason))) => write::close(&mut out, *code, reason),
        // The writer always sends a code.
        Message::Close(None) => return,
    }
    let input = masked(&out, key);
    let (back, err) = run(&[&input], Limits::default());
    assert_eq!(err, None, "a written message does not read back");
    assert_eq!(back.as_slice(), std::slice::from_ref(m), "write + read changed the message");
}

fuzz_target!(|input: &[u8]| {
    let Some(([frame_sel, message_sel, split], data)) = params::<3>(input) else { return };
    let lim = Limits { max_frame_bytes: limit(frame_sel), max_message_bytes: limit(message_sel) };
    let whole = run(&[data], lim);
    let key = [frame_sel, message_sel, split, 0x5a];
    for m in &whole.0 {
        rewrite(m, key);
    }
    let split = run(&chunks(split, data), lim);
    assert_eq!(split, whole, "chunked pushing changed the result");
    let bytewise: Vec<&[u8]> = data.chunks(1).collect();
    assert_eq!(run(&bytewise, lim), whole, "byte-by-byte pushing changed the result");
});
