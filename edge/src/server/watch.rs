//! Notices a client that goes away while its request is being served, so
//! the run can be cancelled upstream at once instead of at the next write.

use std::{
    future::{poll_fn, Future},
    pin::Pin,
    task::Poll,
};

use bytes::BytesMut;

use super::reader::ReadSide;

/// Spare room of a read watching a stream being answered. Small, as each
/// open stream holds it for as long as it streams (under io_uring the kernel
/// owns it meanwhile); it is also where the next keep-alive request's head
/// starts, and the rest of it is read on into a head-sized buffer (one more
/// read per stream, not per event).
pub const STREAM_WATCH: usize = 128;
/// Spare room of a read watching a whole answer being produced: the next
/// keep-alive request arrives in it, so it is sized for a head and that
/// request takes one read, not two. Held until the answer is written.
pub const WHOLE_WATCH: usize = 4 * 1024;

enum First<A> {
    Body(A),
    Read(std::io::Result<usize>),
}

/// Runs `body` while a read on `rd` (into at least `RESERVE` spare bytes of
/// `buf`: [`STREAM_WATCH`] or [`WHOLE_WATCH`]; a constant, so that no
/// answer's state carries it) watches for the client closing.
/// Returns `None` when the client disconnected first (`body` is dropped by
/// its owner). `body` is pinned by the caller, in the caller's own state: an
/// owned future would be stored twice (the parameter and its pinned move),
/// and this runs around every streamed response.
/// Bytes the client sent meanwhile (a pipelined request) are appended to
/// `buf`. When `body` ends first the read stays posted (see [`ReadSide`]):
/// it is the next request's read, never cancelled.
pub async fn with_disconnect_watch<const RESERVE: usize, F, T>(
    rd: &mut ReadSide,
    buf: &mut BytesMut,
    mut body: Pin<&mut F>,
) -> Option<T>
where
    F: Future<Output = T>,
{
    if !rd.is_posted() {
        if !buf.is_empty() {
            // Already holding the next request: EOF can't be told apart; just serve.
            return Some(body.await);
        }
        // Often done at once (a grant with capacity free): then no read is
        // posted before the request has been answered.
        if let Poll::Ready(v) = poll_fn(|cx| Poll::Ready(body.as_mut().poll(cx))).await {
            return Some(v);
        }
        rd.post(buf, RESERVE);
    }
    let first = poll_fn(|cx| {
        if let Poll::Ready(v) = body.as_mut().poll(cx) {
            return Poll::Ready(First::Body(v));
        }
        rd.poll_read(cx, buf).map(First::Read)
    })
    .await;
    match first {
        First::Body(v) => Some(v),
        // A pipelined request (kept in `buf`): the response goes on unwatched.
        First::Read(Ok(n)) if n > 0 => Some(body.await),
        First::Read(_) => None,
    }
}
