//! The provider tunnel on the client side: an admitted request for an
//! OpenAI-compatible provider goes to its node as is (only `model`, and
//! `include_usage` for streams, changed), and the provider's status,
//! headers and body come back to the client byte for byte.

use std::{future::Future, rc::Rc, time::Duration};

use bytes::Bytes;
use iop_core::{
    http::{self, Framing, RequestHead},
    rt::gather::Gather,
    tunnel::{self, TunnelItem},
    wire::pb,
};

use super::{
    dialect::Dialect,
    relay::{relay_body, BodyEnd, Frame, WriteClock},
    replay::{Replay, ReplayChance},
    reply,
    route::Route,
};
use crate::{
    ctx::Ctx,
    dispatch::{self, TunnelStream},
    pool::Admitted,
    server::{with_disconnect_watch, BodyPermit, Conn, Responder, STREAM_WATCH, WHOLE_WATCH},
};

/// The client's headers that go to the provider, plus `x-request-id` when
/// the client sent none (the run id, so both ends log the same id).
pub(super) fn forwarded_headers(head: &RequestHead, request_id: &str) -> Vec<pb::Header> {
    let mut out: Vec<pb::Header> = head
        .headers
        .iter()
        .filter(|(n, _)| tunnel::forwards_request_header(n.as_bytes()))
        .map(|(n, v)| pb::Header { name: n.clone().into_bytes(), value: v.clone() })
        .collect();
    if !out.iter().any(|h| h.name == "x-request-id") {
        out.push(pb::Header {
            name: Bytes::from_static(b"x-request-id"),
            value: Bytes::copy_from_slice(request_id.as_bytes()),
        });
    }
    out
}

/// Sends an admitted request through the tunnel and relays the answer;
/// resolves to whether the connection may be kept. The sending is done
/// before the returned future: it holds only what relaying needs (an open
/// stream's task keeps this state for the whole answer); the request's
/// parts go to `chance` (kept until the answer commits when it may be
/// replayed, else dropped).
pub fn run<'a>(
    worker: &Rc<Ctx>,
    conn: &'a mut Conn,
    route: Route,
    parts: Replay,
    permit: Option<BodyPermit>,
    admitted: Admitted,
    chance: &'a mut ReplayChance,
) -> impl Future<Output = bool> + 'a {
    let (keep, d) = (parts.head.keep_alive, route.dialect());
    let streamed = parts.top.stream;
    let target = &admitted.target.upstream_model;
    // Chat and legacy completions stream usage only when asked.
    // The Responses and Messages APIs always report it (and have no
    // stream_options).
    let (body, hide_usage_chunk) = match route {
        Route::Chat | Route::Completions => parts.top.rewrite(&parts.bytes, target),
        Route::Embeddings | Route::Responses | Route::Messages | Route::CountTokens => {
            (parts.top.with_model(&parts.bytes, target), false)
        }
    };
    let req = pb::ProviderTunnelRequest {
        method: "POST".into(),
        path: route.provider_path().into(),
        body,
        hide_usage_chunk,
        principal: conn.exchange.api_key.as_ref().map(|k| k.entry.name.clone()).unwrap_or_default(),
        session_id: conn.exchange.session_id().to_owned(),
        ..Default::default()
    };
    let model = &parts.group.name;
    let key = admitted.lease.key().clone();
    let mut submitted = dispatch::submit_tunnel(worker, model, admitted, req, |id| forwarded_headers(&parts.head, id));
    if let Ok(s) = &mut submitted {
        s.report_to(&conn.exchange.finish, &key);
    }
    drop(permit);
    chance.keep(parts);
    let write_timeout = worker.config.borrow().http.idle_timeout;
    async move {
        // By reference: a moved binding would be stored twice in this state.
        match &mut submitted {
            Ok(stream) => relay(conn, stream, d, keep, streamed, write_timeout, chance).await,
            Err(e) => reply::dispatch_error(&mut conn.responder(), d, e, keep).await,
        }
    }
}

/// The answer under the client's disconnect watch (a block, as `answer`).
#[allow(clippy::manual_async_fn)]
fn relay<'a>(
    conn: &'a mut Conn,
    stream: &'a mut TunnelStream,
    d: Dialect,
    keep: bool,
    streamed: bool,
    write_timeout: Duration,
    chance: &'a mut ReplayChance,
) -> impl Future<Output = bool> + 'a {
    async move {
        // One disconnect watch for the whole answer, status to last byte (each
        // watch is a read and its cancellation on the client's socket).
        let (head_only, stream_framing) = (conn.head_only, conn.stream_framing);
        let Conn { rd, wr, buf, out, exchange, .. } = conn;
        let mut w = Responder { wr, out, head_only, stream_framing, ex: exchange };
        let answer = std::pin::pin!(answer(&mut w, stream, d, keep, write_timeout, chance));
        // None: the client left; dropping the stream cancels the tunnel.
        let watched = if streamed {
            with_disconnect_watch::<STREAM_WATCH, _, _>(rd, buf, answer).await
        } else {
            with_disconnect_watch::<WHOLE_WATCH, _, _>(rd, buf, answer).await
        };
        watched.unwrap_or(false)
    }
}

/// The provider's status, headers and body to the client. A function
/// returning its block, and the body's relay a future of its own built
/// after the head is written: an open stream's state holds neither the
/// arguments twice nor the first item and the head's parts beside the body.
#[allow(clippy::manual_async_fn)]
fn answer<'a, 'r>(
    w: &'a mut Responder<'r>,
    stream: &'a mut TunnelStream,
    d: Dialect,
    keep: bool,
    write_timeout: Duration,
    chance: &'a mut ReplayChance,
) -> impl Future<Output = bool> + use<'a, 'r> {
    async move {
        // What a client has not read stays within the stream's window.
        stream.credit_on_write();
        match stream.next().await {
            Some(TunnelItem::Start { status, headers }) => {
                // The provider's status goes out now: no replay from here.
                chance.commit();
                body(w, stream, d, keep, write_timeout, status, headers).await
            }
            // Not streamed (S1's usual case): inline, no allocation of its own.
            Some(TunnelItem::Whole(whole)) => {
                chance.commit();
                answer_whole(w, stream.run_id(), d, *whole, keep, write_timeout).await
            }
            first => Box::pin(other_answer(w, d, keep, chance, first)).await,
        }
    }
}

/// An answer that began with neither a head nor a whole answer: a failure
/// before any byte (boxed: rare, and its replies' futures are large).
async fn other_answer(
    w: &mut Responder<'_>,
    d: Dialect,
    keep: bool,
    chance: &mut ReplayChance,
    first: Option<TunnelItem>,
) -> bool {
    match first {
        // Before any byte: maybe held back for a replay elsewhere.
        Some(TunnelItem::Error(f)) => match chance.hold(f) {
            Some(f) => reply::failure(w, d, &f, keep).await,
            None => false,
        },
        _ => {
            let msg = "node answered the tunnel without a status";
            reply::error(w, d, 502, msg, "upstream_protocol", keep).await
        }
    }
}

/// The head (written into the queue now) and the body relayed after it.
fn body<'a, 'r>(
    w: &'a mut Responder<'r>,
    stream: &'a mut TunnelStream,
    d: Dialect,
    keep: bool,
    write_timeout: Duration,
    status: u16,
    headers: Vec<(http::HeaderName, Bytes)>,
) -> impl Future<Output = bool> + use<'a, 'r> {
    let length = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| std::str::from_utf8(v).ok()?.trim().parse::<u64>().ok());
    let sse = is_sse(&headers);
    let (framing, mut frame, keep) = match length {
        Some(n) => (Framing::Length(usize::try_from(n).unwrap_or(usize::MAX)), Frame::Length(n), keep),
        None => (w.stream_framing.framing(), Frame::Streamed(w.stream_framing), w.stream_framing.keep_alive(keep)),
    };
    let mut out = Gather::new();
    put_head(&mut out, status, &headers, stream.run_id(), d, framing, keep);
    w.ex.status(status);
    // The header values are slices of the link's read buffer: not kept for
    // the whole answer.
    drop(headers);
    async move {
        let mut clock = WriteClock::new(&mut w.ex.first_byte, sse.then_some(crate::metrics::Path::Tunnel));
        match relay_body(w.wr, &mut out, stream, &mut frame, sse.then_some(d), write_timeout, &mut clock).await {
            Ok(BodyEnd::Complete) => keep,
            _ => false,
        }
    }
}

/// A whole answer (it arrived at once): head and body queued now, then
/// one write, framed by the body's length. A function returning its block
/// (as `body`): the block holds the queue and the write, not the answer.
#[allow(clippy::manual_async_fn)]
fn answer_whole<'a, 'r>(
    w: &'a mut Responder<'r>,
    request_id: &str,
    d: Dialect,
    whole: tunnel::Whole,
    keep: bool,
    write_timeout: Duration,
) -> impl Future<Output = bool> + use<'a, 'r> {
    let mut out = Gather::new();
    let sse = is_sse(&whole.headers);
    put_head(&mut out, whole.status, &whole.headers, request_id, d, Framing::Length(whole.body_len()), keep);
    w.ex.status(whole.status);
    if !w.head_only {
        whole.body.into_iter().for_each(|p| out.push(p));
    }
    async move {
        let mut clock = WriteClock::new(&mut w.ex.first_byte, sse.then_some(crate::metrics::Path::Tunnel));
        // A timed-out write closes the connection, so dropping it loses nothing.
        match iop_core::rt::time::timeout(write_timeout, out.write_to(w.wr)).await {
            Ok(Ok(_)) => {
                clock.wrote();
                keep
            }
            _ => false,
        }
    }
}

fn is_sse(headers: &[(http::HeaderName, Bytes)]) -> bool {
    headers.iter().any(|(n, v)| n == "content-type" && v.starts_with(b"text/event-stream"))
}

/// The client's response head: the provider's status and the headers that
/// cross a hop, plus `x-request-id` (the run id) when the provider sent none,
/// and the dialect's own request id header likewise.
fn put_head(
    out: &mut Gather,
    status: u16,
    headers: &[(http::HeaderName, Bytes)],
    request_id: &str,
    d: Dialect,
    framing: Framing,
    keep: bool,
) {
    let mut out_headers: Vec<(&str, &[u8])> = headers
        .iter()
        .filter(|(n, _)| tunnel::forwards_response_header(n.as_bytes()))
        .map(|(n, v)| (n.as_str(), &v[..]))
        .collect();
    for name in std::iter::once("x-request-id").chain(d.request_id_header()) {
        if !out_headers.iter().any(|(n, _)| *n == name) {
            out_headers.push((name, request_id.as_bytes()));
        }
    }
    out.put_with(|b| http::write_response_head(b, status, &out_headers, framing, keep));
}
