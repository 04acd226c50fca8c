//! One `response.create` on a Responses API WebSocket: read, admitted like
//! a `POST /v1/responses` (model group, API key, capacity), answered
//! through the tunnel when the provider speaks the Responses API, else
//! translated onto the normalized run ([`super::relay`]). An attempt that
//! fails retryably before the response's first frame (a provider it could
//! not reach, a stall, a node that went away) is followed by one more on
//! another provider, as a `POST` is ([`crate::surface::replay`]'s rules).
//! What cannot be served is an `error` event; the socket stays open. The
//! client is heard all along, queueing included ([`super::inbox`]): a close
//! ends the turn and the socket, and drops the stream (cancelled on the
//! node).

use std::{rc::Rc, sync::Arc};

use bytes::Bytes;
use iop_core::{config::ModelGroup, exec::RunFailure, http::RequestHead, request::Top, responses, wire::pb};
use serde_json::{Map, Value};

use super::{
    inbox::{End, Inbox},
    refused::{Refused, Stop},
    relay::{self, Frames, Relayed},
};
use crate::{
    ctx::Ctx,
    dispatch,
    pool::{keys::KeyState, Admitted, LeaseClass, ResourceKey},
    registry::Generation,
    server::Conn,
    surface::{
        api_keys,
        error::clip,
        exchange::{lease_class, refusal, serving, tunnels_to},
        openai::responses::{normalized::unix_now, stream::ResponsesEncoder, ResponseMeta},
        replay,
        route::Route,
        translated,
    },
};

/// The socket's last response, kept so the next `response.create` can
/// continue it by its id: the items it was asked with and those it gave.
pub struct History {
    id: String,
    items: Vec<Value>,
}

/// A message read and ready to send, once or (replayed) twice.
struct Prepared<'a> {
    /// The socket's upgrade request (its headers go to a tunnel).
    head: &'a RequestHead,
    /// The body the provider gets: the message's fields, `stream: true`,
    /// a continued response's items before the new input.
    body: Bytes,
    top: Top,
    /// The input items asked (for the next continuation).
    asked: Vec<Value>,
}

/// Answers one client message; `Err` when the socket ends.
pub async fn respond(
    worker: &Rc<Ctx>,
    conn: &mut Conn,
    head: &RequestHead,
    key: Option<&Arc<KeyState>>,
    text: &[u8],
    history: &mut Option<History>,
    inbox: &mut Inbox,
) -> Result<(), End> {
    let (access_log, session_header) = {
        let cfg = worker.config.borrow();
        (cfg.http.access_log, cfg.http.session_header.clone())
    };
    conn.exchange.begin(head, session_header.as_deref());
    conn.exchange.set_surface(Route::Responses.label());
    let stopped = match Box::pin(turn(worker, conn, head, key, text, history, inbox)).await {
        Ok(()) => Ok(()),
        Err(Stop::Refused(e)) => {
            conn.exchange.status(e.status);
            e.write_event(&mut conn.out);
            Ok(())
        }
        // The stream, if any, was dropped (cancelled) on the way: its
        // record says so (`outcome=cancelled`), as a POST's client leaving.
        Err(Stop::End(end)) => Err(end),
    };
    conn.exchange.done(access_log);
    stopped
}

/// The client's `input` as a list of items (a string is one user message).
fn items_of(input: Option<Value>) -> Vec<Value> {
    match input {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![serde_json::json!({"role": "user", "content": s})],
        Some(Value::Array(items)) => items,
        Some(other) => vec![other],
    }
}

/// Reads a message into the body to send: a `response.create`, streamed,
/// continuing the socket's last response when it names it.
fn prepare<'a>(head: &'a RequestHead, text: &[u8], history: Option<&History>) -> Result<Prepared<'a>, Refused> {
    let Ok(mut obj) = serde_json::from_slice::<Map<String, Value>>(text) else {
        return Err(Refused::new(400, "invalid_request", "a message must be a JSON object"));
    };
    match obj.remove("type") {
        Some(Value::String(t)) if t == "response.create" => {}
        _ => {
            let msg = "the only client event served is `response.create`";
            return Err(Refused::new(400, "invalid_request", msg).param("type"));
        }
    }
    // Streaming is what the socket does.
    obj.remove("stream");
    if obj.get("background").is_some_and(|b| b != &Value::Bool(false)) {
        let msg = "`background` is not supported over a WebSocket";
        return Err(Refused::new(400, "invalid_request", msg).param("background"));
    }
    if let Some(prev) = obj.remove("previous_response_id") {
        match (prev.as_str(), history) {
            (Some(id), Some(h)) if h.id == id => {
                let mut items = h.items.clone();
                items.extend(items_of(obj.remove("input")));
                obj.insert("input".into(), Value::Array(items));
            }
            _ => {
                let msg = "previous_response_id names no response of this socket: this gateway keeps no responses, \
                           only a WebSocket's last one (send the whole input instead)";
                return Err(Refused::new(400, "previous_response_not_found", msg).param("previous_response_id"));
            }
        }
    }
    let asked = items_of(obj.get("input").cloned());
    obj.insert("stream".into(), Value::Bool(true));
    let body = Bytes::from(serde_json::to_vec(&obj).unwrap_or_default());
    drop(obj);
    let top = Top::parse(&body).map_err(|m| Refused::new(400, "invalid_request", m))?;
    Ok(Prepared { head, body, top, asked })
}

/// Reads, admits and answers one message (twice at most).
async fn turn(
    worker: &Rc<Ctx>,
    conn: &mut Conn,
    head: &RequestHead,
    key: Option<&Arc<KeyState>>,
    text: &[u8],
    history: &mut Option<History>,
    inbox: &mut Inbox,
) -> Result<(), Stop> {
    let p = prepare(head, text, history.as_ref())?;
    let group = worker.config.borrow().model(&p.top.model).cloned();
    let Some(group) = group else {
        let msg = format!("The model `{}` does not exist", clip(&p.top.model));
        return Err(Refused::new(404, "model_not_found", msg).param("model").into());
    };
    conn.exchange.finish.borrow_mut().model.push_str(&group.name);
    if let Some(k) = key {
        api_keys::check(worker, k, &group.name).await.map_err(|r| Refused::new(r.status, r.code, r.message))?;
        // Charged the response's tokens, named in its access-log line.
        conn.exchange.api_key = Some(k.clone());
    }
    let Some(group) = serving(worker, &group, Route::Responses) else {
        let msg = format!("the model `{}` has no provider that serves the Responses API", clip(&p.top.model));
        return Err(Refused::new(400, "unsupported_endpoint", msg).into());
    };
    let class = lease_class(&group, p.body.len());
    let key = crate::surface::affinity::for_group(worker, &group, head, &p.body, &p.top.affinity);
    let admitted = admit(worker, conn, inbox, &group, class, key).await?;
    let terminal = match attempt(worker, conn, inbox, &p, &group, admitted, true).await? {
        Attempted::Answered(terminal) => terminal,
        Attempted::Failed(failed) => Box::pin(replay(worker, conn, inbox, &p, class, failed)).await?,
    };
    // Kept for a continuation: what was asked and what came back, while it
    // fits in one message.
    *history = terminal.and_then(|r| {
        let id = r.get("id")?.as_str()?.to_owned();
        let mut items = p.asked;
        items.extend(r.get("output")?.as_array()?.iter().cloned());
        let size: usize = items.iter().map(|i| i.to_string().len()).sum();
        (size <= inbox.limits().max_message_bytes).then_some(History { id, items })
    });
    Ok(())
}

/// Capacity on `group` (with the affinity `key`, if any), queueing if need
/// be, while the client is heard.
async fn admit(
    worker: &Rc<Ctx>,
    conn: &mut Conn,
    inbox: &mut Inbox,
    group: &ModelGroup,
    class: LeaseClass,
    key: Option<crate::pool::AffinityKey>,
) -> Result<Admitted, Stop> {
    let asked = std::time::Instant::now();
    let write_timeout = worker.config.borrow().http.idle_timeout;
    match inbox.during(conn, crate::dispatch::admit_reachable(worker, group, class, key), write_timeout).await? {
        Ok(admitted) => {
            conn.exchange.queue_wait = Some(asked.elapsed());
            conn.exchange.affinity = (key, admitted.affinity);
            Ok(admitted)
        }
        Err(e) => {
            let (status, code) = refusal(&e);
            Err(Refused::new(status, code, e.to_string()).into())
        }
    }
}

/// How an attempt ended, when not with an `error` event or the socket's end.
enum Attempted {
    /// Relayed to its end; the terminal event's `response`, when one came.
    Answered(Option<Value>),
    /// Failed retryably before its first frame.
    Failed(Failed),
}

/// A first attempt's retryable failure before its first frame.
struct Failed {
    failure: RunFailure,
    /// Its provider, and the node connection it ran over.
    avoid: ResourceKey,
    generation: Generation,
}

/// The second attempt after the first `failed`: admitted to another
/// provider of the model, or the first's failure as the `error` event when
/// there is none.
async fn replay(
    worker: &Rc<Ctx>,
    conn: &mut Conn,
    inbox: &mut Inbox,
    p: &Prepared<'_>,
    class: LeaseClass,
    failed: Failed,
) -> Result<Option<Value>, Stop> {
    let Failed { failure: failed, avoid, generation } = failed;
    let Some((full, group)) =
        replay::second_attempt(worker, Route::Responses, &p.top.model, &avoid, generation, &failed)
    else {
        return Err(Refused::of_failure(&failed).into());
    };
    // Least loaded among the others: the preferred target just failed.
    let admitted = match admit(worker, conn, inbox, &group, class, None).await {
        Ok(a) => a,
        Err(Stop::Refused(_)) => {
            replay::readmission_refused();
            return Err(Refused::of_failure(&failed).into());
        }
        Err(end) => return Err(end),
    };
    tracing::debug!(node = %admitted.target.node, provider = %admitted.target.provider, "replaying before the first frame");
    let second = attempt(worker, conn, inbox, p, &full, admitted, false).await;
    replay::answered();
    match second? {
        Attempted::Answered(terminal) => Ok(terminal),
        // Not replayable: never handed back, but answered if it were.
        Attempted::Failed(f) => Err(Refused::of_failure(&f.failure).into()),
    }
}

/// One attempt at `p` on `admitted`'s provider: through the tunnel when it
/// speaks the Responses API, else translated. `replayable`: a retryable
/// failure before the first frame is handed back instead of answered.
async fn attempt(
    worker: &Rc<Ctx>,
    conn: &mut Conn,
    inbox: &mut Inbox,
    p: &Prepared<'_>,
    group: &ModelGroup,
    admitted: Admitted,
    replayable: bool,
) -> Result<Attempted, Stop> {
    let target = admitted.target.upstream_model.clone();
    let avoid = admitted.lease.key().clone();
    let generation = dispatch::generation_of(worker, &admitted);
    let write_timeout = worker.config.borrow().http.idle_timeout;
    let mut frames = Frames::new(inbox.limits().max_message_bytes);
    let relayed = if tunnels_to(worker, &admitted, Route::Responses) {
        let req = pb::ProviderTunnelRequest {
            method: "POST".into(),
            path: Route::Responses.provider_path().into(),
            body: p.top.with_model(&p.body, &target),
            principal: conn.exchange.api_key.as_ref().map(|k| k.entry.name.clone()).unwrap_or_default(),
            session_id: conn.exchange.session_id().to_owned(),
            ..Default::default()
        };
        let headers = |id: &str| {
            let mut h = crate::surface::tunnel::forwarded_headers(p.head, id);
            h.retain(|h| !h.name.starts_with(b"sec-websocket"));
            h
        };
        let mut stream = dispatch::submit_tunnel(worker, &group.name, admitted, req, headers)
            .map_err(|e| Refused::new(503, "no_ready_node", e.to_string()))?;
        stream.report_to(&conn.exchange.finish, &avoid);
        relay::tunnel(conn, inbox, &mut stream, &mut frames, write_timeout, replayable).await?
    } else {
        let t = responses::to_chat(&p.body, &target, &responses::Options::default())
            .and_then(|t| translated::refuse_if_strict(group, &t.dropped).map(|()| t))
            .map_err(|i| Refused::new(i.status, "invalid_request", i.message.clone()).param(&i.param))?;
        let s = translated::submit(worker, conn, &group.name, admitted, t.body, true, &t.dropped);
        let mut run = s.run.map_err(|e| Refused::new(503, "no_ready_node", e.to_string()))?;
        let meta = ResponseMeta {
            id: ["resp_", run.run_id()].concat(),
            model: target.to_string(),
            created_at: unix_now(),
            echo: t.echo,
            namespaced: t.namespaced,
        };
        let enc = ResponsesEncoder::new(meta);
        relay::run(conn, inbox, &mut run, enc, &mut frames, write_timeout, replayable).await?
    };
    Ok(match relayed {
        Relayed::Done => Attempted::Answered(frames.terminal.take()),
        Relayed::Failed(failure) => Attempted::Failed(Failed { failure, avoid, generation }),
    })
}
