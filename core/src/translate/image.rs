//! The size of an inline (base64) image, checked against a limit before
//! the image is forwarded.

use super::{read::Path, Invalid};

/// The decoded size of base64 `data` (padding counted off; whitespace, which
/// encoders do not write, counted in).
pub(crate) fn decoded_len(data: &str) -> usize {
    let n = data.len();
    let pad = data.bytes().rev().take_while(|&b| b == b'=').count().min(2);
    (n / 4 * 3 + n % 4 * 3 / 4).saturating_sub(pad)
}

/// `Ok` when `size` decoded bytes fit `limit`, else a 413 naming `at`.
pub(crate) fn within(size: usize, limit: usize, at: Path<'_>) -> Result<(), Invalid> {
    if size <= limit {
        return Ok(());
    }
    let param = at.to_string();
    Err(Invalid {
        status: 413,
        message: format!("{param}: the image is {size} bytes decoded, over the limit of {limit} bytes"),
        param,
    })
}
