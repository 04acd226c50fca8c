//! A received request body and its share of the worker core's in-flight
//! body budget (`http.max_inflight_body_bytes`), so bodies being received
//! and parsed at once are bounded in bytes per core.

use std::ops::Deref;

use bytes::Bytes;

pub use crate::budget::{BodyBudget, BodyPermit};

/// A complete request body. Surfaces drop it as soon as they have taken
/// what they need from it, which frees its share of the budget.
#[derive(Debug)]
pub struct Body {
    bytes: Bytes,
    permit: Option<BodyPermit>,
}

impl Body {
    /// A body counted by `permit` (None: empty, nothing to count).
    pub fn new(bytes: Bytes, permit: Option<BodyPermit>) -> Self {
        Self { bytes, permit }
    }
}

impl Body {
    /// The bytes and the permit apart, to free the bytes once parsed while
    /// still counting the request (e.g. while it waits in a queue).
    pub fn into_parts(self) -> (Bytes, Option<BodyPermit>) {
        (self.bytes, self.permit)
    }
}

impl Deref for Body {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn budget_is_bounded_and_returned_on_drop() {
        let budget = BodyBudget::default();
        let a = budget.try_reserve(60, 100).unwrap();
        assert!(budget.try_reserve(41, 100).is_none());
        let mut b = budget.try_reserve(40, 100).unwrap();
        assert!(!b.grow(1, 100));
        assert_eq!(budget.used(), 100);
        drop(a);
        assert!(b.grow(50, 100));
        let body = Body::new(Bytes::from_static(b"xyz"), Some(b));
        assert_eq!(&body[..], b"xyz");
        assert_eq!(budget.used(), 90);
        drop(body);
        assert_eq!(budget.used(), 0);
    }
}
