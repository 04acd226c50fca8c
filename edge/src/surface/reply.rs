//! Error answers written to a client connection, in the route's dialect.

use iop_core::exec::RunFailure;

use super::{dialect::Dialect, error::retry_after};
use crate::{dispatch::DispatchError, server::Responder};

/// An error answer; 429 and 503 (529) carry `Retry-After: 1`. Returns
/// whether the connection may be kept.
pub async fn error(w: &mut Responder<'_>, d: Dialect, status: u16, msg: &str, code: &str, keep: bool) -> bool {
    let body = d.error_body(status, msg, code);
    let status = d.status(status);
    let retry = [("retry-after", "1")];
    let extra: &[(&str, &str)] = if matches!(status, 429 | 503 | 529) { &retry } else { &[] };
    w.respond(status, "application/json", extra, &body, keep).await.is_ok() && keep
}

/// A dispatch that found no way to its node.
pub async fn dispatch_error(w: &mut Responder<'_>, d: Dialect, e: &DispatchError, keep: bool) -> bool {
    let code = match e {
        DispatchError::NoReadyNode(_) => "no_ready_node",
        DispatchError::NodeBusy(_) => "node_busy",
    };
    error(w, d, 503, &e.to_string(), code, keep).await
}

/// A run failure before any byte of the answer: its status, the provider's
/// error fields when it sent them, and its `Retry-After`.
pub async fn failure(w: &mut Responder<'_>, d: Dialect, f: &RunFailure, keep: bool) -> bool {
    let body = d.failure_body(f);
    let status = d.status(f.status);
    let retry = retry_after(f);
    let extra: Vec<(&str, &str)> = match &retry {
        Some((secs, ms)) => vec![("retry-after", secs.as_str()), ("retry-after-ms", ms.as_str())],
        None => vec![],
    };
    w.respond(status, "application/json", &extra, &body, keep).await.is_ok() && keep
}
