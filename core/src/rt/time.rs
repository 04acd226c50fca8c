//! Deadlines that cost an instant and a number until they are armed, and
//! a small entry in the core's timer table while they are (see
//! [`super::timers`]): never monoio's 640-byte timer entry inline in a
//! long-lived future.

use std::{
    fmt,
    future::Future,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use pin_project_lite::pin_project;

pub use super::timers::Sleep;

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
        sleep: Sleep,
    }
}

/// Runs `fut` for at most `limit`.
pub fn timeout<F: Future>(limit: Duration, fut: F) -> Timeout<F> {
    Timeout { fut, sleep: Sleep::until(super::clock::now() + limit) }
}

/// Runs `fut` until `deadline` at the latest.
pub fn timeout_at<F: Future>(deadline: impl Into<monoio::time::Instant>, fut: F) -> Timeout<F> {
    Timeout { fut, sleep: Sleep::until(deadline.into()) }
}

/// A sleep of `d` (see the module docs).
pub fn sleep(d: Duration) -> Sleep {
    Sleep::until(super::clock::now() + d)
}

/// A sleep until `deadline`.
pub fn sleep_until(deadline: impl Into<monoio::time::Instant>) -> Sleep {
    Sleep::until(deadline.into())
}

impl<F: Future> Future for Timeout<F> {
    type Output = Result<F::Output, Elapsed>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(v) = this.fut.poll(cx) {
            return Poll::Ready(Ok(v));
        }
        match Pin::new(this.sleep).poll(cx) {
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
            assert!(std::mem::size_of_val(&f) <= 32, "a deadline and the future, not a timer entry");
            assert_eq!(timeout(Duration::from_secs(5), async { 7 }).await, Ok(7));
            let never = std::future::pending::<()>();
            assert_eq!(timeout(Duration::from_millis(5), never).await, Err(Elapsed));
            let at = std::time::Instant::now() + Duration::from_millis(5);
            assert_eq!(timeout_at(at, std::future::pending::<()>()).await, Err(Elapsed));
        })
        .unwrap();
    }
}
