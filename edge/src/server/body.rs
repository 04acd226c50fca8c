//! A received request body and its share of the worker core's in-flight
//! body budget (`http.max_inflight_body_bytes`), so bodies being received
//! and parsed at once are bounded in bytes per core.

use std::{cell::Cell, ops::Deref, rc::Rc};

use bytes::Bytes;

/// Body bytes held on one core, shared by that core's connections.
#[derive(Debug, Default, Clone)]
pub struct BodyBudget {
    used: Rc<Cell<usize>>,
}

/// A share of a [`BodyBudget`]; dropping it returns the bytes.
#[derive(Debug)]
pub struct BodyPermit {
    used: Rc<Cell<usize>>,
    bytes: usize,
}

impl BodyBudget {
    /// Bytes held now.
    pub fn used(&self) -> usize {
        self.used.get()
    }

    /// A permit for `bytes` unless that would pass `limit`.
    pub fn try_reserve(&self, bytes: usize, limit: usize) -> Option<BodyPermit> {
        let mut permit = BodyPermit { used: self.used.clone(), bytes: 0 };
        permit.grow(bytes, limit).then_some(permit)
    }
}

impl BodyPermit {
    /// Adds `more` bytes unless that would pass `limit`; false when refused.
    pub fn grow(&mut self, more: usize, limit: usize) -> bool {
        let used = self.used.get();
        match used.checked_add(more) {
            Some(total) if total <= limit => {
                self.used.set(total);
                self.bytes += more;
                true
            }
            _ => false,
        }
    }
}

impl Drop for BodyPermit {
    fn drop(&mut self) {
        self.used.set(self.used.get().saturating_sub(self.bytes));
    }
}

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
