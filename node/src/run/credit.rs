//! The node's side of a stream's credit window (see [`iop_core::flow`]):
//! its emitter takes credit before each item and waits until the item fits
//! ([`iop_core::flow::may_send`]); the edge's `StreamCredit` frames give it
//! back.

use std::cell::Cell;

use iop_core::rt::signal::LocalNotify;

/// Credit of one stream. Single waiter: the stream's emitter.
#[derive(Default)]
pub struct Credit {
    available: Cell<i64>,
    window: u64,
    granted: LocalNotify,
    /// The emitter is waiting for a grant (for the transport status).
    waiting: Cell<bool>,
}

impl Credit {
    /// A window of `bytes`.
    pub fn new(bytes: u64) -> Self {
        Self {
            available: Cell::new(i64::try_from(bytes).unwrap_or(i64::MAX)),
            window: bytes,
            granted: LocalNotify::new(),
            waiting: Cell::new(false),
        }
    }

    /// The edge consumed `bytes` more.
    pub fn grant(&self, bytes: u64) {
        let more = i64::try_from(bytes).unwrap_or(i64::MAX);
        self.available.set(self.available.get().saturating_add(more));
        self.granted.notify();
    }

    /// Takes `cost`, first waiting until it fits (or, for an item larger
    /// than the window, until almost nothing is unacknowledged): the edge
    /// never holds more than a window of the stream, whatever the item size.
    pub async fn take(&self, cost: u64) {
        while !iop_core::flow::may_send(self.available.get(), self.window, cost) {
            self.wait_grant().await;
        }
        self.debit(cost);
    }

    async fn wait_grant(&self) {
        self.waiting.set(true);
        self.granted.notified().await;
        self.waiting.set(false);
    }

    /// The stream's emitter waits for the edge to grant credit (its client
    /// is behind).
    pub fn is_waiting(&self) -> bool {
        self.waiting.get()
    }

    /// Waits until at least `bytes` of credit are left (or the window is
    /// smaller and whole again).
    pub async fn wait_for(&self, bytes: u64) {
        let want = i64::try_from(bytes.min(self.window)).unwrap_or(i64::MAX);
        while self.available.get() < want {
            self.wait_grant().await;
        }
    }

    /// Takes `cost` if it may go now (as [`Self::take`] would at once).
    pub fn try_take(&self, cost: u64) -> bool {
        if !iop_core::flow::may_send(self.available.get(), self.window, cost) {
            return false;
        }
        self.debit(cost);
        true
    }

    /// Takes `cost` only if the credit left covers it: several items sent
    /// as one never go beyond the window, as one larger item alone may.
    pub fn try_take_covered(&self, cost: u64) -> bool {
        if self.available.get() < i64::try_from(cost).unwrap_or(i64::MAX) {
            return false;
        }
        self.debit(cost);
        true
    }

    fn debit(&self, cost: u64) {
        let cost = i64::try_from(cost).unwrap_or(i64::MAX);
        self.available.set(self.available.get().saturating_sub(cost));
    }

    /// Credit left now (may be negative).
    pub fn available(&self) -> i64 {
        self.available.get()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use std::rc::Rc;

    use super::*;

    #[test]
    fn waits_until_an_item_fits_and_resumes_on_grant() {
        iop_core::rt::block_on_current(async {
            let window = iop_core::flow::WINDOW_BYTES;
            let c = Rc::new(Credit::new(window));
            c.take(window - 200).await;
            assert!(!c.try_take(256), "beyond the window");
            let waiter = {
                let c = c.clone();
                monoio::spawn(async move {
                    c.take(256).await;
                    c.available()
                })
            };
            // Still does not fit: waiting.
            c.grant(50);
            for _ in 0..10 {
                iop_core::rt::yield_now().await;
            }
            assert_eq!(c.available(), 250);
            c.grant(6);
            assert_eq!(waiter.await, 0);
            // An item larger than the window goes alone, once (almost)
            // nothing is unacknowledged.
            assert!(!c.try_take(2 * window));
            c.grant(window - iop_core::flow::IDLE_GRANT);
            assert!(c.try_take(2 * window));
            assert!(!c.try_take(256));
        })
        .unwrap();
    }
}
