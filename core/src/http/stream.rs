//! How a streamed response body (its length unknown when the head goes out)
//! is framed for one request: chunked to an HTTP/1.1 client; raw bytes
//! ended by closing the connection to an HTTP/1.0 one, which has no chunked
//! coding (RFC 9112 §6.3, §7.1). Every streaming writer frames through this,
//! so the choice is made once per request, from its version.

use bytes::{Bytes, BytesMut};

use super::{begin_chunk, end_chunk, gather_chunk, gather_chunk_parts, write_chunk, write_last_chunk, Framing};
use crate::rt::gather::Gather;

/// A streamed body's framing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StreamFraming {
    /// `transfer-encoding: chunked` (HTTP/1.1).
    #[default]
    Chunked,
    /// No framing header; the body ends when the connection closes (HTTP/1.0).
    Close,
}

impl StreamFraming {
    /// The framing a client speaking HTTP/1.`minor` can read.
    pub fn for_version(minor: u8) -> Self {
        if minor >= 1 {
            StreamFraming::Chunked
        } else {
            StreamFraming::Close
        }
    }

    /// The response head's framing.
    pub fn framing(self) -> Framing {
        match self {
            StreamFraming::Chunked => Framing::Chunked,
            StreamFraming::Close => Framing::Close,
        }
    }

    /// Whether the connection may stay open after the body: never when
    /// only its close ends the body.
    pub fn keep_alive(self, asked: bool) -> bool {
        asked && self == StreamFraming::Chunked
    }

    /// Starts a piece whose data is appended to `out` next (see
    /// [`begin_chunk`]); returns where it starts, for [`Self::end`].
    pub fn begin(self, out: &mut BytesMut) -> usize {
        match self {
            StreamFraming::Chunked => begin_chunk(out),
            StreamFraming::Close => out.len(),
        }
    }

    /// Ends the piece begun at `start`.
    pub fn end(self, out: &mut BytesMut, start: usize) {
        if self == StreamFraming::Chunked {
            end_chunk(out, start);
        }
    }

    /// Appends `data` as one piece (nothing for empty `data`).
    pub fn write(self, out: &mut BytesMut, data: &[u8]) {
        match self {
            StreamFraming::Chunked => write_chunk(out, data),
            StreamFraming::Close => out.extend_from_slice(data),
        }
    }

    /// Appends the end of the body (the connection's close ends a
    /// close-delimited one).
    pub fn write_last(self, out: &mut BytesMut) {
        if self == StreamFraming::Chunked {
            write_last_chunk(out);
        }
    }

    /// Queues `data` as one piece, without copying it.
    pub fn gather(self, out: &mut Gather, data: Bytes) {
        match self {
            StreamFraming::Chunked => gather_chunk(out, data),
            StreamFraming::Close => out.push(data),
        }
    }

    /// Queues `parts` as one piece, without copying them.
    pub fn gather_parts(self, out: &mut Gather, parts: &[Bytes]) {
        match self {
            StreamFraming::Chunked => gather_chunk_parts(out, parts),
            StreamFraming::Close => parts.iter().for_each(|p| out.push(p.clone())),
        }
    }

    /// Queues the end of the body.
    pub fn gather_last(self, out: &mut Gather) {
        if self == StreamFraming::Chunked {
            out.put_with(write_last_chunk);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::http::{parse_response_head, write_response_head, BodyDecoder, BodyKind, Limits};

    /// A head and a body of three pieces, written every way a streaming
    /// writer does.
    fn streamed(s: StreamFraming) -> (BytesMut, Vec<u8>) {
        let mut out = BytesMut::new();
        write_response_head(&mut out, 200, &[("content-type", "text/event-stream")], s.framing(), s.keep_alive(true));
        let at = s.begin(&mut out);
        out.extend_from_slice(b"data: a\n\n");
        s.end(&mut out, at);
        s.write(&mut out, b"data: b\n\n");
        s.write(&mut out, b"");
        s.write_last(&mut out);
        let mut gathered = Gather::new();
        s.gather(&mut gathered, Bytes::from_static(b"data: c\n\n"));
        s.gather_parts(&mut gathered, &[Bytes::from_static(b"data: "), Bytes::new(), Bytes::from_static(b"d\n\n")]);
        s.gather_last(&mut gathered);
        (out, gathered.to_vec())
    }

    #[test]
    fn http_1_1_streams_are_chunked() {
        assert_eq!(StreamFraming::for_version(1), StreamFraming::Chunked);
        let (mut out, gathered) = streamed(StreamFraming::Chunked);
        let head = parse_response_head(&mut out, &Limits::default(), false).unwrap().unwrap();
        assert_eq!((head.body, head.keep_alive), (BodyKind::Chunked, true));
        let mut dec = BodyDecoder::new(head.body, 1 << 20);
        let mut body = Vec::new();
        while let Some(d) = dec.decode(&mut out).unwrap() {
            body.extend_from_slice(&d);
        }
        assert!(dec.is_done());
        assert_eq!(body, b"data: a\n\ndata: b\n\n");
        assert_eq!(gathered, b"9\r\ndata: c\n\n\r\n9\r\ndata: d\n\n\r\n0\r\n\r\n");
    }

    #[test]
    fn http_1_0_streams_are_raw_and_end_with_the_connection() {
        assert_eq!(StreamFraming::for_version(0), StreamFraming::Close);
        assert!(!StreamFraming::Close.keep_alive(true));
        let (out, gathered) = streamed(StreamFraming::Close);
        let text = std::str::from_utf8(&out).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(!head.contains("transfer-encoding") && !head.contains("content-length"), "{head}");
        assert!(head.ends_with("connection: close"), "{head}");
        assert_eq!(body, "data: a\n\ndata: b\n\n");
        assert_eq!(gathered, b"data: c\n\ndata: d\n\n");
        let head = parse_response_head(&mut out.clone(), &Limits::default(), false).unwrap().unwrap();
        assert_eq!((head.body, head.keep_alive), (BodyKind::UntilClose, false));
    }
}
