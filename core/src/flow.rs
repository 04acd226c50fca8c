//! Per-stream flow control on the edge↔node link. The node may have at
//! most [`WINDOW_BYTES`] of one run's or tunnel's items unacknowledged; the
//! edge grants more (`StreamCredit`) as the client's task takes them. So a
//! slow client slows only its own stream (the node stops reading that
//! provider's answer), and the edge holds a bounded amount per stream. An
//! item costs its payload bytes but at least [`MIN_ITEM_COST`], so the
//! window bounds the number of queued items too.

/// Unacknowledged item cost the node may send on one stream.
pub const WINDOW_BYTES: u64 = 1 << 20;

/// The least an item costs (many tiny deltas still fill the window).
pub const MIN_ITEM_COST: u64 = 256;

/// Items one stream can have queued at most within its window.
pub const MAX_QUEUED_ITEMS: usize = (WINDOW_BYTES / MIN_ITEM_COST) as usize;

/// The edge returns credit once this much was taken since the last grant.
pub const CREDIT_BATCH: u64 = WINDOW_BYTES / 4;

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
    }
}
