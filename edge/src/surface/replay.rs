//! Recovery before commit: a chat or Responses request whose first attempt
//! failed retryably (a stall, a provider it could not reach, a node that
//! went away) before any byte reached the client is admitted once more,
//! avoiding the provider that failed. After the first byte, never: the
//! client gets the typed error ending instead.
//!
//! What a replay needs (the body, the head or for a stream only its
//! forwarded headers, the lease class, the provider to avoid) is kept in
//! the [`ReplayChance`] only until the answer commits; a committed stream
//! holds none of it.
//!
//! A Responses API WebSocket's turn keeps its message for the whole turn
//! and answers over the socket, not with an HTTP answer: it makes the same
//! decisions with [`eligible`] and [`second_attempt`], and admits and
//! answers the second attempt itself.

use std::rc::Rc;

use bytes::Bytes;
use iop_core::{config::ModelGroup, exec::RunFailure, http::RequestHead, liveness::ProviderHealth, request::Top};

use super::{
    exchange::{self, Admission},
    reply,
    route::Route,
};
use crate::{
    ctx::Ctx,
    pool::{LeaseClass, PoolView, ResourceKey},
    registry::Generation,
    server::Conn,
};

/// Bodies below this are copied out of the connection's read buffer when
/// kept for a replay (the read buffer is 16 KiB; a larger body has a
/// buffer of its own).
pub const COPY_BELOW: usize = 16 * 1024;

/// What a second attempt needs.
pub struct Replay {
    pub(super) head: RequestHead,
    pub(super) top: Top,
    pub(super) bytes: Bytes,
    pub(super) group: std::sync::Arc<ModelGroup>,
    pub(super) class: LeaseClass,
    /// The provider of the failed attempt.
    pub(super) avoid: ResourceKey,
    /// The node connection generation the failed attempt ran on.
    pub(super) avoid_generation: Generation,
}

/// What is kept of a [`Replay`] until the answer commits: the group is
/// looked up again if it is needed, and only the head's forwarded headers
/// stay (a stream holds this until its first byte).
pub struct Kept {
    head: KeptHead,
    /// The client's body (its top-level fields are parsed again on replay).
    bytes: Bytes,
    class: LeaseClass,
    avoid: ResourceKey,
    avoid_generation: Generation,
}

/// A kept request head: whole for a whole answer's request, compact for a
/// stream's (each opening stream holds it until its first byte).
enum KeptHead {
    Whole(RequestHead),
    /// `keep_alive` and the forwarded headers as `name:value\n` lines in
    /// one small buffer (names are tokens, values hold no line break).
    Compact {
        keep_alive: bool,
        block: Bytes,
    },
}

impl KeptHead {
    fn compact(head: &RequestHead) -> Self {
        let mut block = bytes::BytesMut::new();
        for (n, v) in head.headers.iter().filter(|(n, _)| iop_core::tunnel::forwards_request_header(n.as_bytes())) {
            block.extend_from_slice(n.as_bytes());
            block.extend_from_slice(b":");
            block.extend_from_slice(v);
            block.extend_from_slice(b"\n");
        }
        KeptHead::Compact { keep_alive: head.keep_alive, block: block.freeze() }
    }

    fn keep_alive(&self) -> bool {
        match self {
            KeptHead::Whole(h) => h.keep_alive,
            KeptHead::Compact { keep_alive, .. } => *keep_alive,
        }
    }

    /// A head to answer the replay with (its method and target are not
    /// used past admission).
    fn into_head(self) -> RequestHead {
        let (keep_alive, block) = match self {
            KeptHead::Whole(h) => return h,
            KeptHead::Compact { keep_alive, block } => (keep_alive, block),
        };
        let mut headers = Vec::new();
        let mut at = 0;
        for line in block.split(|&b| b == b'\n') {
            let end = at + line.len();
            if let Some(colon) = line.iter().position(|&b| b == b':') {
                if let Some(name) = iop_core::http::HeaderName::from_bytes(block.slice(at..at + colon)) {
                    headers.push((name, block.slice(at + colon + 1..end)));
                }
            }
            at = end + 1;
        }
        RequestHead {
            method: "POST".into(),
            target: String::new(),
            version: 1,
            headers,
            body: iop_core::http::BodyKind::Empty,
            keep_alive,
            expect_continue: false,
        }
    }
}

/// One request's chance at a second attempt.
#[derive(Default)]
pub struct ReplayChance {
    /// Whether the route may be replayed at all (chat and Responses).
    armed: bool,
    replay: Option<Box<Kept>>,
    /// The first attempt's failure, held back from the client (boxed: the
    /// chance lives in the connection's task for a whole stream).
    failed: Option<Box<RunFailure>>,
}

impl ReplayChance {
    /// The chance of a request on `route`: the conversational routes (chat
    /// completions, Responses, Messages: the spec's scope); none for the
    /// others.
    pub fn for_route(route: Route) -> Self {
        Self { armed: route.replayable(), ..Self::default() }
    }

    /// No second attempt (the second attempt itself).
    pub fn none() -> Self {
        Self::default()
    }

    /// Whether the request's parts are to be kept for a replay.
    pub(super) fn armed(&self) -> bool {
        self.armed
    }

    /// Keeps the parts of an armed request.
    pub(super) fn keep(&mut self, replay: Replay) {
        if !self.armed {
            return;
        }
        let Replay { head, top, bytes, group: _, class, avoid, avoid_generation } = replay;
        // Held by each opening stream until its first byte: only what a
        // replay forwards, in one small buffer.
        let head = if top.stream { KeptHead::compact(&head) } else { KeptHead::Whole(head) };
        self.replay = Some(Box::new(Kept { head, bytes, class, avoid, avoid_generation }));
    }

    /// The first byte is about to reach the client: no replay from here.
    pub(super) fn commit(&mut self) {
        self.armed = false;
        self.replay = None;
    }

    /// A failure before any byte: held back for the replay when it is
    /// retryable and a replay is possible (`None` then: the caller writes
    /// nothing); else handed back for the caller to answer with.
    pub(super) fn hold(&mut self, f: RunFailure) -> Option<RunFailure> {
        if !self.armed {
            return Some(f); // not a replayed route, or the second attempt
        }
        if eligible(&f, self.replay.is_some()) {
            self.failed = Some(Box::new(f));
            return None;
        }
        Some(f)
    }

    /// The held failure and the parts to replay with, if the first attempt
    /// ended that way.
    pub fn take(&mut self) -> Option<(Box<Kept>, RunFailure)> {
        let failed = self.failed.take()?;
        Some((self.replay.take()?, *failed))
    }
}

/// Whether a first attempt's failure before commit gets a second attempt:
/// when it is retryable and the request's parts are at hand
/// (`replay_left`). When not, the decision is observed here.
pub(super) fn eligible(f: &RunFailure, replay_left: bool) -> bool {
    if replay_left && f.retryable {
        return true;
    }
    observe("ineligible", if f.retryable { "no_replay_left" } else { "not_retryable" }, None);
    false
}

/// Where the second attempt of a request for `model` on `route` goes after
/// `failed` on `avoid` (on its node connection `avoid_generation`): the
/// model's group as the config has it now (a reload may have changed it),
/// and that group narrowed to the targets to try ([`targets_avoiding`]).
/// `None`, observed: nowhere else to go; the client gets `failed`.
pub(super) fn second_attempt(
    worker: &Ctx,
    route: Route,
    model: &str,
    avoid: &ResourceKey,
    avoid_generation: Generation,
    failed: &RunFailure,
) -> Option<(std::sync::Arc<ModelGroup>, ModelGroup)> {
    let allow_avoided = failed.stall.as_ref().is_some_and(|s| s.health == ProviderHealth::Available);
    let full = worker.config.borrow().model(model).cloned();
    let Some(full) = full.and_then(|g| exchange::serving(worker, &g, route)) else {
        observe("ineligible", "no_alternate", None);
        return None;
    };
    // Asked of the registry, which ends a connection before its runs fail:
    // the pool's view of it may lag on another core.
    let ended = !worker.shared.registry.lock().is_current_ready(&avoid.node, avoid_generation);
    let view = worker.pool.borrow().clone();
    let Some(group) = targets_avoiding(&view, &full, avoid, allow_avoided, ended) else {
        observe("ineligible", "no_alternate", None);
        return None;
    };
    observe("eligible", if allow_avoided { "stalled_provider_available" } else { "alternate" }, None);
    Some((full, group))
}

/// The second attempt could not be admitted: the client gets the first's failure.
pub(super) fn readmission_refused() {
    observe("eligible", "readmission_refused", Some("failed"));
}

/// The second attempt answered the client.
pub(super) fn answered() {
    observe("eligible", "replayed", Some("answered"));
}

/// The targets a replay may use: the live alternates of the avoided
/// provider; failing those, the avoided provider itself only when the
/// stall's probe found it `available` (`allow_avoided`). `None`: nowhere
/// to go.
///
/// The avoidance is about the connection the attempt failed on: when that
/// connection has ended (`avoided_ended`), the avoided provider stays a
/// candidate behind the alternates. It can only serve again as a new
/// connection, which starts with nothing against it, so a replay queued
/// for busy alternates is served by a restarted node at once instead of
/// waiting for the alternates.
pub fn targets_avoiding(
    view: &PoolView,
    group: &ModelGroup,
    avoid: &ResourceKey,
    allow_avoided: bool,
    avoided_ended: bool,
) -> Option<ModelGroup> {
    let key = |t: &iop_core::config::ModelTarget| ResourceKey::of(t);
    let live = |t: &iop_core::config::ModelTarget| view.resources.get(&key(t)).is_some_and(|l| l.live());
    let (avoided, mut alternates): (Vec<_>, Vec<_>) = group.targets.iter().cloned().partition(|t| key(t) == *avoid);
    let chosen = if alternates.iter().any(live) {
        if avoided_ended {
            alternates.extend(avoided);
        }
        alternates
    } else if allow_avoided && avoided.iter().any(live) {
        avoided
    } else {
        return None;
    };
    Some(ModelGroup { targets: chosen, ..group.clone() })
}

/// The spec's `edge_liveness_recovery_observation` (identifiers left out).
fn observe(decision: &'static str, reason: &'static str, result: Option<&'static str>) {
    tracing::info!(decision, reason, result = result.unwrap_or(""), "edge_liveness_recovery_observation");
    match result {
        Some(r) => crate::metrics::recovery_result(r),
        None => crate::metrics::recovery_decision(decision, reason),
    }
}

/// Answers a request whose first attempt failed before commit with `failed`:
/// admitted again avoiding the failed provider, or `failed` itself when
/// there is nowhere else to go. Resolves to whether the connection may be
/// kept.
pub async fn replay(worker: &Rc<Ctx>, conn: &mut Conn, route: Route, r: Kept, failed: RunFailure) -> bool {
    let (keep, d) = (r.head.keep_alive(), route.dialect());
    // It parsed the first time: it parses again.
    let Ok(top) = Top::parse(&r.bytes) else { return reply::failure(&mut conn.responder(), d, &failed, keep).await };
    let Some((full, group)) = second_attempt(worker, route, &top.model, &r.avoid, r.avoid_generation, &failed) else {
        return reply::failure(&mut conn.responder(), d, &failed, keep).await;
    };
    // Least loaded among the others: the preferred target just failed.
    let admitted = match exchange::take_capacity(worker, conn, &group, r.class, None).await {
        None => return false, // the client left while queued
        Some(Ok(a)) => a,
        Some(Err(_)) => {
            readmission_refused();
            return reply::failure(&mut conn.responder(), d, &failed, keep).await;
        }
    };
    let tunnels = exchange::tunnels_to(worker, &admitted, route);
    tracing::debug!(node = %admitted.target.node, provider = %admitted.target.provider, "replaying before commit");
    let a = Admission { top, bytes: r.bytes, permit: None, group: full, admitted, tunnels };
    let mut none = ReplayChance::none();
    let kept = exchange::answer(worker, conn, r.head.into_head(), route, a, &mut none).await;
    answered();
    kept
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use iop_core::exec::{codes, FailureSource};

    #[test]
    fn only_an_armed_request_holds_back_a_retryable_failure() {
        let f = || RunFailure::new(codes::UPSTREAM_CONNECT, 502, FailureSource::Provider, "x");
        let mut none = ReplayChance::for_route(Route::Embeddings);
        assert!(none.hold(f().retryable()).is_some(), "embeddings are not replayed");
        let mut chance = ReplayChance::for_route(Route::Chat);
        // Armed but nothing kept yet (nothing to replay with): answered.
        assert!(chance.hold(f().retryable()).is_some());
        assert!(chance.take().is_none());
    }

    #[test]
    fn a_second_attempt_needs_a_retryable_failure_and_the_parts() {
        let f = || RunFailure::new(codes::UPSTREAM_CONNECT, 502, FailureSource::Provider, "x");
        assert!(eligible(&f().retryable(), true));
        assert!(!eligible(&f(), true), "not retryable");
        assert!(!eligible(&f().retryable(), false), "nothing kept to replay with");
    }

    fn group_and_view(live: &[(&str, bool)]) -> (ModelGroup, PoolView) {
        let mut view = PoolView::default();
        let mut targets = Vec::new();
        for (node, up) in live {
            let load = crate::pool::ResourceLoad::new(1, 0);
            load.online.store(*up, std::sync::atomic::Ordering::Release);
            view.resources.insert(ResourceKey::new(node, "p"), std::sync::Arc::new(load));
            targets.push(iop_core::config::ModelTarget {
                node: (*node).into(),
                provider: "p".into(),
                upstream_model: "u".into(),
            });
        }
        let group = ModelGroup {
            name: "m".into(),
            targets,
            long_context_threshold: None,
            max_waiters: 1,
            queue_timeout: std::time::Duration::from_secs(1),
            strict: false,
        };
        (group, view)
    }

    fn nodes(g: Option<ModelGroup>) -> Vec<String> {
        g.map(|g| g.targets.iter().map(|t| t.node.to_string()).collect()).unwrap_or_default()
    }

    #[test]
    fn a_replay_avoids_the_failed_connection_not_the_provider_for_good() {
        let avoid = ResourceKey::new("n1", "p");
        // n1's connection lives on (another link): only the alternate.
        let (g, view) = group_and_view(&[("n1", true), ("n2", true)]);
        assert_eq!(nodes(targets_avoiding(&view, &g, &avoid, false, false)), ["n2"]);
        // n1's connection ended: n1 stays a candidate behind n2, for when it
        // comes back as a new connection.
        let (g, view) = group_and_view(&[("n1", false), ("n2", true)]);
        assert_eq!(nodes(targets_avoiding(&view, &g, &avoid, false, true)), ["n2", "n1"]);
        // No live alternate: nowhere to go, unless a probe vouched for n1.
        let (g, view) = group_and_view(&[("n1", true), ("n2", false)]);
        assert!(targets_avoiding(&view, &g, &avoid, false, true).is_none());
        assert_eq!(nodes(targets_avoiding(&view, &g, &avoid, true, false)), ["n1"]);
    }

    #[test]
    fn a_compact_head_keeps_the_forwarded_headers() {
        let mut buf = bytes::BytesMut::from(
            &b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Trace: a:b c\r\nContent-Length: 2\r\nOpenAI-Organization: org\r\n\r\n"[..],
        );
        let head = iop_core::http::parse_request_head(&mut buf, &iop_core::http::Limits::default()).unwrap().unwrap();
        let back = KeptHead::compact(&head).into_head();
        let got: Vec<(String, Vec<u8>)> = back.headers.iter().map(|(n, v)| (n.to_string(), v.to_vec())).collect();
        assert_eq!(
            got,
            vec![("x-trace".to_owned(), b"a:b c".to_vec()), ("openai-organization".to_owned(), b"org".to_vec())]
        );
        assert!(back.keep_alive);
    }
}
