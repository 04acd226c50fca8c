//! Client side: writing request heads and parsing response heads.

use bytes::{Bytes, BytesMut};

use super::{
    explicit_framing, find_header, keep_alive, parse_head, put_decimal, put_headers, put_sanitized, BodyKind,
    HeaderName, HttpError, Limits,
};

/// A parsed response head. Header names are lower-cased.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHead {
    /// Status code.
    pub status: u16,
    /// Minor version: 0 or 1.
    pub version: u8,
    /// Header (lower-cased name, raw value) pairs in order.
    pub headers: Vec<(HeaderName, Bytes)>,
    /// Body framing, taking the request method into account.
    pub body: BodyKind,
    /// The connection may be reused after the body.
    pub keep_alive: bool,
}

impl ResponseHead {
    /// First value of a header (name compared case-insensitively).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        find_header(&self.headers, name)
    }
}

/// Appends a request line, `Host`, `headers` and `Content-Length` (when
/// `content_length` is Some) plus a blank line to `out`. The `Host` value
/// is `host`, followed by `:port` when `port` is Some (an IPv6 literal then
/// in brackets). CR and LF are stripped from every field so that none can
/// inject a header.
pub fn write_request_head<V: AsRef<[u8]>>(
    out: &mut BytesMut,
    method: &str,
    target: &str,
    (host, port): (&str, Option<u16>),
    headers: &[(&str, V)],
    content_length: Option<usize>,
) {
    let header_bytes: usize = headers.iter().map(|(n, v)| n.len() + v.as_ref().len() + 4).sum();
    out.reserve(72 + target.len() + host.len() + header_bytes);
    put_sanitized(out, method);
    out.extend_from_slice(b" ");
    put_sanitized(out, target);
    out.extend_from_slice(b" HTTP/1.1\r\nhost: ");
    match port {
        Some(port) => {
            let v6 = host.contains(':');
            if v6 {
                out.extend_from_slice(b"[");
            }
            put_sanitized(out, host);
            out.extend_from_slice(if v6 { b"]:" } else { b":" });
            put_decimal(out, u64::from(port));
        }
        None => put_sanitized(out, host),
    }
    out.extend_from_slice(b"\r\n");
    put_headers(out, headers);
    if let Some(n) = content_length {
        out.extend_from_slice(b"content-length: ");
        put_decimal(out, n as u64);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// Parses one response head from the front of `buf` (same contract as
/// `parse_request_head`). `head_request` is true when answering a HEAD
/// request (no body). 1xx interim responses are skipped.
///
/// Skipped interim responses are removed from `buf` even when `Ok(None)` is
/// returned afterwards; they are complete and carry nothing the caller needs.
/// `101 Switching Protocols` is final (no body, not reusable).
pub fn parse_response_head(
    buf: &mut BytesMut,
    limits: &Limits,
    head_request: bool,
) -> Result<Option<ResponseHead>, HttpError> {
    loop {
        let parsed = parse_head(buf, limits, |storage, window| {
            let mut res = httparse::Response::new(&mut []);
            Ok(
                match httparse::ParserConfig::default().parse_response_with_uninit_headers(&mut res, window, storage)? {
                    httparse::Status::Complete(len) => {
                        let start = (res.code.unwrap_or_default(), res.version.unwrap_or_default());
                        httparse::Status::Complete((len, &*res.headers, start))
                    }
                    httparse::Status::Partial => httparse::Status::Partial,
                },
            )
        })?;
        let Some(((status, version), headers)) = parsed else {
            return Ok(None);
        };
        if !(100..=999).contains(&status) {
            return Err(HttpError::Malformed("invalid status code"));
        }
        if (100..200).contains(&status) && status != 101 {
            continue;
        }
        let mut keep_alive = keep_alive(&headers, version);
        let body = if head_request || status == 101 || status == 204 || status == 304 {
            // RFC 9112 §6.3 rules 1-2: these never have a body, whatever the headers say.
            if status == 101 {
                keep_alive = false;
            }
            BodyKind::Empty
        } else {
            match explicit_framing(&headers, version)? {
                Some(BodyKind::Length(n)) if n > limits.max_body_bytes as u64 => return Err(HttpError::BodyTooLarge),
                Some(kind) => kind,
                None => {
                    // Delimited only by close: the connection cannot be reused.
                    keep_alive = false;
                    BodyKind::UntilClose
                }
            }
        };
        return Ok(Some(ResponseHead { status, version, headers, body, keep_alive }));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::http::{parse_request_head, BodyDecoder};
    use proptest::prelude::*;

    const STREAM: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n9\r\ndata: x\n\n\r\n0\r\n\r\n";

    fn parse_all(input: &[u8], split: usize) -> (ResponseHead, Vec<u8>) {
        let limits = Limits::default();
        let mut buf = BytesMut::from(&input[..split]);
        let head = match parse_response_head(&mut buf, &limits, false).unwrap() {
            Some(h) => {
                buf.extend_from_slice(&input[split..]);
                h
            }
            None => {
                buf.extend_from_slice(&input[split..]);
                parse_response_head(&mut buf, &limits, false).unwrap().unwrap()
            }
        };
        let mut dec = BodyDecoder::new(head.body, limits.max_body_bytes);
        let mut body = Vec::new();
        while let Some(d) = dec.decode(&mut buf).unwrap() {
            body.extend_from_slice(&d);
        }
        dec.finish_on_eof().unwrap();
        (head, body)
    }

    #[test]
    fn skips_interim_and_parses_chunked_every_split() {
        for split in 0..=STREAM.len() {
            let (head, body) = parse_all(STREAM, split);
            assert_eq!(head.status, 200, "split {split}");
            assert_eq!(head.header("content-type"), Some(&b"text/event-stream"[..]));
            assert_eq!(body, b"data: x\n\n");
        }
    }

    #[test]
    fn until_close_without_framing() {
        let input = b"HTTP/1.1 200 OK\r\n\r\nsome body";
        for split in 0..=input.len() {
            let (head, body) = parse_all(input, split);
            assert_eq!(head.body, BodyKind::UntilClose);
            assert!(!head.keep_alive);
            assert_eq!(body, b"some body");
        }
    }

    #[test]
    fn bodiless_responses() {
        let limits = Limits::default();
        for (input, head_req) in [
            (&b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n"[..], false),
            (b"HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n", false),
            (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", true),
        ] {
            let head = parse_response_head(&mut BytesMut::from(input), &limits, head_req).unwrap().unwrap();
            assert_eq!(head.body, BodyKind::Empty);
            assert!(head.keep_alive);
        }
        let head = parse_response_head(
            &mut BytesMut::from(&b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n"[..]),
            &limits,
            false,
        )
        .unwrap()
        .unwrap();
        assert_eq!((head.version, head.body, head.keep_alive), (0, BodyKind::Length(2), false));
    }

    #[test]
    fn response_limits_and_errors() {
        let small = Limits { max_head_bytes: 32, max_body_bytes: 10, max_headers: 2 };
        let mut trickle = BytesMut::from(&b"HTTP/1.1 200 OK\r\nx: "[..]);
        trickle.extend_from_slice(&[b'a'; 20]);
        assert_eq!(parse_response_head(&mut trickle, &small, false), Err(HttpError::HeadTooLarge));
        let mut big = BytesMut::from(&b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n"[..]);
        let limits = Limits { max_body_bytes: 10, ..Limits::default() };
        assert_eq!(parse_response_head(&mut big, &limits, false), Err(HttpError::BodyTooLarge));
        for bad in [
            &b"HTTP/1.1 2000 OK\r\n\r\n"[..],
            b"HTTP/1.1 099 OK\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 1, 2\r\n\r\n",
            b"HTP/1.1 200 OK\r\n\r\n",
        ] {
            assert!(
                matches!(
                    parse_response_head(&mut BytesMut::from(bad), &Limits::default(), false),
                    Err(HttpError::Malformed(_))
                ),
                "{bad:?}"
            );
        }
        let mut te = BytesMut::from(&b"HTTP/1.1 200 OK\r\nTransfer-Encoding: br\r\n\r\n"[..]);
        assert_eq!(
            parse_response_head(&mut te, &Limits::default(), false),
            Err(HttpError::UnsupportedTransferEncoding)
        );
    }

    #[test]
    fn request_head_roundtrip() {
        let mut out = BytesMut::new();
        write_request_head(
            &mut out,
            "POST",
            "/v1/chat/completions",
            ("127.0.0.1:8000", None),
            &[("content-type", "application/json")],
            Some(17),
        );
        assert_eq!(
            &out[..],
            &b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:8000\r\ncontent-type: application/json\r\ncontent-length: 17\r\n\r\n"[..]
        );
        let head = parse_request_head(&mut out, &Limits::default()).unwrap().unwrap();
        assert_eq!((head.header("host"), head.body), (Some(&b"127.0.0.1:8000"[..]), BodyKind::Length(17)));
        // With a port: IPv6 literals in brackets.
        for (host, want) in [("example.com", "example.com:8443"), ("::1", "[::1]:8443")] {
            let mut out = BytesMut::new();
            write_request_head(&mut out, "GET", "/", (host, Some(8443)), &[] as &[(&str, &str)], None);
            assert_eq!(out, format!("GET / HTTP/1.1\r\nhost: {want}\r\n\r\n").as_bytes());
        }
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(input in proptest::collection::vec(any::<u8>(), 0..300), head_req: bool) {
            let limits = Limits { max_head_bytes: 200, max_headers: 4, max_body_bytes: 100 };
            let mut buf = BytesMut::from(&input[..]);
            let _ = parse_response_head(&mut buf, &limits, head_req);
        }

        #[test]
        fn random_prefix_of_valid_stream(split in 0usize..STREAM.len()) {
            let (head, body) = parse_all(STREAM, split);
            prop_assert_eq!(head.status, 200);
            prop_assert_eq!(body, b"data: x\n\n".to_vec());
        }
    }
}
