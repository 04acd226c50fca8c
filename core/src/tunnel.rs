//! The provider tunnel, shared by both ends: the validated form of a
//! `ProviderTunnelFrame`, which headers cross it in each direction, and the
//! provider paths it may reach.

use bytes::Bytes;

use crate::{
    exec::{RunFailure, Usage},
    http::HeaderName,
    wire::pb,
};

/// Paths under an OpenAI-compatible provider's base URL that the tunnel
/// serves (each is `/v1<path>` on the edge).
pub const PATHS: &[&str] =
    &["/chat/completions", "/completions", "/embeddings", "/responses", "/messages", "/messages/count_tokens"];

/// One item of a tunnel's answer, in order: `Start`, `Body`*, then exactly
/// one of `End` or `Error` (`Error` may also come first); or `Whole` alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TunnelItem {
    /// The provider's status and headers (already filtered).
    Start {
        /// HTTP status.
        status: u16,
        /// Header (lower-cased name, value) pairs in order.
        headers: Vec<(HeaderName, Bytes)>,
    },
    /// Body bytes exactly as the provider sent them (de-chunked).
    Body(Bytes),
    /// Several body pieces that arrived together, in order (at least two).
    Parts(Vec<Bytes>),
    /// The body ended; the usage the provider reported, if any.
    End {
        /// Absent when the provider reported none.
        usage: Option<Usage>,
    },
    /// The tunnel failed (before or after `Start`).
    Error(RunFailure),
    /// The whole answer at once (it arrived with its head): one frame and
    /// one client write instead of three. Boxed: rare enough beside the
    /// body items a stream queues that it should not size them.
    Whole(Box<Whole>),
}

/// A complete answer: what `Start`, the `Body` items and `End` would carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Whole {
    /// HTTP status.
    pub status: u16,
    /// Header (lower-cased name, value) pairs in order.
    pub headers: Vec<(HeaderName, Bytes)>,
    /// The complete body, in pieces.
    pub body: Vec<Bytes>,
    /// As `End`'s.
    pub usage: Option<Usage>,
}

impl Whole {
    /// Bytes of the body.
    pub fn body_len(&self) -> usize {
        self.body.iter().map(Bytes::len).sum()
    }

    /// Its frame's parts: the status and headers (no body), the body, the
    /// usage (so the body can be queued without a copy).
    pub fn into_wire_parts(self) -> (pb::TunnelWhole, Vec<Bytes>, Option<pb::Usage>) {
        let head =
            pb::TunnelWhole { status: u32::from(self.status), headers: wire_headers(self.headers), body: Vec::new() };
        (head, self.body, self.usage.map(pb::Usage::from))
    }
}

/// Headers as they cross the wire.
fn wire_headers(headers: Vec<(HeaderName, Bytes)>) -> Vec<pb::Header> {
    headers.into_iter().map(|(name, value)| pb::Header { name: name.into_bytes(), value }).collect()
}

/// Headers from the wire; `None` when a name is no token.
fn checked_headers(headers: Vec<pb::Header>) -> Option<Vec<(HeaderName, Bytes)>> {
    headers.into_iter().map(|h| Some((HeaderName::from_bytes(h.name)?, h.value))).collect()
}

/// A status from the wire, when it is one (100..=599).
fn checked_status(status: u32) -> Option<u16> {
    u16::try_from(status).ok().filter(|s| (100..=599).contains(s))
}

impl TunnelItem {
    /// Whether this item ends the tunnel.
    pub fn is_terminal(&self) -> bool {
        matches!(self, TunnelItem::End { .. } | TunnelItem::Error(_) | TunnelItem::Whole(_))
    }

    /// Bytes this item holds while queued.
    pub fn payload_bytes(&self) -> usize {
        match self {
            TunnelItem::Start { headers, .. } => headers.iter().map(|(n, v)| n.len() + v.len()).sum(),
            TunnelItem::Body(b) => b.len(),
            TunnelItem::Parts(parts) => parts.iter().map(Bytes::len).sum(),
            TunnelItem::End { .. } => 0,
            TunnelItem::Error(f) => f.message.len(),
            TunnelItem::Whole(w) => w.headers.iter().map(|(n, v)| n.len() + v.len()).sum::<usize>() + w.body_len(),
        }
    }

    /// Splits off the first `at` bytes of a body item (`Body`, `Parts`),
    /// leaving the rest in `self`; `None` for other items, or when `at` is
    /// 0 or not inside the body. The bytes are sliced, not copied.
    pub fn split_body_front(&mut self, at: usize) -> Option<TunnelItem> {
        if at == 0 || at >= self.payload_bytes() {
            return None;
        }
        match self {
            TunnelItem::Body(b) => Some(TunnelItem::Body(b.split_to(at))),
            TunnelItem::Parts(parts) => {
                let mut front = Vec::new();
                let mut left = at;
                while left > 0 {
                    let first = parts.first_mut()?;
                    if first.len() <= left {
                        left -= first.len();
                        front.push(parts.remove(0));
                    } else {
                        front.push(first.split_to(left));
                        left = 0;
                    }
                }
                if parts.len() == 1 {
                    *self = TunnelItem::Body(parts.pop().unwrap_or_default());
                }
                Some(if front.len() == 1 {
                    TunnelItem::Body(front.pop().unwrap_or_default())
                } else {
                    TunnelItem::Parts(front)
                })
            }
            _ => None,
        }
    }

    /// The frame carrying this item.
    pub fn into_wire(self, tunnel_id: &str, seq: u64) -> pb::ProviderTunnelFrame {
        use pb::provider_tunnel_frame::Kind;
        let mut usage = None;
        let kind = match self {
            TunnelItem::Start { status, headers } => {
                Kind::Status(pb::TunnelResponseStart { status: u32::from(status), headers: wire_headers(headers) })
            }
            TunnelItem::Body(b) => Kind::Body(b),
            TunnelItem::Parts(parts) => Kind::Parts(pb::BodyParts { parts }),
            TunnelItem::End { usage: u } => {
                usage = u.map(pb::Usage::from);
                Kind::End(pb::TunnelEnd {})
            }
            TunnelItem::Error(f) => Kind::Error(f.into()),
            TunnelItem::Whole(w) => {
                let (head, body, u) = w.into_wire_parts();
                usage = u;
                Kind::Whole(pb::TunnelWhole { body, ..head })
            }
        };
        pb::ProviderTunnelFrame {
            tunnel_id: Bytes::copy_from_slice(tunnel_id.as_bytes()),
            seq,
            kind: Some(kind),
            usage,
        }
    }

    /// The item of a frame; `None` for a frame without a kind, a status
    /// outside 100..=599 or a header name that is no token (the session
    /// treats each as a protocol violation).
    pub fn from_wire(frame: pb::ProviderTunnelFrame) -> Option<Self> {
        use pb::provider_tunnel_frame::Kind;
        Some(match frame.kind? {
            Kind::Status(s) => {
                TunnelItem::Start { status: checked_status(s.status)?, headers: checked_headers(s.headers)? }
            }
            Kind::Body(b) => TunnelItem::Body(b),
            Kind::Parts(mut p) if p.parts.len() == 1 => TunnelItem::Body(p.parts.pop()?),
            Kind::Parts(p) => TunnelItem::Parts(p.parts),
            Kind::End(_) => TunnelItem::End { usage: frame.usage.map(Usage::from) },
            Kind::Error(e) => TunnelItem::Error(e.into()),
            Kind::Whole(w) => TunnelItem::Whole(Box::new(Whole {
                status: checked_status(w.status)?,
                headers: checked_headers(w.headers)?,
                body: w.body,
                usage: frame.usage.map(Usage::from),
            })),
        })
    }
}

/// Headers that describe one connection hop, never forwarded (RFC 9110
/// §7.6.1), plus the framing headers each hop sets for itself.
pub fn is_hop_by_hop(name: &[u8]) -> bool {
    const HOP: &[&str] = &[
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    ];
    HOP.iter().any(|h| name.eq_ignore_ascii_case(h.as_bytes()))
}

/// Whether a client request header is forwarded to the provider: not
/// hop-by-hop, and not one the node sets itself (`Host`, `Authorization`,
/// `Content-Length`), nor the client's key for the gateway (`x-api-key`,
/// which the edge accepts as `Authorization`'s alternative: a secret of
/// this hop, never the provider's). `Accept-Encoding` is dropped too: the node reads the
/// body for usage, so it asks for it uncompressed; `Expect` belongs to the
/// client's hop.
pub fn forwards_request_header(name: &[u8]) -> bool {
    const OWN: &[&str] = &["host", "authorization", "x-api-key", "content-length", "accept-encoding", "expect"];
    !is_hop_by_hop(name) && !OWN.iter().any(|h| name.eq_ignore_ascii_case(h.as_bytes()))
}

/// Whether a provider response header reaches the client: everything but
/// hop-by-hop ones (`Content-Length` is framing and set by each hop).
pub fn forwards_response_header(name: &[u8]) -> bool {
    !is_hop_by_hop(name) && !name.eq_ignore_ascii_case(b"content-length")
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn body_of(items: &[TunnelItem]) -> Vec<u8> {
        let mut out = Vec::new();
        for i in items {
            match i {
                TunnelItem::Body(b) => out.extend_from_slice(b),
                TunnelItem::Parts(p) => p.iter().for_each(|b| out.extend_from_slice(b)),
                other => panic!("{other:?}"),
            }
        }
        out
    }

    #[test]
    fn the_gateways_own_credentials_never_reach_the_provider() {
        for own in ["Authorization", "x-api-key", "X-Api-Key", "host", "content-length"] {
            assert!(!forwards_request_header(own.as_bytes()), "{own}");
        }
        for passed in ["anthropic-version", "anthropic-beta", "openai-organization", "x-request-id"] {
            assert!(forwards_request_header(passed.as_bytes()), "{passed}");
        }
    }

    #[test]
    fn a_body_splits_anywhere_into_pieces_of_the_same_bytes() {
        let whole: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
        let shapes = [
            TunnelItem::Body(Bytes::from(whole.clone())),
            TunnelItem::Parts(vec![
                Bytes::copy_from_slice(&whole[..10]),
                Bytes::copy_from_slice(&whole[10..600]),
                Bytes::copy_from_slice(&whole[600..]),
            ]),
        ];
        for shape in shapes {
            for at in [1, 9, 10, 11, 599, 600, 601, 999] {
                let mut rest = shape.clone();
                let front = rest.split_body_front(at).unwrap();
                assert_eq!(front.payload_bytes(), at);
                assert!(!matches!(&front, TunnelItem::Parts(p) if p.len() < 2), "a Parts item has at least two");
                assert!(!matches!(&rest, TunnelItem::Parts(p) if p.len() < 2), "a Parts item has at least two");
                assert_eq!(body_of(&[front, rest]), whole, "at {at}");
            }
            let mut same = shape.clone();
            assert!(same.split_body_front(0).is_none() && same.split_body_front(1000).is_none());
            assert_eq!(same, shape);
        }
        assert!(TunnelItem::End { usage: None }.split_body_front(1).is_none());
    }
    use crate::exec::{codes, FailureSource};

    #[test]
    fn items_roundtrip_through_frames() {
        let items = vec![
            TunnelItem::Start {
                status: 429,
                headers: vec![
                    (HeaderName::from_static("retry-after"), Bytes::from_static(b"7")),
                    (HeaderName::from_static("x-y"), Bytes::from_static(b"\xff")),
                ],
            },
            TunnelItem::Body(Bytes::from_static(b"data: {}\n\n")),
            TunnelItem::Parts(vec![Bytes::from_static(b"data: 1\n\n"), Bytes::from_static(b"data: 2\n\n")]),
            TunnelItem::End { usage: Some(Usage { input_tokens: 3, output_tokens: 4, ..Default::default() }) },
            TunnelItem::End { usage: None },
            TunnelItem::Error(RunFailure::new(codes::UPSTREAM_CONNECT, 502, FailureSource::Provider, "x")),
            TunnelItem::Whole(Box::new(Whole {
                status: 200,
                headers: vec![(HeaderName::from_static("content-type"), Bytes::from_static(b"application/json"))],
                body: vec![Bytes::from_static(b"{\"a\":"), Bytes::from_static(b"1}")],
                usage: Some(Usage { input_tokens: 1, output_tokens: 2, ..Default::default() }),
            })),
            TunnelItem::Whole(Box::new(Whole { status: 204, headers: vec![], body: vec![], usage: None })),
        ];
        for (i, item) in items.into_iter().enumerate() {
            let frame = item.clone().into_wire("t1", i as u64);
            assert_eq!((&frame.tunnel_id[..], frame.seq), (&b"t1"[..], i as u64));
            assert_eq!(TunnelItem::from_wire(frame), Some(item));
        }
    }

    #[test]
    fn bad_frames_are_refused() {
        let empty = pb::ProviderTunnelFrame { tunnel_id: Bytes::from_static(b"t"), seq: 0, kind: None, usage: None };
        assert_eq!(TunnelItem::from_wire(empty), None);
        let start = pb::TunnelResponseStart { status: 99, headers: vec![] };
        let frame = pb::ProviderTunnelFrame {
            tunnel_id: Bytes::from_static(b"t"),
            seq: 0,
            kind: Some(pb::provider_tunnel_frame::Kind::Status(start)),
            usage: None,
        };
        assert_eq!(TunnelItem::from_wire(frame), None);
        // A header name that is no token would let a node write lines of its
        // own into the client's response head.
        let status = |name: &[u8]| {
            let header = pb::Header { name: Bytes::copy_from_slice(name), value: Bytes::from_static(b"v") };
            let start = pb::TunnelResponseStart { status: 200, headers: vec![header] };
            pb::ProviderTunnelFrame {
                tunnel_id: Bytes::from_static(b"t"),
                seq: 0,
                kind: Some(pb::provider_tunnel_frame::Kind::Status(start)),
                usage: None,
            }
        };
        for name in [&b"x-a\r\nset-cookie: s"[..], b"", b"a b"] {
            assert_eq!(TunnelItem::from_wire(status(name)), None, "{name:?}");
        }
        let whole = |status: u32, name: &[u8]| {
            let header = pb::Header { name: Bytes::copy_from_slice(name), value: Bytes::from_static(b"v") };
            let whole = pb::TunnelWhole { status, headers: vec![header], body: vec![] };
            pb::ProviderTunnelFrame {
                tunnel_id: Bytes::from_static(b"t"),
                seq: 0,
                kind: Some(pb::provider_tunnel_frame::Kind::Whole(whole)),
                usage: None,
            }
        };
        assert_eq!(TunnelItem::from_wire(whole(600, b"x")), None);
        assert_eq!(TunnelItem::from_wire(whole(200, b"x-a\r\nset-cookie: s")), None);
        assert!(matches!(TunnelItem::from_wire(whole(200, b"X-Up")), Some(TunnelItem::Whole(_))));
        // Upper case from the wire is lowered, as before.
        let Some(TunnelItem::Start { headers, .. }) = TunnelItem::from_wire(status(b"X-Up")) else { panic!("refused") };
        assert_eq!(headers[0].0, "x-up");
    }

    #[test]
    fn header_rules() {
        for h in ["Connection", "transfer-encoding", "Upgrade", "keep-alive", "TE", "trailer", "proxy-authorization"] {
            assert!(
                is_hop_by_hop(h.as_bytes())
                    && !forwards_request_header(h.as_bytes())
                    && !forwards_response_header(h.as_bytes()),
                "{h}"
            );
        }
        for h in ["host", "Authorization", "content-length", "accept-encoding", "expect"] {
            assert!(!forwards_request_header(h.as_bytes()), "{h}");
        }
        for h in
            ["content-type", "x-request-id", "openai-organization", "user-agent", "x-stainless-lang", "idempotency-key"]
        {
            assert!(forwards_request_header(h.as_bytes()), "{h}");
        }
        for h in
            ["retry-after", "retry-after-ms", "x-ratelimit-remaining-requests", "openai-processing-ms", "content-type"]
        {
            assert!(forwards_response_header(h.as_bytes()), "{h}");
        }
        assert!(!forwards_response_header(b"Content-Length"));
    }
}
