//! Bearer-token check of admin requests.

use iop_core::config::Secret;

/// Outcome of checking a request's credentials.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Auth {
    /// No admin token is configured: the API does not exist (404).
    Disabled,
    /// Missing, malformed or wrong credentials (401).
    Denied,
    /// The token matches.
    Granted,
}

/// The token of an `Authorization: Bearer <token>` header value. The scheme
/// is matched case-insensitively (RFC 9110 §11.1); surrounding spaces and
/// tabs are ignored. `None` when the value is not a non-empty bearer token.
pub fn bearer_token(value: &[u8]) -> Option<&str> {
    let value = std::str::from_utf8(value).ok()?.trim_matches([' ', '\t']);
    let (scheme, token) = value.split_once([' ', '\t'])?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let token = token.trim_matches([' ', '\t']);
    (!token.is_empty()).then_some(token)
}

/// Checks the `authorization` header value (if any) against the configured
/// admin token in constant time.
pub fn authorize(admin_token: Option<&Secret>, authorization: Option<&[u8]>) -> Auth {
    let Some(expected) = admin_token else { return Auth::Disabled };
    match authorization.and_then(bearer_token) {
        Some(token) if expected.ct_eq(token) => Auth::Granted,
        _ => Auth::Denied,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn parses_bearer_values() {
        assert_eq!(bearer_token(b"Bearer abc"), Some("abc"));
        assert_eq!(bearer_token(b"bearer abc"), Some("abc"));
        assert_eq!(bearer_token(b"BEARER \t abc  "), Some("abc"));
        assert_eq!(bearer_token(b"  Bearer abc"), Some("abc"));
        assert_eq!(bearer_token(b"Bearer"), None);
        assert_eq!(bearer_token(b"Bearer   "), None);
        assert_eq!(bearer_token(b"Basic abc"), None);
        assert_eq!(bearer_token(b"Bearerabc"), None);
        assert_eq!(bearer_token(b""), None);
        assert_eq!(bearer_token(b"Bearer \xff\xfe"), None);
    }

    #[test]
    fn authorizes_against_the_configured_token() {
        let secret = Secret::new("s3cret");
        assert_eq!(authorize(None, Some(b"Bearer s3cret")), Auth::Disabled);
        assert_eq!(authorize(None, None), Auth::Disabled);
        assert_eq!(authorize(Some(&secret), None), Auth::Denied);
        assert_eq!(authorize(Some(&secret), Some(b"Bearer wrong")), Auth::Denied);
        assert_eq!(authorize(Some(&secret), Some(b"Bearer s3cre")), Auth::Denied);
        assert_eq!(authorize(Some(&secret), Some(b"Bearer s3cret2")), Auth::Denied);
        assert_eq!(authorize(Some(&secret), Some(b"s3cret")), Auth::Denied);
        assert_eq!(authorize(Some(&secret), Some(b"Basic s3cret")), Auth::Denied);
        assert_eq!(authorize(Some(&secret), Some(b"Bearer s3cret")), Auth::Granted);
        assert_eq!(authorize(Some(&secret), Some(b"bearer  s3cret ")), Auth::Granted);
    }
}
