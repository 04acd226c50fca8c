//! Server side: request heads.

use bytes::{Bytes, BytesMut};

use super::{
    explicit_framing, find_header, keep_alive, list_values, parse_head,
    target::{check_host, to_origin_form},
    BodyKind, HeaderName, HttpError, Limits,
};

/// A parsed request head. Header names are lower-cased.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    /// Method, e.g. "GET".
    pub method: String,
    /// Request target: as sent (path and query), but an absolute-form
    /// `http(s)://authority/path?query` is reduced to `/path?query`.
    pub target: String,
    /// Minor version: 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub version: u8,
    /// Header (lower-cased name, raw value) pairs in order.
    pub headers: Vec<(HeaderName, Bytes)>,
    /// How the body is framed (Empty when neither Content-Length nor chunked).
    pub body: BodyKind,
    /// Whether the connection stays open after the response.
    pub keep_alive: bool,
    /// `Expect: 100-continue` was sent on HTTP/1.1 (an HTTP/1.0 client must
    /// never get a 100, RFC 9110 §10.1.1, so its `Expect` is ignored).
    pub expect_continue: bool,
}

impl RequestHead {
    /// First value of a header (name compared case-insensitively).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        find_header(&self.headers, name)
    }

    /// The target without its query string.
    pub fn path(&self) -> &str {
        let end = self.target.find(['?', '#']).unwrap_or(self.target.len());
        &self.target[..end]
    }

    /// The query string (after `?`), if any.
    pub fn query(&self) -> Option<&str> {
        let (_, rest) = self.target.split_once('?')?;
        Some(rest.split_once('#').map_or(rest, |(q, _)| q))
    }
}

/// Parses one request head from the front of `buf`. Returns `Ok(None)` when
/// more bytes are needed (buf untouched); on success the head bytes are
/// removed from `buf`. A head exceeding `limits.max_head_bytes` (complete or
/// not) is `HeadTooLarge`; a Content-Length above `limits.max_body_bytes` is
/// `BodyTooLarge`; conflicting/invalid Content-Length or Transfer-Encoding is
/// `Malformed`/`UnsupportedTransferEncoding`; so is (`Malformed`) an
/// HTTP/1.1 request without `Host`, any with several or an invalid one, and
/// an absolute-form target with an invalid authority (RFC 9112 §3.2).
pub fn parse_request_head(buf: &mut BytesMut, limits: &Limits) -> Result<Option<RequestHead>, HttpError> {
    let parsed = parse_head(buf, limits, |storage, window| {
        let mut req = httparse::Request::new(&mut []);
        Ok(match req.parse_with_uninit_headers(window, storage)? {
            httparse::Status::Complete(len) => {
                let start = (
                    req.method.unwrap_or_default().to_owned(),
                    req.path.unwrap_or_default().to_owned(),
                    req.version.unwrap_or_default(),
                );
                httparse::Status::Complete((len, &*req.headers, start))
            }
            httparse::Status::Partial => httparse::Status::Partial,
        })
    })?;
    let Some(((method, mut target, version), headers)) = parsed else {
        return Ok(None);
    };
    if method.is_empty() || target.is_empty() {
        return Err(HttpError::Malformed("incomplete request line"));
    }
    let body = match explicit_framing(&headers, version)? {
        Some(BodyKind::Length(n)) if n > limits.max_body_bytes as u64 => return Err(HttpError::BodyTooLarge),
        Some(kind) => kind,
        // A request without framing has no body (RFC 9112 §6.3, rule 7).
        None => BodyKind::Empty,
    };
    // After the framing: an oversized or smuggling request is told so
    // (413, 501) whatever its Host.
    check_host(&headers, version)?;
    to_origin_form(&mut target)?;
    let keep_alive = keep_alive(&headers, version);
    let expect_continue =
        version >= 1 && list_values(&headers, "expect").any(|v| v.eq_ignore_ascii_case(b"100-continue"));
    Ok(Some(RequestHead { method, target, version, headers, body, keep_alive, expect_continue }))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const POST: &[u8] = b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: example\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}";

    #[test]
    fn parses_request_and_leaves_body() {
        let mut buf = BytesMut::from(POST);
        let head = parse_request_head(&mut buf, &Limits::default()).unwrap().unwrap();
        assert_eq!(head.method, "POST");
        assert_eq!(head.target, "/v1/chat/completions?x=1");
        assert_eq!(head.path(), "/v1/chat/completions");
        assert_eq!(head.query(), Some("x=1"));
        assert_eq!(head.version, 1);
        assert_eq!(head.body, BodyKind::Length(2));
        assert!(head.keep_alive);
        assert!(!head.expect_continue);
        assert_eq!(head.header("CONTENT-TYPE"), Some(&b"application/json"[..]));
        assert_eq!(head.headers[0].0, "host");
        assert_eq!(&buf[..], b"{}");
    }

    #[test]
    fn every_split_point() {
        for split in 0..POST.len() {
            let mut buf = BytesMut::from(&POST[..split]);
            let head_len = POST.len() - 2;
            if split < head_len {
                assert_eq!(parse_request_head(&mut buf, &Limits::default()).unwrap(), None);
                assert_eq!(&buf[..], &POST[..split], "buf untouched");
                buf.extend_from_slice(&POST[split..]);
            }
            let head = parse_request_head(&mut buf, &Limits::default()).unwrap().unwrap();
            assert_eq!(head.path(), "/v1/chat/completions");
        }
    }

    #[test]
    fn pipelined_requests() {
        let mut buf = BytesMut::from(&b"GET /a HTTP/1.1\r\nHost: a\r\n\r\nGET /b HTTP/1.0\r\n\r\n"[..]);
        let a = parse_request_head(&mut buf, &Limits::default()).unwrap().unwrap();
        let b = parse_request_head(&mut buf, &Limits::default()).unwrap().unwrap();
        assert_eq!((a.path(), a.body, a.keep_alive), ("/a", BodyKind::Empty, true));
        assert_eq!((b.path(), b.version, b.keep_alive), ("/b", 0, false));
        assert!(buf.is_empty());
    }

    #[test]
    fn expect_continue_and_chunked() {
        let mut buf = BytesMut::from(
            &b"POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-Continue\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"[..],
        );
        let head = parse_request_head(&mut buf, &Limits::default()).unwrap().unwrap();
        assert!(head.expect_continue);
        assert_eq!(head.body, BodyKind::Chunked);
        assert!(!head.keep_alive);
    }

    #[test]
    fn head_limit_complete_and_trickled() {
        let limits = Limits { max_head_bytes: 64, ..Limits::default() };
        let mut buf = BytesMut::from(&b"GET / HTTP/1.1\r\nHost: a\r\nx: "[..]);
        buf.extend_from_slice(&[b'a'; 80]);
        buf.extend_from_slice(b"\r\n\r\n");
        assert_eq!(parse_request_head(&mut buf, &limits), Err(HttpError::HeadTooLarge));

        // Endless header, never completed: refused once past the limit.
        let mut buf = BytesMut::from(&b"GET / HTTP/1.1\r\nHost: a\r\nx: "[..]);
        let mut rejected = false;
        for _ in 0..100 {
            buf.extend_from_slice(b"a");
            match parse_request_head(&mut buf, &limits) {
                Ok(None) => assert!(buf.len() <= 64),
                Err(HttpError::HeadTooLarge) => {
                    assert_eq!(buf.len(), 65);
                    rejected = true;
                    break;
                }
                other => panic!("{other:?}"),
            }
        }
        assert!(rejected);

        // Exactly at the limit is fine.
        let head = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n";
        let limits = Limits { max_head_bytes: head.len(), ..Limits::default() };
        assert!(parse_request_head(&mut BytesMut::from(&head[..]), &limits).unwrap().is_some());
    }

    #[test]
    fn header_count_limit() {
        let limits = Limits { max_headers: 2, ..Limits::default() };
        let mut ok = BytesMut::from(&b"GET / HTTP/1.1\r\nHost: a\r\nb: 2\r\n\r\n"[..]);
        assert!(parse_request_head(&mut ok, &limits).unwrap().is_some());
        let mut bad = BytesMut::from(&b"GET / HTTP/1.1\r\nHost: a\r\nb: 2\r\nc: 3\r\n\r\n"[..]);
        assert_eq!(parse_request_head(&mut bad, &limits), Err(HttpError::HeadTooLarge));
        let big = Limits { max_headers: 100, ..Limits::default() };
        let mut many = BytesMut::from(&b"GET / HTTP/1.0\r\n"[..]);
        for i in 0..90 {
            many.extend_from_slice(format!("h{i}: v\r\n").as_bytes());
        }
        many.extend_from_slice(b"\r\n");
        assert_eq!(parse_request_head(&mut many, &big).unwrap().unwrap().headers.len(), 90);
    }

    #[test]
    fn body_limit_from_content_length() {
        let limits = Limits { max_body_bytes: 10, ..Limits::default() };
        let mut buf = BytesMut::from(&b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 11\r\n\r\n"[..]);
        let err = parse_request_head(&mut buf, &limits).unwrap_err();
        assert_eq!((err.clone(), err.status()), (HttpError::BodyTooLarge, 413));
        // Found before a missing Host.
        let mut buf = BytesMut::from(&b"POST / HTTP/1.1\r\nContent-Length: 11\r\n\r\n"[..]);
        assert_eq!(parse_request_head(&mut buf, &limits), Err(HttpError::BodyTooLarge));
    }

    #[test]
    fn smuggling_and_malformed() {
        let cases: &[(&[u8], u16)] = &[
            (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
            (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n", 400),
            (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -3\r\n\r\n", 400),
            (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n", 501),
            (b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
            (b"GET / HTTP/1.1\r\nHost: a\r\nBad Header: x\r\n\r\n", 400),
            (b"GET / HTTP/2.0\r\n\r\n", 400),
            (b"GET\r\n\r\n", 400),
            (b"\x00\x01\x02\r\n\r\n", 400),
        ];
        for (input, status) in cases {
            let err = parse_request_head(&mut BytesMut::from(*input), &Limits::default()).unwrap_err();
            assert_eq!(err.status(), *status, "{input:?}: {err}");
        }
    }

    fn parse(input: &[u8]) -> Result<Option<RequestHead>, HttpError> {
        parse_request_head(&mut BytesMut::from(input), &Limits::default())
    }

    #[test]
    fn host_is_required_once_on_http_1_1() {
        // RFC 9112 §3.2: 400 for a 1.1 request without Host, any request
        // with two, and an invalid value.
        for (input, why) in [
            (&b"GET / HTTP/1.1\r\n\r\n"[..], "missing host"),
            (b"GET / HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n", "more than one host"),
            (b"GET / HTTP/1.1\r\nHost: a\r\nX: 1\r\nhOST: b\r\n\r\n", "more than one host"),
            (b"GET / HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n", "more than one host"),
            (b"GET / HTTP/1.1\r\nHost: a b\r\n\r\n", "invalid host"),
            (b"GET / HTTP/1.1\r\nHost: a@b\r\n\r\n", "invalid host"),
            (b"GET / HTTP/1.0\r\nHost: a:b\r\n\r\n", "invalid host"),
        ] {
            let err = parse(input).unwrap_err();
            assert_eq!((err.clone(), err.status(), err.code()), (HttpError::Malformed(why), 400, "malformed_request"));
        }
        for ok in [
            &b"GET / HTTP/1.0\r\n\r\n"[..],
            b"GET / HTTP/1.1\r\nHost: example:8080\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n",
            // Empty is valid: a target URI without an authority (RFC 9110 §7.2).
            b"GET / HTTP/1.1\r\nHost:\r\n\r\n",
        ] {
            assert!(parse(ok).unwrap().is_some(), "{:?}", String::from_utf8_lossy(ok));
        }
    }

    #[test]
    fn absolute_form_is_routed_by_its_path() {
        let head =
            parse(b"POST http://example/v1/chat/completions?x=1 HTTP/1.1\r\nHost: other\r\n\r\n").unwrap().unwrap();
        assert_eq!(
            (head.target.as_str(), head.path(), head.query()),
            ("/v1/chat/completions?x=1", "/v1/chat/completions", Some("x=1"))
        );
        let head = parse(b"GET HTTP://Example:80 HTTP/1.0\r\n\r\n").unwrap().unwrap();
        assert_eq!((head.path(), head.query()), ("/", None));
        // Origin form as sent.
        let head = parse(b"GET /v1/models?a=b HTTP/1.1\r\nHost: a\r\n\r\n").unwrap().unwrap();
        assert_eq!((head.target.as_str(), head.path()), ("/v1/models?a=b", "/v1/models"));
        // The RFC still asks for Host on 1.1, and the authority must be a host.
        assert_eq!(parse(b"GET http://example/ HTTP/1.1\r\n\r\n"), Err(HttpError::Malformed("missing host")));
        assert_eq!(
            parse(b"GET http://u@example/ HTTP/1.1\r\nHost: a\r\n\r\n"),
            Err(HttpError::Malformed("invalid target authority"))
        );
        assert_eq!(
            parse(b"GET http:///a HTTP/1.1\r\nHost: a\r\n\r\n"),
            Err(HttpError::Malformed("invalid target authority"))
        );
    }

    #[test]
    fn expect_continue_is_ignored_on_http_1_0() {
        let head = parse(b"POST / HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n").unwrap().unwrap();
        assert!(!head.expect_continue);
        let head =
            parse(b"POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n").unwrap().unwrap();
        assert!(head.expect_continue);
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(input in proptest::collection::vec(any::<u8>(), 0..300)) {
            let limits = Limits { max_head_bytes: 200, max_headers: 4, max_body_bytes: 100 };
            let mut buf = BytesMut::from(&input[..]);
            if let Ok(Some(head)) = parse_request_head(&mut buf, &limits) {
                prop_assert!(input.len() - buf.len() <= 200);
                prop_assert!(head.headers.len() <= 4);
            }
        }

        #[test]
        fn random_splits_parse_the_same(split in 0usize..POST.len() - 2) {
            let mut buf = BytesMut::from(&POST[..split]);
            let first = parse_request_head(&mut buf, &Limits::default()).unwrap();
            prop_assert!(first.is_none());
            buf.extend_from_slice(&POST[split..]);
            let head = parse_request_head(&mut buf, &Limits::default()).unwrap().unwrap();
            prop_assert_eq!(head.body, BodyKind::Length(2));
        }
    }
}
