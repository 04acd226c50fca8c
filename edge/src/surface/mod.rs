//! Client-facing API surfaces and the request router.

pub mod admin;
mod affinity;
pub mod anthropic;
pub(crate) mod api_keys;
pub mod dialect;
pub mod encode;
pub mod error;
pub mod exchange;
mod failures;
mod health;
mod metrics;
pub mod models;
pub mod openai;
pub mod relay;
pub mod replay;
mod reply;
pub mod route;
mod translated;
mod tunnel;
pub mod write;

use dialect::Dialect;
use route::Route;

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
        // Refused before its head was read whole: no dialect to tell.
        Dialect::OpenAi.error_body(status, message, code)
    }
}

/// `Allow` of the read-only routes.
pub const ALLOW_GET: (&str, &str) = ("allow", "GET, HEAD");

/// Routes one request; returns whether the connection may be kept open.
/// `HEAD` is served as `GET` with the body left out (`Conn::head_only`).
/// The head is owned so it can go once the request is on its way: an open
/// stream does not keep it.
#[allow(clippy::manual_async_fn)]
pub fn handle<'a>(
    worker: &'a Rc<Ctx>,
    conn: &'a mut Conn,
    head: RequestHead,
    body: Body,
) -> impl std::future::Future<Output = bool> + 'a {
    // An async block, not an async fn: an async fn's state holds each
    // argument twice (as given and as its local), a stream's all its life.
    async move {
        let keep = head.keep_alive;
        let route = Route::from_path(head.path());
        let key = if head.path().starts_with("/v1/") {
            match api_keys::authenticate(worker, conn, &head, keep).await {
                Ok(k) => k,
                Err(kept) => return kept,
            }
        } else {
            None
        };
        if route == Some(Route::Responses) && head.method == "GET" && openai::responses::socket::wants_upgrade(&head) {
            return Box::pin(openai::responses::socket::serve(worker, conn, head, key)).await;
        }
        if let (Some(route), "POST") = (route, head.method.as_str()) {
            conn.exchange.set_surface(route.label());
            return exchange::run(worker, conn, head, body, route, key).await;
        }
        // Boxed: the other routes' states stay out of every connection's task
        // (an open stream's included).
        Box::pin(other(worker, conn, head, body, route.is_some(), key)).await
    }
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
            let body = models::list(Dialect::of(&head), worker, &worker.config.borrow(), key.as_deref());
            conn.respond(200, "application/json", &[], &body, keep).await
        }
        ("GET", p) if p.starts_with("/v1/models/") => {
            let (d, id) = (Dialect::of(&head), &p["/v1/models/".len()..]);
            let found = models::one(d, worker, &worker.config.borrow(), key.as_deref(), id);
            match found {
                Some(body) => conn.respond(200, "application/json", &[], &body, keep).await,
                None => {
                    let msg = format!("The model `{}` does not exist", error::clip(id));
                    let body = d.error_body(404, &msg, "model_not_found");
                    conn.respond(404, "application/json", &[], &body, keep).await
                }
            }
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
        (_, p) if p.starts_with("/v1/models/") => method_not_allowed(conn, &head, ALLOW_GET, keep).await,
        _ => {
            let msg = format!("no route for {} {}", error::clip(&head.method), error::clip(path));
            let body = Dialect::of(&head).error_body(404, &msg, "not_found");
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
        error::clip(&head.method),
        error::clip(head.path()),
        allow.1
    );
    let body = Dialect::of(head).error_body(405, &msg, "method_not_allowed");
    conn.respond(405, "application/json", &[allow], &body, keep).await
}
