//! Why a turn stopped short of a response: a message that gets an `error`
//! event (the socket stays open), or the socket's end.

use bytes::BytesMut;
use iop_core::{exec::RunFailure, ws};

use super::inbox::End;
use crate::surface::error::{clip_to, MAX_MESSAGE_BYTES};

/// Why a message gets an `error` event instead of a response.
#[derive(Debug)]
pub struct Refused {
    pub status: u16,
    kind: &'static str,
    code: &'static str,
    message: String,
    param: Option<String>,
}

impl Refused {
    pub fn new(status: u16, code: &'static str, message: impl Into<String>) -> Self {
        let kind = match status {
            401 => "authentication_error",
            403 => "permission_error",
            429 => "rate_limit_error",
            400..=499 => "invalid_request_error",
            _ => "server_error",
        };
        Self { status, kind, code, message: message.into(), param: None }
    }

    pub fn param(mut self, param: &str) -> Self {
        self.param = Some(param.to_owned());
        self
    }

    pub fn of_failure(f: &RunFailure) -> Self {
        Self::new(f.status, f.code, f.message.clone())
    }

    /// `{"type":"error","status":…,"error":{"type","code","message","param"}}`
    /// as one text frame.
    pub fn write_event(&self, out: &mut BytesMut) {
        let v = serde_json::json!({
            "type": "error",
            "status": self.status,
            "error": {
                "type": self.kind,
                "code": self.code,
                "message": clip_to(&self.message, MAX_MESSAGE_BYTES),
                "param": self.param,
            },
        });
        ws::write::text(out, v.to_string().as_bytes());
    }
}

/// Why a turn stopped: an `error` event, or the socket's end.
#[derive(Debug)]
pub enum Stop {
    Refused(Refused),
    End(End),
}

impl From<Refused> for Stop {
    fn from(r: Refused) -> Self {
        Stop::Refused(r)
    }
}

impl From<End> for Stop {
    fn from(e: End) -> Self {
        Stop::End(e)
    }
}
