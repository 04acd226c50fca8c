//! Client-facing API surfaces and the request router.

pub mod admin;
pub mod anthropic;
mod api_keys;
pub mod encode;
mod failures;
mod health;
mod metrics;
pub mod openai;

use std::rc::Rc;

use iop_core::http::RequestHead;

use crate::{
    ctx::Ctx,
    server::{self, Body, Conn},
};

/// The surfaces as the HTTP server's handler.
#[derive(Debug, Clone, Copy, Default)]
pub struct Router;

impl server::Handler for Router {
    fn handle<'a>(
        &'a self,
        worker: &'a Rc<Ctx>,
        conn: &'a mut Conn,
        head: RequestHead,
        body: Body,
    ) -> impl std::future::Future<Output = bool> + 'a {
        handle(worker, conn, head, body)
    }

    fn refusal_body(&self, status: u16, message: &str, code: &str) -> Vec<u8> {
        openai::error::body(status, message, Some(code))
    }
}

/// `Allow` of the read-only routes.
pub const ALLOW_GET: (&str, &str) = ("allow", "GET, HEAD");

/// Routes one request; returns whether the connection may be kept open.
/// `HEAD` is served as `GET` with the body left out (`Conn::head_only`).
/// The head is owned so it can go once the request is on its way: an open
/// stream does not keep it.
pub async fn handle(worker: &Rc<Ctx>, conn: &mut Conn, head: RequestHead, body: Body) -> bool {
    let keep = head.keep_alive;
    let route = openai::Route::from_path(head.path());
    let key = if head.path().starts_with("/v1/") {
        match api_keys::authenticate(worker, conn, &head, keep).await {
            Ok(k) => k,
            Err(kept) => return kept,
        }
    } else {
        None
    };
    if let (Some(route), "POST") = (route, head.method.as_str()) {
        // Boxed: an idle keep-alive connection's task holds only its
        // reading state, a busy one that of its stage (admission, then the
        // answer), never the largest of all.
        let admission = match Box::pin(openai::admit(worker, conn, &head, body, route, key)).await {
            Ok(a) => a,
            Err(keep) => return keep,
        };
        let mut chance = openai::ReplayChance::for_route(route);
        let kept = openai::answer(worker, conn, head, route, admission, &mut chance).await;
        // Failed before any byte reached the client: once more, elsewhere.
        return match chance.take() {
            Some((parts, failed)) => Box::pin(openai::replay::replay(worker, conn, route, *parts, failed)).await,
            None => kept,
        };
    }
    // Boxed: the other routes' states stay out of every connection's task
    // (an open stream's included).
    Box::pin(other(worker, conn, head, body, route.is_some(), key)).await
}

/// The routes other than a model's `POST`: admin, models, health, metrics
/// and the errors for everything else.
async fn other(
    worker: &Rc<Ctx>,
    conn: &mut Conn,
    head: RequestHead,
    body: Body,
    model_route: bool,
    key: Option<std::sync::Arc<crate::pool::keys::KeyState>>,
) -> bool {
    let keep = head.keep_alive;
    let path = head.path();
    let method = if head.method == "HEAD" { "GET" } else { head.method.as_str() };
    let result = match (method, path) {
        (_, p) if admin::is_admin_path(p) => return admin::handle(worker, conn, &head, body).await,
        ("GET", "/v1/models") => {
            let body = openai::models::list(&worker.config.borrow(), key.as_deref());
            conn.respond(200, "application/json", &[], &body, keep).await
        }
        ("GET", "/healthz") => {
            let (status, body) = health::Health::of(worker).liveness();
            conn.respond(status, "application/json", &[], body.as_bytes(), keep).await
        }
        ("GET", "/metrics") => return metrics::scrape(worker, conn, &head, keep).await,
        ("GET", "/readyz") => {
            let (status, body) = health::Health::of(worker).readiness();
            conn.respond(status, "application/json", &[], body.as_bytes(), keep).await
        }
        (_, _) if model_route => method_not_allowed(conn, &head, ("allow", "POST"), keep).await,
        (_, "/v1/models" | "/healthz" | "/readyz" | "/metrics") => {
            method_not_allowed(conn, &head, ALLOW_GET, keep).await
        }
        _ => {
            let msg = format!("no route for {} {}", openai::error::clip(&head.method), openai::error::clip(path));
            let body = openai::error::body(404, &msg, Some("not_found"));
            conn.respond(404, "application/json", &[], &body, keep).await
        }
    };
    result.is_ok() && keep
}

/// 405 naming the allowed methods (RFC 9110 §15.5.6 requires `Allow`).
pub async fn method_not_allowed(
    conn: &mut Conn,
    head: &RequestHead,
    allow: (&str, &str),
    keep: bool,
) -> std::io::Result<()> {
    let msg = format!(
        "method {} is not allowed on {}; allowed: {}",
        openai::error::clip(&head.method),
        openai::error::clip(head.path()),
        allow.1
    );
    let body = openai::error::body(405, &msg, Some("method_not_allowed"));
    conn.respond(405, "application/json", &[allow], &body, keep).await
}
