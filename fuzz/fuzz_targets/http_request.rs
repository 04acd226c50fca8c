//! `http::parse_request_head` with small limits, then a `BodyDecoder` over
//! the rest, both fed in arbitrary chunks.
//!
//! Input: `[head limit, header-count limit, body limit, split seed, bytes...]`.
//! Invariants: never panics; `Ok(None)` leaves the buffer untouched and within
//! the head limit; a parsed head respects every limit and is well formed (at
//! most one `Host`, exactly one on HTTP/1.1; no `100-continue` on HTTP/1.0;
//! an absolute-form target reduced to origin form); the decoded body never
//! exceeds `max_body_bytes`; chunked feeding gives the same head, body,
//! leftover and errors as feeding everything at once.
#![no_main]

use bytes::BytesMut;
use iop_core::http::{parse_request_head, BodyKind, HttpError, Limits, RequestHead};
use iop_fuzz::{chunks, drive_body, params};
use libfuzzer_sys::fuzz_target;

/// Feeds chunks until the head is complete or fails; returns the result, the
/// buffered rest and how many chunks were used.
fn head(pieces: &[&[u8]], limits: &Limits) -> (Result<Option<RequestHead>, HttpError>, BytesMut, usize) {
    let mut buf = BytesMut::new();
    for (i, piece) in pieces.iter().enumerate() {
        buf.extend_from_slice(piece);
        let before = buf.to_vec();
        let r = parse_request_head(&mut buf, limits);
        match &r {
            Ok(None) => {
                assert_eq!(&buf[..], &before[..], "Ok(None) touched the buffer");
                assert!(buf.len() <= limits.max_head_bytes, "partial head beyond the limit");
                continue;
            }
            Ok(Some(h)) => {
                let consumed = before.len() - buf.len();
                assert!(consumed <= limits.max_head_bytes, "head of {consumed} bytes accepted");
                assert_eq!(&before[consumed..], &buf[..]);
                check_head(h, limits);
            }
            Err(e) => {
                // A complete head with bad framing is consumed; the connection closes anyway.
                assert!(!e.to_string().is_empty());
                assert!(buf.len() <= before.len());
                assert_eq!(&before[before.len() - buf.len()..], &buf[..], "buf is not a suffix");
            }
        }
        return (r, buf, i + 1);
    }
    (Ok(None), buf, pieces.len())
}

fn check_head(h: &RequestHead, limits: &Limits) {
    assert!(h.headers.len() <= limits.max_headers);
    assert!(!h.method.is_empty() && !h.target.is_empty());
    assert!(h.version <= 1);
    for (name, _) in &h.headers {
        assert_eq!(name.as_bytes(), &name.as_bytes().to_ascii_lowercase()[..], "header name not lower-cased");
        assert!(h.header(name.as_str()).is_some());
    }
    // RFC 9112 §3.2: one Host at most, and one on HTTP/1.1.
    let hosts = h.headers.iter().filter(|(n, _)| n == "host").count();
    assert!(hosts <= 1 && (h.version == 0 || hosts == 1), "{hosts} host lines on HTTP/1.{}", h.version);
    assert!(h.version == 1 || !h.expect_continue, "100-continue for HTTP/1.0");
    let scheme = h.target.as_bytes().iter().take(8).map(u8::to_ascii_lowercase).collect::<Vec<u8>>();
    assert!(!scheme.starts_with(b"http://") && !scheme.starts_with(b"https://"), "absolute-form kept: {}", h.target);
    match h.body {
        BodyKind::Length(n) => assert!(n <= limits.max_body_bytes as u64),
        BodyKind::UntilClose => panic!("request body delimited by close"),
        BodyKind::Empty | BodyKind::Chunked => {}
    }
    let _ = (h.path(), h.query());
}

fuzz_target!(|input: &[u8]| {
    let Some(([head_sel, hdr_sel, body_sel, split], data)) = params::<4>(input) else { return };
    let limits = Limits {
        max_head_bytes: usize::from(head_sel) * 4,
        max_headers: usize::from(hdr_sel % 70),
        max_body_bytes: usize::from(body_sel) * 3,
    };
    let pieces = chunks(split, data);
    let (split_head, split_rest, used) = head(&pieces, &limits);
    let (whole_head, whole_rest, _) = head(&[data], &limits);
    assert_eq!(split_head, whole_head, "chunked feeding changed the head");
    assert_eq!(
        split_rest.len() + pieces[used..].iter().map(|p| p.len()).sum::<usize>(),
        whole_rest.len(),
        "chunked feeding consumed a different amount"
    );
    let Ok(Some(h)) = split_head else { return };
    let whole_body = drive_body(h.body, limits.max_body_bytes, whole_rest, &[], false);
    let split_body = drive_body(h.body, limits.max_body_bytes, split_rest, &pieces[used..], false);
    assert_eq!(split_body, whole_body, "chunked feeding changed the body");
});
