//! Notices a client that goes away while its request is being served, so
//! the run can be cancelled upstream at once instead of at the next write.

use std::{
    future::{poll_fn, Future},
    pin::{pin, Pin},
    task::Poll,
};

use bytes::BytesMut;
use monoio::io::{CancelableAsyncReadRent, Canceller};

enum First<A, B> {
    Body(A),
    Watch(B),
}

/// Runs `body` while a read on `rd` watches for the client closing.
/// Returns `None` when the client disconnected first (`body` is dropped by
/// its owner). `body` is pinned by the caller, in the caller's own state: an
/// owned future would be stored twice (the parameter and its pinned move),
/// and this runs around every streamed response.
/// Bytes the client sent meanwhile (a pipelined request) are appended to
/// `buf`. The watch read is cancelled and awaited, never dropped in flight
/// (io_uring could otherwise lose bytes).
pub async fn with_disconnect_watch<R, F, T>(rd: &mut R, buf: &mut BytesMut, mut body: Pin<&mut F>) -> Option<T>
where
    R: CancelableAsyncReadRent,
    F: Future<Output = T>,
{
    if !buf.is_empty() {
        // Already holding the next request: EOF can't be told apart; just serve.
        return Some(body.await);
    }
    // Often done at once (a grant with capacity free): then no watch is
    // armed, which would cost a read and its cancellation.
    if let Poll::Ready(v) = poll_fn(|cx| Poll::Ready(body.as_mut().poll(cx))).await {
        return Some(v);
    }
    let canceller = Canceller::new();
    // Small: it only notices a close (a pipelined request that arrives
    // meanwhile is read on after the response).
    let mut watch = pin!(rd.cancelable_read(BytesMut::with_capacity(512), canceller.handle()));
    let first = poll_fn(|cx| {
        if let Poll::Ready(v) = body.as_mut().poll(cx) {
            return Poll::Ready(First::Body(v));
        }
        if let Poll::Ready(r) = watch.as_mut().poll(cx) {
            return Poll::Ready(First::Watch(r));
        }
        Poll::Pending
    })
    .await;
    match first {
        First::Body(v) => {
            let _ = canceller.cancel();
            let (res, got) = watch.await;
            if matches!(res, Ok(n) if n > 0) {
                buf.extend_from_slice(&got);
            }
            Some(v)
        }
        First::Watch((res, got)) => match res {
            Ok(n) if n > 0 => {
                buf.extend_from_slice(&got);
                Some(body.await)
            }
            _ => None,
        },
    }
}
