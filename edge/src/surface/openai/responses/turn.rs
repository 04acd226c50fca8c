//! One `response.create` on a Responses API WebSocket: admitted like a
//! `POST /v1/responses` (model group, API key, capacity), answered through
//! the tunnel when the provider speaks the Responses API, else translated
//! onto the normalized run, and streamed as one JSON text frame per event.
//! What cannot be served is an `error` event; the socket stays open.

use std::{rc::Rc, time::Duration};

use bytes::{Bytes, BytesMut};
use iop_core::{
    exec::{ExecEvent, RunFailure},
    http::RequestHead,
    net::WriteHalf,
    responses,
    sse::SseParser,
    tunnel::TunnelItem,
    wire::pb,
    ws::{self, Limits},
};
use monoio::io::AsyncWriteRentExt;
use serde_json::{Map, Value};

use super::{normalized::unix_now, stream::ResponsesEncoder, ResponseMeta};
use crate::{
    ctx::Ctx,
    dispatch::{self, RunStream, TunnelStream},
    pool::{keys::KeyState, AdmitError, LeaseClass},
    server::{with_disconnect_watch, Conn, STREAM_WATCH},
    surface::{
        api_keys,
        encode::EventEncoder,
        error::clip,
        exchange::{estimated_tokens, serving, take_capacity, tunnels_to},
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

/// Events that end a response.
const TERMINAL: [&str; 3] = ["response.completed", "response.incomplete", "response.failed"];

/// Answers one client message; false when the socket must close (the client
/// went away, or stopped reading).
pub async fn respond(
    worker: &Rc<Ctx>,
    conn: &mut Conn,
    head: &RequestHead,
    key: Option<&KeyState>,
    text: &[u8],
    history: &mut Option<History>,
    limits: Limits,
) -> bool {
    let access_log = worker.config.borrow().http.access_log;
    conn.exchange.begin(head);
    conn.exchange.set_surface(Route::Responses.label());
    let open = match Box::pin(turn(worker, conn, head, key, text, history, limits)).await {
        Ok(open) => open,
        Err(e) => {
            conn.exchange.status(e.status);
            error_event(&mut conn.out, &e);
            true
        }
    };
    conn.exchange.done(access_log);
    open
}

/// Why a message gets an `error` event instead of a response.
struct Refused {
    status: u16,
    kind: &'static str,
    code: &'static str,
    message: String,
    param: Option<String>,
}

impl Refused {
    fn new(status: u16, code: &'static str, message: impl Into<String>) -> Self {
        let kind = match status {
            401 => "authentication_error",
            403 => "permission_error",
            429 => "rate_limit_error",
            400..=499 => "invalid_request_error",
            _ => "server_error",
        };
        Self { status, kind, code, message: message.into(), param: None }
    }

    fn param(mut self, param: &str) -> Self {
        self.param = Some(param.to_owned());
        self
    }

    fn of_failure(f: &RunFailure) -> Self {
        Self::new(f.status, f.code, f.message.clone())
    }
}

/// `{"type":"error","status":…,"error":{"type","code","message","param"}}`
/// as one text frame.
fn error_event(out: &mut BytesMut, e: &Refused) {
    let v = serde_json::json!({
        "type": "error",
        "status": e.status,
        "error": {
            "type": e.kind,
            "code": e.code,
            "message": crate::surface::error::clip_to(&e.message, crate::surface::error::MAX_MESSAGE_BYTES),
            "param": e.param,
        },
    });
    ws::write::text(out, v.to_string().as_bytes());
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

/// Reads, admits and answers one message. `Ok(false)`: the socket must close.
async fn turn(
    worker: &Rc<Ctx>,
    conn: &mut Conn,
    head: &RequestHead,
    key: Option<&KeyState>,
    text: &[u8],
    history: &mut Option<History>,
    limits: Limits,
) -> Result<bool, Refused> {
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
        match (prev.as_str(), history.as_ref()) {
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
    let top = iop_core::request::Top::parse(&body).map_err(|m| Refused::new(400, "invalid_request", m))?;
    let group = worker.config.borrow().model(&top.model).cloned();
    let Some(group) = group else {
        let msg = format!("The model `{}` does not exist", clip(&top.model));
        return Err(Refused::new(404, "model_not_found", msg).param("model"));
    };
    conn.exchange.finish.borrow_mut().model.push_str(&group.name);
    if let Some(k) = key {
        api_keys::check(k, &group.name).map_err(|r| Refused::new(r.status, r.code, r.message))?;
    }
    let Some(group) = serving(worker, &group, Route::Responses) else {
        let msg = format!("the model `{}` has no provider that serves the Responses API", clip(&top.model));
        return Err(Refused::new(400, "unsupported_endpoint", msg));
    };
    let class = match group.long_context_threshold {
        Some(t) if estimated_tokens(body.len()) > u64::from(t) => LeaseClass::Long,
        _ => LeaseClass::Normal,
    };
    let admitted = match take_capacity(worker, conn, &group, class).await {
        None => return Ok(false),
        Some(Ok(a)) => a,
        Some(Err(e)) => {
            let (status, code) = match e {
                AdmitError::QueueFull(_) => (429, "queue_full"),
                AdmitError::Timeout(_) => (503, "queue_timeout"),
                AdmitError::Unavailable(_) => (503, "no_ready_node"),
            };
            return Err(Refused::new(status, code, e.to_string()));
        }
    };
    let target = admitted.target.upstream_model.clone();
    let resource = admitted.lease.key().clone();
    let principal = conn.exchange.api_key.as_ref().map(|k| k.entry.name.clone()).unwrap_or_default();
    let write_timeout = worker.config.borrow().http.idle_timeout;
    let mut frames = Frames::new(limits.max_message_bytes);
    let open = if tunnels_to(worker, &admitted, Route::Responses) {
        let req = pb::ProviderTunnelRequest {
            method: "POST".into(),
            path: Route::Responses.provider_path().into(),
            body: top.with_model(&body, &target),
            principal,
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
        drop(body);
        relay_tunnel(conn, &mut stream, &mut frames, write_timeout).await?
    } else {
        let t = responses::to_chat(&body, &target, &responses::Options::default())
            .and_then(|t| translated::refuse_if_strict(&group, &t.dropped).map(|()| t))
            .map_err(|i| Refused::new(i.status, "invalid_request", i.message.clone()).param(&i.param))?;
        drop(body);
        let s = translated::submit(worker, conn, &group.name, admitted, t.body, true, &t.dropped);
        let mut run = s.run.map_err(|e| Refused::new(503, "no_ready_node", e.to_string()))?;
        let meta = ResponseMeta {
            id: ["resp_", run.run_id()].concat(),
            model: target.to_string(),
            created_at: unix_now(),
            echo: t.echo,
            namespaced: t.namespaced,
        };
        relay_run(conn, &mut run, ResponsesEncoder::new(meta), &mut frames, write_timeout).await?
    };
    // Kept for a continuation: what was asked and what came back, while it
    // fits in one message.
    *history = frames.terminal.take().and_then(|r| {
        let id = r.get("id")?.as_str()?.to_owned();
        let mut items = asked;
        items.extend(r.get("output")?.as_array()?.iter().cloned());
        let size: usize = items.iter().map(|i| i.to_string().len()).sum();
        (size <= limits.max_message_bytes).then_some(History { id, items })
    });
    Ok(open)
}

/// Server-sent events turned into text frames, one per event, with the
/// terminal event's response kept.
struct Frames {
    parser: SseParser,
    terminal: Option<Value>,
}

impl Frames {
    fn new(max_event: usize) -> Self {
        Self { parser: SseParser::new(max_event), terminal: None }
    }

    /// Frames the events `bytes` complete into `out`.
    fn push(&mut self, bytes: &[u8], out: &mut BytesMut) -> Result<(), Refused> {
        self.parser.push(bytes);
        while let Some(ev) =
            self.parser.next_event().map_err(|e| Refused::new(502, "upstream_protocol", e.to_string()))?
        {
            ws::write::text(out, ev.data.as_bytes());
            let named = ev.event.as_deref().is_some_and(|e| TERMINAL.contains(&e));
            let maybe = ev.event.is_none() && TERMINAL.iter().any(|t| ev.data.contains(t));
            if named || maybe {
                if let Ok(mut v) = serde_json::from_str::<Value>(&ev.data) {
                    if v["type"].as_str().is_some_and(|t| TERMINAL.contains(&t)) {
                        self.terminal = Some(v["response"].take());
                    }
                }
            }
        }
        Ok(())
    }
}

/// Writes `out` within `timeout`; false when the client stopped reading.
async fn send(wr: &mut WriteHalf, out: &mut BytesMut, timeout: Duration) -> bool {
    if out.is_empty() {
        return true;
    }
    let taken = std::mem::take(out);
    match iop_core::rt::time::timeout(timeout, wr.write_all(taken)).await {
        Ok((Ok(_), mut buf)) => {
            buf.clear();
            *out = buf;
            true
        }
        _ => false,
    }
}

/// Relays a tunnel's Responses stream as frames. `Ok(false)`: the socket
/// must close.
async fn relay_tunnel(
    conn: &mut Conn,
    stream: &mut TunnelStream,
    frames: &mut Frames,
    timeout: Duration,
) -> Result<bool, Refused> {
    stream.credit_on_write();
    let Conn { rd, wr, buf, out, exchange, .. } = conn;
    let body = async {
        let mut status = 200;
        let mut error_body = Vec::new();
        while let Some(item) = stream.next().await {
            let parts: Vec<Bytes> = match item {
                TunnelItem::Start { status: s, .. } => {
                    status = s;
                    exchange.status(s);
                    continue;
                }
                TunnelItem::Whole(w) => {
                    status = w.status;
                    exchange.status(w.status);
                    w.body
                }
                TunnelItem::Body(b) => vec![b],
                TunnelItem::Parts(p) => p,
                TunnelItem::End { .. } => break,
                TunnelItem::Error(f) => return Err(Refused::of_failure(&f)),
            };
            for p in parts {
                if status == 200 {
                    frames.push(&p, out)?;
                } else if error_body.len() < 64 * 1024 {
                    error_body.extend_from_slice(&p);
                }
            }
            if !send(wr, out, timeout).await {
                return Ok(false);
            }
            exchange.wrote();
            stream.written();
        }
        if status != 200 {
            // The provider's own message, in the socket's error event.
            let v: Value = serde_json::from_slice(&error_body).unwrap_or_default();
            let msg = v["error"]["message"].as_str().unwrap_or("the provider refused the request").to_owned();
            return Err(Refused::new(status, "upstream_status", msg));
        }
        Ok(true)
    };
    with_disconnect_watch::<STREAM_WATCH, _, _>(rd, buf, std::pin::pin!(body)).await.unwrap_or(Ok(false))
}

/// Relays a normalized run rendered by `enc` as frames. `Ok(false)`: the
/// socket must close.
async fn relay_run(
    conn: &mut Conn,
    run: &mut RunStream,
    mut enc: ResponsesEncoder,
    frames: &mut Frames,
    timeout: Duration,
) -> Result<bool, Refused> {
    run.credit_on_write();
    let Conn { rd, wr, buf, out, exchange, .. } = conn;
    let body = async {
        let mut sse = BytesMut::new();
        let mut started = false;
        while let Some(ev) = run.next().await {
            if let (false, ExecEvent::Error(f)) = (started, &ev) {
                // Before anything went out: an error event, not a failed response.
                return Err(Refused::of_failure(f));
            }
            if !started {
                started = true;
                exchange.status(200);
            }
            let mut terminal = enc.event(&mut sse, ev);
            while !terminal {
                let Some(ev) = run.try_next() else { break };
                terminal = enc.event(&mut sse, ev);
            }
            frames.push(&sse, out)?;
            sse.clear();
            if !send(wr, out, timeout).await {
                return Ok(false);
            }
            exchange.wrote();
            run.written();
            if terminal {
                return Ok(true);
            }
        }
        Err(Refused::of_failure(&crate::surface::failures::ended_without_result()))
    };
    with_disconnect_watch::<STREAM_WATCH, _, _>(rd, buf, std::pin::pin!(body)).await.unwrap_or(Ok(false))
}
