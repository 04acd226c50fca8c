//! Client-facing API surfaces and the request router.

pub mod admin;
pub mod openai;

use std::rc::Rc;

use bytes::Bytes;
use iop_core::http::RequestHead;

use crate::{server::Conn, worker::Worker};

/// Routes one request; returns whether the connection may be kept open.
pub async fn handle(worker: &Rc<Worker>, conn: &mut Conn, head: &RequestHead, body: Bytes) -> bool {
    let keep = head.keep_alive;
    let path = head.path();
    let method = head.method.as_str();
    let result = match (method, path) {
        ("POST", "/v1/chat/completions") => return openai::chat::handle(worker, conn, head, body).await,
        (_, p) if admin::is_admin_path(p) => return admin::handle(worker, conn, head, body).await,
        ("GET", "/v1/models") => {
            let body = openai::models::list(&worker.config.borrow());
            conn.respond(200, "application/json", &[], &body, keep).await
        }
        ("GET", "/healthz") => {
            let ready = worker.routes.borrow().len();
            // Draining: tell load balancers to stop sending before the edge goes away.
            let draining = worker.shared.draining.load(std::sync::atomic::Ordering::Acquire);
            let (status, label) = if draining { (503, "draining") } else { (200, "ok") };
            // `worker` names the core that answered: shows connections spread over cores.
            let body = format!("{{\"status\":\"{label}\",\"nodes_ready\":{ready},\"worker\":{}}}", worker.index);
            conn.respond(status, "application/json", &[], body.as_bytes(), keep).await
        }
        (_, "/v1/chat/completions" | "/v1/models" | "/healthz") => {
            let body = openai::error::body(405, &format!("method {method} is not allowed on {path}"), None);
            conn.respond(405, "application/json", &[], &body, keep).await
        }
        _ => {
            let body = openai::error::body(404, &format!("no route for {method} {path}"), Some("not_found"));
            conn.respond(404, "application/json", &[], &body, keep).await
        }
    };
    result.is_ok() && keep
}
