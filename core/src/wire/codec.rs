//! Sans-IO frame codec: u32 big-endian length, then one `Envelope`.
// SKELETON — to be completed by the wire helper.

use bytes::BytesMut;

use super::pb::Envelope;

/// Default maximum frame size (payload bytes, excluding the 4-byte prefix).
pub const DEFAULT_MAX_FRAME_BYTES: usize = 16 * 1024 * 1024;

/// Frame decode/encode failures.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// Declared frame length above the maximum (checked before reading the body).
    #[error("frame of {len} bytes exceeds the maximum of {max}")]
    FrameTooLarge {
        /// Declared length.
        len: usize,
        /// Configured maximum.
        max: usize,
    },
    /// The frame body is not a valid Envelope.
    #[error("malformed frame: {0}")]
    Malformed(#[from] prost::DecodeError),
    /// An Envelope without a body.
    #[error("frame has no body")]
    EmptyEnvelope,
}

/// Appends one frame holding `msg` to `out`.
pub fn encode(msg: &Envelope, out: &mut BytesMut, max_frame_bytes: usize) -> Result<(), WireError> {
    let _ = (msg, out, max_frame_bytes);
    unimplemented!()
}

/// Decodes one frame from the front of `buf`: `Ok(None)` (buf untouched) when
/// more bytes are needed; on success the frame's bytes are removed from `buf`.
pub fn decode(buf: &mut BytesMut, max_frame_bytes: usize) -> Result<Option<Envelope>, WireError> {
    let _ = (buf, max_frame_bytes);
    unimplemented!()
}
