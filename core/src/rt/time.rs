//! Deadlines that cost a pointer until they are armed. monoio's `Sleep`
//! holds its timer entry inline: 640 bytes, aligned to a cache line pair,
//! so every future holding a `monoio::time::timeout` (and every future
//! around that one) grows by that and its padding, for its whole life.
//! An open stream's task holds several such states; here the timer lives
//! on the heap, and only while the deadline is being awaited.

use std::{
    fmt,
    future::Future,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use monoio::time::Sleep;
use pin_project_lite::pin_project;

/// The deadline passed before the future finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Elapsed;

impl fmt::Display for Elapsed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("deadline has elapsed")
    }
}

impl std::error::Error for Elapsed {}

pin_project! {
    /// Future returned by [`timeout`] and [`timeout_at`].
    pub struct Timeout<F> {
        #[pin]
        fut: F,
        sleep: Pin<Box<Sleep>>,
    }
}

/// Runs `fut` for at most `limit`.
pub fn timeout<F: Future>(limit: Duration, fut: F) -> Timeout<F> {
    Timeout { fut, sleep: Box::pin(monoio::time::sleep(limit)) }
}

/// Runs `fut` until `deadline` at the latest.
pub fn timeout_at<F: Future>(deadline: impl Into<monoio::time::Instant>, fut: F) -> Timeout<F> {
    Timeout { fut, sleep: Box::pin(monoio::time::sleep_until(deadline.into())) }
}

/// A sleep whose timer entry is on the heap (see the module docs).
pub fn sleep(d: Duration) -> Pin<Box<Sleep>> {
    Box::pin(monoio::time::sleep(d))
}

impl<F: Future> Future for Timeout<F> {
    type Output = Result<F::Output, Elapsed>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(v) = this.fut.poll(cx) {
            return Poll::Ready(Ok(v));
        }
        match this.sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(Elapsed)),
            Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn small_and_both_outcomes() {
        crate::rt::block_on_current(async {
            let f = timeout(Duration::from_secs(1), std::future::ready(1u8));
            assert!(std::mem::size_of_val(&f) <= 16, "a pointer and the future, not a timer entry");
            assert_eq!(timeout(Duration::from_secs(5), async { 7 }).await, Ok(7));
            let never = std::future::pending::<()>();
            assert_eq!(timeout(Duration::from_millis(5), never).await, Err(Elapsed));
            let at = std::time::Instant::now() + Duration::from_millis(5);
            assert_eq!(timeout_at(at, std::future::pending::<()>()).await, Err(Elapsed));
        })
        .unwrap();
    }
}
