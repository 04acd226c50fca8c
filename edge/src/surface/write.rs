//! The write loop of a streamed answer from a normalized run, whatever its
//! dialect: the head once the first event is in (before it, a failure may
//! still be replayed elsewhere), then events rendered by the dialect's
//! [`EventEncoder`] straight into the connection's buffer, batched per
//! write from what is already queued, framed, with credit going back to
//! the node only for what the client took.

use bytes::BytesMut;
use iop_core::{
    exec::ExecEvent,
    http::{self, StreamFraming},
};
use monoio::io::AsyncWriteRentExt;

use super::{dialect::Dialect, encode::EventEncoder, relay::WriteClock, replay::ReplayChance, reply};
use crate::{
    dispatch::RunStream,
    run_stream::Piece,
    server::{with_disconnect_watch, Conn, STREAM_WATCH},
};

/// Most SSE bytes gathered from queued events into one client write.
const MAX_WRITE_BATCH: usize = 256 * 1024;

/// Room a buffer given back before a wait starts again with: a few events'
/// worth at once, where growing from nothing by doubling took five
/// reallocations for one chat chunk.
const EVENT_ROOM: usize = 1024;

/// Sizes the write buffer for the events about to be rendered into it: a
/// burst (many events queued at once) would otherwise grow it by doubling,
/// copying what was rendered at each step, and a buffer given back before
/// a wait would do so again at the next burst.
#[derive(Debug)]
struct Room {
    /// Bytes per event in the last batch rendered (its framing included).
    per_event: usize,
}

/// Events queued at once from which the buffer is sized for them.
const BURST: usize = 4;

impl Default for Room {
    fn default() -> Self {
        // A chat chunk of a short token, framed.
        Self { per_event: 256 }
    }
}

impl Room {
    /// Makes room in `out` for `events` more events (a quarter more than
    /// the last burst's size per event, for events that vary). A few
    /// events (a paced stream's token, a stream's opening) get what they
    /// always got: a buffer sized for a burst would stay in the heap's
    /// dirty pages after every such write, for every open stream.
    fn reserve(&self, out: &mut BytesMut, events: usize) {
        if events < BURST {
            if out.capacity() == 0 {
                out.reserve(EVENT_ROOM);
            }
            return;
        }
        let want = events.saturating_mul(self.per_event + self.per_event / 4);
        out.reserve(want.clamp(EVENT_ROOM, MAX_WRITE_BATCH));
    }

    /// `events` took `bytes`; a burst's size per event is learned.
    fn rendered(&mut self, bytes: usize, events: usize) {
        if events >= BURST {
            // Bounded: a huge event (a whole tool call) sizes no batch after it.
            self.per_event = bytes.div_ceil(events).clamp(64, 16 * 1024);
        }
    }
}

/// Streams the run as server-sent events, each rendered by the encoder
/// `make` builds from the model the provider's start reported (empty when
/// it named none), its head carrying the `extra` headers. Errors before the
/// first byte become a plain HTTP error in the dialect `d`, with the mapped
/// status; after it, the encoder's error event.
///
/// In three parts (the wait for the first event, the head, the body) so
/// that a stream's future holds the larger of the two waits' states, never
/// both, nor the first event or the head's pieces while it streams: an
/// open stream holds this future all its life.
#[allow(clippy::too_many_arguments)] // the stream's parts, each used once
pub async fn stream<E: EventEncoder>(
    conn: &mut Conn,
    run: &mut RunStream,
    d: Dialect,
    extra: &[(&str, &str)],
    make: impl FnOnce(&str) -> E,
    keep: bool,
    write_timeout: std::time::Duration,
    chance: &mut ReplayChance,
) -> bool {
    // What a client has not read stays within the stream's window.
    run.credit_on_write();
    let first = match first_event(conn, run, d, keep, chance).await {
        Ok(ev) => ev,
        Err(kept) => return kept,
    };
    // The head goes out now: no replay from here.
    chance.commit();
    let begun = begin(conn, run, d, extra, make, keep, first);
    body(conn, run, begun, write_timeout).await
}

/// The run's first event, watching the client; `Err` holds whether the
/// connection may be kept (the client left, the run ended, or a failure
/// was answered or held back for a replay elsewhere).
async fn first_event(
    conn: &mut Conn,
    run: &mut RunStream,
    d: Dialect,
    keep: bool,
    chance: &mut ReplayChance,
) -> Result<ExecEvent, bool> {
    let Conn { rd, buf, .. } = conn;
    match with_disconnect_watch::<STREAM_WATCH, _, _>(rd, buf, std::pin::pin!(run.next())).await {
        // The client is gone (dropping `run` cancels it on the node), or the run ended.
        None | Some(None) => Err(false),
        // Before any byte: maybe held back for a replay elsewhere.
        Some(Some(ExecEvent::Error(f))) => match chance.hold(f) {
            Some(f) => Err(reply::failure(&mut conn.responder(), d, &f, keep).await),
            None => Err(false),
        },
        Some(Some(ev)) => Ok(ev),
    }
}

/// A stream whose head and first event are in the connection's buffer.
struct Begun<E> {
    render: E,
    framing: StreamFraming,
    /// Where the open chunk begins in the buffer.
    chunk: usize,
    /// The first event ended the stream.
    ended: bool,
    keep: bool,
}

/// Writes the head and renders the first event into the buffer.
fn begin<E: EventEncoder>(
    conn: &mut Conn,
    run: &RunStream,
    d: Dialect,
    extra: &[(&str, &str)],
    make: impl FnOnce(&str) -> E,
    keep: bool,
    first: ExecEvent,
) -> Begun<E> {
    let framing = conn.stream_framing;
    let keep = framing.keep_alive(keep);
    let id = run.run_id();
    let mut headers = vec![("content-type", "text/event-stream"), ("cache-control", "no-cache"), ("x-request-id", id)];
    headers.extend(d.request_id_header().map(|h| (h, id)));
    headers.extend_from_slice(extra);
    http::write_response_head(&mut conn.out, 200, &headers, framing.framing(), keep);
    conn.exchange.status(200);
    let reported = if let ExecEvent::Start { model } = &first { model.as_str() } else { "" };
    let mut render = make(reported);
    // The first event is rendered here, so the body's state holds no event.
    let chunk = framing.begin(&mut conn.out);
    reserve_for(&mut conn.out, &first);
    let ended = render.event(&mut conn.out, first);
    Begun { render, framing, chunk, ended, keep }
}

/// The rest of the stream, watching the client; resolves to whether the
/// connection may be kept. An async block, not an async fn: an async fn's
/// state holds each argument twice (the encoder among them).
#[allow(clippy::manual_async_fn)]
fn body<'a, E: EventEncoder + 'a>(
    conn: &'a mut Conn,
    run: &'a mut RunStream,
    mut begun: Begun<E>,
    write_timeout: std::time::Duration,
) -> impl std::future::Future<Output = bool> + 'a {
    async move {
        let Conn { rd, wr, buf, out, exchange, .. } = conn;
        let mut clock = WriteClock::new(&mut exchange.first_byte, Some(crate::metrics::Path::Normalized));
        let Begun { render, framing, chunk, ended, keep } = &mut begun;
        let body =
            std::pin::pin!(stream_body(wr, out, run, render, *framing, *chunk, *ended, write_timeout, &mut clock));
        match with_disconnect_watch::<STREAM_WATCH, _, _>(rd, buf, body).await {
            Some(Ok(())) => *keep,
            _ => false,
        }
    }
}

/// Room for a large delta's chunk at once. Grown piece by piece while it is
/// written, the buffer would double past it; a stream whose client does not
/// read holds that buffer (about a window's worth), so it is made to fit.
fn reserve_for(sse: &mut BytesMut, ev: &ExecEvent) {
    const LARGE: usize = 16 * 1024;
    let ExecEvent::Delta(d) = ev else { return };
    use iop_core::exec::Part;
    let text = match &d.part {
        Part::Content(t) | Part::Reasoning(t) | Part::Refusal(t) => t.len(),
        Part::ToolCall(c) => c.arguments.len(),
    };
    let bytes = text + d.logprobs.as_ref().map_or(0, bytes::Bytes::len);
    if bytes >= LARGE {
        // The chunk's own fields and its SSE and chunk framing.
        sse.reserve(bytes + 512);
    }
}

/// Writes the chunk begun at `chunk` in `out` (ending the stream when
/// `terminal`), then the run's further events, batched per write, each
/// framed under `framing`.
#[allow(clippy::too_many_arguments)] // the stream's state, passed apart so none is held twice
async fn stream_body<W: AsyncWriteRentExt, E: EventEncoder>(
    wr: &mut W,
    out: &mut BytesMut,
    run: &mut RunStream,
    render: &mut E,
    framing: StreamFraming,
    mut chunk: usize,
    mut terminal: bool,
    write_timeout: std::time::Duration,
    clock: &mut WriteClock<'_>,
) -> std::io::Result<()> {
    let mut pacing = super::relay::Pacing::default();
    let mut room = Room::default();
    loop {
        // Batch what is already queued into one write (bounded, so one
        // write never holds a whole backlog twice), in a buffer made large
        // enough for it at once.
        room.reserve(out, run.pending());
        let (start, mut events) = (out.len(), 0);
        while !terminal && out.len() - chunk < MAX_WRITE_BATCH {
            match run.try_piece() {
                None => break,
                Some(Piece::Text(kind, text)) => render.text(out, kind, text),
                Some(Piece::Event(ev)) => {
                    reserve_for(out, &ev);
                    terminal = render.event(out, ev);
                }
                Some(Piece::Malformed) => terminal = render.event(out, run.malformed()),
            }
            events += 1;
        }
        room.rendered(out.len() - start, events);
        framing.end(out, chunk);
        if terminal {
            framing.write_last(out);
        }
        // A timed-out write closes the connection, so dropping it loses nothing.
        let Ok((res, mut written)) =
            iop_core::rt::time::timeout(write_timeout, wr.write_all(std::mem::take(out))).await
        else {
            return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "client stopped reading"));
        };
        res?;
        clock.wrote();
        run.written();
        if terminal {
            written.clear();
            *out = written;
            return Ok(());
        }
        if run.pending() > 0 {
            written.clear();
            *out = written;
        } else {
            // Paced (the last wait was long): the buffer goes back while
            // the stream waits (dropped here: a binding lives across the
            // await, a KiB per open stream); a busy one keeps it.
            if pacing.paced() {
                drop(written);
                run.shrink();
            } else {
                written.clear();
                *out = written;
            }
            let more = match render.keepalive() {
                None => pacing.wait(run.ready()).await,
                Some(every) => loop {
                    // A wait cut short loses nothing (the queue pops only when ready).
                    match iop_core::rt::time::timeout(every, pacing.wait(run.ready())).await {
                        Ok(more) => break more,
                        Err(_) => {
                            // The model is silent: the stream says it is alive.
                            let at = framing.begin(out);
                            render.ping(out);
                            framing.end(out, at);
                            let Ok((res, mut w)) =
                                iop_core::rt::time::timeout(write_timeout, wr.write_all(std::mem::take(out))).await
                            else {
                                return Err(std::io::Error::new(
                                    std::io::ErrorKind::TimedOut,
                                    "client stopped reading",
                                ));
                            };
                            res?;
                            w.clear();
                            *out = w;
                        }
                    }
                },
            };
            if !more {
                return Ok(());
            }
        }
        // What is queued now is rendered straight into the next chunk (no
        // staging buffer), above.
        room.reserve(out, run.pending());
        chunk = framing.begin(out);
    }
}
