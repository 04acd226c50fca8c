//! The OpenAI-compatible surface: `/v1/chat/completions`,
//! `/v1/completions`, `/v1/embeddings`, `/v1/responses`, the model list,
//! and OpenAI-shaped errors.
//!
//! Every model route goes the same way up to admission: the top-level
//! fields are read ([`iop_core::request::Top`]), the model group looked up,
//! capacity taken (or queued for). Then the selected provider's kind
//! decides, never the client: OpenAI-compatible providers get the request
//! through the provider tunnel (`tunnel`, byte for byte, its body written
//! by [`relay`]); the others run it on the normalized path ([`chat`]),
//! which serves chat completions and embeddings.

mod aggregate;
pub mod chat;
pub mod chunk;
pub mod error;
pub mod models;
pub mod relay;
pub mod replay;
mod reply;
mod tunnel;

use std::{future::Future, pin::Pin, rc::Rc, sync::Arc};

use iop_core::{
    config::{ModelGroup, ModelTarget},
    http::RequestHead,
};

use replay::Replay;
pub use replay::ReplayChance;

use crate::{
    ctx::Ctx,
    pool::{self, AdmitError, Admitted, LeaseClass},
    server::{with_disconnect_watch, Body, Conn, STREAM_WATCH},
};

/// A model route of the surface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// `POST /v1/chat/completions`.
    Chat,
    /// `POST /v1/completions`.
    Completions,
    /// `POST /v1/embeddings`.
    Embeddings,
    /// `POST /v1/responses`.
    Responses,
}

impl Route {
    /// The route serving `path`.
    pub fn from_path(path: &str) -> Option<Route> {
        Some(match path {
            "/v1/chat/completions" => Route::Chat,
            "/v1/completions" => Route::Completions,
            "/v1/embeddings" => Route::Embeddings,
            "/v1/responses" => Route::Responses,
            _ => return None,
        })
    }

    /// The path under an OpenAI-compatible provider's base URL.
    pub fn provider_path(self) -> &'static str {
        match self {
            Route::Chat => "/chat/completions",
            Route::Completions => "/completions",
            Route::Embeddings => "/embeddings",
            Route::Responses => "/responses",
        }
    }

    /// Whether a provider of `kind` serves this route: OpenAI-compatible
    /// ones every route (through the tunnel); the others (normalized) chat
    /// and embeddings.
    fn served_by(self, kind: &iop_core::config::ProviderKind) -> bool {
        kind.is_openai_compatible()
            || match self {
                Route::Chat | Route::Embeddings => true,
                Route::Completions | Route::Responses => false,
            }
    }
}

/// An admitted request, ready to be answered.
pub struct Admission {
    top: iop_core::request::Top,
    bytes: bytes::Bytes,
    permit: Option<crate::server::BodyPermit>,
    group: Arc<ModelGroup>,
    admitted: pool::Admitted,
    tunnels: bool,
}

/// The answer to an admitted request: it is sent to its node before this
/// returns, and the future holds only what answering needs: the request's
/// parts (head, parsed request, body, group) end here, or what a replay
/// needs of them stays in `chance` until the answer commits, so an open
/// stream keeps none of them.
pub fn answer<'a>(
    worker: &Rc<Ctx>,
    conn: &'a mut Conn,
    head: RequestHead,
    route: Route,
    a: Admission,
    chance: &'a mut ReplayChance,
) -> Pin<Box<dyn Future<Output = bool> + 'a>> {
    let Admission { top, mut bytes, permit, group, admitted, tunnels } = a;
    if chance.armed() && top.stream && bytes.len() < replay::COPY_BELOW {
        // Kept until a stream's first byte: a small body is a slice of the
        // connection's read buffer, which it would pin all that time (with
        // many streams opening at once, a buffer each). A whole answer's
        // request keeps it: its connection has nothing else to read.
        bytes = bytes::Bytes::copy_from_slice(&bytes);
    }
    let parts = Replay {
        head,
        top,
        bytes,
        group,
        class: admitted.lease.class(),
        avoid: admitted.lease.key().clone(),
        avoid_generation: crate::dispatch::generation_of(worker, &admitted),
    };
    // Boxed apart: a tunnel's answer is much smaller than a normalized one.
    if tunnels {
        Box::pin(tunnel::run(worker, conn, route, parts, permit, admitted, chance))
    } else {
        Box::pin(chat::normalized(worker, conn, route, parts, permit, admitted, chance))
    }
}

/// Reads, routes and admits one request on a model route. `Err` holds
/// whether the connection may be kept after the error it answered.
pub async fn admit(
    worker: &Rc<Ctx>,
    conn: &mut Conn,
    head: &RequestHead,
    body: Body,
    route: Route,
    key: Option<std::sync::Arc<crate::pool::keys::KeyState>>,
) -> Result<Admission, bool> {
    let keep = head.keep_alive;
    // The body's share of the core's budget is held until the request is
    // handed to its node (queueing included).
    let (bytes, permit) = body.into_parts();
    let top = match iop_core::request::Top::parse(&bytes) {
        Ok(t) => t,
        Err(msg) => return Err(reply::error(&mut conn.responder(), 400, &msg, Some("invalid_request"), keep).await),
    };
    let group = worker.config.borrow().model(&top.model).cloned();
    let Some(group) = group else {
        tracing::debug!(model_len = top.model.len(), "unknown model requested");
        let msg = format!("The model `{}` does not exist", error::clip(&top.model));
        return Err(reply::error(&mut conn.responder(), 404, &msg, Some("model_not_found"), keep).await);
    };
    conn.exchange.finish.borrow_mut().model.push_str(&group.name);
    if let Some(k) = key {
        super::api_keys::admit(conn, head, &k, &group.name, keep).await?;
        conn.exchange.api_key = Some(k);
    }
    let Some(group) = serving(worker, &group, route) else {
        let msg = format!("the model `{}` has no provider that serves {}", error::clip(&top.model), head.path());
        return Err(reply::error(&mut conn.responder(), 400, &msg, Some("unsupported_endpoint"), keep).await);
    };
    // Estimated prompt size: the body's bytes / 4 (before any tokenizer).
    let class = match group.long_context_threshold {
        Some(t) if (bytes.len() as u64).div_ceil(4) > u64::from(t) => LeaseClass::Long,
        _ => LeaseClass::Normal,
    };
    let admitted = match take_capacity(worker, conn, &group, class).await {
        None => return Err(false), // client left while queued; the wait guard left the queue
        Some(Ok(a)) => a,
        Some(Err(e)) => {
            let (status, code) = match e {
                AdmitError::QueueFull(_) => (429, "queue_full"),
                AdmitError::Timeout(_) => (503, "queue_timeout"),
                AdmitError::Unavailable(_) => (503, "no_ready_node"),
            };
            return Err(reply::error(&mut conn.responder(), status, &e.to_string(), Some(code), keep).await);
        }
    };
    let tunnels = tunnels_to(worker, &admitted);
    Ok(Admission { top, bytes, permit, group, admitted, tunnels })
}

/// Takes capacity on `group` for a request of `class`, queueing if need
/// be, while watching the client; `None` when it left.
async fn take_capacity(
    worker: &Rc<Ctx>,
    conn: &mut Conn,
    group: &ModelGroup,
    class: LeaseClass,
) -> Option<Result<Admitted, AdmitError>> {
    let mut regrants = 0;
    let asked = std::time::Instant::now();
    loop {
        let admitted = {
            let Conn { rd, buf, .. } = &mut *conn;
            with_disconnect_watch::<STREAM_WATCH, _, _>(rd, buf, std::pin::pin!(pool::admit(worker, group, class)))
                .await?
        };
        let admitted = match admitted {
            Ok(a) => a,
            Err(e) => return Some(Err(e)),
        };
        // Granted through links that closed meanwhile (the node is going
        // away): the lease goes back and the request asks again, so a
        // queued client is not failed by a node it never reached. The
        // node's fence is on its way to every core; a few turns suffice.
        if regrants < MAX_REGRANTS && !crate::dispatch::reachable(worker, &admitted) {
            regrants += 1;
            drop(admitted);
            iop_core::rt::yield_now().await;
            continue;
        }
        conn.exchange.queue_wait = Some(asked.elapsed());
        return Some(Ok(admitted));
    }
}

/// Whether `admitted`'s provider is OpenAI-compatible (the tunnel serves it).
fn tunnels_to(worker: &Ctx, admitted: &Admitted) -> bool {
    worker
        .config
        .borrow()
        .provider(&admitted.target.node, &admitted.target.provider)
        .is_some_and(|p| p.kind.is_openai_compatible())
}

/// Grants taken again, at most, when one came through links already closed.
const MAX_REGRANTS: u32 = 8;

/// The group with only the targets that can serve `route` (the group
/// itself, not a copy, when all can); `None` when none can.
fn serving(worker: &Ctx, group: &Arc<ModelGroup>, route: Route) -> Option<Arc<ModelGroup>> {
    let config = worker.config.borrow();
    let serves = |t: &ModelTarget| config.provider(&t.node, &t.provider).is_some_and(|p| route.served_by(&p.kind));
    if group.targets.iter().all(serves) {
        return Some(group.clone());
    }
    let targets: Vec<_> = group.targets.iter().filter(|t| serves(t)).cloned().collect();
    (!targets.is_empty()).then(|| Arc::new(ModelGroup { targets, ..(**group).clone() }))
}
