//! The node's side of a stream's credit window (see [`iop_core::flow`]):
//! its emitter takes credit before each item and waits while there is
//! none; the edge's `StreamCredit` frames give it back.

use std::cell::Cell;

use iop_core::rt::signal::LocalNotify;

/// Credit of one stream. Single waiter: the stream's emitter.
#[derive(Default)]
pub struct Credit {
    available: Cell<i64>,
    granted: LocalNotify,
}

impl Credit {
    /// A window of `bytes`.
    pub fn new(bytes: u64) -> Self {
        Self { available: Cell::new(i64::try_from(bytes).unwrap_or(i64::MAX)), granted: LocalNotify::new() }
    }

    /// The edge consumed `bytes` more.
    pub fn grant(&self, bytes: u64) {
        let more = i64::try_from(bytes).unwrap_or(i64::MAX);
        self.available.set(self.available.get().saturating_add(more));
        self.granted.notify();
    }

    /// Takes `cost`, first waiting while nothing is left. An item may take
    /// the window below zero; the next one then waits (so at most one item
    /// beyond the window is ever unacknowledged).
    pub async fn take(&self, cost: u64) {
        while self.available.get() <= 0 {
            self.granted.notified().await;
        }
        let cost = i64::try_from(cost).unwrap_or(i64::MAX);
        self.available.set(self.available.get().saturating_sub(cost));
    }

    /// Takes `cost` if there is credit now (as [`Self::take`] would at once).
    pub fn try_take(&self, cost: u64) -> bool {
        if self.available.get() <= 0 {
            return false;
        }
        let cost = i64::try_from(cost).unwrap_or(i64::MAX);
        self.available.set(self.available.get().saturating_sub(cost));
        true
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
    fn waits_without_credit_and_resumes_on_grant() {
        iop_core::rt::block_on_current(async {
            let c = Rc::new(Credit::new(300));
            c.take(256).await;
            c.take(256).await; // within the window when it started: goes negative
            assert_eq!(c.available(), -212);
            let waiter = {
                let c = c.clone();
                monoio::spawn(async move {
                    c.take(256).await;
                    c.available()
                })
            };
            // Not enough to go positive: still waiting.
            c.grant(100);
            for _ in 0..10 {
                iop_core::rt::yield_now().await;
            }
            assert_eq!(c.available(), -112);
            c.grant(1000);
            assert_eq!(waiter.await, 632);
        })
        .unwrap();
    }
}
