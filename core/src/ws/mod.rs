//! Sans-IO WebSocket (RFC 6455) server codec; the caller owns the socket and
//! the buffers.
//!
//! - [`handshake`]: [`check_upgrade`] validates an upgrade request head
//!   (§4.2.1), [`accept_key`] computes `Sec-WebSocket-Accept`,
//!   [`write_accept`] writes the `101 Switching Protocols` head.
//! - [`frame`]: [`Reader`] takes whole client frames off the front of a read
//!   buffer and returns [`Message`]s: masking, reserved bits and opcodes,
//!   control frame rules, fragmentation, UTF-8 and close payloads are
//!   checked; [`Limits`] are enforced from a frame's header, before its
//!   payload is buffered.
//! - [`mod@write`]: unmasked server frames (text, binary, ping, pong, close).
//!
//! No extension is negotiated (so RSV bits must be 0) and no subprotocol is
//! chosen unless the caller writes one with [`handshake::write_accept_protocol`].
//! Every reader error is a [`WsError`] carrying the close code to answer with
//! ([`WsError::close_code`]) before closing the connection.

pub mod frame;
pub mod handshake;
pub mod write;

pub use frame::{Limits, Message, Reader};
pub use handshake::{accept_key, check_upgrade, write_accept, HandshakeError, HandshakeInfo};

/// Close codes (RFC 6455 §7.4.1) a server sends.
pub mod close_code {
    /// Normal closure.
    pub const NORMAL: u16 = 1000;
    /// The endpoint is going away (server shutdown).
    pub const GOING_AWAY: u16 = 1001;
    /// Protocol error.
    pub const PROTOCOL: u16 = 1002;
    /// A data type the endpoint cannot accept (e.g. binary where only text is).
    pub const UNSUPPORTED: u16 = 1003;
    /// Data inconsistent with the message type (non-UTF-8 text).
    pub const INVALID_DATA: u16 = 1007;
    /// A message that violates policy.
    pub const POLICY: u16 = 1008;
    /// A message too big to process.
    pub const TOO_BIG: u16 = 1009;
    /// An unexpected condition on the server.
    pub const INTERNAL: u16 = 1011;

    /// Whether `code` may appear in a Close frame on the wire (§7.4.1, §7.4.2):
    /// 1000-1003, 1007-1011 and the registered/private range 3000-4999.
    /// 1004-1006 and 1015 are reserved (1005/1006/1015 are never sent), the
    /// rest of 1000-2999 is reserved for future RFCs.
    pub fn is_valid(code: u16) -> bool {
        matches!(code, 1000..=1003 | 1007..=1011 | 3000..=4999)
    }
}

/// A client frame or message that breaks RFC 6455 or a [`Limits`] value.
/// The connection cannot go on: answer with a Close frame carrying
/// [`close_code`](WsError::close_code), then close.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WsError {
    /// A client frame without the mask bit (§5.1) (1002).
    #[error("unmasked client frame")]
    Unmasked,
    /// RSV1-3 set with no extension negotiated (1002).
    #[error("reserved bits set")]
    ReservedBits,
    /// Opcode 0x3-0x7 or 0xB-0xF (1002).
    #[error("reserved opcode {0:#x}")]
    ReservedOpcode(u8),
    /// A control frame with a payload over 125 bytes (1002).
    #[error("control frame longer than 125 bytes")]
    ControlTooLong,
    /// A control frame with FIN = 0 (1002).
    #[error("fragmented control frame")]
    FragmentedControl,
    /// A continuation frame with no fragmented message started (1002).
    #[error("continuation frame without a message started")]
    UnexpectedContinuation,
    /// A text or binary frame while a fragmented message is unfinished (1002).
    #[error("new data frame inside a fragmented message")]
    ExpectedContinuation,
    /// A 64-bit payload length with its most significant bit set (§5.2) (1002).
    #[error("payload length with the most significant bit set")]
    InvalidLength,
    /// A Close payload of one byte (1002).
    #[error("close payload of one byte")]
    CloseTooShort,
    /// A Close code that may not be sent (§7.4) (1002).
    #[error("invalid close code {0}")]
    InvalidCloseCode(u16),
    /// A frame's payload over [`Limits::max_frame_bytes`] (1009).
    #[error("frame of {len} bytes over the limit of {max}")]
    FrameTooBig {
        /// The payload length the header announced.
        len: u64,
        /// The limit.
        max: usize,
    },
    /// A message (all its fragments) over [`Limits::max_message_bytes`] (1009).
    #[error("message of {len} bytes over the limit of {max}")]
    MessageTooBig {
        /// The message length with this frame's payload.
        len: u64,
        /// The limit.
        max: usize,
    },
    /// A text message that is not UTF-8 (1007).
    #[error("text message is not valid UTF-8")]
    InvalidUtf8,
    /// A Close reason that is not UTF-8 (1007).
    #[error("close reason is not valid UTF-8")]
    InvalidCloseReason,
}

impl WsError {
    /// The close code to send in the server's Close frame.
    pub fn close_code(&self) -> u16 {
        match self {
            WsError::FrameTooBig { .. } | WsError::MessageTooBig { .. } => close_code::TOO_BIG,
            WsError::InvalidUtf8 | WsError::InvalidCloseReason => close_code::INVALID_DATA,
            WsError::Unmasked
            | WsError::ReservedBits
            | WsError::ReservedOpcode(_)
            | WsError::ControlTooLong
            | WsError::FragmentedControl
            | WsError::UnexpectedContinuation
            | WsError::ExpectedContinuation
            | WsError::InvalidLength
            | WsError::CloseTooShort
            | WsError::InvalidCloseCode(_) => close_code::PROTOCOL,
        }
    }

    /// A stable, low-cardinality label for logs and metrics.
    pub fn code(&self) -> &'static str {
        match self {
            WsError::FrameTooBig { .. } | WsError::MessageTooBig { .. } => "ws_too_big",
            WsError::InvalidUtf8 | WsError::InvalidCloseReason => "ws_invalid_utf8",
            _ => "ws_protocol_error",
        }
    }
}
