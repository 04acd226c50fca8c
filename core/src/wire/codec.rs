//! Sans-IO frame codec: u32 big-endian length, then one `Envelope`.
//!
//! The length counts only the payload (not the 4-byte prefix). Both sides
//! enforce a hard maximum so a peer can never make us buffer an unbounded
//! frame: `decode` rejects an oversize frame as soon as its prefix arrives,
//! and never allocates for a length it was only announced.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use prost::Message;

use super::{pb::Envelope, run_events::RunFrame};
use crate::http::HeaderName;

/// Default maximum frame size (payload bytes, excluding the 4-byte prefix).
pub const DEFAULT_MAX_FRAME_BYTES: usize = 16 * 1024 * 1024;

/// Bytes of the length prefix.
const PREFIX_LEN: usize = 4;

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
    /// The output buffer could not take the message (cannot happen with a
    /// growable `BytesMut`; kept so encoding never needs to panic).
    #[error("encode failed: {0}")]
    Encode(#[from] prost::EncodeError),
}

/// Appends one frame holding `msg` to `out`.
///
/// Refuses (before writing anything) a message whose encoded length exceeds
/// `max_frame_bytes`, so the peer's decoder would never see it.
pub fn encode(msg: &Envelope, out: &mut BytesMut, max_frame_bytes: usize) -> Result<(), WireError> {
    let len = msg.encoded_len();
    // The prefix is a u32: a larger max must not let a length wrap around.
    let prefix = frame_prefix(len, max_frame_bytes)?;
    out.reserve(PREFIX_LEN + len);
    out.put_u32(prefix);
    msg.encode(out)?;
    Ok(())
}

// Field numbers of runtime.proto: Envelope.run_event = 21; RunEvent.run_id = 1.
const RUN_EVENT: u32 = 21;
const RUN_ID: u32 = 1;

/// Appends the frame of run event `ev` of run `run_id` (correlation id 0):
/// the same bytes as [`encode`] of that envelope with `ev.run_id` set, the
/// id written from the caller's `&str` rather than from a `String` made
/// for each event. `ev.run_id` must be empty.
pub fn encode_run_event(
    run_id: &str,
    ev: &super::pb::RunEvent,
    out: &mut BytesMut,
    max_frame_bytes: usize,
) -> Result<(), WireError> {
    debug_assert!(ev.run_id.is_empty(), "the id is written from `run_id`");
    let inner = opt_field_len(RUN_ID, run_id.len()) + ev.encoded_len();
    put_run_head(out, RUN_EVENT, inner, run_id, max_frame_bytes)?;
    // Proto3 leaves the empty id out, so the rest follows as prost writes it.
    ev.encode_raw(out);
    Ok(())
}

// Field numbers of runtime.proto: Envelope.run_events = 24; RunEvents.run_id
// = 1, .seq = 2, .events = 3.
const RUN_EVENTS: u32 = 24;
const EVENTS_SEQ: u32 = 2;
const EVENTS_EVENT: u32 = 3;

/// Appends the frame of `events`, consecutive events of run `run_id` from
/// number `seq` on (correlation id 0): the same bytes as [`encode`] of the
/// `RunEvents` envelope whose events are each `into_wire_unnamed(0)`'s
/// encoding, the id written from the caller's `&str`, the events straight
/// from the caller's (see `event.rs`).
pub fn encode_run_events(
    run_id: &str,
    seq: u64,
    events: &[crate::exec::ExecEvent],
    out: &mut BytesMut,
    max_frame_bytes: usize,
) -> Result<(), WireError> {
    use prost::encoding::{encode_key, encode_varint, encoded_len_varint, key_len, WireType};
    let seq_len = if seq == 0 { 0 } else { key_len(EVENTS_SEQ) + encoded_len_varint(seq) };
    let events_len: usize = events.iter().map(|e| field_len(EVENTS_EVENT, super::event::encoded_len(e))).sum();
    let inner = opt_field_len(RUN_ID, run_id.len()) + seq_len + events_len;
    put_run_head(out, RUN_EVENTS, inner, run_id, max_frame_bytes)?;
    if seq != 0 {
        encode_key(EVENTS_SEQ, WireType::Varint, out);
        encode_varint(seq, out);
    }
    for e in events {
        super::event::encode_field(EVENTS_EVENT, e, out);
    }
    Ok(())
}

// Field numbers of runtime.proto: Envelope.provider_tunnel_frame = 41;
// ProviderTunnelFrame.tunnel_id = 1, .seq = 2, .body = 11, .parts = 14,
// .whole = 15, .usage = 20; BodyParts.parts = 1; TunnelWhole.body = 3 (after
// status = 1 and headers = 2).
const TUNNEL_FRAME: u32 = 41;
const TUNNEL_ID: u32 = 1;
const TUNNEL_SEQ: u32 = 2;
const TUNNEL_BODY: u32 = 11;
const TUNNEL_PARTS: u32 = 14;
const TUNNEL_WHOLE: u32 = 15;
const TUNNEL_USAGE: u32 = 20;
const TUNNEL_STATUS: u32 = 10;
const PARTS_PART: u32 = 1;
const WHOLE_BODY: u32 = 3;
// TunnelWhole and TunnelResponseStart: status = 1, headers = 2;
// Header: name = 1, value = 2.
const HEAD_STATUS: u32 = 1;
const HEAD_HEADERS: u32 = 2;
const HEADER_NAME: u32 = 1;
const HEADER_VALUE: u32 = 2;

/// A tunnel answer's status and headers, as `TunnelWhole` and
/// `TunnelResponseStart` carry them (fields 1 and 2). Encoded by hand:
/// prost's encoder clones (and drops) a `Bytes` per name and value, two
/// atomic reference-count updates each.
#[derive(Debug, Clone, Copy)]
pub struct TunnelHead<'a> {
    /// HTTP status.
    pub status: u16,
    /// Header (name, value) pairs in order.
    pub headers: &'a [(HeaderName, Bytes)],
}

/// Bytes of an optional (proto3: left out when empty) bytes field.
fn opt_field_len(tag: u32, len: usize) -> usize {
    if len == 0 {
        0
    } else {
        field_len(tag, len)
    }
}

/// Bytes of one `Header` message's fields.
fn header_len(name: &[u8], value: &[u8]) -> usize {
    opt_field_len(HEADER_NAME, name.len()) + opt_field_len(HEADER_VALUE, value.len())
}

impl TunnelHead<'_> {
    /// Bytes of the status and headers fields.
    fn encoded_len(&self) -> usize {
        use prost::encoding::{encoded_len_varint, key_len};
        let status = if self.status == 0 { 0 } else { key_len(HEAD_STATUS) + encoded_len_varint(self.status.into()) };
        status + self.headers.iter().map(|(n, v)| field_len(HEAD_HEADERS, header_len(n.as_bytes(), v))).sum::<usize>()
    }

    /// Writes the status and headers fields (names and values copied).
    fn encode(&self, b: &mut BytesMut) {
        use prost::encoding::{encode_key, encode_varint, WireType};
        if self.status != 0 {
            encode_key(HEAD_STATUS, WireType::Varint, b);
            encode_varint(self.status.into(), b);
        }
        put_header_pairs(b, HEAD_HEADERS, self.headers.iter().map(|(n, v)| (n.as_bytes(), &v[..])));
    }
}

/// Reserves a frame whose envelope holds body `field` of `inner` bytes
/// and writes its prefix, the body's key and length, and the run id (its
/// field 1, left out when empty as proto3 does).
fn put_run_head(
    out: &mut BytesMut,
    field: u32,
    inner: usize,
    run_id: &str,
    max_frame_bytes: usize,
) -> Result<(), WireError> {
    use prost::encoding::{encode_key, encode_varint, WireType};
    let len = field_len(field, inner);
    let prefix = frame_prefix(len, max_frame_bytes)?;
    out.reserve(PREFIX_LEN + len);
    out.put_u32(prefix);
    encode_key(field, WireType::LengthDelimited, out);
    encode_varint(inner as u64, out);
    put_bytes_field(out, RUN_ID, run_id.as_bytes());
    Ok(())
}

/// The length prefix of a frame of `len` bytes, refused over the maximum
/// (the prefix is a u32: a larger maximum must not let a length wrap).
fn frame_prefix(len: usize, max_frame_bytes: usize) -> Result<u32, WireError> {
    match u32::try_from(len) {
        Ok(prefix) if len <= max_frame_bytes => Ok(prefix),
        _ => Err(WireError::FrameTooLarge { len, max: max_frame_bytes }),
    }
}

/// Bytes of a length-delimited field of `len` bytes.
fn field_len(tag: u32, len: usize) -> usize {
    use prost::encoding::{encoded_len_varint, key_len};
    key_len(tag) + encoded_len_varint(len as u64) + len
}

/// Queues the start of a tunnel frame: the prefix, the envelope's field, the
/// id, the sequence number and the key and length of its `kind` field
/// (`kind_tag`, `kind_len` bytes, which the caller queues next), with
/// `after` bytes of further frame fields to follow. Refuses a frame over
/// `max_frame_bytes` before queuing anything.
fn put_tunnel_frame_start(
    out: &mut crate::rt::gather::Gather,
    tunnel_id: &str,
    seq: u64,
    (kind_tag, kind_len): (u32, usize),
    after: usize,
    max_frame_bytes: usize,
) -> Result<(), WireError> {
    use prost::encoding::{encode_key, encode_varint, encoded_len_varint, key_len, WireType};
    let id_len = if tunnel_id.is_empty() { 0 } else { field_len(TUNNEL_ID, tunnel_id.len()) };
    let seq_len = if seq == 0 { 0 } else { key_len(TUNNEL_SEQ) + encoded_len_varint(seq) };
    let inner = id_len + seq_len + field_len(kind_tag, kind_len) + after;
    let len = field_len(TUNNEL_FRAME, inner);
    let prefix = frame_prefix(len, max_frame_bytes)?;
    out.put_with(|b| {
        b.put_u32(prefix);
        encode_key(TUNNEL_FRAME, WireType::LengthDelimited, b);
        encode_varint(inner as u64, b);
        if !tunnel_id.is_empty() {
            encode_key(TUNNEL_ID, WireType::LengthDelimited, b);
            encode_varint(tunnel_id.len() as u64, b);
            b.put_slice(tunnel_id.as_bytes());
        }
        if seq != 0 {
            encode_key(TUNNEL_SEQ, WireType::Varint, b);
            encode_varint(seq, b);
        }
        encode_key(kind_tag, WireType::LengthDelimited, b);
        encode_varint(kind_len as u64, b);
    });
    Ok(())
}

/// Queues `pieces` as the repeated bytes field `tag`, each piece a segment
/// of its own.
fn push_pieces(out: &mut crate::rt::gather::Gather, tag: u32, pieces: &[Bytes]) {
    use prost::encoding::{encode_key, encode_varint, WireType};
    for p in pieces {
        out.put_with(|b| {
            encode_key(tag, WireType::LengthDelimited, b);
            encode_varint(p.len() as u64, b);
        });
        out.push(p.clone());
    }
}

/// Queues on `out` the frame of tunnel body `parts` (`ProviderTunnelFrame`
/// with `body` for one part, `parts` for several; no usage; correlation id
/// 0): the same bytes as [`encode`] of that envelope, with each part queued
/// as a segment of its own instead of being copied into the frame.
pub fn encode_tunnel_body(
    tunnel_id: &str,
    seq: u64,
    parts: &[Bytes],
    out: &mut crate::rt::gather::Gather,
    max_frame_bytes: usize,
) -> Result<(), WireError> {
    let kind = match parts {
        [one] => (TUNNEL_BODY, one.len()),
        many => (TUNNEL_PARTS, many.iter().map(|p| field_len(PARTS_PART, p.len())).sum()),
    };
    put_tunnel_frame_start(out, tunnel_id, seq, kind, 0, max_frame_bytes)?;
    match parts {
        [one] => out.push(one.clone()),
        many => push_pieces(out, PARTS_PART, many),
    }
    Ok(())
}

/// Queues on `out` the frame of a whole tunnel answer (`ProviderTunnelFrame`
/// with `whole`: `head`'s status and headers, then `body`; `usage` on the
/// frame; correlation id 0): the same bytes as [`encode`] of that envelope,
/// with each body piece queued as a segment of its own.
pub fn encode_tunnel_whole(
    tunnel_id: &str,
    seq: u64,
    head: TunnelHead<'_>,
    body: &[Bytes],
    usage: Option<&super::pb::Usage>,
    out: &mut crate::rt::gather::Gather,
    max_frame_bytes: usize,
) -> Result<(), WireError> {
    let whole_len = head.encoded_len() + body.iter().map(|p| field_len(WHOLE_BODY, p.len())).sum::<usize>();
    let usage_len = usage.map_or(0, |u| field_len(TUNNEL_USAGE, u.encoded_len()));
    put_tunnel_frame_start(out, tunnel_id, seq, (TUNNEL_WHOLE, whole_len), usage_len, max_frame_bytes)?;
    out.put_with(|b| head.encode(b));
    push_pieces(out, WHOLE_BODY, body);
    if let Some(u) = usage {
        out.put_with(|b| prost::encoding::message::encode(TUNNEL_USAGE, u, b));
    }
    Ok(())
}

/// Queues on `out` the frame that starts a streamed tunnel answer
/// (`ProviderTunnelFrame` with `status`): the same bytes as [`encode`] of
/// that envelope.
pub fn encode_tunnel_start(
    tunnel_id: &str,
    seq: u64,
    head: TunnelHead<'_>,
    out: &mut crate::rt::gather::Gather,
    max_frame_bytes: usize,
) -> Result<(), WireError> {
    put_tunnel_frame_start(out, tunnel_id, seq, (TUNNEL_STATUS, head.encoded_len()), 0, max_frame_bytes)?;
    out.put_with(|b| head.encode(b));
    Ok(())
}

/// Envelope.run_request.
const RUN_REQUEST: u32 = 20;
/// RunRequest.body.
const RUN_BODY: u32 = 10;

/// Queues on `out` the frame of a run request (correlation id 0), with the
/// body queued as a segment of its own instead of being copied into the
/// frame. The body field goes last, after the others in tag order (fields
/// may come in any order; a decoder reads the same message).
pub fn encode_run_request(
    req: &mut super::pb::RunRequest,
    out: &mut crate::rt::gather::Gather,
    max_frame_bytes: usize,
) -> Result<(), WireError> {
    use prost::encoding::{encode_key, encode_varint, WireType};
    let body = std::mem::take(&mut req.body);
    let inner = req.encoded_len() + opt_field_len(RUN_BODY, body.len());
    let len = field_len(RUN_REQUEST, inner);
    let prefix = match frame_prefix(len, max_frame_bytes) {
        Ok(prefix) => prefix,
        Err(e) => {
            req.body = body;
            return Err(e);
        }
    };
    out.put_with(|b| {
        b.reserve(PREFIX_LEN + len - body.len());
        b.put_u32(prefix);
        encode_key(RUN_REQUEST, WireType::LengthDelimited, b);
        encode_varint(inner as u64, b);
        req.encode_raw(b);
        if !body.is_empty() {
            encode_key(RUN_BODY, WireType::LengthDelimited, b);
            encode_varint(body.len() as u64, b);
        }
    });
    if !body.is_empty() {
        out.push(body.clone());
    }
    req.body = body;
    Ok(())
}

/// Envelope.provider_tunnel_request.
const TUNNEL_REQUEST: u32 = 40;

/// Queues on `out` the frame of a tunnel request (correlation id 0): the
/// same bytes as [`encode`] of that envelope, with the body queued as a
/// segment of its own instead of being copied into the frame, and the
/// headers copied without prost's per-`Bytes` clone.
pub fn encode_tunnel_request(
    req: &super::pb::ProviderTunnelRequest,
    out: &mut crate::rt::gather::Gather,
    max_frame_bytes: usize,
) -> Result<(), WireError> {
    use prost::encoding::{encode_key, encode_varint, encoded_len_varint, key_len, message, WireType};
    // Fields 1-5 and 13-15 are strings; 8, 9 and 11 varints; 10 a bool.
    let head_strings = [(1, &req.tunnel_id), (2, &req.adapter), (3, &req.target), (4, &req.method), (5, &req.path)];
    let tail_strings = [(13, &req.profile), (14, &req.principal), (15, &req.session_id)];
    let varints = [(8, req.deadline_ms), (9, req.window_bytes), (11, req.response_stall_timeout_ms)];
    let varint_len = |(tag, v): (u32, u64)| if v == 0 { 0 } else { key_len(tag) + encoded_len_varint(v) };
    let strings_len = |s: &[(u32, &String)]| s.iter().map(|(tag, v)| opt_field_len(*tag, v.len())).sum::<usize>();
    let headers_len: usize = req.headers.iter().map(|h| field_len(6, header_len(&h.name, &h.value))).sum();
    let after_body = varints.iter().map(|v| varint_len(*v)).sum::<usize>()
        + if req.hide_usage_chunk { key_len(10) + 1 } else { 0 }
        + req.credential.as_ref().map_or(0, |c| message::encoded_len(12, c))
        + strings_len(&tail_strings);
    let inner = strings_len(&head_strings) + headers_len + opt_field_len(7, req.body.len()) + after_body;
    let len = field_len(TUNNEL_REQUEST, inner);
    let prefix = frame_prefix(len, max_frame_bytes)?;
    let put_strings = |b: &mut BytesMut, s: &[(u32, &String)]| {
        for (tag, v) in s {
            put_bytes_field(b, *tag, v.as_bytes());
        }
    };
    let put_varint = |b: &mut BytesMut, (tag, v): (u32, u64)| {
        if v != 0 {
            encode_key(tag, WireType::Varint, b);
            encode_varint(v, b);
        }
    };
    out.put_with(|b| {
        b.reserve(PREFIX_LEN + len - req.body.len());
        b.put_u32(prefix);
        encode_key(TUNNEL_REQUEST, WireType::LengthDelimited, b);
        encode_varint(inner as u64, b);
        put_strings(b, &head_strings);
        put_header_pairs(b, 6, req.headers.iter().map(|h| (&h.name[..], &h.value[..])));
        if !req.body.is_empty() {
            encode_key(7, WireType::LengthDelimited, b);
            encode_varint(req.body.len() as u64, b);
        }
    });
    out.push(req.body.clone());
    out.put_with(|b| {
        put_varint(b, varints[0]);
        put_varint(b, varints[1]);
        if req.hide_usage_chunk {
            encode_key(10, WireType::Varint, b);
            b.put_u8(1);
        }
        put_varint(b, varints[2]);
        if let Some(c) = &req.credential {
            message::encode(12, c, b);
        }
        put_strings(b, &tail_strings);
    });
    Ok(())
}

/// Writes a bytes (or string) field, left out when empty (proto3).
fn put_bytes_field(b: &mut BytesMut, tag: u32, bytes: &[u8]) {
    use prost::encoding::{encode_key, encode_varint, WireType};
    if !bytes.is_empty() {
        encode_key(tag, WireType::LengthDelimited, b);
        encode_varint(bytes.len() as u64, b);
        b.put_slice(bytes);
    }
}

/// Writes (name, value) pairs as the repeated `Header` field `tag` (names
/// and values copied).
fn put_header_pairs<'h>(b: &mut BytesMut, tag: u32, headers: impl Iterator<Item = (&'h [u8], &'h [u8])>) {
    use prost::encoding::{encode_key, encode_varint, WireType};
    for (name, value) in headers {
        encode_key(tag, WireType::LengthDelimited, b);
        encode_varint(header_len(name, value) as u64, b);
        put_bytes_field(b, HEADER_NAME, name);
        put_bytes_field(b, HEADER_VALUE, value);
    }
}

/// A frame as [`decode_frame`] reads it.
// Returned and matched at once, one at a time: boxing the envelope would
// cost every other frame (a tunnel's body chunks) an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    /// Decoded by prost.
    Envelope(Envelope),
    /// A run's events, sliced from the frame (see [`RunFrame`]).
    Run(RunFrame),
}

impl Frame {
    /// The envelope prost decodes from the same frame.
    pub fn into_envelope(self) -> Envelope {
        match self {
            Frame::Envelope(env) => env,
            Frame::Run(run) => run.into_envelope(),
        }
    }
}

/// Decodes one frame from the front of `buf`: `Ok(None)` (buf untouched) when
/// more bytes are needed; on success the frame's bytes are removed from `buf`.
///
/// Bytes fields of the result are zero-copy slices of `buf`'s allocation. On
/// `Malformed`/`EmptyEnvelope` the offending frame has been consumed; on
/// `FrameTooLarge` nothing is consumed. Either way the session should close.
pub fn decode(buf: &mut BytesMut, max_frame_bytes: usize) -> Result<Option<Envelope>, WireError> {
    Ok(decode_frame(buf, max_frame_bytes)?.map(Frame::into_envelope))
}

/// [`decode`], a run's events left as slices of their frame (nothing
/// allocated per event: a reader that routes them one by one).
pub fn decode_frame(buf: &mut BytesMut, max_frame_bytes: usize) -> Result<Option<Frame>, WireError> {
    let Some(prefix) = buf.get(..PREFIX_LEN) else {
        return Ok(None);
    };
    let mut len_bytes = [0u8; PREFIX_LEN];
    len_bytes.copy_from_slice(prefix);
    // u32 always fits in usize on the 32/64-bit targets we build for; saturate otherwise.
    let len = usize::try_from(u32::from_be_bytes(len_bytes)).unwrap_or(usize::MAX);
    if len > max_frame_bytes {
        return Err(WireError::FrameTooLarge { len, max: max_frame_bytes });
    }
    let frame_len = PREFIX_LEN + len;
    if buf.len() < frame_len {
        // Never reserve for the announced length: a peer could announce the
        // maximum and send nothing. The reader's buffer grows with the bytes
        // that actually arrive.
        return Ok(None);
    }
    let mut frame = buf.split_to(frame_len).freeze();
    frame.advance(PREFIX_LEN);
    if let Some(run) = super::run_events::run_frame_by_hand(&frame) {
        return Ok(Some(Frame::Run(run)));
    }
    // Decoding from `Bytes` makes prost slice bytes fields instead of copying.
    let envelope = Envelope::decode(frame)?;
    if envelope.body.is_none() {
        return Err(WireError::EmptyEnvelope);
    }
    Ok(Some(Frame::Envelope(envelope)))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use bytes::Bytes;
    use proptest::prelude::*;

    use super::*;
    use crate::wire::pb::{self, envelope::Body};

    const MAX: usize = DEFAULT_MAX_FRAME_BYTES;

    fn env(id: u64, body: Body) -> Envelope {
        Envelope { correlation_id: id, body: Some(body) }
    }

    fn usage() -> pb::Usage {
        pb::Usage { input_tokens: 12, output_tokens: 34, reasoning_tokens: Some(5), cached_input_tokens: None }
    }

    fn run_error() -> pb::RunError {
        pb::RunError {
            code: "upstream_status".into(),
            message: "bad gateway".into(),
            status: 502,
            retryable: true,
            source: pb::ErrorSource::Provider as i32,
            provider_code: Some("server_error".into()),
            provider_param: None,
            provider_type: Some("server_error".into()),
            retry_after_ms: Some(1000),
            failure: Some(pb::ExecutionFailure {
                kind: pb::ExecutionFailureKind::ResponseStalled as i32,
                stall_timeout_ms: 300_000,
                idle_ms: 300_004,
                provider_health: pb::ProviderHealth::Available as i32,
                liveness_classification: pb::LivenessClassification::RequestStalled as i32,
                health_observation_seq: 1,
            }),
        }
    }

    fn node_config() -> pb::NodeConfigPayload {
        pb::NodeConfigPayload {
            node_id: "node-1".into(),
            revision: 7,
            providers: vec![
                pb::ProviderConfig {
                    id: "mock".into(),
                    kind: pb::ProviderKind::Mock as i32,
                    max_concurrency: 4,
                    mock: Some(pb::MockSettings {
                        tokens: 16,
                        token_interval_ms: 1,
                        first_token_delay_ms: 2,
                        reasoning: true,
                    }),
                    ..Default::default()
                },
                pb::ProviderConfig {
                    id: "up".into(),
                    kind: pb::ProviderKind::OpenaiCompat as i32,
                    base_url: "http://127.0.0.1:9000/v1".into(),
                    api_key: "k".into(),
                    max_concurrency: 64,
                    mock: None,
                    request_timeout_ms: 600_000,
                    tls_ca_pem: Default::default(),
                    ..Default::default()
                },
            ],
            workspaces: vec![pb::WorkspaceConfig {
                workspace_ref: "repo".into(),
                host: pb::WorkspaceHost::Linux as i32,
                root: "/srv/repo".into(),
                operations: vec![pb::WorkspaceOperation::Read as i32, pb::WorkspaceOperation::Command as i32],
                commands: vec![pb::WorkspaceCommand { id: "test".into(), argv: vec!["cargo".into(), "test".into()] }],
                env: vec!["PATH".into()],
                max_read_bytes: 1 << 20,
                max_write_bytes: 1 << 20,
                max_list_entries: 256,
                command_timeout_ms: 120_000,
                max_output_bytes: 65_536,
            }],
        }
    }

    fn run_event(kind: pb::run_event::Kind) -> Body {
        Body::RunEvent(pb::RunEvent {
            run_id: "run-1".into(),
            seq: 3,
            kind: Some(kind),
            usage: Some(usage()),
            choice: 1,
            logprobs_json: Bytes::from_static(b"{}"),
        })
    }

    fn tunnel_frame(kind: pb::provider_tunnel_frame::Kind) -> Body {
        Body::ProviderTunnelFrame(pb::ProviderTunnelFrame {
            tunnel_id: Bytes::from_static(b"t-1"),
            seq: 9,
            kind: Some(kind),
            usage: None,
        })
    }

    /// One envelope per body variant (and per run-event / tunnel-frame kind).
    fn all_variants() -> Vec<Envelope> {
        use pb::{provider_tunnel_frame::Kind as Tk, run_event::Kind as Rk};
        let header = pb::Header { name: "content-type".into(), value: Bytes::from_static(b"text/event-stream") };
        let bodies = vec![
            Body::RegisterRequest(pb::RegisterRequest {
                token: "tok".into(),
                node_version: "0.1.0".into(),
                instance: 77,
                link: 1,
                links: 2,
                ..Default::default()
            }),
            Body::RegisterResponse(pb::RegisterResponse {
                accepted: true,
                reason: String::new(),
                refusal: pb::RegisterRefusal::None as i32,
                config: Some(node_config()),
                ..Default::default()
            }),
            Body::RegisterResponse(pb::RegisterResponse {
                accepted: false,
                reason: "duplicate".into(),
                refusal: pb::RegisterRefusal::DuplicateConnection as i32,
                config: None,
                ..Default::default()
            }),
            Body::NodeReadyRequest(pb::NodeReadyRequest {
                node_id: "node-1".into(),
                config_revision: 7,
                refused_workspaces: vec![pb::WorkspaceRefusal {
                    workspace_ref: "repo".into(),
                    reason: pb::WorkspaceRefusalReason::RootMissing as i32,
                }],
                shares: Some(pb::CapacityShares {
                    epoch: 3,
                    shares: vec![pb::ProviderShare { provider: "mock".into(), normal: 2, long: 1 }],
                }),
            }),
            Body::ShareDemand(pb::ShareDemand {
                applied_epoch: 3,
                providers: vec![pb::ProviderDemand {
                    provider: "mock".into(),
                    in_use_normal: 2,
                    in_use_long: 0,
                    waiting: 5,
                }],
            }),
            Body::NodeReadyResponse(pb::NodeReadyResponse { ready: true, reason: String::new() }),
            Body::RunRequest(pb::RunRequest {
                run_id: "run-1".into(),
                adapter: "mock".into(),
                target: "mock-model".into(),
                body: Bytes::from_static(br#"{"model":"m","messages":[{"role":"user","content":"h\u00e9llo"}]}"#),
                operation: pb::RunOperation::Chat as i32,
                session_id: "s".into(),
                deadline_ms: 1_700_000_000_000,
                window_bytes: 1 << 20,
                whole: true,
                response_stall_timeout_ms: 30_000,
                ..Default::default()
            }),
            run_event(Rk::Start(pb::RunStart { model: "m".into() })),
            run_event(Rk::Delta(pb::TextDelta { text: "hi".into() })),
            run_event(Rk::ReasoningDelta(pb::TextDelta { text: "hmm".into() })),
            run_event(Rk::Complete(pb::RunComplete { finish_reason: "stop".into() })),
            run_event(Rk::Error(run_error())),
            run_event(Rk::Cancelled(pb::RunCancelled { reason: "client".into() })),
            Body::RunEvents(pb::RunEvents {
                run_id: "run-1".into(),
                seq: 4,
                events: vec![
                    pb::RunEvent { kind: Some(Rk::Delta(pb::TextDelta { text: "a".into() })), ..Default::default() }
                        .encode_to_vec()
                        .into(),
                    pb::RunEvent {
                        kind: Some(Rk::Complete(pb::RunComplete { finish_reason: "stop".into() })),
                        usage: Some(usage()),
                        ..Default::default()
                    }
                    .encode_to_vec()
                    .into(),
                ],
            }),
            Body::CancelRequest(pb::CancelRequest {
                kind: pb::CancelKind::CancelRun as i32,
                run_id: "run-1".into(),
                adapter: "mock".into(),
                target: "m".into(),
                session_id: "s".into(),
                reason: "client gone".into(),
            }),
            Body::NodeCommandRequest(pb::NodeCommandRequest {
                kind: pb::NodeCommandKind::Capabilities as i32,
                adapter: "mock".into(),
                target: String::new(),
                payload_json: Bytes::from_static(b"{}"),
            }),
            Body::NodeCommandResponse(pb::NodeCommandResponse {
                ok: true,
                error: String::new(),
                result_json: Bytes::from_static(b"[1,2]"),
                status: 200,
            }),
            Body::ProviderTunnelRequest(pb::ProviderTunnelRequest {
                tunnel_id: "t-1".into(),
                adapter: "up".into(),
                target: "m".into(),
                method: "POST".into(),
                path: "/chat/completions".into(),
                headers: vec![header.clone()],
                body: Bytes::from_static(b"{\"stream\":true}"),
                deadline_ms: 1_700_000_000_000,
                window_bytes: 1 << 20,
                hide_usage_chunk: true,
                response_stall_timeout_ms: 0,
                ..Default::default()
            }),
            tunnel_frame(Tk::Status(pb::TunnelResponseStart { status: 200, headers: vec![header] })),
            tunnel_frame(Tk::Body(Bytes::from_static(b"data: {}\n\n"))),
            tunnel_frame(Tk::Body(Bytes::new())),
            tunnel_frame(Tk::End(pb::TunnelEnd {})),
            tunnel_frame(Tk::Error(run_error())),
            Body::ConfigRefresh(pb::ConfigRefresh { config: Some(node_config()) }),
            Body::ConfigRefreshAck(pb::ConfigRefreshAck {
                revision: 7,
                applied: false,
                error: "bad".into(),
                ..Default::default()
            }),
            Body::Heartbeat(pb::Heartbeat { ping: true, sent_at_ms: 1 }),
            Body::StreamCredit(pb::StreamCredit { id: "t-1".into(), bytes: 65536 }),
            Body::Heartbeat(pb::Heartbeat { ping: false, sent_at_ms: 0 }),
        ];
        bodies.into_iter().enumerate().map(|(i, b)| env(i as u64, b)).collect()
    }

    fn encode_all(msgs: &[Envelope]) -> BytesMut {
        let mut out = BytesMut::new();
        for m in msgs {
            encode(m, &mut out, MAX).unwrap();
        }
        out
    }

    /// Feeds `wire` in chunks ending at `cuts` (sorted) and collects every frame.
    fn decode_in_chunks(wire: &[u8], cuts: &[usize], max: usize) -> Vec<Envelope> {
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        let mut start = 0;
        for &end in cuts.iter().chain(std::iter::once(&wire.len())) {
            buf.extend_from_slice(&wire[start..end]);
            start = end;
            while let Some(m) = decode(&mut buf, max).unwrap() {
                out.push(m);
            }
        }
        assert!(buf.is_empty(), "leftover bytes: {}", buf.len());
        out
    }

    type Headers = Vec<(HeaderName, Bytes)>;

    fn wire_headers(headers: &Headers) -> Vec<pb::Header> {
        headers.iter().map(|(n, v)| pb::Header { name: n.clone().into_bytes(), value: v.clone() }).collect()
    }

    fn header_cases() -> Vec<Headers> {
        let header = |n: &'static str, v: &'static [u8]| (HeaderName::from_static(n), Bytes::from_static(v));
        vec![
            vec![],
            vec![header("x-a", b"")],
            vec![header("content-type", b"application/json")],
            vec![header("retry-after", b"7"), header("x-b", b"\xff"), header("x-long", &[b'v'; 200])],
        ]
    }

    fn tunnel_frame_env(
        id: &str,
        seq: u64,
        kind: pb::provider_tunnel_frame::Kind,
        usage: Option<pb::Usage>,
    ) -> Envelope {
        let frame =
            pb::ProviderTunnelFrame { tunnel_id: Bytes::copy_from_slice(id.as_bytes()), seq, kind: Some(kind), usage };
        Envelope { correlation_id: 0, body: Some(Body::ProviderTunnelFrame(frame)) }
    }

    #[test]
    fn gathered_whole_answers_are_the_prost_encoding() {
        let part = |len: usize, b: u8| Bytes::from(vec![b; len]);
        let usage = pb::Usage { input_tokens: 3, output_tokens: 300, ..Default::default() };
        let h = header_cases();
        type Case = (&'static str, u64, u16, Headers, Vec<Bytes>, Option<pb::Usage>);
        let cases: Vec<Case> = vec![
            ("t-1", 0, 200, h[0].clone(), vec![], None),
            ("", 0, 204, h[1].clone(), vec![part(0, b'a')], Some(usage)),
            ("tunnel-abc", 300, 200, h[2].clone(), vec![part(127, b'c')], Some(usage)),
            ("y", u64::MAX, 429, h[3].clone(), vec![part(5, b'f'), part(70_000, b'g')], None),
        ];
        for (id, seq, status, headers, body, usage) in cases {
            let whole = pb::TunnelWhole { status: status.into(), headers: wire_headers(&headers), body: body.clone() };
            let env = tunnel_frame_env(id, seq, pb::provider_tunnel_frame::Kind::Whole(whole), usage);
            let mut expected = BytesMut::new();
            encode(&env, &mut expected, MAX).unwrap();
            let head = TunnelHead { status, headers: &headers };
            let mut got = crate::rt::gather::Gather::new();
            encode_tunnel_whole(id, seq, head, &body, usage.as_ref(), &mut got, MAX).unwrap();
            assert_eq!(got.to_vec(), &expected[..], "id {id:?} seq {seq} status {status}");
            assert_eq!(got.pushed() as usize, body.iter().filter(|p| !p.is_empty()).count(), "payloads not copied");
        }
        let head = TunnelHead { status: 200, headers: &[] };
        let mut out = crate::rt::gather::Gather::new();
        let err = encode_tunnel_whole("t", 1, head, &[part(100, b'x')], None, &mut out, 64).unwrap_err();
        assert!(matches!(err, WireError::FrameTooLarge { max: 64, .. }), "{err:?}");
        assert!(out.is_empty());
    }

    #[test]
    fn tunnel_starts_are_the_prost_encoding() {
        for (i, headers) in header_cases().into_iter().enumerate() {
            let (id, seq, status) =
                (["t-1", "", "tunnel-abc", "y"][i], [0, 1, 300, u64::MAX][i], [200, 101, 599, 429][i]);
            let start = pb::TunnelResponseStart { status: u32::from(status), headers: wire_headers(&headers) };
            let env = tunnel_frame_env(id, seq, pb::provider_tunnel_frame::Kind::Status(start), None);
            let mut expected = BytesMut::new();
            encode(&env, &mut expected, MAX).unwrap();
            let mut got = crate::rt::gather::Gather::new();
            encode_tunnel_start(id, seq, TunnelHead { status, headers: &headers }, &mut got, MAX).unwrap();
            assert_eq!(got.to_vec(), &expected[..], "id {id:?} seq {seq} status {status}");
        }
        let big = vec![(HeaderName::from_static("x-big"), Bytes::from(vec![b'v'; 100]))];
        let mut out = crate::rt::gather::Gather::new();
        let err = encode_tunnel_start("t", 1, TunnelHead { status: 200, headers: &big }, &mut out, 64).unwrap_err();
        assert!(matches!(err, WireError::FrameTooLarge { max: 64, .. }), "{err:?}");
        assert!(out.is_empty());
    }

    #[test]
    fn run_events_with_a_borrowed_id_are_the_prost_encoding() {
        let events: Vec<pb::RunEvent> = all_variants()
            .into_iter()
            .filter_map(|e| match e.body {
                Some(Body::RunEvent(ev)) => Some(ev),
                _ => None,
            })
            .collect();
        assert!(!events.is_empty());
        let text = |len| pb::run_event::Kind::Delta(pb::TextDelta { text: "é".repeat(len) });
        let mut cases: Vec<(String, pb::RunEvent)> =
            events.into_iter().map(|ev| (String::from_utf8_lossy(&ev.run_id).into_owned(), ev)).collect();
        for (id_len, seq, text_len) in [(0, 0, 0), (1, 1, 63), (127, 300, 64), (128, u64::MAX, 40_000)] {
            let ev = pb::RunEvent { seq, choice: 2, kind: Some(text(text_len)), ..Default::default() };
            cases.push(("r".repeat(id_len), ev));
        }
        for (id, mut ev) in cases {
            ev.run_id = Bytes::from(id.clone());
            let mut expected = BytesMut::new();
            encode(&env(0, Body::RunEvent(ev.clone())), &mut expected, MAX).unwrap();
            ev.run_id.clear();
            let mut got = BytesMut::new();
            encode_run_event(&id, &ev, &mut got, MAX).unwrap();
            assert_eq!(got, expected, "id of {} bytes, seq {}", id.len(), ev.seq);
        }
        let mut out = BytesMut::new();
        let ev = pb::RunEvent { kind: Some(text(100)), ..Default::default() };
        let err = encode_run_event("r", &ev, &mut out, 64).unwrap_err();
        assert!(matches!(err, WireError::FrameTooLarge { max: 64, .. }), "{err:?}");
        assert!(out.is_empty());
    }

    /// Every kind of run event, and deltas in each of their shapes.
    fn exec_events() -> Vec<crate::exec::ExecEvent> {
        use crate::exec::{Delta, ExecEvent, Part, ToolCallDelta};
        let mut events: Vec<ExecEvent> = all_variants()
            .into_iter()
            .filter_map(|e| match e.body {
                Some(Body::RunEvent(ev)) => ExecEvent::from_wire(ev),
                _ => None,
            })
            .collect();
        let delta = |choice, part, logprobs: Option<&str>| {
            ExecEvent::Delta(Delta { choice, part, logprobs: logprobs.map(|l| Bytes::from(l.to_owned())) })
        };
        let call = |index, id: &str, args: &str| {
            Part::ToolCall(Box::new(ToolCallDelta {
                index,
                id: id.into(),
                kind: if id.is_empty() { String::new() } else { "function".into() },
                name: if id.is_empty() { String::new() } else { "get_weather".into() },
                arguments: args.into(),
            }))
        };
        events.extend([
            delta(0, Part::Content(String::new()), None),
            delta(0, Part::Content("é".repeat(40_000)), None),
            delta(3, Part::Reasoning("think".into()), None),
            delta(u32::MAX, Part::Refusal("no".into()), Some(r#"{"content":[]}"#)),
            delta(0, call(0, "call_1", ""), None),
            delta(1, call(2, "", r#"{"city":"#), None),
            delta(0, call(0, "", ""), None),
        ]);
        events
    }

    /// What prost writes for `events` as one batch.
    fn prost_batch(id: &str, seq: u64, events: &[crate::exec::ExecEvent]) -> BytesMut {
        let events = events.iter().map(|e| Bytes::from(e.clone().into_wire_unnamed(0).encode_to_vec())).collect();
        let batch = pb::RunEvents { run_id: Bytes::from(id.to_owned()), seq, events };
        let mut expected = BytesMut::new();
        encode(&env(0, Body::RunEvents(batch)), &mut expected, MAX).unwrap();
        expected
    }

    #[test]
    fn run_event_batches_with_a_borrowed_id_are_the_prost_encoding() {
        let events = exec_events();
        assert!(events.len() > 10);
        for (id_len, seq, count) in [(0, 0, 0), (1, 1, 1), (127, 300, 2), (128, u64::MAX, events.len())] {
            let id = "r".repeat(id_len);
            let mut got = BytesMut::new();
            encode_run_events(&id, seq, &events[..count], &mut got, MAX).unwrap();
            assert_eq!(got, prost_batch(&id, seq, &events[..count]), "id of {id_len} bytes, seq {seq}, {count} events");
        }
        // Each event decodes back to itself.
        let mut got = BytesMut::new();
        encode_run_events("r", 0, &events, &mut got, MAX).unwrap();
        let Some(Body::RunEvents(batch)) = decode(&mut got, MAX).unwrap().unwrap().body else { panic!("not a batch") };
        let back: Vec<_> = batch
            .events
            .into_iter()
            .map(|b| crate::exec::ExecEvent::from_wire(pb::RunEvent::decode(b).unwrap()))
            .collect();
        assert_eq!(back, events.iter().cloned().map(Some).collect::<Vec<_>>());
        let mut out = BytesMut::new();
        let err = encode_run_events("r", 1, &events, &mut out, 64).unwrap_err();
        assert!(matches!(err, WireError::FrameTooLarge { max: 64, .. }), "{err:?}");
        assert!(out.is_empty());
    }

    #[test]
    fn tokens_of_every_short_length_are_the_prost_encoding_and_decode_back() {
        use crate::exec::{Delta, ExecEvent, Part};
        for len in 0..=130 {
            for kind in 0..3 {
                for logprobs in [None, Some(Bytes::new())] {
                    let text = "é".repeat(len / 2) + &"x".repeat(len % 2);
                    let part = [Part::Content, Part::Reasoning, Part::Refusal][kind](text);
                    let events = vec![ExecEvent::Delta(Delta { choice: 0, part, logprobs })];
                    let mut got = BytesMut::new();
                    encode_run_events("r", 1, &events, &mut got, MAX).unwrap();
                    assert_eq!(got, prost_batch("r", 1, &events), "{len} bytes, kind {kind}");
                    let Some(Body::RunEvents(batch)) = decode(&mut got, MAX).unwrap().unwrap().body else { panic!() };
                    let back = crate::wire::decode_event(batch.events[0].clone()).unwrap().unwrap();
                    let expected =
                        ExecEvent::from_wire(pb::RunEvent::decode(batch.events[0].clone()).unwrap()).unwrap();
                    assert_eq!(back, expected);
                }
            }
        }
    }

    proptest! {
        #[test]
        fn any_delta_batch_is_the_prost_encoding(
            deltas in proptest::collection::vec(
                (any::<u32>(), 0u8..4, ".{0,40}", any::<u32>(), proptest::option::of(".{0,20}")),
                0..6,
            ),
        ) {
            use crate::exec::{Delta, ExecEvent, Part, ToolCallDelta};
            let events: Vec<ExecEvent> = deltas
                .into_iter()
                .map(|(choice, kind, text, index, logprobs)| {
                    let part = match kind {
                        0 => Part::Content(text),
                        1 => Part::Reasoning(text),
                        2 => Part::Refusal(text),
                        _ => Part::ToolCall(Box::new(ToolCallDelta {
                            index,
                            id: text.clone(),
                            kind: String::new(),
                            name: text.chars().rev().collect(),
                            arguments: text,
                        })),
                    };
                    ExecEvent::Delta(Delta { choice, part, logprobs: logprobs.map(Bytes::from) })
                })
                .collect();
            let mut got = BytesMut::new();
            encode_run_events("run-1", 7, &events, &mut got, MAX).unwrap();
            prop_assert_eq!(got, prost_batch("run-1", 7, &events));
        }
    }

    #[test]
    fn gathered_tunnel_bodies_are_the_prost_encoding() {
        let part = |len: usize, b: u8| Bytes::from(vec![b; len]);
        let cases: Vec<(&str, u64, Vec<Bytes>)> = vec![
            ("t-1", 0, vec![part(0, b'a')]),
            ("", 7, vec![part(3, b'b')]),
            ("tunnel-abc", 300, vec![part(127, b'c')]),
            ("x", u64::MAX, vec![part(128, b'd')]),
            ("y", 1, vec![part(70_000, b'e')]),
            ("z", 9, vec![part(5, b'f'), part(0, b'g'), part(200, b'h')]),
            ("w", 2, vec![part(1, b'i'), part(70_000, b'j')]),
        ];
        for (id, seq, parts) in cases {
            let kind = match &parts[..] {
                [one] => pb::provider_tunnel_frame::Kind::Body(one.clone()),
                many => pb::provider_tunnel_frame::Kind::Parts(pb::BodyParts { parts: many.to_vec() }),
            };
            let frame = pb::ProviderTunnelFrame {
                tunnel_id: Bytes::copy_from_slice(id.as_bytes()),
                seq,
                kind: Some(kind),
                usage: None,
            };
            let env = Envelope { correlation_id: 0, body: Some(Body::ProviderTunnelFrame(frame)) };
            let mut expected = BytesMut::new();
            encode(&env, &mut expected, MAX).unwrap();
            let mut got = crate::rt::gather::Gather::new();
            encode_tunnel_body(id, seq, &parts, &mut got, MAX).unwrap();
            assert_eq!(got.to_vec(), &expected[..], "id {id:?} seq {seq} parts {}", parts.len());
            assert_eq!(got.pushed() as usize, parts.iter().filter(|p| !p.is_empty()).count(), "payloads not copied");
        }
        let mut out = crate::rt::gather::Gather::new();
        let err = encode_tunnel_body("t", 1, &[Bytes::from(vec![0u8; 100])], &mut out, 64).unwrap_err();
        assert!(matches!(err, WireError::FrameTooLarge { max: 64, .. }), "{err:?}");
        assert!(out.is_empty());
    }

    #[test]
    fn roundtrip_every_variant() {
        for msg in all_variants() {
            let mut buf = BytesMut::new();
            encode(&msg, &mut buf, MAX).unwrap();
            assert_eq!(buf.len(), 4 + msg.encoded_len());
            assert_eq!(&buf[..4], &(msg.encoded_len() as u32).to_be_bytes());
            let back = decode(&mut buf, MAX).unwrap().expect("complete frame");
            assert_eq!(back, msg);
            assert!(buf.is_empty());
        }
    }

    #[test]
    fn encode_appends_after_existing_bytes() {
        let msgs = all_variants();
        let mut buf = BytesMut::from(&b"xyz"[..]);
        encode(&msgs[0], &mut buf, MAX).unwrap();
        assert_eq!(&buf[..3], b"xyz");
        buf.advance(3);
        assert_eq!(decode(&mut buf, MAX).unwrap(), Some(msgs[0].clone()));
    }

    #[test]
    fn every_split_point_of_multi_frame_buffer() {
        let msgs = all_variants();
        let wire = encode_all(&msgs);
        for cut in 0..=wire.len() {
            assert_eq!(decode_in_chunks(&wire, &[cut], MAX), msgs, "cut at {cut}");
        }
    }

    #[test]
    fn byte_by_byte() {
        let msgs = all_variants();
        let wire = encode_all(&msgs);
        let cuts: Vec<usize> = (1..wire.len()).collect();
        assert_eq!(decode_in_chunks(&wire, &cuts, MAX), msgs);
    }

    #[test]
    fn bytes_fields_are_zero_copy() {
        let payload = vec![0xabu8; 1024];
        let msg = env(1, tunnel_frame(pb::provider_tunnel_frame::Kind::Body(Bytes::from(payload.clone()))));
        let mut buf = BytesMut::new();
        encode(&msg, &mut buf, MAX).unwrap();
        let range = buf.as_ptr() as usize..buf.as_ptr() as usize + buf.len();
        let back = decode(&mut buf, MAX).unwrap().unwrap();
        let Some(Body::ProviderTunnelFrame(pb::ProviderTunnelFrame {
            kind: Some(pb::provider_tunnel_frame::Kind::Body(body)),
            ..
        })) = back.body
        else {
            panic!("wrong body: {back:?}");
        };
        assert_eq!(&body[..], &payload[..]);
        assert!(range.contains(&(body.as_ptr() as usize)), "body was copied out of the frame");
    }

    #[test]
    fn oversize_rejected_with_only_the_prefix() {
        let max = 1024;
        let mut buf = BytesMut::new();
        buf.put_u32(1025);
        let err = decode(&mut buf, max).unwrap_err();
        assert!(matches!(err, WireError::FrameTooLarge { len: 1025, max: 1024 }), "{err:?}");
        assert_eq!(buf.len(), 4, "nothing consumed");
        // Exactly the max is fine (and incomplete here).
        let mut buf = BytesMut::new();
        buf.put_u32(1024);
        assert!(decode(&mut buf, max).unwrap().is_none());
        // An announced frame reserves nothing: memory follows arrived bytes.
        let mut buf = BytesMut::with_capacity(8);
        buf.put_u32(16 << 20);
        buf.put_u8(0);
        assert!(decode(&mut buf, MAX).unwrap().is_none());
        assert!(buf.capacity() < 1024, "reserved {} bytes for an announced frame", buf.capacity());
        // u32::MAX never turns into an allocation.
        let mut buf = BytesMut::from(&[0xff, 0xff, 0xff, 0xff][..]);
        assert!(matches!(decode(&mut buf, MAX), Err(WireError::FrameTooLarge { .. })));
    }

    #[test]
    fn encode_refuses_oversize() {
        let msg = env(1, tunnel_frame(pb::provider_tunnel_frame::Kind::Body(Bytes::from(vec![0u8; 2000]))));
        let mut buf = BytesMut::new();
        let err = encode(&msg, &mut buf, 1024).unwrap_err();
        assert!(matches!(err, WireError::FrameTooLarge { max: 1024, .. }), "{err:?}");
        assert!(buf.is_empty(), "nothing written");
        // The same message fits a bigger max, exactly.
        encode(&msg, &mut buf, msg.encoded_len()).unwrap();
    }

    #[test]
    fn truncated_is_none_until_complete() {
        let msg = all_variants().swap_remove(5);
        let mut wire = BytesMut::new();
        encode(&msg, &mut wire, MAX).unwrap();
        let mut buf = BytesMut::new();
        for (i, &b) in wire.iter().enumerate() {
            if i + 1 < wire.len() {
                buf.put_u8(b);
                assert!(decode(&mut buf, MAX).unwrap().is_none(), "at {i}");
                assert_eq!(&buf[..], &wire[..=i], "buffer untouched");
            }
        }
        buf.put_u8(wire[wire.len() - 1]);
        assert_eq!(decode(&mut buf, MAX).unwrap(), Some(msg));
    }

    #[test]
    fn empty_envelope_rejected() {
        let mut buf = BytesMut::new();
        // A zero-length frame decodes as an Envelope with no body.
        buf.put_u32(0);
        assert!(matches!(decode(&mut buf, MAX), Err(WireError::EmptyEnvelope)));
        assert!(buf.is_empty());
        // So does one carrying only a correlation id.
        let msg = Envelope { correlation_id: 5, body: None };
        encode(&msg, &mut buf, MAX).unwrap();
        assert!(matches!(decode(&mut buf, MAX), Err(WireError::EmptyEnvelope)));
    }

    #[test]
    fn garbage_is_an_error() {
        let cases: &[&[u8]] = &[
            // Field 10 (register_request), length-delimited, length beyond the frame.
            &[0x52, 0x7f],
            // Invalid wire type 7.
            &[0x0f],
            // Truncated varint.
            &[0x08, 0xff],
            // Field number 0.
            &[0x00, 0x00],
            // Invalid UTF-8 in RegisterRequest.token.
            &[0x52, 0x03, 0x0a, 0x01, 0xff],
        ];
        for payload in cases {
            let mut buf = BytesMut::new();
            buf.put_u32(payload.len() as u32);
            buf.extend_from_slice(payload);
            let err = decode(&mut buf, MAX).unwrap_err();
            assert!(matches!(err, WireError::Malformed(_)), "{payload:?}: {err:?}");
            assert!(buf.is_empty(), "bad frame consumed");
        }
    }

    #[test]
    fn errors_display() {
        let e = WireError::FrameTooLarge { len: 10, max: 5 };
        assert_eq!(e.to_string(), "frame of 10 bytes exceeds the maximum of 5");
        assert_eq!(WireError::EmptyEnvelope.to_string(), "frame has no body");
    }

    fn arb_bytes() -> impl Strategy<Value = Bytes> {
        proptest::collection::vec(any::<u8>(), 0..300).prop_map(Bytes::from)
    }

    fn arb_run_event() -> impl Strategy<Value = Body> {
        use pb::run_event::Kind;
        let kind = prop_oneof![
            ".{0,40}".prop_map(|model| Kind::Start(pb::RunStart { model })),
            ".{0,200}".prop_map(|text| Kind::Delta(pb::TextDelta { text })),
            ".{0,200}".prop_map(|text| Kind::ReasoningDelta(pb::TextDelta { text })),
            ".{0,10}".prop_map(|finish_reason| Kind::Complete(pb::RunComplete { finish_reason })),
            (".{0,20}", ".{0,80}", any::<u32>(), any::<bool>(), any::<Option<u64>>()).prop_map(
                |(code, message, status, retryable, retry_after_ms)| {
                    Kind::Error(pb::RunError {
                        code,
                        message,
                        status,
                        retryable,
                        source: 4,
                        provider_code: Some("c".into()),
                        retry_after_ms,
                        ..Default::default()
                    })
                }
            ),
            (any::<u32>(), ".{0,10}", ".{0,30}").prop_map(|(index, name, arguments)| {
                Kind::ToolCall(pb::ToolCallDelta {
                    index,
                    id: "call".into(),
                    r#type: "function".into(),
                    name,
                    arguments,
                })
            }),
            ".{0,10}"
                .prop_map(|finish_reason| Kind::ChoiceFinish(pb::ChoiceFinish { finish_reason, ..Default::default() })),
            proptest::collection::vec(any::<f32>().prop_filter("comparable", |f| !f.is_nan()), 0..20)
                .prop_map(|values| Kind::Embeddings(pb::Embeddings { data: vec![pb::Embedding { values }] })),
        ];
        let usage = proptest::option::of((any::<u64>(), any::<u64>(), any::<Option<u64>>(), any::<Option<u64>>()))
            .prop_map(|u| {
                u.map(|(input_tokens, output_tokens, reasoning_tokens, cached_input_tokens)| pb::Usage {
                    input_tokens,
                    output_tokens,
                    reasoning_tokens,
                    cached_input_tokens,
                })
            });
        (".{0,40}", any::<u64>(), proptest::option::of(kind), usage, any::<u32>(), arb_bytes()).prop_map(
            |(run_id, seq, kind, usage, choice, logprobs_json)| {
                Body::RunEvent(pb::RunEvent { run_id: run_id.into(), seq, kind, usage, choice, logprobs_json })
            },
        )
    }

    fn arb_run_request() -> impl Strategy<Value = Body> {
        (".{0,40}", ".{0,20}", ".{0,20}", arb_bytes(), any::<u64>(), any::<bool>()).prop_map(
            |(run_id, adapter, target, body, deadline_ms, embeddings)| {
                Body::RunRequest(pb::RunRequest {
                    run_id,
                    adapter,
                    target,
                    body,
                    operation: if embeddings { 1 } else { 0 },
                    session_id: String::new(),
                    deadline_ms,
                    window_bytes: 0,
                    whole: embeddings,
                    response_stall_timeout_ms: deadline_ms % 1000,
                    ..Default::default()
                })
            },
        )
    }

    fn arb_tunnel_body() -> impl Strategy<Value = Body> {
        (".{0,40}", any::<u64>(), arb_bytes()).prop_map(|(tunnel_id, seq, body)| {
            Body::ProviderTunnelFrame(pb::ProviderTunnelFrame {
                tunnel_id: Bytes::from(tunnel_id),
                seq,
                kind: Some(pb::provider_tunnel_frame::Kind::Body(body)),
                usage: None,
            })
        })
    }

    fn arb_tunnel_request() -> impl Strategy<Value = pb::ProviderTunnelRequest> {
        let header = ("[a-z-]{1,20}", arb_bytes()).prop_map(|(n, value)| pb::Header { name: Bytes::from(n), value });
        let lease = (arb_bytes(), arb_bytes(), arb_bytes())
            .prop_map(|(ephemeral_key, nonce, ciphertext)| pb::SealedLease { ephemeral_key, nonce, ciphertext });
        let strings = (".{0,30}", ".{0,10}", ".{0,10}", ".{0,6}", ".{0,30}", ".{0,10}", ".{0,10}", ".{0,12}");
        let rest = (
            proptest::collection::vec(header, 0..6),
            arb_bytes(),
            (any::<u64>(), 0..3u64, any::<bool>(), prop_oneof![Just(0u64), any::<u64>()]),
            proptest::option::of(lease),
        );
        (strings, rest).prop_map(
            |(
                (id, adapter, target, method, path, profile, principal, session_id),
                (headers, body, nums, credential),
            )| {
                let (deadline_ms, window_bytes, hide_usage_chunk, response_stall_timeout_ms) = nums;
                pb::ProviderTunnelRequest {
                    tunnel_id: id,
                    adapter,
                    target,
                    method,
                    path,
                    headers,
                    body,
                    deadline_ms,
                    window_bytes,
                    hide_usage_chunk,
                    response_stall_timeout_ms,
                    credential,
                    profile,
                    principal,
                    session_id,
                }
            },
        )
    }

    fn arb_envelope() -> impl Strategy<Value = Envelope> {
        let body = prop_oneof![
            arb_run_event(),
            arb_run_request(),
            arb_tunnel_body(),
            (any::<bool>(), any::<u64>())
                .prop_map(|(ping, sent_at_ms)| Body::Heartbeat(pb::Heartbeat { ping, sent_at_ms })),
        ];
        (any::<u64>(), body).prop_map(|(id, body)| env(id, body))
    }

    proptest! {
        #[test]
        fn prop_roundtrip_across_random_splits(
            msgs in proptest::collection::vec(arb_envelope(), 1..8),
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..10),
        ) {
            let wire = encode_all(&msgs);
            let mut cuts: Vec<usize> = cuts.iter().map(|i| i.index(wire.len() + 1)).collect();
            cuts.sort_unstable();
            prop_assert_eq!(decode_in_chunks(&wire, &cuts, MAX), msgs);
        }

        #[test]
        fn prop_arbitrary_bytes_never_panic(
            data in proptest::collection::vec(any::<u8>(), 0..512),
            max in 0usize..1024,
        ) {
            let mut buf = BytesMut::from(&data[..]);
            // Keep decoding until the input runs out or errors; each step must
            // either consume a frame, stop, or fail without panicking.
            loop {
                let before = buf.len();
                match decode(&mut buf, max) {
                    Ok(Some(_)) => prop_assert!(buf.len() < before),
                    Ok(None) => {
                        prop_assert_eq!(buf.len(), before);
                        break;
                    }
                    Err(_) => break,
                }
            }
        }

        #[test]
        fn prop_gathered_run_requests_decode_to_the_request(
            body in arb_bytes(), run_id in ".{0,30}", profile in ".{0,10}", whole in any::<bool>(),
            stall in any::<u64>(), deadline_ms in any::<u64>(),
        ) {
            let req = pb::RunRequest {
                run_id, adapter: "p".into(), target: "m".into(), body, whole, profile,
                response_stall_timeout_ms: stall, deadline_ms, principal: "key".into(), ..Default::default()
            };
            let mut got = crate::rt::gather::Gather::new();
            let mut sent = req.clone();
            encode_run_request(&mut sent, &mut got, MAX).unwrap();
            prop_assert_eq!(&sent, &req, "the request is given back whole");
            prop_assert_eq!(got.pushed(), u64::from(!req.body.is_empty()), "the body is not copied");
            let mut buf = BytesMut::from(&got.to_vec()[..]);
            let env = decode(&mut buf, MAX).unwrap().unwrap();
            prop_assert!(buf.is_empty());
            prop_assert_eq!(env, Envelope { correlation_id: 0, body: Some(Body::RunRequest(req.clone())) });
            // The same length as prost's own encoding; refused over the maximum.
            let mut expected = BytesMut::new();
            encode(&Envelope { correlation_id: 0, body: Some(Body::RunRequest(req.clone())) }, &mut expected, MAX).unwrap();
            prop_assert_eq!(got.len(), expected.len());
            let mut small = crate::rt::gather::Gather::new();
            let refused = matches!(
                encode_run_request(&mut sent, &mut small, expected.len() - PREFIX_LEN - 1),
                Err(WireError::FrameTooLarge { .. })
            );
            prop_assert!(refused && small.is_empty());
            prop_assert_eq!(&sent, &req);
        }

        #[test]
        fn prop_gathered_tunnel_requests_are_the_prost_encoding(req in arb_tunnel_request()) {
            let env = Envelope { correlation_id: 0, body: Some(Body::ProviderTunnelRequest(req.clone())) };
            let mut expected = BytesMut::new();
            encode(&env, &mut expected, MAX).unwrap();
            let mut got = crate::rt::gather::Gather::new();
            encode_tunnel_request(&req, &mut got, MAX).unwrap();
            prop_assert_eq!(got.to_vec(), expected.to_vec());
            prop_assert_eq!(got.pushed(), u64::from(!req.body.is_empty()), "the body is not copied");
            // And refused before anything is queued when over the maximum.
            let mut small = crate::rt::gather::Gather::new();
            let max = expected.len() - PREFIX_LEN - 1;
            let refused = matches!(encode_tunnel_request(&req, &mut small, max), Err(WireError::FrameTooLarge { .. }));
            prop_assert!(refused);
            prop_assert!(small.is_empty());
        }
    }
}
