//! The dialect-neutral exchange of a model route: the request's top-level
//! fields read, its model group looked up and narrowed to the targets that
//! serve the route, capacity taken (or queued for) while the client is
//! watched; then the answer, through the tunnel when the chosen provider
//! speaks the route itself, else on the normalized run rendered by the
//! route's dialect; and a replay elsewhere when the first attempt failed
//! before any byte reached the client ([`super::replay`]).

use std::{future::Future, pin::Pin, rc::Rc, sync::Arc};

use iop_core::{
    config::{ModelGroup, ModelTarget},
    http::RequestHead,
};

use super::{
    error::clip,
    replay::{self, Replay, ReplayChance},
    reply,
    route::Route,
};
use crate::{
    ctx::Ctx,
    pool::{self, AdmitError, Admitted, LeaseClass},
    server::{with_disconnect_watch, Body, BodyPermit, Conn, STREAM_WATCH},
};

/// An admitted request, ready to be answered.
pub struct Admission {
    pub(super) top: iop_core::request::Top,
    pub(super) bytes: bytes::Bytes,
    pub(super) permit: Option<BodyPermit>,
    pub(super) group: Arc<ModelGroup>,
    pub(super) admitted: pool::Admitted,
    /// The chosen provider speaks the route itself.
    pub(super) tunnels: bool,
}

/// Admits, answers and (before any byte reached the client) replays one
/// request on a model route; resolves to whether the connection may be
/// kept.
#[allow(clippy::manual_async_fn)]
pub fn run<'a>(
    worker: &'a Rc<Ctx>,
    conn: &'a mut Conn,
    head: RequestHead,
    body: Body,
    route: Route,
    key: Option<Arc<pool::keys::KeyState>>,
) -> impl Future<Output = bool> + 'a {
    // An async block, not an async fn: an async fn's state holds each
    // argument twice (as given and as its local), a stream's all its life.
    async move {
        // Boxed: an idle keep-alive connection's task holds only its reading
        // state, a busy one that of its stage (admission, then the answer),
        // never the largest of all.
        let admission = match Box::pin(admit(worker, conn, &head, body, route, key)).await {
            Ok(a) => a,
            Err(keep) => return keep,
        };
        let mut chance = ReplayChance::for_route(route);
        let kept = answer(worker, conn, head, route, admission, &mut chance).await;
        // Failed before any byte reached the client: once more, elsewhere.
        match chance.take() {
            Some((parts, failed)) => Box::pin(replay::replay(worker, conn, route, *parts, failed)).await,
            None => kept,
        }
    }
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
    match (tunnels, route) {
        (true, _) => Box::pin(super::tunnel::run(worker, conn, route, parts, permit, admitted, chance)),
        // Counted by the provider's tokenizer, or estimated.
        (false, Route::CountTokens) => {
            Box::pin(super::anthropic::count::tokenize(worker, conn, parts, permit, admitted))
        }
        (false, Route::Responses) => {
            Box::pin(super::openai::responses::normalized::answer(worker, conn, parts, permit, admitted, chance))
        }
        (false, Route::Messages) => {
            Box::pin(super::anthropic::normalized::answer(worker, conn, parts, permit, admitted, chance))
        }
        (false, _) => Box::pin(super::openai::chat::normalized(worker, conn, route, parts, permit, admitted, chance)),
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
    key: Option<Arc<pool::keys::KeyState>>,
) -> Result<Admission, bool> {
    let (keep, d) = (head.keep_alive, route.dialect());
    // The body's share of the core's budget is held until the request is
    // handed to its node (queueing included).
    let (bytes, permit) = body.into_parts();
    // A request the edge may translate keeps its fields' places: the
    // translation then reads them without walking the body again.
    let parse = match route {
        Route::Messages | Route::Responses => iop_core::request::Top::parse_keeping,
        _ => iop_core::request::Top::parse,
    };
    let top = match parse(&bytes) {
        Ok(t) => t,
        Err(msg) => return Err(reply::error(&mut conn.responder(), d, 400, &msg, "invalid_request", keep).await),
    };
    if route == Route::Messages {
        let agent = worker.config.borrow().agents.iter().find(|a| a.name == top.model).cloned();
        if let Some(agent) = agent {
            // The single-request path answers here (an `Err` is "answered").
            drop(permit);
            if let Some(k) = key {
                super::api_keys::admit(worker, conn, head, &k, &agent.name, keep).await?;
                conn.exchange.api_key = Some(k);
            }
            conn.exchange.finish.borrow_mut().model.push_str(&agent.name);
            return Err(Box::pin(super::anthropic::agent::serve(worker, conn, head, &bytes, agent)).await);
        }
    }
    let group = worker.config.borrow().model(&top.model).cloned();
    let Some(group) = group else {
        tracing::debug!(model_len = top.model.len(), "unknown model requested");
        let msg = format!("The model `{}` does not exist", clip(&top.model));
        return Err(reply::error(&mut conn.responder(), d, 404, &msg, "model_not_found", keep).await);
    };
    conn.exchange.finish.borrow_mut().model.push_str(&group.name);
    if let Some(k) = key {
        super::api_keys::admit(worker, conn, head, &k, &group.name, keep).await?;
        conn.exchange.api_key = Some(k);
    }
    let Some(group) = serving(worker, &group, route) else {
        if route == Route::CountTokens {
            return Err(super::anthropic::count::estimate(conn, &bytes, keep).await);
        }
        let msg = format!("the model `{}` has no provider that serves {}", clip(&top.model), head.path());
        return Err(reply::error(&mut conn.responder(), d, 400, &msg, "unsupported_endpoint", keep).await);
    };
    let class = lease_class(&group, bytes.len());
    let key = super::affinity::for_group(worker, &group, head, &bytes, &top.affinity);
    let admitted = match take_capacity(worker, conn, &group, class, key).await {
        None => return Err(false), // client left while queued; the wait guard left the queue
        Some(Ok(a)) => a,
        Some(Err(e)) => {
            let (status, code) = refusal(&e);
            return Err(reply::error(&mut conn.responder(), d, status, &e.to_string(), code, keep).await);
        }
    };
    let tunnels = tunnels_to(worker, &admitted, route);
    Ok(Admission { top, bytes, permit, group, admitted, tunnels })
}

/// The lease class of a request with a body of `body_bytes` on `group`:
/// long past the group's `long_context_threshold`, by the estimated
/// prompt size (before any tokenizer saw it).
pub(super) fn lease_class(group: &ModelGroup, body_bytes: usize) -> LeaseClass {
    match group.long_context_threshold {
        Some(t) if estimated_tokens(body_bytes) > u64::from(t) => LeaseClass::Long,
        _ => LeaseClass::Normal,
    }
}

/// A prompt's size in tokens, estimated from its body's bytes before any
/// tokenizer saw it: a token is about four bytes of text.
pub fn estimated_tokens(body_bytes: usize) -> u64 {
    (body_bytes as u64).div_ceil(4)
}

/// Takes capacity on `group` for a request of `class` (with its affinity
/// `key`, if any), queueing if need be, while watching the client; `None`
/// when it left.
pub(super) async fn take_capacity(
    worker: &Rc<Ctx>,
    conn: &mut Conn,
    group: &ModelGroup,
    class: LeaseClass,
    key: Option<pool::AffinityKey>,
) -> Option<Result<Admitted, AdmitError>> {
    let asked = std::time::Instant::now();
    let admitted = {
        let Conn { rd, buf, .. } = &mut *conn;
        with_disconnect_watch::<STREAM_WATCH, _, _>(
            rd,
            buf,
            std::pin::pin!(crate::dispatch::admit_reachable(worker, group, class, key)),
        )
        .await?
    };
    if let Ok(a) = &admitted {
        conn.exchange.queue_wait = Some(asked.elapsed());
        conn.exchange.affinity = (key, a.affinity);
    }
    Some(admitted)
}

/// The status and error code a refused admission is answered with.
pub(super) fn refusal(e: &AdmitError) -> (u16, &'static str) {
    match e {
        AdmitError::QueueFull(_) => (429, "queue_full"),
        AdmitError::Timeout(_) => (503, "queue_timeout"),
        AdmitError::Unavailable(_) => (503, "no_ready_node"),
    }
}

/// Whether `admitted`'s provider speaks `route` itself (the tunnel serves it).
pub(super) fn tunnels_to(worker: &Ctx, admitted: &Admitted, route: Route) -> bool {
    worker
        .config
        .borrow()
        .provider(&admitted.target.node, &admitted.target.provider)
        .is_some_and(|p| route.native_on(p))
}

/// The group with only the targets that can serve `route` (the group
/// itself, not a copy, when all can); `None` when none can.
pub(super) fn serving(worker: &Ctx, group: &Arc<ModelGroup>, route: Route) -> Option<Arc<ModelGroup>> {
    let config = worker.config.borrow();
    let serves = |t: &ModelTarget| config.provider(&t.node, &t.provider).is_some_and(|p| route.served_by(p));
    if group.targets.iter().all(serves) {
        return Some(group.clone());
    }
    let targets: Vec<_> = group.targets.iter().filter(|t| serves(t)).cloned().collect();
    (!targets.is_empty()).then(|| Arc::new(ModelGroup { targets, ..(**group).clone() }))
}
