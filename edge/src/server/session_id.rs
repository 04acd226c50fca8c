//! The client's session id (`http.session_header`): an opaque correlation
//! that travels on the request's runs to the node's run store, its events
//! and its access-log line. It never selects, groups or changes a run.

use std::time::Duration;

use iop_core::{http::RequestHead, limits::LogThrottle};

/// Longest session id taken, in bytes (a UUID is 36): a correlation, not a
/// payload.
pub const MAX_SESSION_ID_BYTES: usize = 128;

/// At most one debug line a minute about ignored values.
static IGNORED_LOG: LogThrottle = LogThrottle::new(Duration::from_secs(60));

/// The session id `head` carries in `header` (lower-cased), or "" when
/// there is none. A value that is empty, longer than
/// [`MAX_SESSION_ID_BYTES`] or not visible ASCII is ignored rather than
/// refused: the id only labels the request, so a client's odd value must
/// not cost it its answer, and cutting or cleaning it could make two
/// sessions look like one.
pub fn of<'a>(head: &'a RequestHead, header: Option<&str>) -> &'a str {
    let Some(value) = header.and_then(|h| head.header(h)) else { return "" };
    match valid(value) {
        Some(id) => id,
        None => {
            if let Some(more) = IGNORED_LOG.allow() {
                // Its length only: the value is the client's.
                tracing::debug!(len = value.len(), ignored_since_last_report = more, "session id ignored");
            }
            ""
        }
    }
}

fn valid(value: &[u8]) -> Option<&str> {
    let ok = !value.is_empty() && value.len() <= MAX_SESSION_ID_BYTES && value.iter().all(|b| b.is_ascii_graphic());
    // Visible ASCII is UTF-8.
    ok.then(|| std::str::from_utf8(value).ok()).flatten()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn head(headers: &[(&str, &[u8])]) -> RequestHead {
        let mut raw = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n".to_vec();
        for (n, v) in headers {
            raw.extend_from_slice(n.as_bytes());
            raw.extend_from_slice(b": ");
            raw.extend_from_slice(v);
            raw.extend_from_slice(b"\r\n");
        }
        raw.extend_from_slice(b"\r\n");
        let mut buf = bytes::BytesMut::from(&raw[..]);
        iop_core::http::parse_request_head(&mut buf, &iop_core::http::Limits::default()).unwrap().unwrap()
    }

    #[test]
    fn taken_from_the_configured_header_only() {
        let h = head(&[("X-Claude-Code-Session-Id", b"5e1c2a9e-0b7f-4c1e-9d3a-2f6b8c4d1e0a"), ("x-session-id", b"b")]);
        assert_eq!(of(&h, Some("x-claude-code-session-id")), "5e1c2a9e-0b7f-4c1e-9d3a-2f6b8c4d1e0a");
        assert_eq!(of(&h, Some("x-session-id")), "b");
        assert_eq!(of(&h, Some("session-id")), "");
        assert_eq!(of(&h, None), "", "off");
    }

    #[test]
    fn odd_values_are_ignored() {
        let long = "a".repeat(MAX_SESSION_ID_BYTES + 1);
        let max = "a".repeat(MAX_SESSION_ID_BYTES);
        for (value, want) in [
            (&b"a b"[..], ""),
            (b"caf\xc3\xa9", ""),
            (b"a\tb", ""),
            (long.as_bytes(), ""),
            (max.as_bytes(), max.as_str()),
            (b"s:1/\"q\"=\\", "s:1/\"q\"=\\"),
        ] {
            assert_eq!(of(&head(&[("x-s", value)]), Some("x-s")), want, "{:?}", String::from_utf8_lossy(value));
        }
    }
}
