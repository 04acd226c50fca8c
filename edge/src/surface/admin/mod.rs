//! The admin API under `/admin`: a live snapshot of nodes, providers and
//! model queues, and a stream of lifecycle events.
//!
//! Every request must carry `Authorization: Bearer <admin_token>`. Without
//! an `admin_token` in the config the whole API answers 404.
//!
//! - `GET /admin/v1/nodes`: [`snapshot::snapshot`] as JSON.
//! - `GET /admin/v1/events`: SSE of [`crate::events::EdgeEvent`]s ([`events`]).

pub mod auth;
pub mod events;
pub mod snapshot;

use std::rc::Rc;

use bytes::Bytes;
use iop_core::http::RequestHead;

use crate::{server::Conn, surface::openai::error, worker::Worker};

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

/// Handles one `/admin` request; returns whether the connection may be kept.
pub async fn handle(worker: &Rc<Worker>, conn: &mut Conn, head: &RequestHead, _body: Bytes) -> bool {
    let keep = head.keep_alive;
    let config = worker.config.borrow().clone();
    match auth::authorize(config.admin_token.as_ref(), head.header("authorization")) {
        Auth::Granted => {}
        Auth::Disabled => return respond_error(conn, 404, DISABLED_MESSAGE, Some("admin_disabled"), &[], keep).await,
        Auth::Denied => {
            // Never log the presented credential.
            tracing::debug!(path = head.path(), "admin request without a valid token");
            let challenge = [("www-authenticate", "Bearer")];
            let msg = "a valid admin token is required: send `Authorization: Bearer <admin_token>`";
            return respond_error(conn, 401, msg, Some("invalid_admin_token"), &challenge, keep).await;
        }
    }
    let path = head.path();
    let method = head.method.as_str();
    match (method, path) {
        ("GET", NODES_PATH) => {
            let statuses = worker.shared.registry.lock().statuses(&config);
            let pool = worker.pool.borrow().clone();
            let body = serde_json::to_vec(&snapshot::snapshot(&config, &statuses, &pool)).unwrap_or_default();
            let headers = [("cache-control", "no-store")];
            conn.respond(200, "application/json", &headers, &body, keep).await.is_ok() && keep
        }
        ("GET", EVENTS_PATH) => events::stream(worker, conn).await,
        (_, NODES_PATH | EVENTS_PATH) => {
            let msg = format!("method {method} is not allowed on {path}");
            respond_error(conn, 405, &msg, None, &[("allow", "GET")], keep).await
        }
        _ => {
            let msg = format!("no admin route for {method} {path}");
            respond_error(conn, 404, &msg, Some("not_found"), &[], keep).await
        }
    }
}

async fn respond_error(
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
