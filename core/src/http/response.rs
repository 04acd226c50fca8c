//! Server side: writing response heads and chunked bodies.

use bytes::BytesMut;

use super::{put_decimal, put_headers};

/// How the response body will be framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// `Content-Length: n`.
    Length(usize),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// No framing header: the body ends when the connection closes (for
    /// an HTTP/1.0 client, which cannot read chunked). Always written
    /// with `Connection: close`.
    Close,
}

/// Appends a status line, `headers`, the framing header and
/// `Connection: keep-alive|close` plus a blank line to `out`.
///
/// CR and LF are stripped from names and values so that no header can be
/// injected. No framing header is written for 1xx and 204 responses, which
/// must not carry one (RFC 9110 §8.6). `Framing::Close` writes
/// `Connection: close` whatever `keep_alive` says.
pub fn write_response_head<V: AsRef<[u8]>>(
    out: &mut BytesMut,
    status: u16,
    headers: &[(&str, V)],
    framing: Framing,
    keep_alive: bool,
) {
    out.reserve(64 + headers.iter().map(|(n, v)| n.len() + v.as_ref().len() + 4).sum::<usize>());
    out.extend_from_slice(b"HTTP/1.1 ");
    put_decimal(out, u64::from(status));
    out.extend_from_slice(b" ");
    out.extend_from_slice(reason_phrase(status).as_bytes());
    out.extend_from_slice(b"\r\n");
    put_headers(out, headers);
    if !(status < 200 || status == 204) {
        match framing {
            Framing::Length(n) => {
                out.extend_from_slice(b"content-length: ");
                put_decimal(out, n as u64);
                out.extend_from_slice(b"\r\n");
            }
            Framing::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
            Framing::Close => {}
        }
    }
    let keep_alive = keep_alive && framing != Framing::Close;
    out.extend_from_slice(if keep_alive { b"connection: keep-alive\r\n\r\n" } else { b"connection: close\r\n\r\n" });
}

/// Appends one chunk (no-op for empty `data`: an empty chunk would end the body).
pub fn write_chunk(out: &mut BytesMut, data: &[u8]) {
    if data.is_empty() {
        return;
    }
    out.reserve(data.len() + 20);
    put_hex(out, data.len());
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// Width of the chunk-size field [`begin_chunk`] reserves: eight hex
/// digits (leading zeros are valid chunk-size syntax), so a chunk of up to
/// 4 GiB is written in place and its size patched in after.
const CHUNK_SIZE_DIGITS: usize = 8;

/// Starts a chunk whose data is appended to `out` next (no staging buffer,
/// no copy); returns where it starts, for [`end_chunk`].
pub fn begin_chunk(out: &mut BytesMut) -> usize {
    let start = out.len();
    out.extend_from_slice(&[b'0'; CHUNK_SIZE_DIGITS]);
    out.extend_from_slice(b"\r\n");
    start
}

/// Ends the chunk begun at `start`: patches its size, or removes it when no
/// data was appended (an empty chunk would end the body).
pub fn end_chunk(out: &mut BytesMut, start: usize) {
    let data_at = start + CHUNK_SIZE_DIGITS + 2;
    let len = out.len().saturating_sub(data_at);
    if len == 0 || u32::try_from(len).is_err() {
        debug_assert!(len == 0, "a chunk over 4 GiB");
        out.truncate(start);
        return;
    }
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let field = &mut out[start..start + CHUNK_SIZE_DIGITS];
    let mut n = len;
    for digit in field.iter_mut().rev() {
        *digit = HEX[n & 0xf];
        n >>= 4;
    }
    out.extend_from_slice(b"\r\n");
}

/// Queues one chunk with its payload as a segment of its own (no copy;
/// no-op for empty `data`).
pub fn gather_chunk(out: &mut crate::rt::gather::Gather, data: bytes::Bytes) {
    if data.is_empty() {
        return;
    }
    out.put_with(|b| {
        put_hex(b, data.len());
        b.extend_from_slice(b"\r\n");
    });
    out.push(data);
    out.put_slice(b"\r\n");
}

/// Queues `parts` as one chunk (their total size, then each part as a
/// segment of its own; no-op when they are all empty).
pub fn gather_chunk_parts(out: &mut crate::rt::gather::Gather, parts: &[bytes::Bytes]) {
    let total: usize = parts.iter().map(bytes::Bytes::len).sum();
    if total == 0 {
        return;
    }
    out.put_with(|b| {
        put_hex(b, total);
        b.extend_from_slice(b"\r\n");
    });
    for p in parts {
        out.push(p.clone());
    }
    out.put_slice(b"\r\n");
}

/// Appends the terminating zero-length chunk.
pub fn write_last_chunk(out: &mut BytesMut) {
    out.extend_from_slice(b"0\r\n\r\n");
}

/// Canonical reason phrase for a status code (empty for unknown codes,
/// which the grammar allows).
pub fn reason_phrase(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        101 => "Switching Protocols",
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        204 => "No Content",
        206 => "Partial Content",
        301 => "Moved Permanently",
        302 => "Found",
        304 => "Not Modified",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        402 => "Payment Required",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        406 => "Not Acceptable",
        408 => "Request Timeout",
        409 => "Conflict",
        410 => "Gone",
        411 => "Length Required",
        412 => "Precondition Failed",
        413 => "Content Too Large",
        414 => "URI Too Long",
        415 => "Unsupported Media Type",
        417 => "Expectation Failed",
        421 => "Misdirected Request",
        422 => "Unprocessable Content",
        425 => "Too Early",
        426 => "Upgrade Required",
        428 => "Precondition Required",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        451 => "Unavailable For Legal Reasons",
        499 => "Client Closed Request",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        507 => "Insufficient Storage",
        511 => "Network Authentication Required",
        _ => "",
    }
}

fn put_hex(out: &mut BytesMut, n: usize) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut digits = [0u8; 16];
    let mut i = digits.len();
    let mut n = n;
    loop {
        i -= 1;
        digits[i] = HEX[n & 0xf];
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::http::{parse_response_head, BodyDecoder, BodyKind, Limits};

    #[test]
    fn chunks_written_in_place_decode_and_empty_ones_vanish() {
        let mut out = BytesMut::new();
        let empty = begin_chunk(&mut out);
        end_chunk(&mut out, empty);
        assert!(out.is_empty());
        for data in [&b"a"[..], &[b'x'; 300][..], b"data: {}\n\n"] {
            let at = begin_chunk(&mut out);
            out.extend_from_slice(data);
            end_chunk(&mut out, at);
        }
        assert!(out.starts_with(b"00000001\r\na\r\n0000012c\r\n"));
        write_last_chunk(&mut out);
        let mut decoder = BodyDecoder::new(BodyKind::Chunked, 1 << 20);
        let mut body = Vec::new();
        while let Some(piece) = decoder.decode(&mut out).unwrap() {
            body.extend_from_slice(&piece);
        }
        assert!(decoder.is_done());
        assert_eq!(body.len(), 1 + 300 + 10);
    }

    #[test]
    fn head_roundtrips_through_client_parser() {
        let mut out = BytesMut::new();
        write_response_head(&mut out, 200, &[("content-type", "text/event-stream")], Framing::Chunked, true);
        write_chunk(&mut out, b"data: x\n\n");
        write_chunk(&mut out, b"");
        write_chunk(&mut out, &[b'a'; 300]);
        write_last_chunk(&mut out);
        assert!(
            out.starts_with(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n")
        );
        let head = parse_response_head(&mut out, &Limits::default(), false).unwrap().unwrap();
        assert_eq!((head.status, head.body, head.keep_alive), (200, BodyKind::Chunked, true));
        let mut dec = BodyDecoder::new(head.body, 1 << 20);
        let mut body = Vec::new();
        while let Some(d) = dec.decode(&mut out).unwrap() {
            body.extend_from_slice(&d);
        }
        assert!(dec.is_done());
        assert_eq!(body.len(), 9 + 300);
        assert!(out.is_empty());
    }

    #[test]
    fn gathered_chunks_are_the_same_bytes_as_copied_ones() {
        let mut copied = BytesMut::new();
        let mut gathered = crate::rt::gather::Gather::new();
        for data in [&b"data: x\n\n"[..], b"", &[b'a'; 300]] {
            write_chunk(&mut copied, data);
            gather_chunk(&mut gathered, bytes::Bytes::copy_from_slice(data));
        }
        assert_eq!(gathered.to_vec(), &copied[..]);
        assert_eq!(gathered.pushed(), 2);
        let mut parts = crate::rt::gather::Gather::new();
        let pieces =
            [bytes::Bytes::from_static(b"data: a\n\n"), bytes::Bytes::new(), bytes::Bytes::from_static(b"data: b\n\n")];
        gather_chunk_parts(&mut parts, &pieces);
        gather_chunk_parts(&mut parts, &[bytes::Bytes::new()]);
        assert_eq!(parts.to_vec(), b"12\r\ndata: a\n\ndata: b\n\n\r\n");
    }

    #[test]
    fn length_framing_close_and_injection() {
        let mut out = BytesMut::new();
        write_response_head(&mut out, 404, &[("x-evil", "a\r\nset-cookie: b")], Framing::Length(5), false);
        assert_eq!(
            &out[..],
            &b"HTTP/1.1 404 Not Found\r\nx-evil: aset-cookie: b\r\ncontent-length: 5\r\nconnection: close\r\n\r\n"[..]
        );
        let mut out = BytesMut::new();
        write_response_head::<&str>(&mut out, 204, &[], Framing::Length(0), true);
        assert_eq!(&out[..], &b"HTTP/1.1 204 No Content\r\nconnection: keep-alive\r\n\r\n"[..]);
        assert_eq!(reason_phrase(599), "");
    }
}
