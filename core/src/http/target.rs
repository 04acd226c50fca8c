//! The request target and `Host` (RFC 9112 §3.2): an HTTP/1.1 request needs
//! exactly one valid `Host`, and an absolute-form target
//! (`POST http://host/path HTTP/1.1`) is accepted and reduced to its path
//! and query, which is all routing looks at.

use bytes::Bytes;

use super::{HeaderName, HttpError};

/// Checks the request's `Host` lines: more than one, or one whose value is
/// not `host[:port]`, is an error for any version; none is an error for
/// HTTP/1.1 only (HTTP/1.0 predates `Host`).
pub(crate) fn check_host(headers: &[(HeaderName, Bytes)], version: u8) -> Result<(), HttpError> {
    let mut hosts = headers.iter().filter(|(n, _)| n == "host");
    match (hosts.next(), hosts.next()) {
        (Some(_), Some(_)) => Err(HttpError::Malformed("more than one host")),
        // Empty is valid: a target URI without an authority (RFC 9110 §7.2).
        (Some((_, v)), None) if host_port(v).is_none() => Err(HttpError::Malformed("invalid host")),
        (None, None) if version >= 1 => Err(HttpError::Malformed("missing host")),
        _ => Ok(()),
    }
}

/// Reduces an absolute-form `http`/`https` target to origin form in place
/// (its path and query; `/` for an empty path, RFC 9112 §3.3). The
/// authority, which an origin server uses instead of `Host`, must be a
/// non-empty `host[:port]` (RFC 9110 §4.2.1; no userinfo) and is not kept:
/// routing is by path. Any other target is left as sent.
pub(crate) fn to_origin_form(target: &mut String) -> Result<(), HttpError> {
    let Some(after_scheme) = scheme_end(target.as_bytes()) else { return Ok(()) };
    let rest = &target[after_scheme..];
    let authority_len = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let host = host_port(&rest.as_bytes()[..authority_len]).ok_or(HttpError::Malformed("invalid target authority"))?;
    if host.is_empty() {
        return Err(HttpError::Malformed("invalid target authority"));
    }
    target.drain(..after_scheme + authority_len);
    if !target.starts_with('/') {
        target.insert(0, '/');
    }
    Ok(())
}

/// Where the authority starts when `target` begins `http://` or `https://`
/// (the scheme in any case).
fn scheme_end(target: &[u8]) -> Option<usize> {
    [&b"http://"[..], b"https://"]
        .into_iter()
        .find(|p| target.get(..p.len()).is_some_and(|s| s.eq_ignore_ascii_case(p)))
        .map(<[u8]>::len)
}

/// The host of `host[:port]` (RFC 3986 `host`: an IP literal in brackets,
/// or a reg-name, which covers IPv4; `port` is digits, maybe none), or
/// `None` when `v` is not of that form.
fn host_port(v: &[u8]) -> Option<&[u8]> {
    let (host, port) = if v.first() == Some(&b'[') {
        let close = v.iter().position(|&b| b == b']')?;
        let (literal, rest) = v.split_at(close + 1);
        let inner = &literal[1..close];
        let ok = !inner.is_empty() && inner.iter().all(|&b| b == b':' || unreserved_or_sub_delim(b));
        (ok.then_some(literal)?, rest)
    } else {
        let colon = v.iter().position(|&b| b == b':').unwrap_or(v.len());
        let (name, rest) = v.split_at(colon);
        (reg_name(name).then_some(name)?, rest)
    };
    match port {
        [] => Some(host),
        [b':', digits @ ..] if digits.iter().all(u8::is_ascii_digit) => Some(host),
        _ => None,
    }
}

/// `*( unreserved / pct-encoded / sub-delims )`.
fn reg_name(mut s: &[u8]) -> bool {
    while let [b, rest @ ..] = s {
        s = match (b, rest) {
            (b'%', [h, l, tail @ ..]) if h.is_ascii_hexdigit() && l.is_ascii_hexdigit() => tail,
            _ if unreserved_or_sub_delim(*b) => rest,
            _ => return false,
        };
    }
    true
}

fn unreserved_or_sub_delim(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=".contains(&b)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn host_values() {
        for good in [
            &b""[..],
            b"example",
            b"example:8080",
            b"example:",
            b"127.0.0.1:80",
            b"[::1]:443",
            b"[v1.x]",
            b"a%2Fb",
            b"xn--bcher-kva.example",
        ] {
            assert!(host_port(good).is_some(), "{:?}", String::from_utf8_lossy(good));
        }
        for bad in [
            &b"a b"[..],
            b"a:b",
            b"a:80:80",
            b"user@host",
            b"host/path",
            b"[::1",
            b"[]",
            b"[::1]x",
            b"a%2",
            b"a%zz",
            b"\xff",
            b"a\tb",
        ] {
            assert!(host_port(bad).is_none(), "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn absolute_form_becomes_origin_form() {
        let cases = [
            ("http://example/v1/chat/completions?x=1", "/v1/chat/completions?x=1"),
            ("HTTPS://example:8443/v1/models", "/v1/models"),
            ("http://example", "/"),
            ("http://example?x=1", "/?x=1"),
            ("http://[::1]:80/a", "/a"),
            // Not absolute-form: left as sent (routing finds no such path).
            ("/v1/models", "/v1/models"),
            ("*", "*"),
            ("ftp://example/a", "ftp://example/a"),
            ("/http://example/a", "/http://example/a"),
        ];
        for (sent, origin) in cases {
            let mut target = sent.to_owned();
            to_origin_form(&mut target).unwrap();
            assert_eq!(target, origin, "{sent}");
        }
        for bad in ["http://", "http:///a", "http://user@example/a", "http://a b/", "http://example:x/a"] {
            let mut target = bad.to_owned();
            assert_eq!(to_origin_form(&mut target), Err(HttpError::Malformed("invalid target authority")), "{bad}");
        }
    }
}
