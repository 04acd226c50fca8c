//! Small JSON rendering helpers shared by the response shapes. The shapes are
//! rendered by hand (not through `serde_json::Value`) so that key order is
//! fixed and matches the real servers, which byte-level tests rely on.

/// `s` as a JSON string literal.
pub fn json_str(s: &str) -> String {
    // Serializing a str cannot fail; the fallback keeps the output valid JSON regardless.
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_owned())
}

/// `Some(s)` as a JSON string, `None` as `null`.
pub fn json_opt_str(s: Option<&str>) -> String {
    s.map_or_else(|| "null".to_owned(), json_str)
}

/// A finite float in its shortest round-trip form (`0` for NaN/inf, which
/// the shapes never produce).
pub fn json_f64(x: f64) -> String {
    serde_json::Number::from_f64(x).map_or_else(|| "0".to_owned(), |n| n.to_string())
}

/// An `f32` in its shortest round-trip form, so that a client parsing it as
/// `f32` gets the exact value the base64 encoding carries.
pub fn json_f32(x: f32) -> String {
    serde_json::to_string(&x).unwrap_or_else(|_| "0".to_owned())
}

/// The bytes of `s` as a JSON array of integers (`bytes` of a logprob).
pub fn json_bytes(s: &str) -> String {
    let mut out = String::with_capacity(2 + s.len() * 4);
    out.push('[');
    for (i, b) in s.bytes().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&b.to_string());
    }
    out.push(']');
    out
}

/// Lower-case hex of `bytes` (SHA-256 digests in `/last`, Ollama digests).
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    out
}

/// Standard base64 with padding (`encoding_format: "base64"` of embeddings).
pub fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for group in bytes.chunks(3) {
        let b = [group[0], group.get(1).copied().unwrap_or(0), group.get(2).copied().unwrap_or(0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        let sextet = |shift: u32| char::from(ALPHABET[((n >> shift) & 63) as usize]);
        out.push(sextet(18));
        out.push(sextet(12));
        out.push(if group.len() > 1 { sextet(6) } else { '=' });
        out.push(if group.len() > 2 { sextet(0) } else { '=' });
    }
    out
}

/// SHA-256 of `data` (embedding seeds, Ollama digests).
pub fn sha256(data: &[u8]) -> [u8; 32] {
    let digest = ring::digest::digest(&ring::digest::SHA256, data);
    let mut out = [0u8; 32];
    out.copy_from_slice(digest.as_ref());
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn renders_scalars() {
        assert_eq!(json_str("a\"b\n"), r#""a\"b\n""#);
        assert_eq!(json_opt_str(None), "null");
        assert_eq!(json_f64(-0.01), "-0.01");
        assert_eq!(json_f64(f64::NAN), "0");
        assert_eq!(json_f32(0.1), "0.1");
        assert_eq!(json_bytes("é "), "[195,169,32]");
        assert_eq!(json_bytes(""), "[]");
        assert_eq!(hex(&[0x00, 0xab, 0xff]), "00abff");
    }

    #[test]
    fn base64_matches_rfc4648_vectors() {
        for (input, want) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(input.as_bytes()), want, "{input}");
        }
        assert_eq!(base64(&[0xfb, 0xff]), "+/8=");
    }

    #[test]
    fn sha256_of_abc() {
        assert_eq!(hex(&sha256(b"abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }
}
