//! The provider tunnel on the client side: an admitted request for an
//! OpenAI-compatible provider goes to its node as is (only `model`, and
//! `include_usage` for streams, changed), and the provider's status,
//! headers and body come back to the client byte for byte.

use std::{rc::Rc, time::Duration};

use bytes::{Bytes, BytesMut};
use iop_core::{
    http::{self, Framing, RequestHead},
    tunnel::{self, TunnelItem},
    wire::pb,
};
use monoio::io::AsyncWriteRentExt;

use iop_core::request::Top;

use super::{error, reply, Route};
use crate::{
    dispatch::{self, TunnelStream},
    pool::Admitted,
    server::{with_disconnect_watch, BodyPermit, Conn},
    worker::Worker,
};

/// Most body bytes gathered from queued items into one client write.
const MAX_WRITE_BATCH: usize = 256 * 1024;

/// The client's headers that go to the provider, plus `x-request-id` when
/// the client sent none (the run id, so both ends log the same id).
fn forwarded_headers(head: &RequestHead, request_id: &str) -> Vec<pb::Header> {
    let mut out: Vec<pb::Header> = head
        .headers
        .iter()
        .filter(|(n, _)| tunnel::forwards_request_header(n))
        .map(|(n, v)| pb::Header { name: n.clone(), value: v.clone() })
        .collect();
    if !out.iter().any(|h| h.name == "x-request-id") {
        out.push(pb::Header { name: "x-request-id".into(), value: Bytes::copy_from_slice(request_id.as_bytes()) });
    }
    out
}

/// Sends an admitted request through the tunnel and relays the answer;
/// returns whether the connection may be kept.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    worker: &Rc<Worker>,
    conn: &mut Conn,
    head: &RequestHead,
    route: Route,
    top: &Top,
    bytes: Bytes,
    permit: Option<BodyPermit>,
    model: &str,
    admitted: Admitted,
) -> bool {
    let keep = head.keep_alive;
    let target = &admitted.target.upstream_model;
    // Chat and legacy completions stream usage only when asked; the
    // Responses API always reports it (and has no stream_options).
    let (body, hide_usage_chunk) = match route {
        Route::Chat | Route::Completions => top.rewrite(&bytes, target),
        Route::Embeddings | Route::Responses => (top.with_model(&bytes, target), false),
    };
    drop(bytes);
    let req = pb::ProviderTunnelRequest {
        method: "POST".into(),
        path: route.provider_path().into(),
        body,
        hide_usage_chunk,
        ..Default::default()
    };
    let submitted = dispatch::submit_tunnel(worker, model, admitted, req, |id| forwarded_headers(head, id));
    drop(permit);
    let stream = match submitted {
        Ok(s) => s,
        Err(e) => return reply::dispatch_error(conn, &e, keep).await,
    };
    let write_timeout = worker.config.borrow().http.idle_timeout;
    relay(conn, stream, keep, write_timeout).await
}

/// How the client's response body is framed.
enum Frame {
    Chunked,
    /// The provider's Content-Length: exactly this many bytes are left.
    Length(u64),
}

async fn relay(conn: &mut Conn, mut stream: TunnelStream, keep: bool, write_timeout: Duration) -> bool {
    let first = {
        let Conn { rd, buf, .. } = &mut *conn;
        with_disconnect_watch(rd, buf, stream.next()).await
    };
    let (status, headers) = match first {
        None => return false, // client gone; dropping the stream cancels the tunnel
        Some(Some(TunnelItem::Start { status, headers })) => (status, headers),
        Some(Some(TunnelItem::Error(f))) => return reply::failure(conn, &f, keep).await,
        Some(_) => {
            let msg = "node answered the tunnel without a status";
            return reply::error(conn, 502, msg, Some("upstream_protocol"), keep).await;
        }
    };
    let length = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| std::str::from_utf8(v).ok()?.trim().parse::<u64>().ok());
    let sse = headers.iter().any(|(n, v)| n == "content-type" && v.starts_with(b"text/event-stream"));
    let mut out_headers: Vec<(&str, &[u8])> = headers
        .iter()
        .filter(|(n, _)| tunnel::forwards_response_header(n))
        .map(|(n, v)| (n.as_str(), &v[..]))
        .collect();
    let request_id = stream.run_id().to_owned();
    if !out_headers.iter().any(|(n, _)| *n == "x-request-id") {
        out_headers.push(("x-request-id", request_id.as_bytes()));
    }
    let (framing, mut frame) = match length {
        Some(n) => (Framing::Length(usize::try_from(n).unwrap_or(usize::MAX)), Frame::Length(n)),
        None => (Framing::Chunked, Frame::Chunked),
    };
    http::write_response_head(&mut conn.out, status, &out_headers, framing, keep);
    drop(out_headers);
    let Conn { rd, wr, buf, out, .. } = conn;
    let body = relay_body(wr, out, &mut stream, &mut frame, sse, write_timeout);
    match with_disconnect_watch(rd, buf, body).await {
        Some(Ok(BodyEnd::Complete)) => keep,
        _ => false,
    }
}

/// How a relayed body ended.
enum BodyEnd {
    /// Every byte arrived and the framing was closed properly.
    Complete,
    /// The tunnel failed mid-body: the client got what arrived (and, for an
    /// SSE stream, a final error event); the connection must close.
    Broken,
}

async fn relay_body<W: AsyncWriteRentExt>(
    wr: &mut W,
    out: &mut BytesMut,
    stream: &mut TunnelStream,
    frame: &mut Frame,
    sse: bool,
    write_timeout: Duration,
) -> std::io::Result<BodyEnd> {
    loop {
        // Gather what is queued into one write (bounded).
        let mut end = None;
        let mut next = stream.next().await;
        while let Some(item) = next.take() {
            match item {
                TunnelItem::Body(b) => {
                    if !append(out, frame, &b) {
                        end = Some(BodyEnd::Broken);
                        break;
                    }
                }
                TunnelItem::End { .. } => {
                    end = Some(match frame {
                        Frame::Chunked => {
                            http::write_last_chunk(out);
                            BodyEnd::Complete
                        }
                        Frame::Length(0) => BodyEnd::Complete,
                        // Fewer bytes than announced: the client must see a cut.
                        Frame::Length(_) => BodyEnd::Broken,
                    });
                    break;
                }
                TunnelItem::Error(f) => {
                    tracing::debug!(run = %stream.run_id(), code = f.code, "tunnel failed mid-body");
                    if sse && matches!(frame, Frame::Chunked) {
                        // Said in the stream's own language, then a clean end,
                        // so an SDK raises instead of ending quietly.
                        let mut event = BytesMut::new();
                        iop_core::sse::write_event(&mut event, &error::failure_body(&f));
                        http::write_chunk(out, &event);
                        http::write_last_chunk(out);
                    }
                    end = Some(BodyEnd::Broken);
                    break;
                }
                TunnelItem::Start { .. } => {
                    end = Some(BodyEnd::Broken);
                    break;
                }
            }
            if out.len() >= MAX_WRITE_BATCH {
                break;
            }
            next = stream.try_next();
        }
        if !out.is_empty() {
            // A timed-out write closes the connection, so dropping it loses nothing.
            let Ok((res, mut written)) = monoio::time::timeout(write_timeout, wr.write_all(std::mem::take(out))).await
            else {
                return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "client stopped reading"));
            };
            written.clear();
            *out = written;
            res?;
        }
        if let Some(end) = end {
            return Ok(end);
        }
    }
}

/// Appends body bytes under the framing; false when the provider sent more
/// than its Content-Length announced.
fn append(out: &mut BytesMut, frame: &mut Frame, b: &[u8]) -> bool {
    match frame {
        Frame::Chunked => {
            http::write_chunk(out, b);
            true
        }
        Frame::Length(left) => {
            let n = b.len() as u64;
            if n > *left {
                return false;
            }
            *left -= n;
            out.extend_from_slice(b);
            true
        }
    }
}
