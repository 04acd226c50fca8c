//! `POST /v1/chat/completions`: dispatch to a node, then stream the run as
//! SSE chunks or aggregate it into one `chat.completion`.

use std::{
    rc::Rc,
    time::{SystemTime, UNIX_EPOCH},
};

use bytes::{Bytes, BytesMut};
use iop_core::{
    config::ModelGroup,
    exec::{ExecEvent, RunFailure, Usage},
    http::{self, Framing, RequestHead},
};
use monoio::io::AsyncWriteRentExt;
use serde_json::json;

use super::{chunk::ChunkEncoder, error, request};
use crate::{
    dispatch::{self, DispatchError, RunStream},
    pool::Admitted,
    server::{with_disconnect_watch, BodyPermit, Conn},
    worker::Worker,
};

/// Runs an admitted chat completion on the normalized path (a provider
/// that does not speak the OpenAI HTTP API); returns whether the
/// connection may be kept. `permit` is the body's share of the core's
/// budget, held until the run is handed to its node.
pub async fn normalized(
    worker: &Rc<Worker>,
    conn: &mut Conn,
    head: &RequestHead,
    bytes: Bytes,
    permit: Option<BodyPermit>,
    group: &ModelGroup,
    admitted: Admitted,
) -> bool {
    let keep = head.keep_alive;
    let req = match request::parse_raw(&bytes).and_then(request::Raw::into_request) {
        Ok(r) => r,
        Err(msg) => return respond_error(conn, 400, &msg, Some("invalid_request"), keep).await,
    };
    drop(bytes);
    let run_req = iop_core::wire::pb::RunRequest {
        messages: req.messages,
        max_tokens: req.max_tokens,
        params_json: req.params_json,
        ..Default::default()
    };
    let submitted = dispatch::submit(worker, &group.name, admitted, run_req);
    drop(permit);
    let run = match submitted {
        Ok(run) => run,
        Err(e) => return respond_dispatch_error(conn, &e, keep).await,
    };
    let meta = Meta { model: req.model, id: format!("chatcmpl-{}", run.run_id()), created: unix_now() };
    if req.stream {
        // A client that stops reading for this long is dropped (its run was
        // already failed by the session once its event queue filled up).
        let write_timeout = worker.config.borrow().http.idle_timeout;
        stream(conn, run, &meta, req.include_usage, keep, write_timeout).await
    } else {
        aggregate(conn, run, &meta, keep).await
    }
}

struct Meta {
    model: String,
    id: String,
    created: u64,
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

pub(super) async fn respond_error(conn: &mut Conn, status: u16, msg: &str, code: Option<&str>, keep: bool) -> bool {
    let body = error::body(status, msg, code);
    let retry = [("retry-after", "1")];
    let extra: &[(&str, &str)] = if status == 503 || status == 429 { &retry } else { &[] };
    conn.respond(status, "application/json", extra, &body, keep).await.is_ok() && keep
}

/// A dispatch that found no way to its node.
pub(super) async fn respond_dispatch_error(conn: &mut Conn, e: &DispatchError, keep: bool) -> bool {
    let code = match e {
        DispatchError::NoReadyNode(_) => "no_ready_node",
        DispatchError::NodeBusy(_) => "node_busy",
    };
    respond_error(conn, 503, &e.to_string(), Some(code), keep).await
}

pub(super) async fn respond_failure(conn: &mut Conn, f: &RunFailure, keep: bool) -> bool {
    let code = Some(f.code);
    respond_error(conn, f.status, &f.message, code, keep).await
}

/// Streams the run. Errors before the first byte become a plain HTTP error
/// with the mapped status; after it, an SSE error event.
async fn stream(
    conn: &mut Conn,
    mut run: RunStream,
    meta: &Meta,
    include_usage: bool,
    keep: bool,
    write_timeout: std::time::Duration,
) -> bool {
    let Conn { rd, wr, buf, out, .. } = conn;
    let Some(first) = with_disconnect_watch(rd, buf, run.next()).await else {
        return false; // client gone; dropping `run` cancels it on the node
    };
    let first = match first {
        Some(ExecEvent::Error(f)) => return respond_failure(conn, &f, keep).await,
        Some(ev) => ev,
        None => return false,
    };
    let request_id = run.run_id().to_owned();
    http::write_response_head(
        out,
        200,
        &[("content-type", "text/event-stream"), ("cache-control", "no-cache"), ("x-request-id", &request_id)],
        Framing::Chunked,
        keep,
    );
    let enc = ChunkEncoder::new(&meta.id, &meta.model, meta.created);
    let body = stream_body(wr, out, &mut run, &enc, first, include_usage, write_timeout);
    match with_disconnect_watch(rd, buf, body).await {
        Some(Ok(())) => keep,
        _ => false,
    }
}

async fn stream_body<W: AsyncWriteRentExt>(
    wr: &mut W,
    out: &mut BytesMut,
    run: &mut RunStream,
    enc: &ChunkEncoder,
    first: ExecEvent,
    include_usage: bool,
    write_timeout: std::time::Duration,
) -> std::io::Result<()> {
    let mut sse = BytesMut::with_capacity(1024);
    enc.role(&mut sse);
    let mut next = Some(first);
    while let Some(ev) = next.take() {
        let mut terminal = encode(enc, &mut sse, ev, include_usage);
        // Batch what is already queued into one write (bounded, so one
        // write never holds a whole backlog twice).
        while !terminal && sse.len() < MAX_WRITE_BATCH {
            let Some(ev) = run.try_next() else { break };
            terminal = encode(enc, &mut sse, ev, include_usage);
        }
        http::write_chunk(out, &sse);
        sse.clear();
        if terminal {
            http::write_last_chunk(out);
        }
        // A timed-out write closes the connection, so dropping it loses nothing.
        let Ok((res, mut written)) = monoio::time::timeout(write_timeout, wr.write_all(std::mem::take(out))).await
        else {
            return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "client stopped reading"));
        };
        written.clear();
        *out = written;
        res?;
        if terminal {
            return Ok(());
        }
        next = run.next().await;
    }
    Ok(())
}

/// Appends the SSE for `ev`; true when it ended the stream.
fn encode(enc: &ChunkEncoder, sse: &mut BytesMut, ev: ExecEvent, include_usage: bool) -> bool {
    match ev {
        ExecEvent::Start { .. } => false,
        ExecEvent::Delta(t) => {
            enc.content(sse, &t);
            false
        }
        ExecEvent::ReasoningDelta(t) => {
            enc.reasoning(sse, &t);
            false
        }
        ExecEvent::Complete { finish_reason, usage } => {
            enc.finish(sse, &finish_reason);
            // Unknown usage stays absent: no chunk of invented zeros.
            if let (true, Some(usage)) = (include_usage, usage) {
                enc.usage(sse, &usage);
            }
            enc.done(sse);
            true
        }
        ExecEvent::Error(f) => {
            enc.error(sse, &f);
            true
        }
        ExecEvent::Cancelled { reason } => {
            enc.error(sse, &node_cancelled(&reason));
            true
        }
    }
}

/// The node cancelled a run the client still wanted (e.g. its drain
/// deadline passed): a server-side failure.
fn node_cancelled(reason: &str) -> RunFailure {
    RunFailure::new(
        "cancelled",
        503,
        iop_core::exec::FailureSource::Node,
        format!("run cancelled by the node: {reason}"),
    )
}

/// Most SSE bytes gathered from queued events into one client write.
const MAX_WRITE_BATCH: usize = 256 * 1024;

/// Largest non-streamed completion the edge buffers (text and reasoning).
const MAX_AGGREGATE_BYTES: usize = 64 * 1024 * 1024;

struct Aggregate {
    content: String,
    reasoning: String,
    finish_reason: String,
    usage: Option<Usage>,
}

async fn collect(run: &mut RunStream) -> Result<Aggregate, RunFailure> {
    let mut agg =
        Aggregate { content: String::new(), reasoning: String::new(), finish_reason: String::new(), usage: None };
    while let Some(ev) = run.next().await {
        if agg.content.len() + agg.reasoning.len() > MAX_AGGREGATE_BYTES {
            // The caller then drops the stream, which cancels the run on the node.
            let msg = format!("the completion exceeds {MAX_AGGREGATE_BYTES} bytes; use stream=true");
            return Err(RunFailure::new(
                iop_core::exec::codes::INTERNAL,
                502,
                iop_core::exec::FailureSource::Edge,
                msg,
            ));
        }
        match ev {
            ExecEvent::Start { .. } => {}
            ExecEvent::Delta(t) => agg.content.push_str(&t),
            ExecEvent::ReasoningDelta(t) => agg.reasoning.push_str(&t),
            ExecEvent::Complete { finish_reason, usage } => {
                agg.finish_reason = finish_reason;
                agg.usage = usage;
                return Ok(agg);
            }
            ExecEvent::Error(f) => return Err(f),
            ExecEvent::Cancelled { reason } => return Err(node_cancelled(&reason)),
        }
    }
    Err(RunFailure::new(
        iop_core::exec::codes::INTERNAL,
        502,
        iop_core::exec::FailureSource::Edge,
        "run ended without a result",
    ))
}

/// Waits for the whole run and answers with one `chat.completion`.
async fn aggregate(conn: &mut Conn, mut run: RunStream, meta: &Meta, keep: bool) -> bool {
    let result = {
        let Conn { rd, buf, .. } = &mut *conn;
        with_disconnect_watch(rd, buf, collect(&mut run)).await
    };
    let agg = match result {
        None => return false,
        Some(Err(f)) => return respond_failure(conn, &f, keep).await,
        Some(Ok(agg)) => agg,
    };
    let mut message = json!({"role": "assistant", "content": agg.content});
    if !agg.reasoning.is_empty() {
        message["reasoning_content"] = json!(agg.reasoning);
    }
    let mut v = json!({
        "id": meta.id,
        "object": "chat.completion",
        "created": meta.created,
        "model": meta.model,
        "choices": [{"index": 0, "message": message, "logprobs": null, "finish_reason": agg.finish_reason}],
    });
    if let Some(u) = &agg.usage {
        let mut ub = BytesMut::new();
        super::chunk::usage_json(&mut ub, u);
        v["usage"] = serde_json::from_slice(&ub).unwrap_or(serde_json::Value::Null);
    }
    let body = serde_json::to_vec(&v).unwrap_or_default();
    let request_id = run.run_id().to_owned();
    conn.respond(200, "application/json", &[("x-request-id", &request_id)], &body, keep).await.is_ok() && keep
}
