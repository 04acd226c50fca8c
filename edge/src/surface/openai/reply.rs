//! OpenAI-shaped error answers written to a client connection.

use iop_core::exec::RunFailure;

use super::error;
use crate::{dispatch::DispatchError, server::Responder};

/// An error answer; 429 and 503 carry `Retry-After: 1`. Returns whether the
/// connection may be kept.
pub async fn error(conn: &mut Responder<'_>, status: u16, msg: &str, code: Option<&str>, keep: bool) -> bool {
    let body = error::body(status, msg, code);
    let retry = [("retry-after", "1")];
    let extra: &[(&str, &str)] = if status == 503 || status == 429 { &retry } else { &[] };
    conn.respond(status, "application/json", extra, &body, keep).await.is_ok() && keep
}

/// A dispatch that found no way to its node.
pub async fn dispatch_error(conn: &mut Responder<'_>, e: &DispatchError, keep: bool) -> bool {
    let code = match e {
        DispatchError::NoReadyNode(_) => "no_ready_node",
        DispatchError::NodeBusy(_) => "node_busy",
    };
    error(conn, 503, &e.to_string(), Some(code), keep).await
}

/// A run failure before any byte of the answer: its status, the provider's
/// error fields when it sent them, and its `Retry-After`.
pub async fn failure(conn: &mut Responder<'_>, f: &RunFailure, keep: bool) -> bool {
    let body = error::failure_body(f);
    let retry = error::retry_after(f);
    let extra: Vec<(&str, &str)> = match &retry {
        Some((secs, ms)) => vec![("retry-after", secs.as_str()), ("retry-after-ms", ms.as_str())],
        None => vec![],
    };
    conn.respond(f.status, "application/json", &extra, &body, keep).await.is_ok() && keep
}
