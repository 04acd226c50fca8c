//! Server side: the opening handshake (RFC 6455 §4.2).

use base64::Engine as _;
use bytes::BytesMut;

use crate::http::{list_values, put_sanitized, trim_ows, BodyKind, RequestHead};

/// The GUID appended to the client's key (§1.3).
const GUID: &[u8] = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// The only protocol version (§4.1).
pub const VERSION: &str = "13";

/// `Sec-WebSocket-Accept` for a `Sec-WebSocket-Key`: base64 of the SHA-1 of
/// the key (as sent, without surrounding whitespace) followed by the GUID.
pub fn accept_key(client_key: &[u8]) -> String {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY);
    ctx.update(client_key);
    ctx.update(GUID);
    base64::engine::general_purpose::STANDARD.encode(ctx.finish())
}

/// What an accepted upgrade request asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandshakeInfo {
    /// The `Sec-WebSocket-Accept` value to answer with ([`write_accept`]).
    pub accept: String,
    /// Subprotocols offered in `Sec-WebSocket-Protocol`, in order (none
    /// is selected unless the caller answers with
    /// [`write_accept_protocol`]).
    pub protocols: Vec<String>,
}

/// A request that is not a valid WebSocket upgrade, with the status to
/// answer it with ([`status`](HandshakeError::status)) and the headers that
/// answer must carry ([`headers`](HandshakeError::headers)).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    /// Not GET (405, with `Allow: GET`).
    #[error("method {0} is not GET")]
    Method(String),
    /// HTTP/1.0 (400): an upgrade needs HTTP/1.1.
    #[error("WebSocket needs HTTP/1.1")]
    HttpVersion,
    /// No `websocket` token in `Upgrade` (426, with `Upgrade: websocket`).
    #[error("no `Upgrade: websocket`")]
    NotWebSocket,
    /// No `upgrade` token in `Connection` (400).
    #[error("`Connection` has no `upgrade` token")]
    ConnectionNotUpgrade,
    /// `Sec-WebSocket-Version` missing or not 13 (426, with
    /// `Sec-WebSocket-Version: 13`).
    #[error("unsupported or missing Sec-WebSocket-Version")]
    UnsupportedVersion,
    /// `Sec-WebSocket-Key` missing, repeated, or not the base64 of 16 bytes (400).
    #[error("missing or invalid Sec-WebSocket-Key")]
    InvalidKey,
    /// A request body (400): the bytes after the head are WebSocket frames.
    #[error("upgrade request with a body")]
    Body,
}

impl HandshakeError {
    /// HTTP status to answer with.
    pub fn status(&self) -> u16 {
        match self {
            HandshakeError::Method(_) => 405,
            HandshakeError::NotWebSocket | HandshakeError::UnsupportedVersion => 426,
            HandshakeError::HttpVersion
            | HandshakeError::ConnectionNotUpgrade
            | HandshakeError::InvalidKey
            | HandshakeError::Body => 400,
        }
    }

    /// Headers the error response must carry (RFC 9110 §15.5.6 and §15.5.22,
    /// RFC 6455 §4.4).
    pub fn headers(&self) -> &'static [(&'static str, &'static str)] {
        match self {
            HandshakeError::Method(_) => &[("allow", "GET")],
            HandshakeError::NotWebSocket => &[("upgrade", "websocket")],
            HandshakeError::UnsupportedVersion => &[("sec-websocket-version", VERSION)],
            _ => &[],
        }
    }

    /// A stable, low-cardinality code for error bodies and metrics.
    pub fn code(&self) -> &'static str {
        match self {
            HandshakeError::Method(_) => "method_not_allowed",
            HandshakeError::NotWebSocket => "upgrade_required",
            HandshakeError::UnsupportedVersion => "unsupported_websocket_version",
            HandshakeError::HttpVersion
            | HandshakeError::ConnectionNotUpgrade
            | HandshakeError::InvalidKey
            | HandshakeError::Body => "invalid_websocket_handshake",
        }
    }
}

/// Checks an upgrade request per RFC 6455 §4.2.1: GET on HTTP/1.1, a
/// `websocket` token in `Upgrade` and an `upgrade` token in `Connection`
/// (both case-insensitive, in comma lists), `Sec-WebSocket-Version: 13`,
/// exactly one `Sec-WebSocket-Key` that is the base64 of a 16-byte nonce,
/// and no body. The HTTP parser has already required a single valid `Host`.
/// `Origin` is the caller's policy.
pub fn check_upgrade(head: &RequestHead) -> Result<HandshakeInfo, HandshakeError> {
    if head.method != "GET" {
        return Err(HandshakeError::Method(head.method.clone()));
    }
    if head.version < 1 {
        return Err(HandshakeError::HttpVersion);
    }
    let headers = &head.headers;
    if !list_values(headers, "upgrade").any(|t| t.eq_ignore_ascii_case(b"websocket")) {
        return Err(HandshakeError::NotWebSocket);
    }
    if !list_values(headers, "connection").any(|t| t.eq_ignore_ascii_case(b"upgrade")) {
        return Err(HandshakeError::ConnectionNotUpgrade);
    }
    if head.body != BodyKind::Empty && head.body != BodyKind::Length(0) {
        return Err(HandshakeError::Body);
    }
    let mut versions = headers.iter().filter(|(n, _)| n == "sec-websocket-version");
    match (versions.next(), versions.next()) {
        (Some((_, v)), None) if trim_ows(v) == VERSION.as_bytes() => {}
        _ => return Err(HandshakeError::UnsupportedVersion),
    }
    let mut keys = headers.iter().filter(|(n, _)| n == "sec-websocket-key");
    let key = match (keys.next(), keys.next()) {
        (Some((_, k)), None) => trim_ows(k),
        _ => return Err(HandshakeError::InvalidKey),
    };
    match base64::engine::general_purpose::STANDARD.decode(key) {
        Ok(nonce) if nonce.len() == 16 => {}
        _ => return Err(HandshakeError::InvalidKey),
    }
    let protocols =
        list_values(headers, "sec-websocket-protocol").map(|p| String::from_utf8_lossy(p).into_owned()).collect();
    Ok(HandshakeInfo { accept: accept_key(key), protocols })
}

/// Appends the `101 Switching Protocols` head accepting the upgrade.
pub fn write_accept(out: &mut BytesMut, accept: &str) {
    write_accept_protocol(out, accept, None);
}

/// [`write_accept`], selecting a subprotocol the client offered
/// ([`HandshakeInfo::protocols`]): a client that offered some fails the
/// connection unless one is selected.
pub fn write_accept_protocol(out: &mut BytesMut, accept: &str, protocol: Option<&str>) {
    out.reserve(160);
    out.extend_from_slice(
        b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-accept: ",
    );
    put_sanitized(out, accept);
    out.extend_from_slice(b"\r\n");
    if let Some(p) = protocol {
        out.extend_from_slice(b"sec-websocket-protocol: ");
        put_sanitized(out, p);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::http::{parse_request_head, Limits};

    fn head(text: &str) -> RequestHead {
        let mut buf = BytesMut::from(text);
        match parse_request_head(&mut buf, &Limits::default()) {
            Ok(Some(h)) => h,
            other => unreachable!("test head did not parse: {other:?}"),
        }
    }

    const GOOD: &str = "GET /v1/responses HTTP/1.1\r\nHost: server.example.com\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";

    #[test]
    fn rfc_example_accept_key() {
        // RFC 6455 §1.3.
        assert_eq!(accept_key(b"dGhlIHNhbXBsZSBub25jZQ=="), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    }

    #[test]
    fn accepts_the_rfc_request() {
        let info = check_upgrade(&head(GOOD)).unwrap();
        assert_eq!(info.accept, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
        assert!(info.protocols.is_empty());
        let mut out = BytesMut::new();
        write_accept(&mut out, &info.accept);
        assert_eq!(
            &out[..],
            b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n"
        );
        // The written head parses as a 101 response.
        let mut resp = out.clone();
        let parsed = crate::http::parse_response_head(&mut resp, &Limits::default(), false).unwrap().unwrap();
        assert_eq!(parsed.status, 101);
        assert!(resp.is_empty());
    }

    #[test]
    fn token_lists_and_case() {
        let h = head(
            "GET /v1/responses HTTP/1.1\r\nHost: a\r\nUpgrade: h2c, WebSocket\r\nConnection: keep-alive, UPGRADE\r\nsec-websocket-key:  dGhlIHNhbXBsZSBub25jZQ== \r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: chat, superchat\r\nSec-WebSocket-Protocol: x\r\n\r\n",
        );
        let info = check_upgrade(&h).unwrap();
        assert_eq!(info.accept, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
        assert_eq!(info.protocols, ["chat", "superchat", "x"]);
        let mut out = BytesMut::new();
        write_accept_protocol(&mut out, &info.accept, Some("chat\r\nx-injected: 1"));
        assert!(out.ends_with(b"sec-websocket-protocol: chatx-injected: 1\r\n\r\n"));
    }

    #[test]
    fn rejects() {
        let cases: &[(&str, &str, HandshakeError, u16)] = &[
            ("GET ", "POST ", HandshakeError::Method("POST".into()), 405),
            ("HTTP/1.1\r\n", "HTTP/1.0\r\n", HandshakeError::HttpVersion, 400),
            ("Upgrade: websocket", "Upgrade: h2c", HandshakeError::NotWebSocket, 426),
            ("Upgrade: websocket", "X-Upgrade: websocket", HandshakeError::NotWebSocket, 426),
            ("Connection: Upgrade", "Connection: keep-alive", HandshakeError::ConnectionNotUpgrade, 400),
            ("Sec-WebSocket-Version: 13", "Sec-WebSocket-Version: 8", HandshakeError::UnsupportedVersion, 426),
            ("Sec-WebSocket-Version: 13", "X: y", HandshakeError::UnsupportedVersion, 426),
            (
                "Sec-WebSocket-Version: 13",
                "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Version: 13",
                HandshakeError::UnsupportedVersion,
                426,
            ),
            ("Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", "X: y", HandshakeError::InvalidKey, 400),
            ("dGhlIHNhbXBsZSBub25jZQ==", "dGhlIHNhbXBsZSBub25j", HandshakeError::InvalidKey, 400),
            ("dGhlIHNhbXBsZSBub25jZQ==", "dGhlIHNhbXBsZSBub25jZQ", HandshakeError::InvalidKey, 400),
            ("dGhlIHNhbXBsZSBub25jZQ==", "not base64 at all!!!!!==", HandshakeError::InvalidKey, 400),
            (
                "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
                "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
                HandshakeError::InvalidKey,
                400,
            ),
            ("Connection: Upgrade", "Connection: Upgrade\r\nContent-Length: 3", HandshakeError::Body, 400),
        ];
        for (from, to, want, status) in cases {
            let text = GOOD.replacen(from, to, 1);
            assert_ne!(text, GOOD, "case {to:?} changed nothing");
            let err = check_upgrade(&head(&text)).unwrap_err();
            assert_eq!(&err, want, "{to:?}");
            assert_eq!(err.status(), *status, "{to:?}");
            assert!(!err.to_string().is_empty());
        }
        assert_eq!(HandshakeError::UnsupportedVersion.headers(), &[("sec-websocket-version", "13")]);
        assert_eq!(HandshakeError::NotWebSocket.headers(), &[("upgrade", "websocket")]);
        assert_eq!(HandshakeError::Method("PUT".into()).headers(), &[("allow", "GET")]);
    }
}
