//! Header names as slices of the head they came in: lower-cased in the one
//! copy of the head, so a parsed head costs no allocation per header, and a
//! name crosses the edge-node wire as `bytes` sliced from the frame.

use std::fmt;

use bytes::Bytes;

/// A lower-case HTTP header name (an RFC 9110 token). Always valid ASCII.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HeaderName(Bytes);

impl HeaderName {
    /// A name known at compile time; must already be a lower-case token
    /// (checked in debug builds and by the tests).
    pub const fn from_static(name: &'static str) -> Self {
        Self(Bytes::from_static(name.as_bytes()))
    }

    /// A name received from elsewhere (the wire): `None` unless it is a
    /// token. Upper-case letters are lowered (one copy, only then).
    pub fn from_bytes(name: Bytes) -> Option<Self> {
        // One pass: every byte a token byte, and whether any is upper case.
        let mut upper = false;
        for &b in name.iter() {
            match TOKEN[usize::from(b)] {
                0 => return None,
                2 => upper = true,
                _ => {}
            }
        }
        if name.is_empty() {
            return None;
        }
        if upper {
            return Some(Self(Bytes::from(name.to_ascii_lowercase())));
        }
        Some(Self(name))
    }

    /// A name given as text (tests, configuration): as `from_bytes`.
    pub fn parse(name: &str) -> Option<Self> {
        Self::from_bytes(Bytes::copy_from_slice(name.as_bytes()))
    }

    /// Wraps bytes the head parser already checked (a token, lower-cased).
    pub(crate) fn from_checked(name: Bytes) -> Self {
        debug_assert!(name.iter().all(|&b| is_token_byte(b) && !b.is_ascii_uppercase()));
        Self(name)
    }

    /// The name as text (checks its bytes each time: on hot paths use
    /// [`Self::as_bytes`]).
    pub fn as_str(&self) -> &str {
        // Always ASCII (checked on construction), so this never falls back.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Never true (a name is a non-empty token); for symmetry with `len`.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The name's bytes (what comparisons use: no UTF-8 check).
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The name's bytes (shared, not copied).
    pub fn into_bytes(self) -> Bytes {
        self.0
    }
}

/// `tchar` of RFC 9110 §5.6.2.
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Per byte: 0 not a token byte, 1 a token byte, 2 an upper-case letter.
static TOKEN: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        let special = matches!(
            c,
            b'!' | b'#' | b'$' | b'%' | b'&' | b'\'' | b'*' | b'+' | b'-' | b'.' | b'^' | b'_' | b'`' | b'|' | b'~'
        );
        t[b] = if c.is_ascii_uppercase() {
            2
        } else if c.is_ascii_alphanumeric() || special {
            1
        } else {
            0
        };
        b += 1;
    }
    t
};

impl AsRef<[u8]> for HeaderName {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl PartialEq<str> for HeaderName {
    fn eq(&self, other: &str) -> bool {
        self.0 == other.as_bytes()
    }
}

impl PartialEq<&str> for HeaderName {
    fn eq(&self, other: &&str) -> bool {
        self.0 == other.as_bytes()
    }
}

impl fmt::Debug for HeaderName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for HeaderName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn names_from_elsewhere_are_checked_and_lowered() {
        assert_eq!(HeaderName::parse("Content-Type").unwrap(), "content-type");
        assert_eq!(HeaderName::parse("x-request-id").unwrap().as_str(), "x-request-id");
        for bad in ["", "a b", "a:b", "a\r\nb", "ünï", "a\0"] {
            assert!(HeaderName::parse(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn the_table_agrees_with_the_rule() {
        for b in 0..=255u8 {
            assert_eq!(TOKEN[usize::from(b)] != 0, is_token_byte(b), "{b}");
            assert_eq!(TOKEN[usize::from(b)] == 2, b.is_ascii_uppercase(), "{b}");
        }
    }

    #[test]
    fn a_lower_case_name_is_shared_not_copied() {
        let b = Bytes::from_static(b"accept");
        let n = HeaderName::from_bytes(b.clone()).unwrap();
        assert_eq!(n.into_bytes().as_ptr(), b.as_ptr());
    }
}
