//! Per-stream flow control on the edge↔node link. The node may have at
//! most [`WINDOW_BYTES`] of one run's or tunnel's items unacknowledged; the
//! edge grants more (`StreamCredit`) once the client's task has *written*
//! them to the client (taken from the queue is not enough: a batch taken
//! into a write the client does not read is memory too). So a slow client
//! slows only its own stream (the node stops reading that provider's
//! answer), and the edge holds at most a window per stream, queued and
//! being written together. An item costs its payload bytes but at least
//! [`MIN_ITEM_COST`], so the window bounds the number of queued items too.
//!
//! An item goes only when it fits in the credit left ([`may_send`]), so
//! the window is never overshot, except by an item larger than the window
//! itself, which goes alone when at most [`IDLE_GRANT`] is unacknowledged.
//! The edge grants what it wrote whenever its queue is empty and at least
//! [`IDLE_GRANT`] is ungranted, so a node waiting to send such an item is
//! always granted in the end.

/// Unacknowledged item cost the node may send on one stream.
pub const WINDOW_BYTES: u64 = 1 << 20;

/// The least an item costs (many tiny deltas still fill the window).
pub const MIN_ITEM_COST: u64 = 256;

/// Items one stream can have queued at most within its window.
pub const MAX_QUEUED_ITEMS: usize = (WINDOW_BYTES / MIN_ITEM_COST) as usize;

/// The edge returns credit once this much was taken since the last grant.
pub const CREDIT_BATCH: u64 = WINDOW_BYTES / 4;

/// The edge grants what was written, however little, once its queue is
/// empty and at least this much is ungranted; a node may send an item
/// that does not fit its credit while no more than this is unacknowledged.
pub const IDLE_GRANT: u64 = WINDOW_BYTES / 16;

/// Whether a node with `available` credit of a `window` may send an item
/// of `cost` now: when it fits, or when so little is unacknowledged that
/// the edge grants it back on its own (an item larger than the window
/// still goes, alone).
pub fn may_send(available: i64, window: u64, cost: u64) -> bool {
    let cost = i64::try_from(cost).unwrap_or(i64::MAX);
    let window = i64::try_from(window).unwrap_or(i64::MAX);
    let idle = i64::try_from(IDLE_GRANT).unwrap_or(i64::MAX);
    available >= cost || window.saturating_sub(available) <= idle
}

/// What an item of `payload_bytes` costs against the window.
pub fn cost(payload_bytes: usize) -> u64 {
    u64::try_from(payload_bytes).unwrap_or(u64::MAX).max(MIN_ITEM_COST)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn costs_and_bounds() {
        assert_eq!(cost(0), MIN_ITEM_COST);
        assert_eq!(cost(1 << 20), 1 << 20);
        assert_eq!(MAX_QUEUED_ITEMS, 4096);
        const { assert!(CREDIT_BATCH < WINDOW_BYTES) };
        const { assert!(IDLE_GRANT < CREDIT_BATCH) };
    }

    #[test]
    fn an_item_goes_when_it_fits_or_alone() {
        let w = WINDOW_BYTES;
        let wi = w as i64;
        assert!(may_send(wi, w, 1000));
        assert!(may_send(300, w, 300));
        assert!(!may_send(299, w, 300), "never beyond the window");
        // Larger than the window: only with (almost) nothing outstanding.
        assert!(may_send(wi, w, 4 * w));
        assert!(may_send(wi - IDLE_GRANT as i64, w, 4 * w));
        assert!(!may_send(wi - IDLE_GRANT as i64 - 1, w, 4 * w));
        assert!(!may_send(0, w, 1));
    }
}
