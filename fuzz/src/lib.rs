//! Helpers shared by the fuzz targets: reading parameters off the front of
//! the input, cutting the rest into chunks, and driving a `BodyDecoder`.

use bytes::BytesMut;
use iop_core::http::{BodyDecoder, BodyKind, HttpError};

/// Splits `N` parameter bytes off the front of `input`.
pub fn params<const N: usize>(input: &[u8]) -> Option<([u8; N], &[u8])> {
    let (head, rest) = input.split_first_chunk::<N>()?;
    Some((*head, rest))
}

/// Cuts `data` into consecutive chunks chosen by `seed`: 0 keeps it whole,
/// anything else gives pseudo-random lengths (seed picks the size class, so
/// byte-by-byte feeding is reachable).
pub fn chunks(seed: u8, data: &[u8]) -> Vec<&[u8]> {
    if seed == 0 || data.is_empty() {
        return vec![data];
    }
    const CLASSES: [u64; 8] = [1, 2, 3, 5, 8, 16, 64, 512];
    let max = CLASSES[usize::from(seed % 8)];
    let mut state = u64::from(seed).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::new();
    let mut rest = data;
    while !rest.is_empty() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let len = usize::try_from(1 + state % max).unwrap_or(1).min(rest.len());
        let (chunk, tail) = rest.split_at(len);
        out.push(chunk);
        rest = tail;
    }
    out
}

/// The outcome of decoding one body: the body (or the first error) and, on
/// success, the bytes left after it.
#[derive(Debug, PartialEq, Eq)]
pub struct BodyOutcome {
    pub result: Result<Vec<u8>, HttpError>,
    pub leftover: Vec<u8>,
}

/// Feeds `first` then each of `pieces` to a decoder for `kind`, checking the
/// decoder's invariants at every step, then signals EOF when `eof` is set.
pub fn drive_body(kind: BodyKind, max: usize, first: BytesMut, pieces: &[&[u8]], eof: bool) -> BodyOutcome {
    let mut dec = BodyDecoder::new(kind, max);
    let mut buf = first;
    let mut body = Vec::new();
    let inputs = std::iter::once(&[][..]).chain(pieces.iter().copied());
    for piece in inputs {
        buf.extend_from_slice(piece);
        loop {
            let before = buf.to_vec();
            match dec.decode(&mut buf) {
                Ok(Some(data)) => {
                    assert!(!data.is_empty(), "empty data piece");
                    // Data is a prefix-side slice: what was consumed ends with it.
                    let consumed = before.len() - buf.len();
                    assert!(data.len() <= consumed);
                    assert_eq!(&before[before.len() - buf.len()..], &buf[..], "buf is not a suffix");
                    body.extend_from_slice(&data);
                    assert!(body.len() <= max, "decoded body {} exceeds limit {max}", body.len());
                    assert_eq!(dec.decoded_bytes(), body.len() as u64);
                }
                Ok(None) => {
                    assert!(before.len() >= buf.len());
                    assert_eq!(&before[before.len() - buf.len()..], &buf[..], "buf is not a suffix");
                    if dec.is_done() {
                        // Done: nothing more is consumed, trailing bytes stay.
                        let keep = buf.to_vec();
                        assert_eq!(dec.decode(&mut buf), Ok(None));
                        assert_eq!(&buf[..], &keep[..]);
                    }
                    break;
                }
                Err(e) => {
                    assert!(!e.to_string().is_empty());
                    assert!(matches!(e.status(), 400 | 413 | 431 | 501));
                    return BodyOutcome { result: Err(e), leftover: Vec::new() };
                }
            }
        }
    }
    if dec.is_done() {
        if let BodyKind::Length(n) = kind {
            assert_eq!(body.len() as u64, n, "Length body done with the wrong size");
        }
    }
    if eof {
        let was_done = dec.is_done();
        let r = dec.finish_on_eof();
        match kind {
            BodyKind::UntilClose => assert_eq!(r, Ok(())),
            _ => assert_eq!(r.is_ok(), was_done, "finish_on_eof: {r:?}, done before: {was_done}"),
        }
        if let Err(e) = r {
            return BodyOutcome { result: Err(e), leftover: Vec::new() };
        }
        assert!(dec.is_done());
    }
    BodyOutcome { result: Ok(body), leftover: buf.to_vec() }
}
