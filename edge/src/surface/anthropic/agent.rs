//! `POST /v1/messages` whose `model` is an agent: the single-request path.
//! The task (the last user message's text) is carried out by the
//! coordinator in a task of its own; the client sees only the closed stage
//! envelope while it runs, as `ping` events carrying the stage
//! (`{"type":"ping","stage":"planning"}`): every Anthropic SDK drops pings,
//! where an unknown event type reaches some of them as a malformed
//! `message_start` (Python's 2.x yields it); then one terminal:
//! the final message, a `max_tokens` stop with no content, or an error.
//! Buffered answers share the same frozen terminal. A client that leaves
//! cancels the run silently; its workspace is still cleaned up.

use std::{rc::Rc, time::Duration};

use bytes::BytesMut;
use iop_core::{config::AgentEntry, http::RequestHead};
use monoio::io::AsyncWriteRentExt;
use serde::Deserialize;
use serde_json::{json, Value};

use super::error;
use crate::{
    coordinator::{
        run::{self, Outcome, Progress, Task},
        state::{Stage, Terminal},
        workspace::{self, AdmitFailure},
    },
    ctx::Ctx,
    server::{with_disconnect_watch, Conn, STREAM_WATCH, WHOLE_WATCH},
};

/// Header a request picks its workspace with (an agent's first by default).
pub const WORKSPACE_HEADER: &str = "x-iop-workspace";
/// Longest task accepted, in bytes.
const MAX_TASK_BYTES: usize = 64 * 1024;
/// A streamed answer's keep-alive while a stage runs.
const PING_INTERVAL: Duration = Duration::from_secs(15);

#[derive(Deserialize)]
struct Request {
    messages: Vec<Message>,
    max_tokens: u32,
    #[serde(default)]
    stream: bool,
}

#[derive(Deserialize)]
struct Message {
    role: String,
    content: Content,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Blocks(Vec<Block>),
}

#[derive(Deserialize)]
struct Block {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: String,
}

/// The task and options of a request, or why it is invalid.
fn parse(body: &[u8]) -> Result<(String, u32, bool), String> {
    let req: Request = serde_json::from_slice(body).map_err(|e| format!("invalid request body: {e}"))?;
    let last = req.messages.last().ok_or("`messages` is empty")?;
    if last.role != "user" {
        return Err("the last message must be the user's task".into());
    }
    let text = match &last.content {
        Content::Text(t) => t.clone(),
        Content::Blocks(b) => {
            b.iter().filter(|b| b.kind == "text").map(|b| b.text.as_str()).collect::<Vec<_>>().join("\n")
        }
    };
    if text.trim().is_empty() {
        return Err("the task (the last user message) has no text".into());
    }
    if text.len() > MAX_TASK_BYTES {
        return Err(format!("the task is longer than {MAX_TASK_BYTES} bytes"));
    }
    if req.max_tokens == 0 {
        return Err("`max_tokens` must be at least 1".into());
    }
    Ok((text, req.max_tokens, req.stream))
}

/// Serves the request; resolves to whether the connection may be kept.
pub async fn serve(worker: &Rc<Ctx>, conn: &mut Conn, head: &RequestHead, body: &[u8], agent: AgentEntry) -> bool {
    let keep = head.keep_alive;
    crate::metrics::single_request_ingress();
    let (text, max_tokens, stream) = match parse(body) {
        Ok(p) => p,
        Err(msg) => return respond_error(conn, 400, &msg, keep).await,
    };
    let requested = match head.header(WORKSPACE_HEADER).map(std::str::from_utf8) {
        Some(Ok(v)) => Some(v.trim()),
        Some(Err(_)) => return respond_error(conn, 400, "the workspace header is not UTF-8", keep).await,
        None => None,
    };
    let frozen = match workspace::freeze(worker, &agent, requested) {
        Ok(f) => f,
        Err(e @ AdmitFailure::Foreign) => return respond_error(conn, 400, &e.to_string(), keep).await,
        Err(e @ AdmitFailure::Unavailable) => return respond_error(conn, 503, &e.to_string(), keep).await,
    };
    let request_id = worker.next_run_id();
    let principal = conn.exchange.api_key.as_ref().map(|k| k.entry.name.clone()).unwrap_or_default();
    let session_id = conn.exchange.session_id().to_owned();
    let task = Task { request_id: request_id.clone(), text, principal, session_id, max_tokens };
    let progress = Rc::new(Progress::default());
    let (tx, rx) = iop_core::rt::oneshot::oneshot();
    let (ctx, name, p) = (worker.clone(), agent.name.clone(), progress.clone());
    let key = conn.exchange.api_key.clone();
    monoio::spawn(async move {
        let outcome = run::run(ctx, agent, frozen, task, p.clone()).await;
        if p.client_gone.is_cancelled() {
            // The client's record is gone: its key is charged here.
            if let Some(k) = &key {
                k.charge_tokens(outcome.usage.input_tokens.saturating_add(outcome.usage.output_tokens));
            }
        }
        tx.send(outcome);
    });
    let message_id = format!("msg_{request_id}");
    if stream {
        return streamed(worker, conn, &request_id, &name, progress, rx, keep).await;
    }
    let outcome = {
        let Conn { rd, buf, .. } = &mut *conn;
        with_disconnect_watch::<WHOLE_WATCH, _, _>(rd, buf, std::pin::pin!(rx)).await
    };
    let Some(Some(outcome)) = outcome else {
        progress.client_gone.cancel();
        return false;
    };
    record(conn, &request_id, &outcome);
    if let Terminal::Error(class) = outcome.terminal {
        let (_, status) = class.anthropic();
        return respond_error(conn, status, &failure_message(class.as_str()), keep).await;
    }
    if !outcome.terminal.is_written() {
        return false;
    }
    let body = message(&message_id, &name, &outcome);
    let extra = [("request-id", message_id.as_str())];
    conn.respond(200, "application/json", &extra, body.to_string().as_bytes(), keep).await.is_ok() && keep
}

/// The request's record (access log, the key's token charge): the run's
/// id, how it ended, and every stage's tokens together.
fn record(conn: &mut Conn, request_id: &str, o: &Outcome) {
    let mut f = conn.exchange.finish.borrow_mut();
    f.id.clear();
    f.id.push_str(request_id);
    f.outcome = outcome_label(o.terminal);
    f.usage = Some(o.usage);
}

fn outcome_label(t: Terminal) -> &'static str {
    match t {
        Terminal::EndTurn | Terminal::Length => "complete",
        Terminal::Error(_) => "error",
        Terminal::Cancelled { .. } => "cancelled",
    }
}

async fn respond_error(conn: &mut Conn, status: u16, msg: &str, keep: bool) -> bool {
    let body = error::body(status, msg);
    conn.respond(status, "application/json", &[], &body, keep).await.is_ok() && keep
}

/// The message of a failed run: its class, never its private content.
fn failure_message(class: &str) -> String {
    format!("the agent's run failed (class `{class}`)")
}

fn stop_reason(t: Terminal) -> &'static str {
    match t {
        Terminal::Length => "max_tokens",
        _ => "end_turn",
    }
}

/// The whole answer of a run that ended with `end_turn` or `length`.
fn message(id: &str, model: &str, o: &Outcome) -> Value {
    let content = if o.terminal.exposes_content() { json!([{"type": "text", "text": o.text}]) } else { json!([]) };
    json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason(o.terminal),
        "stop_sequence": null,
        "usage": {"input_tokens": o.usage.input_tokens, "output_tokens": o.usage.output_tokens},
    })
}

fn stage_name(s: Stage) -> Option<&'static str> {
    match s {
        // Terminal stages are told by the terminal itself.
        Stage::Completed | Stage::Failed | Stage::Cancelled => None,
        s => Some(run::stage_label(s)),
    }
}

fn sse(out: &mut BytesMut, event: &str, data: &Value) {
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(event.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    out.extend_from_slice(data.to_string().as_bytes());
    out.extend_from_slice(b"\n\n");
}

/// The events that end a streamed answer.
fn terminal_events(out: &mut BytesMut, o: &Outcome) {
    if let Terminal::Error(class) = o.terminal {
        let (kind, _) = class.anthropic();
        let err = json!({"type": "error", "error": {"type": kind, "message": failure_message(class.as_str())}});
        sse(out, "error", &err);
        return;
    }
    if o.terminal.exposes_content() {
        sse(
            out,
            "content_block_start",
            &json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        );
        let delta = json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": o.text}});
        sse(out, "content_block_delta", &delta);
        sse(out, "content_block_stop", &json!({"type": "content_block_stop", "index": 0}));
    }
    let delta = json!({
        "type": "message_delta",
        "delta": {"stop_reason": stop_reason(o.terminal), "stop_sequence": null},
        "usage": {"input_tokens": o.usage.input_tokens, "output_tokens": o.usage.output_tokens},
    });
    sse(out, "message_delta", &delta);
    sse(out, "message_stop", &json!({"type": "message_stop"}));
}

/// A streamed answer: the head and `message_start` at once, the stage
/// envelope as the run moves, pings while it waits, then one terminal.
async fn streamed(
    worker: &Rc<Ctx>,
    conn: &mut Conn,
    request_id: &str,
    model: &str,
    progress: Rc<Progress>,
    outcome: iop_core::rt::oneshot::OneshotReceiver<Outcome>,
    keep: bool,
) -> bool {
    let write_timeout = worker.config.borrow().http.idle_timeout;
    let framing = conn.stream_framing;
    let keep = framing.keep_alive(keep);
    let message_id = format!("msg_{request_id}");
    let id = message_id.as_str();
    let finish = conn.exchange.finish.clone();
    let Conn { rd, wr, buf, out, exchange, .. } = conn;
    let headers = [
        ("content-type", "text/event-stream"),
        ("cache-control", "no-cache"),
        ("request-id", id),
        ("x-request-id", id),
    ];
    iop_core::http::write_response_head(out, 200, &headers, framing.framing(), keep);
    exchange.status(200);
    let start = json!({
        "type": "message_start",
        "message": {
            "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": 0, "output_tokens": 0},
        },
    });
    let body = async {
        let mut outcome = std::pin::pin!(outcome);
        let mut events = BytesMut::new();
        sse(&mut events, "message_start", &start);
        loop {
            for s in progress.take() {
                if let Some(name) = stage_name(s) {
                    sse(&mut events, "ping", &json!({"type": "ping", "stage": name}));
                }
            }
            if !events.is_empty() {
                let chunk = framing.begin(out);
                out.extend_from_slice(&events);
                events.clear();
                framing.end(out, chunk);
                write(wr, out, write_timeout).await?;
                exchange.wrote();
            }
            let ended = monoio::select! {
                o = &mut outcome => Some(o),
                _ = progress.changed.notified() => None,
                _ = iop_core::rt::time::sleep(PING_INTERVAL) => {
                    sse(&mut events, "ping", &json!({"type": "ping"}));
                    None
                }
            };
            if let Some(o) = ended {
                let Some(o) = o else { return Err(std::io::ErrorKind::BrokenPipe.into()) };
                {
                    let mut f = finish.borrow_mut();
                    f.id.clear();
                    f.id.push_str(request_id);
                    f.outcome = outcome_label(o.terminal);
                    f.usage = Some(o.usage);
                }
                if !o.terminal.is_written() {
                    return Err(std::io::ErrorKind::BrokenPipe.into());
                }
                let chunk = framing.begin(out);
                terminal_events(out, &o);
                framing.end(out, chunk);
                framing.write_last(out);
                return write(wr, out, write_timeout).await;
            }
        }
    };
    let wrote = with_disconnect_watch::<STREAM_WATCH, _, _>(rd, buf, std::pin::pin!(body)).await;
    match wrote {
        Some(Ok(())) => keep,
        _ => {
            progress.client_gone.cancel();
            false
        }
    }
}

async fn write(wr: &mut iop_core::net::WriteHalf, out: &mut BytesMut, write_timeout: Duration) -> std::io::Result<()> {
    let Ok((res, mut written)) = iop_core::rt::time::timeout(write_timeout, wr.write_all(std::mem::take(out))).await
    else {
        return Err(std::io::ErrorKind::TimedOut.into());
    };
    res?;
    written.clear();
    *out = written;
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use iop_core::exec::Usage;

    use super::*;
    use crate::coordinator::state::ErrorClass;

    fn outcome(terminal: Terminal) -> Outcome {
        Outcome { terminal, text: "private or final".into(), usage: Usage::default(), model_calls: 1, tool_calls: 0 }
    }

    #[test]
    fn the_task_is_the_last_user_message() {
        let (t, max, stream) =
            parse(br#"{"model":"a","max_tokens":9,"stream":true,"messages":[{"role":"user","content":[{"type":"text","text":"fix it"}]}]}"#)
                .unwrap();
        assert_eq!((t.as_str(), max, stream), ("fix it", 9, true));
        assert!(parse(br#"{"model":"a","max_tokens":9,"messages":[]}"#).is_err());
        assert!(parse(br#"{"model":"a","max_tokens":9,"messages":[{"role":"assistant","content":"x"}]}"#).is_err());
        assert!(parse(br#"{"model":"a","max_tokens":9,"messages":[{"role":"user","content":"  "}]}"#).is_err());
        assert!(parse(br#"{"model":"a","messages":[{"role":"user","content":"x"}]}"#).is_err());
    }

    #[test]
    fn only_end_turn_carries_content_and_errors_carry_their_class_only() {
        let m = message("msg_1", "agent", &outcome(Terminal::EndTurn));
        assert_eq!(m["content"][0]["text"], "private or final");
        let m = message("msg_1", "agent", &outcome(Terminal::Length));
        assert_eq!(m["content"], json!([]));
        assert_eq!(m["stop_reason"], "max_tokens");
        let mut out = BytesMut::new();
        terminal_events(&mut out, &outcome(Terminal::Length));
        let s = String::from_utf8(out.to_vec()).unwrap();
        assert!(!s.contains("private"), "{s}");
        assert_eq!(s.matches("message_stop").count(), 2, "{s}"); // the event name and its type
        let mut out = BytesMut::new();
        terminal_events(&mut out, &outcome(Terminal::Error(ErrorClass::Validation)));
        let s = String::from_utf8(out.to_vec()).unwrap();
        assert!(s.starts_with("event: error\n") && s.contains("invalid_request_error") && !s.contains("private"));
    }
}
