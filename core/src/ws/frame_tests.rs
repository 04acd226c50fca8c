use super::*;
use crate::ws::write;
use proptest::prelude::*;

const KEY: [u8; 4] = [0x37, 0xfa, 0x21, 0x3d];

/// A masked client frame: first byte `b0` (FIN, RSV, opcode), `payload`
/// masked with `key`, the shortest length encoding.
fn client(b0: u8, payload: &[u8], key: [u8; 4]) -> Vec<u8> {
    let mut out = vec![b0];
    match payload.len() {
        n if n < 126 => out.push(0x80 | n as u8),
        n if n <= 0xFFFF => {
            out.push(0x80 | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(0x80 | 127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    out.extend_from_slice(&key);
    out.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
    out
}

fn limits(frame: usize, message: usize) -> Limits {
    Limits { max_frame_bytes: frame, max_message_bytes: message }
}

/// Feeds `pieces` one after the other, reading every message after each;
/// stops at the first error. Checks the buffer bounds at every `Ok(None)`.
fn run(limits: Limits, pieces: &[&[u8]]) -> (Vec<Message>, Option<WsError>) {
    let mut r = Reader::new(limits);
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    for piece in pieces {
        buf.extend_from_slice(piece);
        loop {
            match r.read(&mut buf) {
                Ok(Some(m)) => out.push(m),
                Ok(None) => {
                    assert!(buf.len() < MAX_HEADER_BYTES + limits.max_frame_bytes, "{} bytes left", buf.len());
                    assert!(r.buffered() <= limits.max_message_bytes);
                    break;
                }
                Err(e) => {
                    assert_eq!(r.read(&mut buf), Err(e.clone()), "errors are final");
                    return (out, Some(e));
                }
            }
        }
    }
    (out, None)
}

fn whole(input: &[u8]) -> (Vec<Message>, Option<WsError>) {
    run(Limits::default(), &[input])
}

fn bytewise(limits: Limits, input: &[u8]) -> (Vec<Message>, Option<WsError>) {
    let pieces: Vec<&[u8]> = input.chunks(1).collect();
    run(limits, &pieces)
}

fn text(s: &str) -> Message {
    Message::Text(Bytes::copy_from_slice(s.as_bytes()))
}

#[test]
fn rfc_masked_hello() {
    // RFC 6455 §5.7: a single-frame masked text message "Hello".
    let frame = [0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58];
    let mut buf = BytesMut::from(&frame[..]);
    let mut r = Reader::new(Limits::default());
    assert_eq!(r.read(&mut buf), Ok(Some(text("Hello"))));
    assert!(buf.is_empty());
    assert_eq!(r.read(&mut buf), Ok(None));
    assert_eq!(client(0x81, b"Hello", KEY), frame);
}

#[test]
fn rfc_unmasked_hello_is_refused() {
    // The §5.7 unmasked example is what a server sends, never a client.
    let (msgs, err) = whole(&[0x81, 0x05, 0x48, 0x65, 0x6c, 0x6c, 0x6f]);
    assert!(msgs.is_empty());
    assert_eq!(err, Some(WsError::Unmasked));
    assert_eq!(WsError::Unmasked.close_code(), 1002);
}

#[test]
fn rfc_fragmented_hello() {
    // §5.7: "Hel" (FIN=0, text) then "lo" (FIN=1, continuation), masked.
    let mut input = client(0x01, b"Hel", KEY);
    input.extend(client(0x80, b"lo", [1, 2, 3, 4]));
    let mut r = Reader::new(Limits::default());
    let mut buf = BytesMut::from(&input[..9]);
    assert_eq!(r.read(&mut buf), Ok(None));
    assert_eq!(r.buffered(), 3, "the first fragment is taken in");
    assert!(buf.is_empty());
    buf.extend_from_slice(&input[9..]);
    assert_eq!(r.read(&mut buf), Ok(Some(text("Hello"))));
    assert_eq!(r.buffered(), 0);
    assert_eq!(bytewise(Limits::default(), &input), (vec![text("Hello")], None));
}

#[test]
fn rfc_ping_and_pong() {
    // §5.7: a masked pong "Hello"; a masked ping built the same way.
    let pong = [0x8a, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58];
    assert_eq!(whole(&pong), (vec![Message::Pong(Bytes::from_static(b"Hello"))], None));
    let ping = client(0x89, b"Hello", KEY);
    assert_eq!(whole(&ping), (vec![Message::Ping(Bytes::from_static(b"Hello"))], None));
    // The unmasked ping of §5.7 is a server's.
    assert_eq!(whole(&[0x89, 0x05, 0x48, 0x65, 0x6c, 0x6c, 0x6f]).1, Some(WsError::Unmasked));
}

#[test]
fn rfc_lengths_256_and_64k() {
    let small: Vec<u8> = (0..256u32).map(|i| i as u8).collect();
    let frame = client(0x82, &small, KEY);
    assert_eq!(&frame[..4], &[0x82, 0xFE, 0x01, 0x00]);
    assert_eq!(whole(&frame), (vec![Message::Binary(small.into())], None));

    let big: Vec<u8> = (0..65536u32).map(|i| (i * 7) as u8).collect();
    let frame = client(0x82, &big, KEY);
    assert_eq!(&frame[..10], &[0x82, 0xFF, 0, 0, 0, 0, 0, 0x01, 0x00, 0x00]);
    assert_eq!(whole(&frame), (vec![Message::Binary(big.clone().into())], None));
    assert_eq!(bytewise(Limits::default(), &frame), (vec![Message::Binary(big.into())], None));
}

#[test]
fn non_minimal_lengths_are_read() {
    // 5 bytes in a 16-bit and in a 64-bit length field.
    let mut input = vec![0x81, 0x80 | 126, 0, 5];
    input.extend_from_slice(&[0; 4]);
    input.extend_from_slice(b"Hello");
    input.extend_from_slice(&[0x81, 0x80 | 127, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0]);
    input.extend_from_slice(b"World");
    assert_eq!(whole(&input), (vec![text("Hello"), text("World")], None));
}

#[test]
fn control_frames_between_fragments() {
    let mut input = client(0x01, "żó".as_bytes(), KEY);
    input.extend(client(0x89, b"p1", KEY));
    input.extend(client(0x00, "ł".as_bytes(), KEY));
    input.extend(client(0x8A, b"", KEY));
    input.extend(client(0x80, "ć".as_bytes(), KEY));
    input.extend(client(0x82, b"\xff\x00", KEY));
    let want = vec![
        Message::Ping(Bytes::from_static(b"p1")),
        Message::Pong(Bytes::new()),
        text("żółć"),
        Message::Binary(Bytes::from_static(b"\xff\x00")),
    ];
    assert_eq!(whole(&input), (want.clone(), None));
    assert_eq!(bytewise(Limits::default(), &input), (want, None));
}

#[test]
fn utf8_split_across_fragments() {
    // "€" (E2 82 AC) cut inside the sequence: valid once whole.
    let mut input = client(0x01, b"a\xE2", KEY);
    input.extend(client(0x00, b"\x82", KEY));
    input.extend(client(0x80, b"\xACb", KEY));
    assert_eq!(whole(&input), (vec![text("a€b")], None));
    // The message ends inside the sequence.
    let mut input = client(0x01, b"a\xE2", KEY);
    input.extend(client(0x80, b"\x82", KEY));
    assert_eq!(whole(&input).1, Some(WsError::InvalidUtf8));
}

#[test]
fn invalid_utf8_fails_fast() {
    // The first fragment is invalid: the error comes before the rest.
    let input = client(0x01, b"ok\xC0\xAF", KEY);
    let (msgs, err) = whole(&input);
    assert!(msgs.is_empty());
    assert_eq!(err, Some(WsError::InvalidUtf8));
    // Binary is not checked.
    assert_eq!(whole(&client(0x82, b"\xC0\xAF", KEY)), (vec![Message::Binary(Bytes::from_static(b"\xC0\xAF"))], None));
}

#[test]
fn close_payloads() {
    assert_eq!(whole(&client(0x88, b"", KEY)), (vec![Message::Close(None)], None));
    for code in [1000u16, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 3000, 4000, 4999] {
        let mut p = code.to_be_bytes().to_vec();
        p.extend_from_slice("bye ✓".as_bytes());
        assert_eq!(whole(&client(0x88, &p, KEY)), (vec![Message::Close(Some((code, "bye ✓".into())))], None), "{code}");
    }
    for code in [0u16, 999, 1004, 1005, 1006, 1012, 1015, 1016, 2000, 2999, 5000, 65535] {
        let err = whole(&client(0x88, &code.to_be_bytes(), KEY)).1.unwrap();
        assert_eq!(err, WsError::InvalidCloseCode(code));
        assert_eq!(err.close_code(), 1002);
    }
}

#[test]
fn after_close_nothing_is_read() {
    let mut input = client(0x88, &1000u16.to_be_bytes(), KEY);
    input.extend(client(0x81, b"late", KEY));
    let mut r = Reader::new(Limits::default());
    let mut buf = BytesMut::from(&input[..]);
    assert_eq!(r.read(&mut buf), Ok(Some(Message::Close(Some((1000, String::new()))))));
    assert!(r.is_closed());
    assert!(buf.is_empty());
    buf.extend_from_slice(&client(0x81, b"later", KEY));
    assert_eq!(r.read(&mut buf), Ok(None));
    assert!(buf.is_empty());
}

#[test]
fn every_error_has_its_close_code() {
    let mut started = client(0x01, b"a", KEY);
    started.extend(client(0x81, b"b", KEY));
    let mut too_long_ping = vec![0x89, 0x80 | 126, 0, 126];
    too_long_ping.extend_from_slice(&[0; 4 + 126]);
    let mut msb = vec![0x82, 0x80 | 127, 0x80, 0, 0, 0, 0, 0, 0, 0];
    msb.extend_from_slice(&KEY);
    let cases: Vec<(&str, Vec<u8>, WsError, u16)> = vec![
        ("unmasked", vec![0x82, 0x00], WsError::Unmasked, 1002),
        ("rsv1", client(0xC1, b"x", KEY), WsError::ReservedBits, 1002),
        ("rsv2", client(0xA1, b"x", KEY), WsError::ReservedBits, 1002),
        ("rsv3", client(0x91, b"x", KEY), WsError::ReservedBits, 1002),
        ("opcode 3", client(0x83, b"", KEY), WsError::ReservedOpcode(3), 1002),
        ("opcode 7", client(0x87, b"", KEY), WsError::ReservedOpcode(7), 1002),
        ("opcode B", client(0x8B, b"", KEY), WsError::ReservedOpcode(0xB), 1002),
        ("opcode F", client(0x8F, b"", KEY), WsError::ReservedOpcode(0xF), 1002),
        ("ping of 126", too_long_ping, WsError::ControlTooLong, 1002),
        ("fragmented ping", client(0x09, b"", KEY), WsError::FragmentedControl, 1002),
        ("fragmented close", client(0x08, b"", KEY), WsError::FragmentedControl, 1002),
        ("lone continuation", client(0x80, b"x", KEY), WsError::UnexpectedContinuation, 1002),
        ("text inside text", started, WsError::ExpectedContinuation, 1002),
        ("length msb", msb, WsError::InvalidLength, 1002),
        ("close of 1 byte", client(0x88, b"\x03", KEY), WsError::CloseTooShort, 1002),
        ("close 1005", client(0x88, &1005u16.to_be_bytes(), KEY), WsError::InvalidCloseCode(1005), 1002),
        ("close reason", client(0x88, b"\x03\xE8\xFF", KEY), WsError::InvalidCloseReason, 1007),
        ("text", client(0x81, b"\xFF", KEY), WsError::InvalidUtf8, 1007),
        ("text truncated", client(0x81, b"\xE2\x82", KEY), WsError::InvalidUtf8, 1007),
    ];
    for (name, input, want, code) in cases {
        for (mode, got) in [("whole", whole(&input)), ("bytewise", bytewise(Limits::default(), &input))] {
            assert_eq!(got.1.as_ref(), Some(&want), "{name} ({mode})");
        }
        assert_eq!(want.close_code(), code, "{name}");
        assert!(!want.to_string().is_empty());
    }
    let too_big = WsError::FrameTooBig { len: 2, max: 1 };
    assert_eq!((too_big.close_code(), too_big.code()), (1009, "ws_too_big"));
}

#[test]
fn frame_limit_refuses_from_the_header() {
    // A 1 GiB frame is refused once its length is in: nothing of it is
    // buffered, not even the mask key is awaited.
    let lim = limits(1024, 4096);
    let mut r = Reader::new(lim);
    let mut buf = BytesMut::from(&[0x82, 0x80 | 127, 0, 0, 0, 0, 0x40, 0, 0][..]);
    assert_eq!(r.read(&mut buf), Ok(None), "length incomplete");
    buf.extend_from_slice(&[0]);
    assert_eq!(r.read(&mut buf), Err(WsError::FrameTooBig { len: 1 << 30, max: 1024 }));
    // Exactly at the limit is fine.
    assert_eq!(run(lim, &[&client(0x82, &[0; 1024], KEY)]).0.len(), 1);
    assert_eq!(run(lim, &[&client(0x82, &[0; 1025], KEY)]).1, Some(WsError::FrameTooBig { len: 1025, max: 1024 }));
    // Control frames fall under the frame limit too.
    assert_eq!(run(limits(4, 4), &[&client(0x89, b"hello", KEY)]).1, Some(WsError::FrameTooBig { len: 5, max: 4 }));
}

#[test]
fn message_limit_counts_every_fragment() {
    let lim = limits(100, 250);
    let mut r = Reader::new(lim);
    let mut buf = BytesMut::new();
    buf.extend_from_slice(&client(0x02, &[1; 100], KEY));
    buf.extend_from_slice(&client(0x00, &[2; 100], KEY));
    assert_eq!(r.read(&mut buf), Ok(None));
    assert_eq!(r.buffered(), 200);
    // The third fragment would make 260: refused from its 2-byte header.
    buf.extend_from_slice(&[0x80, 0x80 | 60]);
    assert_eq!(r.read(&mut buf), Err(WsError::MessageTooBig { len: 260, max: 250 }));
    assert_eq!(r.buffered(), 0, "the partial message is dropped");
    // 250 exactly is accepted.
    let mut input = client(0x02, &[1; 100], KEY);
    input.extend(client(0x00, &[2; 100], KEY));
    input.extend(client(0x80, &[3; 50], KEY));
    let (msgs, err) = run(lim, &[&input]);
    assert_eq!(err, None);
    assert!(matches!(&msgs[..], [Message::Binary(b)] if b.len() == 250));
    // An unfragmented message over the message limit.
    assert_eq!(
        run(limits(100, 50), &[&client(0x81, &[b'a'; 60], KEY)]).1,
        Some(WsError::MessageTooBig { len: 60, max: 50 })
    );
}

#[test]
fn errors_are_final() {
    let mut r = Reader::new(Limits::default());
    let mut buf = BytesMut::from(&[0x81, 0x00][..]);
    assert_eq!(r.read(&mut buf), Err(WsError::Unmasked));
    let mut fresh = BytesMut::from(&client(0x81, b"ok", KEY)[..]);
    assert_eq!(r.read(&mut fresh), Err(WsError::Unmasked));
}

/// A stream of several kinds of frames.
fn sample() -> Vec<u8> {
    let mut input = client(0x81, b"{\"type\":\"response.create\"}", KEY);
    input.extend(client(0x89, b"", [0, 0, 0, 0]));
    input.extend(client(0x02, &[9; 300], KEY));
    input.extend(client(0x8A, b"pong", KEY));
    input.extend(client(0x80, &[8; 3], KEY));
    input.extend(client(0x01, "κόσ".as_bytes(), [1, 2, 3, 4]));
    input.extend(client(0x80, "με".as_bytes(), [5, 6, 7, 8]));
    input.extend(client(0x88, b"\x03\xE8done", KEY));
    input
}

#[test]
fn byte_by_byte_equals_whole() {
    let input = sample();
    let want = whole(&input);
    assert_eq!(want.0.len(), 6);
    assert_eq!(want.1, None);
    assert_eq!(bytewise(Limits::default(), &input), want);
}

#[test]
fn every_split_point_equals_whole() {
    let input = sample();
    let want = whole(&input);
    for i in 0..=input.len() {
        let (a, b) = input.split_at(i);
        assert_eq!(run(Limits::default(), &[a, b]), want, "split at {i}");
    }
}

#[test]
fn unmask_matches_bytewise_xor() {
    for len in 0..40 {
        let data: Vec<u8> = (0..len).map(|i| (i * 31 + 7) as u8).collect();
        let mut fast = data.clone();
        unmask(&mut fast, KEY);
        let slow: Vec<u8> = data.iter().enumerate().map(|(i, b)| b ^ KEY[i % 4]).collect();
        assert_eq!(fast, slow, "{len}");
    }
}

/// Turns an unmasked server frame into the same frame masked with `key`.
fn masked(server: &[u8], key: [u8; 4]) -> Vec<u8> {
    let header = match server[1] & 0x7F {
        126 => 4,
        127 => 10,
        _ => 2,
    };
    let mut out = server[..header].to_vec();
    out[1] |= 0x80;
    out.extend_from_slice(&key);
    out.extend(server[header..].iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
    out
}

#[test]
fn writers_round_trip_through_the_reader() {
    let mut out = BytesMut::new();
    write::text(&mut out, "héllo".as_bytes());
    write::binary(&mut out, &[0; 70000]);
    write::ping(&mut out, b"p");
    write::pong(&mut out, b"q");
    write::close(&mut out, 1001, "bye");
    let mut input = Vec::new();
    let mut rest = &out[..];
    while !rest.is_empty() {
        let (len, header) = match rest[1] & 0x7F {
            126 => (usize::from(u16::from_be_bytes([rest[2], rest[3]])), 4),
            127 => (usize::try_from(u64::from_be_bytes(rest[2..10].try_into().unwrap())).unwrap(), 10),
            n => (usize::from(n), 2),
        };
        input.extend(masked(&rest[..header + len], KEY));
        rest = &rest[header + len..];
    }
    assert_eq!(
        whole(&input),
        (
            vec![
                text("héllo"),
                Message::Binary(vec![0; 70000].into()),
                Message::Ping(Bytes::from_static(b"p")),
                Message::Pong(Bytes::from_static(b"q")),
                Message::Close(Some((1001, "bye".into()))),
            ],
            None
        )
    );
}

#[derive(Debug, Clone)]
enum Gen {
    Text(String, Vec<usize>),
    Binary(Vec<u8>, Vec<usize>),
    Ping(Vec<u8>),
}

fn gen() -> impl Strategy<Value = Gen> {
    prop_oneof![
        (".{0,40}", prop::collection::vec(0usize..50, 0..4)).prop_map(|(s, cuts)| Gen::Text(s, cuts)),
        (prop::collection::vec(any::<u8>(), 0..300), prop::collection::vec(0usize..300, 0..4))
            .prop_map(|(b, cuts)| Gen::Binary(b, cuts)),
        prop::collection::vec(any::<u8>(), 0..=125).prop_map(Gen::Ping),
    ]
}

/// Data frames for `payload` cut at `cuts` (sorted, clamped: possibly
/// empty fragments, and cuts inside UTF-8 sequences).
fn fragments(opcode: u8, payload: &[u8], cuts: &[usize], key: [u8; 4]) -> Vec<u8> {
    let mut cuts: Vec<usize> = cuts.iter().map(|&c| c.min(payload.len())).collect();
    cuts.sort_unstable();
    let mut out = Vec::new();
    let mut start = 0;
    let mut first = true;
    for &c in cuts.iter().chain(std::iter::once(&payload.len())) {
        let op = if first { opcode } else { OP_CONTINUATION };
        first = false;
        out.push((op, &payload[start..c.max(start)]));
        start = c.max(start);
    }
    let n = out.len();
    out.into_iter()
        .enumerate()
        .flat_map(|(i, (op, p))| client(if i + 1 == n { FIN | op } else { op }, p, key))
        .collect()
}

proptest! {
    #[test]
    fn random_streams_split_anywhere(msgs in prop::collection::vec(gen(), 0..8), key in any::<[u8; 4]>(),
                                     splits in prop::collection::vec(any::<prop::sample::Index>(), 0..6)) {
        let mut input = Vec::new();
        let mut want = Vec::new();
        for m in &msgs {
            match m {
                Gen::Text(s, cuts) => {
                    input.extend(fragments(OP_TEXT, s.as_bytes(), cuts, key));
                    want.push(text(s));
                }
                Gen::Binary(b, cuts) => {
                    input.extend(fragments(OP_BINARY, b, cuts, key));
                    want.push(Message::Binary(b.clone().into()));
                }
                Gen::Ping(p) => {
                    input.extend(client(0x89, p, key));
                    want.push(Message::Ping(p.clone().into()));
                }
            }
        }
        let mut points: Vec<usize> = splits.iter().map(|i| i.index(input.len() + 1)).collect();
        points.sort_unstable();
        let mut pieces = Vec::new();
        let mut last = 0;
        for p in points.into_iter().chain(std::iter::once(input.len())) {
            pieces.push(&input[last..p]);
            last = p;
        }
        prop_assert_eq!(run(Limits::default(), &pieces), (want, None));
    }
}
