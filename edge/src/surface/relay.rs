//! Writes a tunnel's body to the client: the provider's bytes, framed
//! (chunked, under the provider's Content-Length, or for an HTTP/1.0
//! client raw until the connection closes), gathered from what is
//! queued into vectored writes. Body bytes are never copied: each chunk
//! the node link decoded is written from the buffer it was read into.

use std::{
    future::Future,
    time::{Duration, Instant},
};

use iop_core::{http::StreamFraming, rt::gather::Gather, tunnel::TunnelItem};
use monoio::io::AsyncWriteRent;

use super::dialect::Dialect;
use crate::{dispatch::TunnelStream, metrics};

/// When a streamed answer's writes go out: the first one is the request's
/// time to first byte, the gaps between them feed the gap histogram.
pub struct WriteClock<'a> {
    first: &'a mut Option<std::time::Instant>,
    last: Option<std::time::Instant>,
    /// Where gaps are counted; `None` for a whole (non-streamed) body.
    path: Option<metrics::Path>,
}

impl<'a> WriteClock<'a> {
    /// A clock that records the first write into `first`.
    pub fn new(first: &'a mut Option<std::time::Instant>, path: Option<metrics::Path>) -> Self {
        Self { first, last: None, path }
    }

    /// A write went out.
    pub fn wrote(&mut self) {
        let now = std::time::Instant::now();
        if let (Some(prev), Some(path)) = (self.last, self.path) {
            metrics::gap(path, now.saturating_duration_since(prev));
        }
        if self.first.is_none() {
            *self.first = Some(now);
        }
        self.last = Some(now);
    }
}

/// Most body bytes gathered from queued items into one client write.
pub const MAX_WRITE_BATCH: usize = 256 * 1024;

/// A wait for the next item at least this long means the stream is paced
/// (idle between items): its buffers go back while it waits.
const IDLE_GAP: Duration = Duration::from_millis(5);

/// Whether a stream is paced by its model rather than carrying a backlog:
/// its last wait for the next item took at least [`IDLE_GAP`]. A paced
/// stream gives back its buffers before it waits again; a busy one keeps
/// them.
pub struct Pacing {
    waited_long: bool,
}

/// A stream starts as paced: its first write carried the response head
/// and the opening events (for the Responses API, the whole `response`
/// object twice), a buffer no later event needs, and every stream opened
/// at once would hold one while it waits for its next token. A busy
/// stream finds out at its first wait and keeps its buffer from then on.
impl Default for Pacing {
    fn default() -> Self {
        Self { waited_long: true }
    }
}

impl Pacing {
    /// The last wait was long.
    pub fn paced(&self) -> bool {
        self.waited_long
    }

    /// Awaits `next`, timing the wait.
    pub async fn wait<F: Future>(&mut self, next: F) -> F::Output {
        let started = Instant::now();
        let out = next.await;
        self.waited_long = started.elapsed() >= IDLE_GAP;
        out
    }
}

/// Where a relayed body's items come from (a tunnel's stream).
pub trait Source {
    /// The next item, waiting; `None` after the terminal.
    fn next(&mut self) -> impl Future<Output = Option<TunnelItem>>;
    /// The next item already queued.
    fn try_next(&mut self) -> Option<TunnelItem>;
    /// Gives back the memory of an empty queue (before a long wait).
    fn shrink(&mut self) {}
    /// The stream's id, for logs.
    fn id(&self) -> &str;
    /// What was taken so far was written to the client (credit goes back).
    fn written(&mut self) {}
}

impl Source for TunnelStream {
    fn next(&mut self) -> impl Future<Output = Option<TunnelItem>> {
        TunnelStream::next(self)
    }

    fn try_next(&mut self) -> Option<TunnelItem> {
        TunnelStream::try_next(self)
    }

    fn shrink(&mut self) {
        TunnelStream::shrink(self);
    }

    fn id(&self) -> &str {
        self.run_id()
    }

    fn written(&mut self) {
        TunnelStream::written(self);
    }
}

/// How the client's response body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frame {
    /// Streamed: chunked, or (an HTTP/1.0 client) raw until the close.
    Streamed(StreamFraming),
    /// The provider's Content-Length: exactly this many bytes are left.
    Length(u64),
}

/// How a relayed body ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyEnd {
    /// Every byte arrived and the framing was closed properly.
    Complete,
    /// The tunnel failed mid-body: the client got what arrived (and, for an
    /// SSE stream, a final error event); the connection must close.
    Broken,
}

/// Relays the body items of `src` to `wr` under `frame`, after what `out`
/// already holds (the response head). `sse`: the body is an event stream in
/// that dialect, so a failure mid-body is told as its error event. A write
/// that makes no progress for `write_timeout` fails with `TimedOut`.
///
/// A function returning its loop, not an `async fn`: that would keep every
/// argument twice in the state an open stream holds.
#[allow(clippy::manual_async_fn)]
pub fn relay_body<'a, 'c, W: AsyncWriteRent, S: Source>(
    wr: &'a mut W,
    out: &'a mut Gather,
    src: &'a mut S,
    frame: &'a mut Frame,
    sse: Option<Dialect>,
    write_timeout: Duration,
    clock: &'a mut WriteClock<'c>,
) -> impl Future<Output = std::io::Result<BodyEnd>> + use<'a, 'c, W, S> {
    async move {
        let mut pacing = Pacing::default();
        loop {
            // Gather what is queued into one write (bounded).
            let mut end = None;
            let mut next = src.try_next();
            if next.is_none() {
                // Between bursts (the last wait was long: tokens paced by the
                // model, not a backlog) the write queue's memory goes back while
                // waiting; a busy stream keeps it.
                if pacing.paced() {
                    out.release();
                    src.shrink();
                }
                next = pacing.wait(src.next()).await;
            }
            while let Some(item) = next.take() {
                match item {
                    TunnelItem::Body(b) => {
                        if !append(out, frame, std::slice::from_ref(&b)) {
                            end = Some(BodyEnd::Broken);
                            break;
                        }
                    }
                    TunnelItem::Parts(parts) => {
                        if !append(out, frame, &parts) {
                            end = Some(BodyEnd::Broken);
                            break;
                        }
                    }
                    TunnelItem::End { .. } => {
                        end = Some(match *frame {
                            Frame::Streamed(s) => {
                                s.gather_last(out);
                                BodyEnd::Complete
                            }
                            Frame::Length(0) => BodyEnd::Complete,
                            // Fewer bytes than announced: the client must see a cut.
                            Frame::Length(_) => BodyEnd::Broken,
                        });
                        break;
                    }
                    TunnelItem::Error(f) => {
                        tracing::debug!(run = %src.id(), code = f.code, "tunnel failed mid-body");
                        if let (Some(d), Frame::Streamed(s)) = (sse, *frame) {
                            // Said in the stream's own language, then a clean end,
                            // so an SDK raises instead of ending quietly.
                            let mut event = bytes::BytesMut::new();
                            d.stream_error(&mut event, &f);
                            s.gather(out, event.freeze());
                            s.gather_last(out);
                        }
                        end = Some(BodyEnd::Broken);
                        break;
                    }
                    TunnelItem::Start { .. } | TunnelItem::Whole(_) => {
                        end = Some(BodyEnd::Broken);
                        break;
                    }
                }
                if out.len() >= MAX_WRITE_BATCH {
                    break;
                }
                next = src.try_next();
            }
            if !out.is_empty() {
                // A timed-out write closes the connection, so dropping it loses nothing.
                let Ok(res) = iop_core::rt::time::timeout(write_timeout, out.write_to(wr)).await else {
                    return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "client stopped reading"));
                };
                res?;
                clock.wrote();
                src.written();
            }
            if let Some(end) = end {
                return Ok(end);
            }
        }
    }
}

/// Queues body pieces under the framing (the pieces of one item as one
/// chunk); false when the provider sent more than its Content-Length
/// announced.
fn append(out: &mut Gather, frame: &mut Frame, parts: &[bytes::Bytes]) -> bool {
    let left = match frame {
        Frame::Streamed(s) => {
            s.gather_parts(out, parts);
            return true;
        }
        Frame::Length(left) => left,
    };
    let n: u64 = parts.iter().map(|p| p.len() as u64).sum();
    if n > *left {
        return false;
    }
    *left -= n;
    for p in parts {
        out.push(p.clone());
    }
    true
}
