//! What every dialect's error bodies share: client input quoted in them is
//! bounded.

/// Longest message an error body carries; longer ones are cut, so no
/// client input of any size is echoed back whole.
pub const MAX_MESSAGE_BYTES: usize = 1024;
/// Longest piece of client input (a model name, a path) quoted in a message.
pub const MAX_ECHO_BYTES: usize = 128;

/// `s` cut to at most `max` bytes at a character boundary, with `…` when cut.
pub fn clip_to(s: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if s.len() <= max {
        return s.into();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end]).into()
}

/// Client input quoted in a message, cut to [`MAX_ECHO_BYTES`].
pub fn clip(s: &str) -> std::borrow::Cow<'_, str> {
    clip_to(s, MAX_ECHO_BYTES)
}

/// `Retry-After` (whole seconds, rounded up) and `Retry-After-Ms` for a
/// failure: the provider's wait when it gave one, else 1 s on 429 and 503.
pub fn retry_after(f: &iop_core::exec::RunFailure) -> Option<(String, String)> {
    let ms = f.retry_after_ms.or(matches!(f.status, 429 | 503).then_some(1000))?;
    Some((ms.div_ceil(1000).max(1).to_string(), ms.to_string()))
}
