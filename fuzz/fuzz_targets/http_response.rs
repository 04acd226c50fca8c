//! `http::parse_response_head` (with or without a HEAD request) and a
//! `BodyDecoder` over the rest, ending with `finish_on_eof`.
//!
//! Input: `[head limit, header-count limit, body limit, flags, split seed, bytes...]`
//! (flags bit 0: the request was HEAD).
//! Invariants: never panics; `Ok(None)` only drops whole interim responses
//! from the front and stays within the head limit; a parsed head follows the
//! RFC 9112 body rules; the decoded body never exceeds `max_body_bytes`;
//! `finish_on_eof` succeeds exactly for until-close or finished bodies; chunked
//! feeding gives the same result as feeding everything at once.
#![no_main]

use bytes::BytesMut;
use iop_core::http::{parse_response_head, BodyKind, HttpError, Limits, ResponseHead};
use iop_fuzz::{chunks, drive_body, params};
use libfuzzer_sys::fuzz_target;

fn head(
    pieces: &[&[u8]],
    limits: &Limits,
    head_request: bool,
) -> (Result<Option<ResponseHead>, HttpError>, BytesMut, usize) {
    let mut buf = BytesMut::new();
    for (i, piece) in pieces.iter().enumerate() {
        buf.extend_from_slice(piece);
        let before = buf.to_vec();
        let r = parse_response_head(&mut buf, limits, head_request);
        assert!(buf.len() <= before.len());
        assert_eq!(&before[before.len() - buf.len()..], &buf[..], "buf is not a suffix");
        match &r {
            Ok(None) => {
                assert!(buf.len() <= limits.max_head_bytes, "partial head beyond the limit");
                continue;
            }
            Ok(Some(h)) => check_head(h, limits, head_request),
            Err(e) => assert!(!e.to_string().is_empty()),
        }
        return (r, buf, i + 1);
    }
    (Ok(None), buf, pieces.len())
}

fn check_head(h: &ResponseHead, limits: &Limits, head_request: bool) {
    assert!((100..=999).contains(&h.status));
    assert!(!(100..200).contains(&h.status) || h.status == 101, "interim response returned");
    assert!(h.version <= 1);
    assert!(h.headers.len() <= limits.max_headers);
    for (name, _) in &h.headers {
        assert_eq!(name.as_bytes(), &name.as_bytes().to_ascii_lowercase()[..], "header name not lower-cased");
    }
    if head_request || matches!(h.status, 101 | 204 | 304) {
        assert_eq!(h.body, BodyKind::Empty);
    }
    if h.status == 101 || h.body == BodyKind::UntilClose {
        assert!(!h.keep_alive);
    }
    if let BodyKind::Length(n) = h.body {
        assert!(n <= limits.max_body_bytes as u64);
    }
}

fuzz_target!(|input: &[u8]| {
    let Some(([head_sel, hdr_sel, body_sel, flags, split], data)) = params::<5>(input) else { return };
    let limits = Limits {
        max_head_bytes: usize::from(head_sel) * 4,
        max_headers: usize::from(hdr_sel % 70),
        max_body_bytes: usize::from(body_sel) * 3,
    };
    let head_request = flags & 1 == 1;
    let pieces = chunks(split, data);
    let (split_head, split_rest, used) = head(&pieces, &limits, head_request);
    let (whole_head, whole_rest, _) = head(&[data], &limits, head_request);
    assert_eq!(split_head, whole_head, "chunked feeding changed the head");
    assert_eq!(
        split_rest.len() + pieces[used..].iter().map(|p| p.len()).sum::<usize>(),
        whole_rest.len(),
        "chunked feeding consumed a different amount"
    );
    let Ok(Some(h)) = split_head else { return };
    let whole_body = drive_body(h.body, limits.max_body_bytes, whole_rest, &[], true);
    let split_body = drive_body(h.body, limits.max_body_bytes, split_rest, &pieces[used..], true);
    assert_eq!(split_body, whole_body, "chunked feeding changed the body");
});
