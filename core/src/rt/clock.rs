//! The clock every deadline, stall window and probe schedule reads
//! ([`now`]): the real monotonic clock, or on a test's thread a manual one
//! that stands still until the test advances it ([`ManualClock`]), so
//! tests of thresholds and races are deterministic and take no real time.
//! I/O timeouts inside monoio itself are not on it.

use std::{cell::Cell, time::Duration};

use monoio::time::Instant;

thread_local! {
    static MANUAL: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Now, on this thread's clock.
pub fn now() -> Instant {
    MANUAL.with(Cell::get).unwrap_or_else(Instant::now)
}

/// Whether this thread runs on a manual clock (its sleeps are fired by
/// [`ManualClock::advance`], not by real time).
pub(crate) fn is_manual() -> bool {
    MANUAL.with(Cell::get).is_some()
}

/// A manual clock for this thread, from its creation until it drops. Not
/// `Send`: it belongs to the thread (the runtime) it was made on.
#[derive(Debug)]
pub struct ManualClock {
    _not_send: std::marker::PhantomData<*const ()>,
}

impl ManualClock {
    /// Stops this thread's clock at the real now.
    pub fn install() -> Self {
        MANUAL.with(|m| m.set(Some(Instant::now())));
        Self { _not_send: std::marker::PhantomData }
    }

    /// Moves the clock on by `d` and wakes every sleep now due (their tasks
    /// run when the caller next yields to the runtime).
    pub fn advance(&self, d: Duration) {
        let now = MANUAL.with(|m| {
            let t = m.get().unwrap_or_else(Instant::now) + d;
            m.set(Some(t));
            t
        });
        super::timers::fire_due(now);
    }
}

impl Drop for ManualClock {
    fn drop(&mut self) {
        MANUAL.with(|m| m.set(None));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use std::{
        future::Future,
        pin::pin,
        task::{Context, Poll, Waker},
    };

    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_advanced_and_wakes_what_is_due() {
        crate::rt::block_on_current(async {
            let clock = ManualClock::install();
            let start = now();
            let mut sleep = pin!(crate::rt::time::sleep(Duration::from_secs(3600)));
            let cx = &mut Context::from_waker(Waker::noop());
            assert!(sleep.as_mut().poll(cx).is_pending());
            std::thread::sleep(Duration::from_millis(5));
            assert_eq!(now(), start, "the clock stands still");
            clock.advance(Duration::from_secs(3599));
            assert!(sleep.as_mut().poll(cx).is_pending());
            clock.advance(Duration::from_secs(1));
            assert_eq!(sleep.as_mut().poll(cx), Poll::Ready(()));
            assert_eq!(now() - start, Duration::from_secs(3600));
            drop(clock);
            assert!(now() >= start, "back on the real clock");
        })
        .unwrap();
    }
}
