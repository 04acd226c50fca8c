//! The runs in flight on one node session, and delivery of their events.

use std::collections::HashMap;

use iop_core::exec::{codes, ExecEvent, FailureSource, RunFailure};

use super::RunEvents;
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
    /// order and exactly one terminal; a full client mailbox fails the run
    /// rather than blocking the connection.
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
            let _ = entry.events.try_send(ExecEvent::Error(f));
            self.runs.remove(run_id);
            return Routed::CancelOnNode("protocol_violation");
        }
        entry.next_seq += 1;
        let terminal = ev.is_terminal();
        // Keep one slot free so a slow consumer can still be told why it failed.
        if !terminal && entry.events.len() + 1 >= super::RUN_EVENT_CAPACITY {
            let f = RunFailure::new(codes::SLOW_CONSUMER, 503, FailureSource::Client, "client is reading too slowly");
            let _ = entry.events.try_send(ExecEvent::Error(f));
            self.runs.remove(run_id);
            return Routed::CancelOnNode("slow_consumer");
        }
        match entry.events.try_send(ev) {
            Ok(()) => {
                if terminal {
                    self.runs.remove(run_id);
                }
                Routed::Done
            }
            Err(_) => {
                // The client is gone (or its mailbox is full at a terminal).
                self.runs.remove(run_id);
                if terminal {
                    Routed::Done
                } else {
                    Routed::CancelOnNode("client_gone")
                }
            }
        }
    }

    /// Ends every run with `failure` (connection lost).
    pub fn fail_all(&mut self, failure: &RunFailure) {
        for (_, e) in self.runs.drain() {
            let _ = e.events.try_send(ExecEvent::Error(failure.clone()));
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use iop_core::rt::mailbox;

    use super::*;

    #[test]
    fn delivers_in_order_and_forgets_after_terminal() {
        let mut t = RunTable::default();
        let (tx, rx) = mailbox::mailbox(super::super::RUN_EVENT_CAPACITY);
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
        let (tx, rx) = mailbox::mailbox(8);
        t.insert("r".into(), tx, None);
        assert_eq!(t.route("r", 1, ExecEvent::Delta("x".into())), Routed::CancelOnNode("protocol_violation"));
        assert!(matches!(rx.try_recv(), Some(ExecEvent::Error(_))));
    }

    #[test]
    fn slow_consumer_fails_without_blocking() {
        let mut t = RunTable::default();
        let (tx, rx) = mailbox::mailbox(super::super::RUN_EVENT_CAPACITY);
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
    fn client_gone_asks_node_to_cancel() {
        let mut t = RunTable::default();
        let (tx, rx) = mailbox::mailbox(8);
        t.insert("r".into(), tx, None);
        drop(rx);
        assert_eq!(t.route("r", 0, ExecEvent::Delta("x".into())), Routed::CancelOnNode("client_gone"));
        assert_eq!(t.len(), 0);
    }
}
