//! The response-stall watchdog shared by normalized runs and tunnels: only
//! the provider's progress resets it. Time the stream spends waiting on the
//! edge (no credit, a full link) is not the provider's stall and is not
//! counted.

use std::{cell::Cell, time::Duration};

use monoio::time::Instant;

/// Progress of one run or tunnel, as its emitter reports it.
pub struct Activity {
    last: Cell<Instant>,
    /// Waits on the edge in progress.
    held: Cell<u32>,
}

impl Activity {
    /// Starts the clock now (the request was just sent).
    pub fn new() -> Self {
        Self { last: Cell::new(iop_core::rt::clock::now()), held: Cell::new(0) }
    }

    /// The provider produced something (any non-terminal item).
    pub fn progress(&self) {
        self.last.set(iop_core::rt::clock::now());
    }

    /// The stream waits on the edge until the guard drops; the window
    /// restarts when it does.
    pub fn hold(&self) -> Hold<'_> {
        self.held.set(self.held.get() + 1);
        Hold(self)
    }

    /// Resolves when nothing came for `timeout` outside of holds; gives how
    /// long nothing came.
    pub async fn stalled(&self, timeout: Duration) -> Duration {
        loop {
            let due = self.last.get() + timeout;
            iop_core::rt::time::sleep_until(due).await;
            let idle = iop_core::rt::clock::now().saturating_duration_since(self.last.get());
            if self.held.get() == 0 && idle >= timeout {
                return idle;
            }
            if self.held.get() > 0 {
                // Not the provider's wait: look again a window later.
                self.progress();
            }
        }
    }
}

impl Default for Activity {
    fn default() -> Self {
        Self::new()
    }
}

/// See [`Activity::hold`].
pub struct Hold<'a>(&'a Activity);

impl Drop for Hold<'_> {
    fn drop(&mut self) {
        self.0.held.set(self.0.held.get().saturating_sub(1));
        self.0.progress();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use std::rc::Rc;

    use super::*;

    #[test]
    fn progress_resets_and_holds_do_not_count() {
        iop_core::rt::block_on_current(async {
            let a = Rc::new(Activity::new());
            let t = Duration::from_millis(40);
            // Progress every 20 ms keeps it from firing for 120 ms.
            let started = Instant::now();
            let ticker = {
                let a = a.clone();
                monoio::spawn(async move {
                    for _ in 0..6 {
                        iop_core::rt::time::sleep(Duration::from_millis(20)).await;
                        a.progress();
                    }
                    // Then held (waiting on the edge) for 100 ms: still no stall.
                    let hold = a.hold();
                    iop_core::rt::time::sleep(Duration::from_millis(100)).await;
                    drop(hold);
                })
            };
            let idle = a.stalled(t).await;
            ticker.await;
            assert!(idle >= t);
            assert!(started.elapsed() >= Duration::from_millis(220), "fired after {:?}", started.elapsed());
        })
        .unwrap();
    }
}
