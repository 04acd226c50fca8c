//! The admin API under `/admin`: a live snapshot of nodes, providers and
//! model queues, and a stream of lifecycle events.
//!
//! Every request must carry `Authorization: Bearer <admin_token>`. Without
//! an `admin_token` in the config the whole API answers 404.
//!
//! - `GET /admin/v1/nodes`: [`snapshot::snapshot`] as JSON.
//! - `GET /admin/v1/events`: SSE of [`crate::events::EdgeEvent`]s ([`events`]).
//! - `/admin/v1/nodes/{node}/…`: node commands ([`commands`]), among them
//!   `GET …/runs?limit=&status=` and `GET …/runs/{run_id}`, the node's
//!   recent runs from its run store.
//! - `/admin/v1/keys` and `/admin/v1/keys/{name}/limits`: API key limits
//!   at run time ([`limits`]).

pub mod auth;
pub mod commands;
pub mod events;
pub mod limits;
pub mod page;
pub mod snapshot;

use std::rc::Rc;

use iop_core::http::RequestHead;

use crate::{
    ctx::Ctx,
    limits::failures::Credential,
    server::{Body, Conn},
    surface::openai::error,
};

use self::auth::Auth;

/// Path of the node snapshot.
pub const NODES_PATH: &str = "/admin/v1/nodes";
/// Path of the event stream.
pub const EVENTS_PATH: &str = "/admin/v1/events";

/// Message of the 404 answered while no admin token is configured.
pub const DISABLED_MESSAGE: &str = "admin API is disabled: set admin_token in the edge config";

/// Whether `path` belongs to the admin API.
pub fn is_admin_path(path: &str) -> bool {
    path == "/admin" || path.starts_with("/admin/")
}

/// Checks the admin token of a request. The token is compared first (in
/// constant time): the right one is always granted. A wrong one counts
/// against its address's failed admin authentications
/// ([`crate::limits::failures`]: apart from node registrations and API
/// keys); past that budget it gets 429 instead of 401. `Ok(true)`:
/// granted; `Ok(false)`: no admin token is configured; `Err(keep)`:
/// answered (401 or 429).
pub async fn check_token(worker: &Rc<Ctx>, conn: &mut Conn, head: &RequestHead, keep: bool) -> Result<bool, bool> {
    let token = worker.config.borrow().admin_token.clone();
    match auth::authorize(token.as_ref(), head.header("authorization")) {
        Auth::Granted => Ok(true),
        Auth::Disabled => Ok(false),
        Auth::Denied => match worker.shared.auth.failed(Credential::Admin, conn.peer.ip()) {
            Ok(()) => {
                // Never log the presented credential.
                tracing::debug!(path = %error::clip(head.path()), peer = %conn.peer, "admin request without a valid token");
                let challenge = [("www-authenticate", "Bearer")];
                let msg = "a valid admin token is required: send `Authorization: Bearer <admin_token>`";
                Err(respond_error(conn, 401, msg, Some("invalid_admin_token"), &challenge, keep).await)
            }
            Err(wait) => {
                let retry = wait.as_secs().max(1).to_string();
                let msg = "invalid admin token, and too many failed admin authentications from this address; \
                           retry later";
                let extra = [("retry-after", retry.as_str())];
                Err(respond_error(conn, 429, msg, Some(TOO_MANY_ADMIN_FAILURES), &extra, keep).await)
            }
        },
    }
}

/// Error code of the 429 a wrong admin token gets past its address's budget.
pub const TOO_MANY_ADMIN_FAILURES: &str = "too_many_failed_admin_authentications";

/// Handles one `/admin` request; returns whether the connection may be kept
/// (the token is checked by [`check_token`]).
pub async fn handle(worker: &Rc<Ctx>, conn: &mut Conn, head: &RequestHead, body: Body) -> bool {
    let keep = head.keep_alive;
    // The status page's files hold no data: served without the token
    // (which the page then sends with every data request), but only while
    // the admin API exists.
    if let Some(file) = page::File::of(head.path()) {
        if worker.config.borrow().admin_token.is_none() {
            return respond_error(conn, 404, DISABLED_MESSAGE, Some("admin_disabled"), &[], keep).await;
        }
        return page::serve(conn, head, file, keep).await;
    }
    match check_token(worker, conn, head, keep).await {
        Ok(true) => {}
        Ok(false) => return respond_error(conn, 404, DISABLED_MESSAGE, Some("admin_disabled"), &[], keep).await,
        Err(kept) => return kept,
    }
    let path = head.path();
    let method = if head.method == "HEAD" { "GET" } else { head.method.as_str() };
    match (method, path) {
        ("GET", NODES_PATH) => {
            let body = serde_json::to_vec(&snapshot::current(worker).await).unwrap_or_default();
            let headers = [("cache-control", "no-store")];
            conn.respond(200, "application/json", &headers, &body, keep).await.is_ok() && keep
        }
        ("GET", EVENTS_PATH) => events::stream(worker, conn, events::wants_snapshots(head.query())).await,
        (_, p) if commands::CommandRoute::parse(p).is_some() => {
            let Some(route) = commands::CommandRoute::parse(p) else { return false };
            let (bytes, _permit) = body.into_parts();
            commands::handle(worker, conn, head, route, bytes).await
        }
        (_, p) if limits::LimitsRoute::parse(p).is_some() => {
            let Some(route) = limits::LimitsRoute::parse(p) else { return false };
            let (bytes, _permit) = body.into_parts();
            limits::handle(worker, conn, head, route, &bytes).await
        }
        (_, NODES_PATH | EVENTS_PATH) => {
            crate::surface::method_not_allowed(conn, head, crate::surface::ALLOW_GET, keep).await.is_ok() && keep
        }
        _ => {
            let msg = format!("no admin route for {} {}", error::clip(&head.method), error::clip(path));
            respond_error(conn, 404, &msg, Some("not_found"), &[], keep).await
        }
    }
}

pub(crate) async fn respond_error(
    conn: &mut Conn,
    status: u16,
    msg: &str,
    code: Option<&str>,
    extra: &[(&str, &str)],
    keep: bool,
) -> bool {
    let body = error::body(status, msg, code);
    conn.respond(status, "application/json", extra, &body, keep).await.is_ok() && keep
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn admin_paths() {
        assert!(is_admin_path("/admin"));
        assert!(is_admin_path("/admin/"));
        assert!(is_admin_path(NODES_PATH));
        assert!(is_admin_path("/admin/v2/whatever"));
        assert!(!is_admin_path("/administrator"));
        assert!(!is_admin_path("/v1/admin"));
    }
}
