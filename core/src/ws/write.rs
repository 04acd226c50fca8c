//! Server side: writing frames. Server frames are never masked (§5.1) and
//! always final (one message, one frame); the payload length takes the
//! shortest of the 7-, 16- and 64-bit encodings (§5.2).

use bytes::{BufMut, BytesMut};

use super::frame::{FIN, MAX_CONTROL_PAYLOAD, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG, OP_TEXT};

/// Appends a text frame. `payload` must be UTF-8 (the caller's JSON is).
pub fn text(out: &mut BytesMut, payload: &[u8]) {
    frame(out, OP_TEXT, payload);
}

/// Appends a binary frame.
pub fn binary(out: &mut BytesMut, payload: &[u8]) {
    frame(out, OP_BINARY, payload);
}

/// Appends only the header of a text frame whose `len` payload bytes the
/// caller appends (or gathers) next.
pub fn text_header(out: &mut BytesMut, len: usize) {
    header(out, OP_TEXT, len);
}

/// Appends a ping; `payload` is cut to 125 bytes (a control frame's most).
pub fn ping(out: &mut BytesMut, payload: &[u8]) {
    frame(out, OP_PING, control(payload));
}

/// Appends a pong, the answer to a ping with its payload; `payload` is cut
/// to 125 bytes (a control frame's most, which a read ping never exceeds).
pub fn pong(out: &mut BytesMut, payload: &[u8]) {
    frame(out, OP_PONG, control(payload));
}

/// Appends a Close frame with `code` and `reason`; the reason is cut at a
/// char boundary to the 123 bytes that fit. `code` should be one that may
/// be sent (see [`super::close_code::is_valid`]).
pub fn close(out: &mut BytesMut, code: u16, reason: &str) {
    let max = MAX_CONTROL_PAYLOAD - 2;
    let mut end = reason.len().min(max);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    let reason = reason.get(..end).unwrap_or_default().as_bytes();
    header(out, OP_CLOSE, 2 + reason.len());
    out.put_u16(code);
    out.extend_from_slice(reason);
}

fn control(payload: &[u8]) -> &[u8] {
    payload.get(..MAX_CONTROL_PAYLOAD).unwrap_or(payload)
}

fn frame(out: &mut BytesMut, opcode: u8, payload: &[u8]) {
    header(out, opcode, payload.len());
    out.extend_from_slice(payload);
}

fn header(out: &mut BytesMut, opcode: u8, len: usize) {
    out.reserve(10 + len);
    out.put_u8(FIN | opcode);
    match (u8::try_from(len), u16::try_from(len)) {
        (Ok(n), _) if n < 126 => out.put_u8(n),
        (_, Ok(n)) => {
            out.put_u8(126);
            out.put_u16(n);
        }
        _ => {
            out.put_u8(127);
            out.put_u64(len as u64);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn rfc_examples() {
        // RFC 6455 §5.7: a single-frame unmasked text message "Hello".
        let mut out = BytesMut::new();
        text(&mut out, b"Hello");
        assert_eq!(&out[..], &[0x81, 0x05, 0x48, 0x65, 0x6c, 0x6c, 0x6f]);
        // An unmasked ping "Hello".
        let mut out = BytesMut::new();
        ping(&mut out, b"Hello");
        assert_eq!(&out[..], &[0x89, 0x05, 0x48, 0x65, 0x6c, 0x6c, 0x6f]);
        // 256 bytes of binary: a 16-bit length.
        let mut out = BytesMut::new();
        binary(&mut out, &[7; 256]);
        assert_eq!(&out[..4], &[0x82, 0x7E, 0x01, 0x00]);
        assert_eq!(out.len(), 4 + 256);
        // 64 KiB of binary: a 64-bit length.
        let mut out = BytesMut::new();
        binary(&mut out, &vec![7; 65536]);
        assert_eq!(&out[..10], &[0x82, 0x7F, 0, 0, 0, 0, 0, 0x01, 0x00, 0x00]);
        assert_eq!(out.len(), 10 + 65536);
    }

    #[test]
    fn length_encoding_edges() {
        for (len, header_len, second) in [(0, 2, 0), (125, 2, 125), (126, 4, 126), (65535, 4, 126), (65536, 10, 127)] {
            let mut out = BytesMut::new();
            text(&mut out, &vec![b'a'; len]);
            assert_eq!(out.len(), header_len + len, "{len}");
            assert_eq!(out[1], second, "{len}");
            let mut h = BytesMut::new();
            text_header(&mut h, len);
            assert_eq!(&h[..], &out[..header_len]);
        }
    }

    #[test]
    fn control_frames_fit() {
        let mut out = BytesMut::new();
        pong(&mut out, &[1; 200]);
        assert_eq!(&out[..2], &[0x8A, 125]);
        assert_eq!(out.len(), 2 + 125);

        let mut out = BytesMut::new();
        close(&mut out, 1000, "");
        assert_eq!(&out[..], &[0x88, 0x02, 0x03, 0xE8]);

        // "é" is two bytes: 62 of them are 124 bytes, cut to 61 (122 bytes).
        let mut out = BytesMut::new();
        close(&mut out, 1009, &"é".repeat(62));
        assert_eq!(out[1], 2 + 122);
        assert!(std::str::from_utf8(&out[4..]).is_ok());
    }
}
