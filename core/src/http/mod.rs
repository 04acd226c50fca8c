//! Sans-IO HTTP/1.1 codec: request heads and bodies for the servers, response
//! heads and bodies for the upstream client. Built on `httparse`; no I/O here.
//!
//! Framing follows RFC 9112 strictly where lenience enables request
//! smuggling: Content-Length must be digits (duplicates must agree), a message
//! with both Content-Length and Transfer-Encoding is rejected, and chunk
//! lines need CRLF. An HTTP/1.1 request needs exactly one valid `Host`; an
//! absolute-form target is reduced to its path. A streamed response is
//! chunked for HTTP/1.1 and close-delimited for HTTP/1.0 ([`StreamFraming`]).

pub mod chunked;
pub mod client;
pub mod error;
pub mod name;
pub mod request;
pub mod response;
pub mod stream;
mod target;

use std::mem::MaybeUninit;

use bytes::{Buf, Bytes, BytesMut};

pub use chunked::{BodyDecoder, BodyKind};
pub use client::{parse_response_head, write_request_head, ResponseHead};
pub use error::HttpError;
pub use name::HeaderName;
pub use request::{parse_request_head, RequestHead};
pub use response::{
    begin_chunk, end_chunk, gather_chunk, gather_chunk_parts, reason_phrase, write_chunk, write_last_chunk,
    write_response_head, Framing,
};
pub use stream::StreamFraming;

/// Size limits applied while parsing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest accepted head (request line/status line + headers), in bytes.
    pub max_head_bytes: usize,
    /// Largest accepted decoded body, in bytes.
    pub max_body_bytes: usize,
    /// Most header lines accepted.
    pub max_headers: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self { max_head_bytes: 16 * 1024, max_body_bytes: 4 * 1024 * 1024, max_headers: 64 }
    }
}

/// First value of header `name` (case-insensitive) in a parsed header list.
pub fn find_header<'a>(headers: &'a [(HeaderName, Bytes)], name: &str) -> Option<&'a [u8]> {
    headers.iter().find(|(n, _)| n.as_bytes().eq_ignore_ascii_case(name.as_bytes())).map(|(_, v)| v.as_ref())
}

/// Header slots on the stack (left uninitialized: httparse writes those it
/// fills) for limits up to this; a larger limit takes them from the heap.
const STACK_HEADERS: usize = 128;

/// What a head parser reports on a complete head: its length, the headers
/// it filled in, and its own output (start line fields).
pub(crate) type HeadStatus<'h, 'b, T> =
    Result<httparse::Status<(usize, &'h [httparse::Header<'b>], T)>, httparse::Error>;

/// A complete head: the parser's output and the headers.
pub(crate) type ParsedHead<T> = (T, Vec<(HeaderName, Bytes)>);

/// Runs `parse` over the first `max_head_bytes` of `buf` with `max_headers`
/// header slots. On a complete head, removes it from `buf` and returns the
/// parse output and the headers with lower-cased names and values sliced
/// from one copy of the head.
pub(crate) fn parse_head<T>(
    buf: &mut BytesMut,
    limits: &Limits,
    parse: impl for<'h, 'b> FnOnce(&'h mut [MaybeUninit<httparse::Header<'b>>], &'b [u8]) -> HeadStatus<'h, 'b, T>,
) -> Result<Option<ParsedHead<T>>, HttpError> {
    // Only the allowed prefix is scanned, which bounds the work per call on
    // trickled input and rejects an endless head before it completes.
    let window = &buf[..buf.len().min(limits.max_head_bytes)];
    // Uninitialized: filling 128 slots before each parse cost more than
    // the parse of a typical head.
    let mut stack = [const { MaybeUninit::uninit() }; STACK_HEADERS];
    let mut heap = Vec::new();
    let storage: &mut [MaybeUninit<httparse::Header<'_>>] = if limits.max_headers <= STACK_HEADERS {
        &mut stack[..limits.max_headers]
    } else {
        heap.reserve_exact(limits.max_headers);
        &mut heap.spare_capacity_mut()[..limits.max_headers]
    };
    let base = window.as_ptr() as usize;
    let (len, parsed, out) = match parse(storage, window) {
        Ok(httparse::Status::Complete(done)) => done,
        Ok(httparse::Status::Partial) => {
            if buf.len() > limits.max_head_bytes {
                return Err(HttpError::HeadTooLarge);
            }
            return Ok(None);
        }
        Err(httparse::Error::TooManyHeaders) => return Err(HttpError::HeadTooLarge),
        Err(e) => return Err(HttpError::Malformed(httparse_error(e))),
    };
    // Names and values are sub-slices of `window`: by their offsets they
    // are sliced from one copy of the head (a few hundred bytes). Slices of
    // `buf` would keep the whole read buffer (and the body bytes read with
    // the head) alive as long as the request or response. Names are
    // lower-cased in the copy, so neither needs an allocation of its own.
    let span = |s: &[u8]| {
        let start = (s.as_ptr() as usize).saturating_sub(base);
        (start, start + s.len())
    };
    let mut copy = BytesMut::from(window.get(..len).ok_or(HttpError::Malformed("head out of range"))?);
    for h in parsed {
        let (start, end) = span(h.name.as_bytes());
        copy.get_mut(start..end).ok_or(HttpError::Malformed("header name out of range"))?.make_ascii_lowercase();
    }
    let head = copy.freeze();
    let mut headers = Vec::with_capacity(parsed.len());
    for h in parsed {
        let ((ns, ne), (vs, ve)) = (span(h.name.as_bytes()), span(h.value));
        if ne > head.len() || ve > head.len() {
            return Err(HttpError::Malformed("header out of range"));
        }
        // httparse accepted the name as a token.
        headers.push((HeaderName::from_checked(head.slice(ns..ne)), head.slice(vs..ve)));
    }
    buf.advance(len);
    Ok(Some((out, headers)))
}

fn httparse_error(e: httparse::Error) -> &'static str {
    match e {
        httparse::Error::HeaderName => "invalid header name",
        httparse::Error::HeaderValue => "invalid header value",
        httparse::Error::NewLine => "invalid line ending",
        httparse::Error::Status => "invalid status",
        httparse::Error::Token => "invalid token",
        httparse::Error::TooManyHeaders => "too many headers",
        httparse::Error::Version => "invalid HTTP version",
    }
}

/// Comma-separated list elements of every `name` header, trimmed, empty ones skipped.
pub(crate) fn list_values<'a>(
    headers: &'a [(HeaderName, Bytes)],
    name: &'a str,
) -> impl Iterator<Item = &'a [u8]> + 'a {
    headers
        .iter()
        .filter(move |(n, _)| n == name)
        .flat_map(|(_, v)| v.split(|&b| b == b','))
        .map(trim_ows)
        .filter(|s| !s.is_empty())
}

pub(crate) fn trim_ows(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}

/// Explicit framing from Content-Length / Transfer-Encoding: `None` when
/// neither is present.
pub(crate) fn explicit_framing(headers: &[(HeaderName, Bytes)], version: u8) -> Result<Option<BodyKind>, HttpError> {
    let has_cl = headers.iter().any(|(n, _)| n == "content-length");
    let has_te = headers.iter().any(|(n, _)| n == "transfer-encoding");
    if has_cl && has_te {
        // RFC 9112 §6.3: the classic request-smuggling ambiguity; refuse it.
        return Err(HttpError::Malformed("both content-length and transfer-encoding"));
    }
    if has_te {
        if version == 0 {
            return Err(HttpError::Malformed("transfer-encoding in HTTP/1.0"));
        }
        let mut chunked = 0usize;
        for coding in list_values(headers, "transfer-encoding") {
            if coding.eq_ignore_ascii_case(b"chunked") {
                chunked += 1;
            } else {
                return Err(HttpError::UnsupportedTransferEncoding);
            }
        }
        return match chunked {
            0 => Err(HttpError::Malformed("empty transfer-encoding")),
            1 => Ok(Some(BodyKind::Chunked)),
            _ => Err(HttpError::Malformed("chunked applied more than once")),
        };
    }
    if has_cl {
        let mut length = None;
        // Every header line must have a value; an empty one is an error too.
        for (_, v) in headers.iter().filter(|(n, _)| n == "content-length") {
            if trim_ows(v).is_empty() {
                return Err(HttpError::Malformed("empty content-length"));
            }
        }
        for value in list_values(headers, "content-length") {
            let n = parse_decimal(value).ok_or(HttpError::Malformed("invalid content-length"))?;
            match length {
                Some(prev) if prev != n => return Err(HttpError::Malformed("conflicting content-length")),
                _ => length = Some(n),
            }
        }
        return Ok(length.map(BodyKind::Length));
    }
    Ok(None)
}

/// Digits only (no sign, no whitespace), without overflow.
fn parse_decimal(s: &[u8]) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    s.iter().try_fold(0u64, |acc, &b| {
        if !b.is_ascii_digit() {
            return None;
        }
        acc.checked_mul(10)?.checked_add(u64::from(b - b'0'))
    })
}

/// Persistence per RFC 9112 §9.3: HTTP/1.1 defaults to keep-alive, HTTP/1.0
/// needs `Connection: keep-alive`; `close` always wins.
pub(crate) fn keep_alive(headers: &[(HeaderName, Bytes)], version: u8) -> bool {
    let mut close = false;
    let mut keep = false;
    for token in list_values(headers, "connection") {
        if token.eq_ignore_ascii_case(b"close") {
            close = true;
        } else if token.eq_ignore_ascii_case(b"keep-alive") {
            keep = true;
        }
    }
    !close && (version >= 1 || keep)
}

/// Appends `s` minus CR/LF so a caller-supplied value can never inject a header line.
pub(crate) fn put_sanitized(out: &mut BytesMut, s: impl AsRef<[u8]>) {
    let bytes = s.as_ref();
    if memchr::memchr2(b'\r', b'\n', bytes).is_none() {
        out.extend_from_slice(bytes);
    } else {
        out.extend(bytes.iter().copied().filter(|&b| b != b'\r' && b != b'\n'));
    }
}

/// Appends `name: value\r\n` for each header, sanitized. Values are bytes:
/// a relayed header may carry non-UTF-8 (obs-text) octets.
pub(crate) fn put_headers<V: AsRef<[u8]>>(out: &mut BytesMut, headers: &[(&str, V)]) {
    for (name, value) in headers {
        put_sanitized(out, name);
        out.extend_from_slice(b": ");
        put_sanitized(out, value);
        out.extend_from_slice(b"\r\n");
    }
}

/// Appends the decimal form of `n`.
pub fn put_decimal(out: &mut BytesMut, n: u64) {
    // One digit (an index, most counts in an event): no loop.
    if let Ok(d @ 0..=9) = u8::try_from(n) {
        out.extend_from_slice(&[b'0' + d]);
        return;
    }
    let mut digits = [0u8; 20];
    out.extend_from_slice(decimal(n, &mut digits));
}

/// Appends the decimal form of `n` to a string (no formatting machinery:
/// ids and numbers on the hot path).
pub fn push_decimal(out: &mut String, n: u64) {
    let mut digits = [0u8; 20];
    for d in decimal(n, &mut digits) {
        out.push(char::from(*d));
    }
}

/// The decimal digits of `n`, written at the end of `digits`.
fn decimal(mut n: u64, digits: &mut [u8; 20]) -> &[u8] {
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    &digits[i..]
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn hdrs(list: &[(&str, &str)]) -> Vec<(HeaderName, Bytes)> {
        list.iter().map(|(n, v)| (HeaderName::parse(n).unwrap(), Bytes::copy_from_slice(v.as_bytes()))).collect()
    }

    #[test]
    fn http_framing_rules() {
        assert_eq!(explicit_framing(&hdrs(&[]), 1), Ok(None));
        assert_eq!(explicit_framing(&hdrs(&[("content-length", "12")]), 1), Ok(Some(BodyKind::Length(12))));
        assert_eq!(
            explicit_framing(&hdrs(&[("content-length", "12"), ("content-length", "12, 12")]), 1),
            Ok(Some(BodyKind::Length(12)))
        );
        assert_eq!(explicit_framing(&hdrs(&[("transfer-encoding", "Chunked")]), 1), Ok(Some(BodyKind::Chunked)));
        assert_eq!(
            explicit_framing(&hdrs(&[("transfer-encoding", "gzip, chunked")]), 1),
            Err(HttpError::UnsupportedTransferEncoding)
        );
        for bad in [
            hdrs(&[("content-length", "1"), ("content-length", "2")]),
            hdrs(&[("content-length", "+1")]),
            hdrs(&[("content-length", "1 2")]),
            hdrs(&[("content-length", "0x10")]),
            hdrs(&[("content-length", "")]),
            hdrs(&[("content-length", "99999999999999999999999")]),
            hdrs(&[("content-length", "5"), ("transfer-encoding", "chunked")]),
            hdrs(&[("transfer-encoding", "chunked, chunked")]),
            hdrs(&[("transfer-encoding", " , ")]),
        ] {
            assert!(matches!(explicit_framing(&bad, 1), Err(HttpError::Malformed(_))), "{bad:?}");
        }
        assert!(explicit_framing(&hdrs(&[("transfer-encoding", "chunked")]), 0).is_err());
    }

    #[test]
    fn http_keep_alive_rules() {
        assert!(keep_alive(&hdrs(&[]), 1));
        assert!(!keep_alive(&hdrs(&[]), 0));
        assert!(keep_alive(&hdrs(&[("connection", "Keep-Alive")]), 0));
        assert!(!keep_alive(&hdrs(&[("connection", "upgrade, close")]), 1));
    }

    #[test]
    fn decimals_are_what_format_writes() {
        for n in (0..2_000u64).chain([9_999, 10_000, 99_999_999, u64::MAX - 1, u64::MAX]) {
            let mut out = BytesMut::new();
            put_decimal(&mut out, n);
            assert_eq!(&out[..], n.to_string().as_bytes());
        }
    }

    #[test]
    fn http_decimal_and_sanitize() {
        let mut out = BytesMut::new();
        put_decimal(&mut out, 0);
        out.extend_from_slice(b" ");
        put_decimal(&mut out, u64::MAX);
        out.extend_from_slice(b" ");
        put_sanitized(&mut out, "a\r\nb");
        assert_eq!(&out[..], b"0 18446744073709551615 ab");
        let mut s = String::from("x-");
        for n in [0, 7, 10, 1234567890, u64::MAX] {
            push_decimal(&mut s, n);
            s.push(' ');
        }
        assert_eq!(s, "x-0 7 10 1234567890 18446744073709551615 ");
    }
}
