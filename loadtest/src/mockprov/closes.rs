//! The close log behind `GET /closes`: for every tagged model request
//! (`"mock": {"tag": ...}`) whose client closed the connection before the
//! answer was complete, the tag and the wall-clock instant the mock saw the
//! close. A load generator that stamps its own disconnects on the same clock
//! measures how long a gateway takes to close the upstream connection after
//! its client left. Kept even with `--no-record`; the oldest entries go first
//! beyond [`CAPACITY`].

use std::collections::VecDeque;

use serde::Serialize;

use super::clock::Timestamp;

/// Closes kept.
pub const CAPACITY: usize = 1 << 16;

/// One early close.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Close {
    /// The request's `mock.tag`.
    pub tag: String,
    /// Sequence number of the model request.
    pub id: u64,
    /// When the close was seen, in ns since the Unix epoch.
    pub closed_unix_ns: u64,
}

/// The last [`CAPACITY`] closes, oldest first.
#[derive(Debug, Default)]
pub struct CloseLog {
    entries: VecDeque<Close>,
}

impl CloseLog {
    /// Logs a close seen at `at`.
    pub fn push(&mut self, tag: String, id: u64, at: Timestamp) {
        if self.entries.len() >= CAPACITY {
            self.entries.pop_front();
        }
        self.entries.push_back(Close { tag, id, closed_unix_ns: at.unix_nanos() });
    }

    /// Closes logged.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none is logged.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// `GET /closes`: every kept close, oldest first.
    pub fn to_json(&self) -> String {
        serde_json::to_string(&self.entries).unwrap_or_else(|_| "[]".to_owned())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn logs_closes_bounded_and_ordered() {
        let mut log = CloseLog::default();
        assert!(log.is_empty());
        assert_eq!(log.to_json(), "[]");
        log.push("a".into(), 1, Timestamp { secs: 2, nanos: 5 });
        assert_eq!(log.to_json(), r#"[{"tag":"a","id":1,"closed_unix_ns":2000000005}]"#);
        for id in 2..=CAPACITY as u64 + 1 {
            log.push(format!("t{id}"), id, Timestamp::from_secs(id));
        }
        assert_eq!(log.len(), CAPACITY);
        let v: serde_json::Value = serde_json::from_str(&log.to_json()).unwrap();
        assert_eq!(v[0]["tag"], "t2");
        assert_eq!(v[CAPACITY - 1]["id"], CAPACITY as u64 + 1);
    }
}
