//! HTTP codec errors, each mapped to the status a server answers with.

/// A request or response that cannot be parsed or exceeds a limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HttpError {
    /// Head larger than `Limits::max_head_bytes` (431).
    #[error("request header fields too large")]
    HeadTooLarge,
    /// Decoded body larger than `Limits::max_body_bytes` (413).
    #[error("body too large")]
    BodyTooLarge,
    /// Syntax error (400).
    #[error("malformed HTTP: {0}")]
    Malformed(&'static str),
    /// A Transfer-Encoding other than chunked (501).
    #[error("unsupported transfer-encoding")]
    UnsupportedTransferEncoding,
}

impl HttpError {
    /// HTTP status a server answers this error with.
    pub fn status(&self) -> u16 {
        match self {
            HttpError::HeadTooLarge => 431,
            HttpError::BodyTooLarge => 413,
            HttpError::Malformed(_) => 400,
            HttpError::UnsupportedTransferEncoding => 501,
        }
    }

    /// A stable, low-cardinality code for error bodies and metrics.
    pub fn code(&self) -> &'static str {
        match self {
            HttpError::HeadTooLarge => "head_too_large",
            HttpError::BodyTooLarge => "body_too_large",
            HttpError::Malformed(_) => "malformed_request",
            HttpError::UnsupportedTransferEncoding => "unsupported_transfer_encoding",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_error_statuses() {
        assert_eq!(HttpError::HeadTooLarge.status(), 431);
        assert_eq!(HttpError::BodyTooLarge.status(), 413);
        assert_eq!(HttpError::Malformed("x").status(), 400);
        assert_eq!(HttpError::UnsupportedTransferEncoding.status(), 501);
        assert_eq!(HttpError::BodyTooLarge.code(), "body_too_large");
    }
}
