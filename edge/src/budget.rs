//! A worker core's in-flight request body budget
//! (`http.max_inflight_body_bytes`): bodies being received and parsed at
//! once are bounded in bytes per core; each holds a permit for its share.

use std::{cell::Cell, rc::Rc};

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
