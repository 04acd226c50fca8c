//! The runs in flight on one node session, and delivery of their events.

use std::collections::HashMap;

use iop_core::exec::{codes, ExecEvent, FailureSource, RunFailure};

use super::{RunEvents, Undelivered};
use crate::pool::Lease;

/// A run in flight. Dropping the entry (terminal, cancel, slow consumer,
/// disconnect) drops the run's lease: capacity is released exactly once,
/// here, and never waits on a client that is slow to read.
struct Entry {
    events: RunEvents,
    next_seq: u64,
    _lease: Option<Lease>,
}

/// What the session must do after routing an event.
#[derive(Debug, PartialEq, Eq)]
pub enum Routed {
    /// Delivered (or the run is unknown: stale/finished, ignored).
    Done,
    /// The run was dropped here; tell the node to cancel it.
    CancelOnNode(&'static str),
}

/// Runs of one session by id.
#[derive(Default)]
pub struct RunTable {
    runs: HashMap<String, Entry>,
    /// Events for runs this table does not know (finished or cancelled).
    pub ignored_events: u64,
}

impl RunTable {
    /// Tracks a new run.
    pub fn insert(&mut self, run_id: String, events: RunEvents, lease: Option<Lease>) {
        self.runs.insert(run_id, Entry { events, next_seq: 0, _lease: lease });
    }

    /// Forgets a run; true if it was tracked.
    pub fn remove(&mut self, run_id: &str) -> bool {
        self.runs.remove(run_id).is_some()
    }

    /// Runs in flight.
    pub fn len(&self) -> usize {
        self.runs.len()
    }

    /// Delivers one event of `run_id` with sequence `seq`. Keeps per-run
    /// order and exactly one terminal; a client too far behind (in events
    /// or bytes) fails the run rather than blocking the connection.
    pub fn route(&mut self, run_id: &str, seq: u64, ev: ExecEvent) -> Routed {
        let Some(entry) = self.runs.get_mut(run_id) else {
            // Expected after a cancel or a slow-consumer failure races the node's events.
            self.ignored_events += 1;
            tracing::debug!(run = %run_id, seq, ignored = self.ignored_events, "event for a run no longer tracked dropped");
            return Routed::Done;
        };
        if seq != entry.next_seq {
            let f = RunFailure::new(
                codes::INTERNAL,
                502,
                FailureSource::Node,
                format!("node sent event {seq} of run out of order (expected {})", entry.next_seq),
            );
            entry.events.send_terminal(ExecEvent::Error(f));
            self.runs.remove(run_id);
            return Routed::CancelOnNode("protocol_violation");
        }
        entry.next_seq += 1;
        if ev.is_terminal() {
            // Its slot is always free (see below); a gone client just misses it.
            entry.events.send_terminal(ev);
            self.runs.remove(run_id);
            return Routed::Done;
        }
        // Keep one slot free so a slow consumer can still be told why it failed.
        match entry.events.try_send(ev, 1) {
            Ok(()) => Routed::Done,
            Err(Undelivered::Full) => {
                let f =
                    RunFailure::new(codes::SLOW_CONSUMER, 503, FailureSource::Client, "client is reading too slowly");
                entry.events.send_terminal(ExecEvent::Error(f));
                self.runs.remove(run_id);
                Routed::CancelOnNode("slow_consumer")
            }
            Err(Undelivered::Closed) => {
                self.runs.remove(run_id);
                Routed::CancelOnNode("client_gone")
            }
        }
    }

    /// Ends every run with `failure` (connection lost).
    pub fn fail_all(&mut self, failure: &RunFailure) {
        for (_, e) in self.runs.drain() {
            e.events.send_terminal(ExecEvent::Error(failure.clone()));
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::transport::{run_events, RUN_BUFFER_BYTES};

    #[test]
    fn delivers_in_order_and_forgets_after_terminal() {
        let mut t = RunTable::default();
        let (tx, rx) = run_events();
        t.insert("r".into(), tx, None);
        assert_eq!(t.route("r", 0, ExecEvent::Delta("a".into())), Routed::Done);
        let done = ExecEvent::Complete { finish_reason: "stop".into(), usage: None };
        assert_eq!(t.route("r", 1, done.clone()), Routed::Done);
        assert_eq!(t.len(), 0);
        assert_eq!(t.route("r", 2, ExecEvent::Delta("late".into())), Routed::Done);
        assert_eq!(t.ignored_events, 1);
        assert_eq!(rx.try_recv(), Some(ExecEvent::Delta("a".into())));
        assert_eq!(rx.try_recv(), Some(done));
        assert_eq!(rx.try_recv(), None, "nothing after the terminal");
    }

    #[test]
    fn out_of_order_fails_the_run() {
        let mut t = RunTable::default();
        let (tx, rx) = run_events();
        t.insert("r".into(), tx, None);
        assert_eq!(t.route("r", 1, ExecEvent::Delta("x".into())), Routed::CancelOnNode("protocol_violation"));
        assert!(matches!(rx.try_recv(), Some(ExecEvent::Error(_))));
    }

    #[test]
    fn slow_consumer_fails_without_blocking() {
        let mut t = RunTable::default();
        let (tx, rx) = run_events();
        t.insert("r".into(), tx, None);
        let mut seq = 0;
        let outcome = loop {
            match t.route("r", seq, ExecEvent::Delta("x".into())) {
                Routed::Done => seq += 1,
                other => break other,
            }
        };
        assert_eq!(outcome, Routed::CancelOnNode("slow_consumer"));
        let mut last = None;
        while let Some(ev) = rx.try_recv() {
            last = Some(ev);
        }
        assert!(matches!(last, Some(ExecEvent::Error(f)) if f.code == codes::SLOW_CONSUMER));
    }

    #[test]
    fn buffered_bytes_are_bounded() {
        let mut t = RunTable::default();
        let (tx, rx) = run_events();
        t.insert("r".into(), tx, None);
        let mib = "x".repeat(1 << 20);
        // An empty queue takes one event of any size.
        let huge = "y".repeat(RUN_BUFFER_BYTES + 1);
        assert_eq!(t.route("r", 0, ExecEvent::Delta(huge)), Routed::Done);
        assert_eq!(rx.queued_bytes(), RUN_BUFFER_BYTES + 1);
        assert!(rx.try_recv().is_some());
        assert_eq!(rx.queued_bytes(), 0);
        let mut seq = 1;
        let outcome = loop {
            match t.route("r", seq, ExecEvent::Delta(mib.clone())) {
                Routed::Done => seq += 1,
                other => break other,
            }
        };
        assert_eq!(outcome, Routed::CancelOnNode("slow_consumer"));
        assert_eq!(seq - 1, (RUN_BUFFER_BYTES >> 20) as u64, "exactly the bound was queued");
        assert!(rx.queued_bytes() <= RUN_BUFFER_BYTES + 64);
        let mut last = None;
        while let Some(ev) = rx.try_recv() {
            last = Some(ev);
        }
        assert!(matches!(last, Some(ExecEvent::Error(f)) if f.code == codes::SLOW_CONSUMER));
        assert_eq!(rx.queued_bytes(), 0);
    }

    #[test]
    fn client_gone_asks_node_to_cancel() {
        let mut t = RunTable::default();
        let (tx, rx) = run_events();
        t.insert("r".into(), tx, None);
        drop(rx);
        assert_eq!(t.route("r", 0, ExecEvent::Delta("x".into())), Routed::CancelOnNode("client_gone"));
        assert_eq!(t.len(), 0);
    }
}
