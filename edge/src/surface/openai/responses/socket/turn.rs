//! One `response.create` on a Responses API WebSocket: read, admitted like
//! a `POST /v1/responses` (model group, API key, capacity), answered
//! through the tunnel when the provider speaks the Responses API, else
//! translated onto the normalized run ([`super::relay`]). What cannot be served is an `error` event; the socket stays open. The
//! client is heard all along, queueing included ([`super::inbox`]): a close
//! ends the turn and the socket, and drops the stream (cancelled on the
//! node).

use std::{rc::Rc, sync::Arc};

use bytes::Bytes;
use iop_core::{config::ModelGroup, http::RequestHead, request::Top, responses, wire::pb};
use serde_json::{Map, Value};

use super::{
    inbox::{End, Inbox},
    refused::{Refused, Stop},
    relay::{self, Frames},
};
use crate::{
    ctx::Ctx,
    dispatch,
    pool::{keys::KeyState, Admitted, LeaseClass},
    server::Conn,
    surface::{
        api_keys,
        error::clip,
        exchange::{admit_reachable, estimated_tokens, refusal, serving, tunnels_to},
        openai::responses::{normalized::unix_now, stream::ResponsesEncoder, ResponseMeta},
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

/// A message read and ready to send.
struct Prepared {
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
    let access_log = worker.config.borrow().http.access_log;
    conn.exchange.begin(head);
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
fn prepare(text: &[u8], history: Option<&History>) -> Result<Prepared, Refused> {
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
    Ok(Prepared { body, top, asked })
}

/// Reads, admits and answers one message.
async fn turn(
    worker: &Rc<Ctx>,
    conn: &mut Conn,
    head: &RequestHead,
    key: Option<&Arc<KeyState>>,
    text: &[u8],
    history: &mut Option<History>,
    inbox: &mut Inbox,
) -> Result<(), Stop> {
    let p = prepare(text, history.as_ref())?;
    let group = worker.config.borrow().model(&p.top.model).cloned();
    let Some(group) = group else {
        let msg = format!("The model `{}` does not exist", clip(&p.top.model));
        return Err(Refused::new(404, "model_not_found", msg).param("model").into());
    };
    conn.exchange.finish.borrow_mut().model.push_str(&group.name);
    if let Some(k) = key {
        api_keys::check(k, &group.name).map_err(|r| Refused::new(r.status, r.code, r.message))?;
        // Charged the response's tokens, named in its access-log line.
        conn.exchange.api_key = Some(k.clone());
    }
    let Some(group) = serving(worker, &group, Route::Responses) else {
        let msg = format!("the model `{}` has no provider that serves the Responses API", clip(&p.top.model));
        return Err(Refused::new(400, "unsupported_endpoint", msg).into());
    };
    let class = match group.long_context_threshold {
        Some(t) if estimated_tokens(p.body.len()) > u64::from(t) => LeaseClass::Long,
        _ => LeaseClass::Normal,
    };
    let admitted = admit(worker, conn, inbox, &group, class).await?;
    let terminal = attempt(worker, conn, inbox, head, &p, &group, admitted).await?;
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

/// Capacity on `group`, queueing if need be, while the client is heard.
async fn admit(
    worker: &Rc<Ctx>,
    conn: &mut Conn,
    inbox: &mut Inbox,
    group: &ModelGroup,
    class: LeaseClass,
) -> Result<Admitted, Stop> {
    let asked = std::time::Instant::now();
    let write_timeout = worker.config.borrow().http.idle_timeout;
    match inbox.during(conn, admit_reachable(worker, group, class), write_timeout).await? {
        Ok(admitted) => {
            conn.exchange.queue_wait = Some(asked.elapsed());
            Ok(admitted)
        }
        Err(e) => {
            let (status, code) = refusal(&e);
            Err(Refused::new(status, code, e.to_string()).into())
        }
    }
}

/// Answers `p` on `admitted`'s provider: through the tunnel when it speaks
/// the Responses API, else translated; the terminal event's `response`,
/// when one came.
async fn attempt(
    worker: &Rc<Ctx>,
    conn: &mut Conn,
    inbox: &mut Inbox,
    head: &RequestHead,
    p: &Prepared,
    group: &ModelGroup,
    admitted: Admitted,
) -> Result<Option<Value>, Stop> {
    let target = admitted.target.upstream_model.clone();
    let resource = admitted.lease.key().clone();
    let write_timeout = worker.config.borrow().http.idle_timeout;
    let mut frames = Frames::new(inbox.limits().max_message_bytes);
    if tunnels_to(worker, &admitted, Route::Responses) {
        let req = pb::ProviderTunnelRequest {
            method: "POST".into(),
            path: Route::Responses.provider_path().into(),
            body: p.top.with_model(&p.body, &target),
            principal: conn.exchange.api_key.as_ref().map(|k| k.entry.name.clone()).unwrap_or_default(),
            ..Default::default()
        };
        let headers = |id: &str| {
            let mut h = crate::surface::tunnel::forwarded_headers(head, id);
            h.retain(|h| !h.name.starts_with(b"sec-websocket"));
            h
        };
        let mut stream = dispatch::submit_tunnel(worker, &group.name, admitted, req, headers)
            .map_err(|e| Refused::new(503, "no_ready_node", e.to_string()))?;
        stream.report_to(&conn.exchange.finish, &resource);
        relay::tunnel(conn, inbox, &mut stream, &mut frames, write_timeout).await?;
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
        relay::run(conn, inbox, &mut run, enc, &mut frames, write_timeout).await?;
    }
    Ok(frames.terminal.take())
}
