//! Server side: reading client frames (RFC 6455 §5) into messages.

use bytes::{Buf, Bytes, BytesMut};

use super::{close_code, WsError};

pub(crate) const FIN: u8 = 0x80;
const RSV: u8 = 0x70;
const MASK: u8 = 0x80;

pub(crate) const OP_CONTINUATION: u8 = 0x0;
pub(crate) const OP_TEXT: u8 = 0x1;
pub(crate) const OP_BINARY: u8 = 0x2;
pub(crate) const OP_CLOSE: u8 = 0x8;
pub(crate) const OP_PING: u8 = 0x9;
pub(crate) const OP_PONG: u8 = 0xA;

/// The largest payload of a control frame (§5.5).
pub const MAX_CONTROL_PAYLOAD: usize = 125;

/// The longest frame header: 2 bytes, a 64-bit length and the mask key.
pub const MAX_HEADER_BYTES: usize = 14;

/// Size limits of the reader. Both are checked from a frame's header, before
/// any of its payload is buffered, and refused with close code 1009.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest payload of one frame, data or control. The caller's read
    /// buffer never needs to hold more than this plus
    /// [`MAX_HEADER_BYTES`] to make progress.
    pub max_frame_bytes: usize,
    /// Largest message: the payloads of all fragments of one text or binary
    /// message together (an unfragmented message is one frame). This is the
    /// most the reader itself holds between calls.
    pub max_message_bytes: usize,
}

impl Default for Limits {
    /// 4 MiB each, as the HTTP body limit: clients send a message in one frame.
    fn default() -> Self {
        Self { max_frame_bytes: 4 * 1024 * 1024, max_message_bytes: 4 * 1024 * 1024 }
    }
}

/// A message from the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// A text message; the bytes are valid UTF-8 (checked).
    Text(Bytes),
    /// A binary message.
    Binary(Bytes),
    /// A ping (at most 125 bytes): answer with a pong carrying the same payload.
    Ping(Bytes),
    /// A pong (at most 125 bytes).
    Pong(Bytes),
    /// A Close frame: its code (valid per §7.4) and UTF-8 reason, or `None`
    /// for an empty payload. After it the reader reads nothing more.
    Close(Option<(u16, String)>),
}

/// The parsed header of one frame.
#[derive(Debug)]
struct Header {
    fin: bool,
    opcode: u8,
    header_len: usize,
    payload_len: usize,
    mask: [u8; 4],
}

/// An unfinished fragmented message.
#[derive(Debug)]
struct Partial {
    text: bool,
    data: BytesMut,
    /// For text: `data[..utf8_checked]` is valid UTF-8 and ends on a char
    /// boundary; the rest is at most an incomplete sequence.
    utf8_checked: usize,
}

impl Partial {
    /// Checks the new bytes of a text message: invalid UTF-8 fails at once,
    /// an incomplete sequence at the end only when the message is finished.
    fn check_utf8(&mut self, fin: bool) -> Result<(), WsError> {
        if !self.text {
            return Ok(());
        }
        let tail = self.data.get(self.utf8_checked..).unwrap_or_default();
        match std::str::from_utf8(tail) {
            Ok(_) => {
                self.utf8_checked = self.data.len();
                Ok(())
            }
            Err(e) if e.error_len().is_none() && !fin => {
                self.utf8_checked += e.valid_up_to();
                Ok(())
            }
            Err(_) => Err(WsError::InvalidUtf8),
        }
    }
}

/// Reads client frames off the front of a read buffer the caller fills.
///
/// Call [`read`](Reader::read) after each read from the socket until it
/// returns `Ok(None)`. Whole frames are consumed from the buffer; a frame
/// still arriving is left there, its header checked (limits included) as
/// soon as it is complete. The reader holds the fragments of one unfinished
/// message, at most [`Limits::max_message_bytes`] ([`buffered`](Reader::buffered)).
/// An error is final: later calls return it again.
#[derive(Debug)]
pub struct Reader {
    limits: Limits,
    partial: Option<Partial>,
    closed: bool,
    failed: Option<WsError>,
}

impl Reader {
    /// A reader for a new connection.
    pub fn new(limits: Limits) -> Self {
        Self { limits, partial: None, closed: false, failed: None }
    }

    /// The next message from `buf`, consuming the frames it came in (and any
    /// fragments and control frames before it). `Ok(None)` means more bytes
    /// are needed; then `buf` holds less than one frame, at most
    /// [`MAX_HEADER_BYTES`] + [`Limits::max_frame_bytes`] bytes. After a
    /// Close message, everything is discarded and `Ok(None)` returned.
    pub fn read(&mut self, buf: &mut BytesMut) -> Result<Option<Message>, WsError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if self.closed {
            buf.clear();
            return Ok(None);
        }
        let out = self.read_frames(buf);
        if let Err(e) = &out {
            self.partial = None;
            self.failed = Some(e.clone());
        }
        out
    }

    /// Bytes of an unfinished fragmented message held by the reader.
    pub fn buffered(&self) -> usize {
        self.partial.as_ref().map_or(0, |p| p.data.len())
    }

    /// Whether a Close frame was read.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// The limits this reader enforces.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    fn read_frames(&mut self, buf: &mut BytesMut) -> Result<Option<Message>, WsError> {
        loop {
            let Some(h) = self.header(buf)? else { return Ok(None) };
            if buf.len() < h.header_len.saturating_add(h.payload_len) {
                return Ok(None);
            }
            buf.advance(h.header_len);
            let mut payload = buf.split_to(h.payload_len);
            unmask(&mut payload, h.mask);
            match h.opcode {
                // Control payloads are copied (≤ 125 bytes) so that they do
                // not keep the read buffer's allocation alive.
                OP_PING => return Ok(Some(Message::Ping(Bytes::copy_from_slice(&payload)))),
                OP_PONG => return Ok(Some(Message::Pong(Bytes::copy_from_slice(&payload)))),
                OP_CLOSE => {
                    let close = parse_close(&payload)?;
                    self.closed = true;
                    buf.clear();
                    return Ok(Some(Message::Close(close)));
                }
                OP_TEXT | OP_BINARY => {
                    let mut p = Partial { text: h.opcode == OP_TEXT, data: payload, utf8_checked: 0 };
                    p.check_utf8(h.fin)?;
                    if h.fin {
                        return Ok(Some(finish(p)));
                    }
                    self.partial = Some(p);
                }
                _ => {
                    // A continuation: `header` refused one with nothing started.
                    let Some(p) = self.partial.as_mut() else { return Err(WsError::UnexpectedContinuation) };
                    p.data.extend_from_slice(&payload);
                    p.check_utf8(h.fin)?;
                    if h.fin {
                        if let Some(p) = self.partial.take() {
                            return Ok(Some(finish(p)));
                        }
                    }
                }
            }
        }
    }

    /// Parses and checks the header at the front of `buf`: every rule that
    /// its first two bytes decide as soon as they are there, the length
    /// limits as soon as the length is, the mask key last. `Ok(None)`: the
    /// header is incomplete.
    fn header(&self, buf: &[u8]) -> Result<Option<Header>, WsError> {
        let [b0, b1, ..] = *buf else { return Ok(None) };
        if b0 & RSV != 0 {
            return Err(WsError::ReservedBits);
        }
        let fin = b0 & FIN != 0;
        let opcode = b0 & 0x0F;
        if !matches!(opcode, OP_CONTINUATION | OP_TEXT | OP_BINARY | OP_CLOSE | OP_PING | OP_PONG) {
            return Err(WsError::ReservedOpcode(opcode));
        }
        if b1 & MASK == 0 {
            return Err(WsError::Unmasked);
        }
        let len7 = b1 & 0x7F;
        let control = opcode & 0x08 != 0;
        if control {
            if !fin {
                return Err(WsError::FragmentedControl);
            }
            if usize::from(len7) > MAX_CONTROL_PAYLOAD {
                return Err(WsError::ControlTooLong);
            }
        } else {
            match (opcode, self.partial.is_some()) {
                (OP_CONTINUATION, false) => return Err(WsError::UnexpectedContinuation),
                (OP_TEXT | OP_BINARY, true) => return Err(WsError::ExpectedContinuation),
                _ => {}
            }
        }
        let ext = match len7 {
            126 => 2,
            127 => 8,
            _ => 0,
        };
        let Some(ext_bytes) = buf.get(2..2 + ext) else { return Ok(None) };
        let len = match *ext_bytes {
            [a, b] => u64::from(u16::from_be_bytes([a, b])),
            [a, b, c, d, e, f, g, h] => u64::from_be_bytes([a, b, c, d, e, f, g, h]),
            _ => u64::from(len7),
        };
        // Non-minimal length encodings are accepted: they are unambiguous.
        if len >> 63 != 0 {
            return Err(WsError::InvalidLength);
        }
        let max_frame = self.limits.max_frame_bytes;
        let payload_len = match usize::try_from(len) {
            Ok(n) if n <= max_frame => n,
            _ => return Err(WsError::FrameTooBig { len, max: max_frame }),
        };
        if !control {
            let max = self.limits.max_message_bytes;
            let held = self.buffered();
            if payload_len > max.saturating_sub(held) {
                return Err(WsError::MessageTooBig { len: (held as u64).saturating_add(len), max });
            }
        }
        let header_len = 2 + ext + 4;
        let Some(&[k0, k1, k2, k3]) = buf.get(2 + ext..header_len) else { return Ok(None) };
        Ok(Some(Header { fin, opcode, header_len, payload_len, mask: [k0, k1, k2, k3] }))
    }
}

fn finish(p: Partial) -> Message {
    let data = p.data.freeze();
    if p.text {
        Message::Text(data)
    } else {
        Message::Binary(data)
    }
}

/// A Close payload: empty, or a valid code and a UTF-8 reason (§5.5.1).
fn parse_close(payload: &[u8]) -> Result<Option<(u16, String)>, WsError> {
    match payload {
        [] => Ok(None),
        [_] => Err(WsError::CloseTooShort),
        [a, b, reason @ ..] => {
            let code = u16::from_be_bytes([*a, *b]);
            if !close_code::is_valid(code) {
                return Err(WsError::InvalidCloseCode(code));
            }
            let reason = std::str::from_utf8(reason).map_err(|_| WsError::InvalidCloseReason)?;
            Ok(Some((code, reason.to_owned())))
        }
    }
}

/// XORs `data` with the 4-byte mask `key`, starting at key offset 0 (§5.3),
/// eight bytes at a time.
pub(crate) fn unmask(data: &mut [u8], key: [u8; 4]) {
    if key == [0; 4] {
        return;
    }
    let [a, b, c, d] = key;
    let wide = u64::from_ne_bytes([a, b, c, d, a, b, c, d]);
    let (words, tail) = data.as_chunks_mut::<8>();
    for w in words {
        *w = (u64::from_ne_bytes(*w) ^ wide).to_ne_bytes();
    }
    // The tail starts at a multiple of 8, so at key offset 0.
    for (byte, k) in tail.iter_mut().zip(key.iter().cycle()) {
        *byte ^= k;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#[path = "frame_tests.rs"]
mod tests;
