//! Body framing and the incremental body decoder (Content-Length, chunked,
//! until-close), shared by server requests and client responses.

use bytes::{Buf, Bytes, BytesMut};

use super::HttpError;

/// How a message body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyKind {
    /// No body.
    Empty,
    /// Exactly this many bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Until the peer closes (responses only).
    UntilClose,
}

/// Longest chunk-size line (size plus extensions) accepted. Extensions are
/// ignored, so anything longer is abuse and must not grow the buffer.
const MAX_CHUNK_LINE: usize = 4096;
/// Largest trailer section accepted; trailers are consumed and discarded.
const MAX_TRAILER_BYTES: usize = 16 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// `Content-Length` body with this many bytes left.
    Length(u64),
    /// Expecting a chunk-size line.
    ChunkSize,
    /// Inside a chunk with this many data bytes left.
    ChunkData(u64),
    /// Expecting the CRLF that closes a chunk's data.
    ChunkDataEnd,
    /// Reading trailer lines; bytes consumed so far.
    Trailers(usize),
    /// Everything until EOF.
    UntilClose,
    Done,
}

/// Incremental, sans-IO body decoder.
#[derive(Debug)]
pub struct BodyDecoder {
    state: State,
    max_body_bytes: usize,
    /// Decoded bytes produced so far.
    decoded: u64,
}

impl BodyDecoder {
    /// A decoder for `kind` that fails with `BodyTooLarge` once more than
    /// `max_body_bytes` decoded bytes have been produced.
    pub fn new(kind: BodyKind, max_body_bytes: usize) -> Self {
        let state = match kind {
            BodyKind::Empty | BodyKind::Length(0) => State::Done,
            BodyKind::Length(n) => State::Length(n),
            BodyKind::Chunked => State::ChunkSize,
            BodyKind::UntilClose => State::UntilClose,
        };
        Self { state, max_body_bytes, decoded: 0 }
    }

    /// Decodes as much of `buf` as possible, removing consumed bytes from it.
    /// Returns the next piece of decoded body data (zero-copy split of `buf`
    /// where possible), `Ok(None)` when more input is needed. Once
    /// `is_done()` is true no more data is consumed (trailing bytes belong to
    /// the next message).
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Bytes>, HttpError> {
        loop {
            match self.state {
                State::Done => return Ok(None),
                State::Length(remaining) => {
                    // Reject up front: the declared size alone exceeds the limit.
                    self.check_limit(remaining)?;
                    if buf.is_empty() {
                        return Ok(None);
                    }
                    let take = clamp_len(remaining, buf.len());
                    let left = remaining - take as u64;
                    self.state = if left == 0 { State::Done } else { State::Length(left) };
                    return Ok(Some(self.take(buf, take)));
                }
                State::UntilClose => {
                    if buf.is_empty() {
                        return Ok(None);
                    }
                    self.check_limit(buf.len() as u64)?;
                    let take = buf.len();
                    return Ok(Some(self.take(buf, take)));
                }
                State::ChunkSize => {
                    let Some((consumed, size)) = size_line(buf)? else { return Ok(None) };
                    buf.advance(consumed);
                    if size == 0 {
                        self.state = State::Trailers(0);
                    } else {
                        self.check_limit(size)?;
                        self.state = State::ChunkData(size);
                    }
                }
                State::ChunkData(remaining) => {
                    if buf.is_empty() {
                        return Ok(None);
                    }
                    let take = clamp_len(remaining, buf.len());
                    let left = remaining - take as u64;
                    self.state = if left == 0 { State::ChunkDataEnd } else { State::ChunkData(left) };
                    return Ok(Some(self.take(buf, take)));
                }
                State::ChunkDataEnd => {
                    match buf.get(..2) {
                        Some(b"\r\n") => buf.advance(2),
                        Some(_) => return Err(HttpError::Malformed("missing CRLF after chunk data")),
                        None => {
                            if buf.first().is_some_and(|&b| b != b'\r') {
                                return Err(HttpError::Malformed("missing CRLF after chunk data"));
                            }
                            return Ok(None);
                        }
                    }
                    self.state = State::ChunkSize;
                }
                State::Trailers(seen) => {
                    let Some(lf) = memchr::memchr(b'\n', buf) else {
                        if seen + buf.len() > MAX_TRAILER_BYTES {
                            return Err(HttpError::HeadTooLarge);
                        }
                        return Ok(None);
                    };
                    if seen + lf + 1 > MAX_TRAILER_BYTES {
                        return Err(HttpError::HeadTooLarge);
                    }
                    // Strict CRLF, as for chunk lines: a bare LF is a smuggling vector.
                    if lf == 0 || buf[lf - 1] != b'\r' {
                        return Err(HttpError::Malformed("trailer line without CRLF"));
                    }
                    let line = &buf[..lf - 1];
                    if line.is_empty() {
                        buf.advance(lf + 1);
                        self.state = State::Done;
                        return Ok(None);
                    }
                    if !valid_trailer_line(line) {
                        return Err(HttpError::Malformed("invalid trailer field"));
                    }
                    buf.advance(lf + 1);
                    self.state = State::Trailers(seen + lf + 1);
                }
            }
        }
    }

    /// Like [`Self::decode`], but a chunked body's data in `buf` comes out
    /// as one piece however many chunks it spans: each chunk's data is moved
    /// down over the framing before it, in place, and split off once. A
    /// server that sends every event as a chunk of its own then costs one
    /// piece per read, not one per event.
    pub fn decode_joined(&mut self, buf: &mut BytesMut) -> Result<Option<Bytes>, HttpError> {
        if !matches!(self.state, State::ChunkSize | State::ChunkData(_) | State::ChunkDataEnd) {
            return self.decode(buf);
        }
        // buf[..w]: data so far; buf[w..r]: framing consumed; buf[r..]: not
        // yet looked at.
        let (mut w, mut r) = (0, 0);
        loop {
            match self.state {
                State::ChunkSize => {
                    let Some((consumed, size)) = size_line(&buf[r..])? else { break };
                    r += consumed;
                    if size == 0 {
                        self.state = State::Trailers(0);
                        break;
                    }
                    self.check_limit(size.saturating_add(w as u64))?;
                    self.state = State::ChunkData(size);
                }
                State::ChunkData(remaining) => {
                    let take = clamp_len(remaining, buf.len() - r);
                    if take == 0 {
                        break;
                    }
                    if w != r {
                        buf.copy_within(r..r + take, w);
                    }
                    (w, r) = (w + take, r + take);
                    let left = remaining - take as u64;
                    self.state = if left == 0 { State::ChunkDataEnd } else { State::ChunkData(left) };
                }
                State::ChunkDataEnd => match buf.get(r..r + 2) {
                    Some(b"\r\n") => {
                        r += 2;
                        self.state = State::ChunkSize;
                    }
                    Some(_) => return Err(HttpError::Malformed("missing CRLF after chunk data")),
                    None => {
                        if buf.get(r).is_some_and(|&b| b != b'\r') {
                            return Err(HttpError::Malformed("missing CRLF after chunk data"));
                        }
                        break;
                    }
                },
                _ => break,
            }
        }
        let data = (w > 0).then(|| self.take(buf, w));
        buf.advance(r - w);
        match data {
            Some(data) => Ok(Some(data)),
            // Only framing was there: the trailers (or nothing) come next.
            None => self.decode(buf),
        }
    }

    /// The body is complete.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// The peer closed the connection: for `UntilClose` this completes the
    /// body; for other kinds with bytes outstanding it is `Malformed`.
    pub fn finish_on_eof(&mut self) -> Result<(), HttpError> {
        match self.state {
            State::Done => Ok(()),
            State::UntilClose => {
                self.state = State::Done;
                Ok(())
            }
            _ => Err(HttpError::Malformed("connection closed before end of body")),
        }
    }

    /// The bytes still to come of a `Content-Length` body (`None` for other
    /// framings, whose end is not known ahead).
    pub fn length_left(&self) -> Option<u64> {
        match self.state {
            State::Length(n) => Some(n),
            State::Done => Some(0),
            _ => None,
        }
    }

    /// Decoded body bytes produced so far.
    pub fn decoded_bytes(&self) -> u64 {
        self.decoded
    }

    /// Fails when `more` decoded bytes on top of those produced would exceed the limit.
    fn check_limit(&self, more: u64) -> Result<(), HttpError> {
        match self.decoded.checked_add(more) {
            Some(total) if total <= self.max_body_bytes as u64 => Ok(()),
            _ => Err(HttpError::BodyTooLarge),
        }
    }

    fn take(&mut self, buf: &mut BytesMut, n: usize) -> Bytes {
        self.decoded += n as u64;
        buf.split_to(n).freeze()
    }
}

/// The chunk-size line at the start of `buf`: its length with the CRLF
/// and the size it gives; `None` until it is complete.
fn size_line(buf: &[u8]) -> Result<Option<(usize, u64)>, HttpError> {
    match httparse::parse_chunk_size(buf) {
        Ok(httparse::Status::Complete((consumed, size))) => {
            // httparse accepts a line without digits as size 0.
            if !buf.first().is_some_and(u8::is_ascii_hexdigit) {
                return Err(HttpError::Malformed("invalid chunk size"));
            }
            if consumed > MAX_CHUNK_LINE {
                return Err(HttpError::Malformed("chunk size line too long"));
            }
            // httparse takes any octet inside an extension, a bare LF
            // included: a lenient proxy in front would split the line there
            // (a smuggling primitive). Only the final CRLF may be a line
            // break; no other control character but HTAB is allowed.
            if !valid_chunk_line(&buf[..consumed - 2]) {
                return Err(HttpError::Malformed("invalid character in chunk size line"));
            }
            Ok(Some((consumed, size)))
        }
        Ok(httparse::Status::Partial) if buf.len() > MAX_CHUNK_LINE => {
            Err(HttpError::Malformed("chunk size line too long"))
        }
        Ok(httparse::Status::Partial) => Ok(None),
        Err(_) => Err(HttpError::Malformed("invalid chunk size")),
    }
}

/// `min(remaining, available)` as a usize without lossy casts.
fn clamp_len(remaining: u64, available: usize) -> usize {
    usize::try_from(remaining).map_or(available, |r| r.min(available))
}

/// A chunk-size line without its CRLF: no CR, LF or other control
/// character except HTAB (RFC 9112 §7.1.1 extensions are tokens and
/// quoted strings).
fn valid_chunk_line(line: &[u8]) -> bool {
    line.iter().all(|&b| b == b'\t' || (b >= 0x20 && b != 0x7f))
}

/// A trailer line must look like `name: value` with a token name.
fn valid_trailer_line(line: &[u8]) -> bool {
    match memchr::memchr(b':', line) {
        Some(0) | None => false,
        Some(colon) => line[..colon].iter().all(|&b| is_tchar(b)),
    }
}

/// RFC 9110 token character.
pub(crate) fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Feeds `input` split at `splits` and collects body + leftover.
    fn decode_split(kind: BodyKind, max: usize, input: &[u8], split: usize) -> Result<(Vec<u8>, Vec<u8>), HttpError> {
        decode_split_with(false, kind, max, input, split)
    }

    /// `decode_split` with [`BodyDecoder::decode_joined`] when `joined`.
    fn decode_split_with(
        joined: bool,
        kind: BodyKind,
        max: usize,
        input: &[u8],
        split: usize,
    ) -> Result<(Vec<u8>, Vec<u8>), HttpError> {
        let mut dec = BodyDecoder::new(kind, max);
        let mut buf = BytesMut::new();
        let mut body = Vec::new();
        for part in [&input[..split], &input[split..]] {
            buf.extend_from_slice(part);
            while let Some(data) = if joined { dec.decode_joined(&mut buf)? } else { dec.decode(&mut buf)? } {
                assert!(!data.is_empty());
                body.extend_from_slice(&data);
            }
        }
        if !dec.is_done() {
            dec.finish_on_eof()?;
        }
        Ok((body, buf.to_vec()))
    }

    #[test]
    fn content_length_body_leaves_next_message() {
        let input = b"hello worldGET / HTTP/1.1\r\n";
        for split in 0..=input.len() {
            let (body, rest) = decode_split(BodyKind::Length(11), 100, input, split).unwrap();
            assert_eq!(body, b"hello world");
            assert_eq!(rest, b"GET / HTTP/1.1\r\n");
        }
    }

    #[test]
    fn chunked_with_extensions_and_trailers_every_split() {
        let input = b"5;name=val\r\nhello\r\n6\r\n world\r\n0\r\nx-trailer: 1\r\nother: 2\r\n\r\nNEXT";
        for split in 0..=input.len() {
            let (body, rest) = decode_split(BodyKind::Chunked, 100, input, split).unwrap();
            assert_eq!(body, b"hello world", "split {split}");
            assert_eq!(rest, b"NEXT");
        }
    }

    #[test]
    fn chunked_is_zero_copy() {
        let mut buf = BytesMut::from(&b"5\r\nhello\r\n0\r\n\r\n"[..]);
        let base = buf.as_ptr() as usize;
        let mut dec = BodyDecoder::new(BodyKind::Chunked, 100);
        let data = dec.decode(&mut buf).unwrap().unwrap();
        assert_eq!(data.as_ptr() as usize, base + 3);
        assert_eq!(dec.decode(&mut buf).unwrap(), None);
        assert!(dec.is_done());
    }

    #[test]
    fn chunked_body_limit_applies_to_decoded_size() {
        let input = b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n";
        assert!(decode_split(BodyKind::Chunked, 11, input, 0).is_ok());
        assert_eq!(decode_split(BodyKind::Chunked, 10, input, 0), Err(HttpError::BodyTooLarge));
        // A huge declared chunk is refused before any data arrives.
        let mut dec = BodyDecoder::new(BodyKind::Chunked, 10);
        let mut buf = BytesMut::from(&b"ffffffff\r\n"[..]);
        assert_eq!(dec.decode(&mut buf), Err(HttpError::BodyTooLarge));
    }

    #[test]
    fn length_and_until_close_limits() {
        let mut dec = BodyDecoder::new(BodyKind::Length(11), 10);
        assert_eq!(dec.decode(&mut BytesMut::new()), Err(HttpError::BodyTooLarge));
        let mut dec = BodyDecoder::new(BodyKind::UntilClose, 4);
        let mut buf = BytesMut::from(&b"abcd"[..]);
        assert_eq!(dec.decode(&mut buf).unwrap().unwrap(), &b"abcd"[..]);
        buf.extend_from_slice(b"e");
        assert_eq!(dec.decode(&mut buf), Err(HttpError::BodyTooLarge));
    }

    #[test]
    fn joined_chunks_come_out_as_one_piece_from_the_read_buffer() {
        let mut dec = BodyDecoder::new(BodyKind::Chunked, 1 << 20);
        let mut buf = BytesMut::from(&b"5\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n5\r\nabc"[..]);
        let base = buf.as_ptr() as usize;
        let data = dec.decode_joined(&mut buf).unwrap().unwrap();
        assert_eq!(&data[..], b"hello worldabc");
        assert_eq!(data.as_ptr() as usize, base, "moved in place, not copied out");
        assert!(buf.is_empty());
        assert_eq!(dec.decoded_bytes(), 14);
        // The rest of the last chunk, the last chunk marker and what follows.
        buf.extend_from_slice(b"de\r\n0\r\n\r\nHTTP/1.1");
        assert_eq!(&dec.decode_joined(&mut buf).unwrap().unwrap()[..], b"de");
        assert_eq!(dec.decode_joined(&mut buf).unwrap(), None);
        assert!(dec.is_done());
        assert_eq!(&buf[..], b"HTTP/1.1");
        // The limit counts the chunks joined so far.
        let mut dec = BodyDecoder::new(BodyKind::Chunked, 8);
        let mut buf = BytesMut::from(&b"5\r\nhello\r\n5\r\nworld\r\n"[..]);
        assert_eq!(dec.decode_joined(&mut buf), Err(HttpError::BodyTooLarge));
    }

    #[test]
    fn a_length_body_tells_what_is_left_and_others_do_not() {
        let mut dec = BodyDecoder::new(BodyKind::Length(10), 100);
        assert_eq!(dec.length_left(), Some(10));
        let mut buf = BytesMut::from(&b"abcd"[..]);
        assert_eq!(dec.decode(&mut buf).unwrap().unwrap(), &b"abcd"[..]);
        assert_eq!(dec.length_left(), Some(6));
        buf.extend_from_slice(b"efghij");
        dec.decode(&mut buf).unwrap();
        assert_eq!(dec.length_left(), Some(0));
        assert_eq!(BodyDecoder::new(BodyKind::Chunked, 100).length_left(), None);
        assert_eq!(BodyDecoder::new(BodyKind::UntilClose, 100).length_left(), None);
    }

    #[test]
    fn until_close_finishes_on_eof() {
        let (body, _) = decode_split(BodyKind::UntilClose, 100, b"abc", 1).unwrap();
        assert_eq!(body, b"abc");
    }

    #[test]
    fn empty_kinds_are_done() {
        assert!(BodyDecoder::new(BodyKind::Empty, 0).is_done());
        assert!(BodyDecoder::new(BodyKind::Length(0), 0).is_done());
        let mut dec = BodyDecoder::new(BodyKind::Empty, 0);
        let mut buf = BytesMut::from(&b"next"[..]);
        assert_eq!(dec.decode(&mut buf).unwrap(), None);
        assert_eq!(&buf[..], b"next");
    }

    #[test]
    fn truncated_bodies_fail_on_eof() {
        assert!(decode_split(BodyKind::Length(5), 100, b"abc", 3).is_err());
        assert!(decode_split(BodyKind::Chunked, 100, b"5\r\nhel", 3).is_err());
        assert!(decode_split(BodyKind::Chunked, 100, b"0\r\n", 3).is_err());
    }

    #[test]
    fn malformed_chunks() {
        for bad in [
            &b"\r\nhello"[..],
            b"zz\r\n",
            b"5\r\nhelloXY",
            b"5\nhello\r\n",
            b"5\r\nhello\r\n0\r\nbad trailer\r\n\r\n",
            b"5\r\nhello\r\n0\r\nx: y\n\r\n",
            b"fffffffffffffffff\r\n",
            // A bare LF (or CR, or NUL) inside a chunk extension.
            b"5;a\nb\r\nhello\r\n0\r\n\r\n",
            b"5;a\rb\r\nhello\r\n0\r\n\r\n",
            b"5;a\x00b\r\nhello\r\n0\r\n\r\n",
            b"5\r\nhello\r\n0;x\ny\r\n\r\n",
        ] {
            let r = decode_split(BodyKind::Chunked, 1 << 40, bad, 0);
            assert!(matches!(r, Err(HttpError::Malformed(_))), "{bad:?}: {r:?}");
        }
    }

    #[test]
    fn endless_chunk_line_or_trailer_is_bounded() {
        let mut dec = BodyDecoder::new(BodyKind::Chunked, 100);
        let mut buf = BytesMut::from(&b"5;"[..]);
        buf.extend_from_slice(&[b'x'; MAX_CHUNK_LINE]);
        assert!(matches!(dec.decode(&mut buf), Err(HttpError::Malformed(_))));

        let mut dec = BodyDecoder::new(BodyKind::Chunked, 100);
        let mut buf = BytesMut::from(&b"0\r\n"[..]);
        for _ in 0..MAX_TRAILER_BYTES / 8 {
            buf.extend_from_slice(b"a: bcd\r\n");
        }
        buf.extend_from_slice(b"a: bcd\r\n\r\n");
        assert_eq!(dec.decode(&mut buf), Err(HttpError::HeadTooLarge));
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(input in proptest::collection::vec(any::<u8>(), 0..512),
                                       split in 0usize..512, max in 0usize..256) {
            let split = split.min(input.len());
            for kind in [BodyKind::Chunked, BodyKind::Length(40), BodyKind::UntilClose] {
                if let Ok((body, _)) = decode_split(kind, max, &input, split) {
                    prop_assert!(body.len() <= max);
                }
            }
        }

        #[test]
        fn joined_decoding_reads_what_piecewise_decoding_reads(
            input in proptest::collection::vec(any::<u8>(), 0..512), split in 0usize..512, max in 0usize..256,
        ) {
            let split = split.min(input.len());
            for kind in [BodyKind::Chunked, BodyKind::Length(40), BodyKind::UntilClose] {
                let piecewise = decode_split_with(false, kind, max, &input, split);
                let joined = decode_split_with(true, kind, max, &input, split);
                prop_assert_eq!(piecewise.is_ok(), joined.is_ok(), "{:?} against {:?}", piecewise, joined);
                if let (Ok(a), Ok(b)) = (piecewise, joined) {
                    prop_assert_eq!(a, b);
                }
            }
        }

        #[test]
        fn joined_chunks_roundtrip(chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..8),
                                   split in 0usize..1024, tail in proptest::collection::vec(any::<u8>(), 0..16)) {
            let mut wire = BytesMut::new();
            let mut expected = Vec::new();
            for c in &chunks {
                crate::http::write_chunk(&mut wire, c);
                expected.extend_from_slice(c);
            }
            crate::http::write_last_chunk(&mut wire);
            wire.extend_from_slice(&tail);
            let split = split.min(wire.len());
            let (body, rest) = decode_split_with(true, BodyKind::Chunked, 1 << 20, &wire, split).unwrap();
            prop_assert_eq!(body, expected);
            prop_assert_eq!(rest, tail);
        }

        #[test]
        fn chunked_roundtrip(chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..8),
                             split in 0usize..1024) {
            let mut wire = BytesMut::new();
            let mut expected = Vec::new();
            for c in &chunks {
                crate::http::write_chunk(&mut wire, c);
                expected.extend_from_slice(c);
            }
            crate::http::write_last_chunk(&mut wire);
            let split = split.min(wire.len());
            let (body, rest) = decode_split(BodyKind::Chunked, 1 << 20, &wire, split).unwrap();
            prop_assert_eq!(body, expected);
            prop_assert!(rest.is_empty());
        }
    }
}
