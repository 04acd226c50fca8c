//! The streams in flight on one node session (normalized runs and provider
//! tunnels), and delivery of their items.

use std::collections::HashMap;

use iop_core::{
    exec::{codes, ExecEvent, FailureSource, RunFailure},
    tunnel::TunnelItem,
    wire::pb,
};

use crate::stream::{Failing, RunEvents, StreamTx, TunnelEvents, Undelivered};
use crate::{
    pool::{HealthReport, Lease, Source},
    registry::Generation,
};

/// Where a stream's items go.
enum Sink {
    Run(RunEvents),
    Tunnel(TunnelEvents),
}

/// A stream in flight. Dropping the entry (terminal, cancel, slow consumer,
/// disconnect) drops its lease: capacity is released exactly once, here,
/// and never waits on a client that is slow to read.
struct Entry {
    sink: Sink,
    next_seq: u64,
    /// The exact target the stream was sent to (what a stall's recovery
    /// probe asks about).
    target: String,
    // Dropped with the entry (see above).
    lease: Option<Lease>,
}

/// What the session must do after routing an item.
#[derive(Debug, PartialEq, Eq)]
pub enum Routed {
    /// Delivered (or the stream is unknown: stale/finished, ignored).
    Done,
    /// The stream was dropped here; tell the node to cancel it.
    CancelOnNode(&'static str),
}

/// The node connection a session's streams arrive on.
#[derive(Debug, Clone)]
pub struct Reception {
    /// Node id.
    pub node: String,
    /// Its connection generation.
    pub generation: Generation,
    /// The link.
    pub link: u32,
}

/// Streams of one session by id (run and tunnel ids share one space).
#[derive(Default)]
pub struct RunTable {
    runs: HashMap<String, Entry>,
    /// Where the streams arrive (none in unit tests: no health handoff).
    reception: Option<Reception>,
    /// Items for streams this table does not know (finished or cancelled).
    pub ignored_events: u64,
}

impl RunTable {
    /// The table of a session on `reception`.
    pub fn new(reception: Reception) -> Self {
        Self { reception: Some(reception), ..Self::default() }
    }

    /// Records the exact target stream `id` was sent to.
    pub fn set_target(&mut self, id: &str, target: String) {
        if let Some(e) = self.runs.get_mut(id) {
            e.target = target;
        }
    }

    /// Tracks a new run.
    pub fn insert(&mut self, run_id: String, events: RunEvents, lease: Option<Lease>) {
        self.runs.insert(run_id, Entry { sink: Sink::Run(events), next_seq: 0, target: String::new(), lease });
    }

    /// Tracks a new tunnel.
    pub fn insert_tunnel(&mut self, tunnel_id: String, events: TunnelEvents, lease: Option<Lease>) {
        self.runs.insert(tunnel_id, Entry { sink: Sink::Tunnel(events), next_seq: 0, target: String::new(), lease });
    }

    /// Forgets a stream; true if it was tracked.
    pub fn remove(&mut self, run_id: &str) -> bool {
        self.runs.remove(run_id).is_some()
    }

    /// Whether stream `id` is in flight.
    pub fn contains(&self, id: &str) -> bool {
        self.runs.contains_key(id)
    }

    /// Streams in flight.
    pub fn len(&self) -> usize {
        self.runs.len()
    }

    /// Whether no stream is in flight.
    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// Delivers one event of run `run_id` with sequence `seq`.
    pub fn route(&mut self, run_id: &str, seq: u64, ev: ExecEvent) -> Routed {
        self.route_item(run_id, seq, ev, |s| match s {
            Sink::Run(tx) => Some(tx),
            Sink::Tunnel(_) => None,
        })
    }

    /// Delivers one item of tunnel `tunnel_id` with sequence `seq`.
    pub fn route_tunnel(&mut self, tunnel_id: &str, seq: u64, item: TunnelItem) -> Routed {
        self.route_item(tunnel_id, seq, item, |s| match s {
            Sink::Tunnel(tx) => Some(tx),
            Sink::Run(_) => None,
        })
    }

    /// Delivers one tunnel frame as the session received it; returns the
    /// outcome with the tunnel's id. The id stays a slice of the frame (no
    /// allocation per body chunk); one that is not UTF-8 names no tunnel.
    pub fn route_tunnel_frame(&mut self, mut frame: pb::ProviderTunnelFrame) -> (bytes::Bytes, Routed) {
        let (raw_id, seq) = (std::mem::take(&mut frame.tunnel_id), frame.seq);
        let Ok(id) = std::str::from_utf8(&raw_id) else {
            self.ignored_events += 1;
            return (raw_id, Routed::Done);
        };
        let item = TunnelItem::from_wire(frame).unwrap_or_else(|| {
            TunnelItem::Error(RunFailure::new(
                codes::INTERNAL,
                502,
                FailureSource::Node,
                "node sent a malformed tunnel frame",
            ))
        });
        let routed = self.route_tunnel(id, seq, item);
        (raw_id, routed)
    }

    /// Keeps per-stream order and exactly one terminal; a client too far
    /// behind (in items or bytes) fails the stream rather than blocking the
    /// connection. An item of the wrong kind for its id is a protocol
    /// violation that ends the stream.
    fn route_item<T: Failing>(
        &mut self,
        id: &str,
        seq: u64,
        item: T,
        tx_of: impl Fn(&Sink) -> Option<&StreamTx<T>>,
    ) -> Routed {
        let Some(entry) = self.runs.get_mut(id) else {
            // Expected after a cancel or a slow-consumer failure races the node's items.
            self.ignored_events += 1;
            tracing::debug!(run = %id, seq, ignored = self.ignored_events, "item for a stream no longer tracked dropped");
            return Routed::Done;
        };
        let Some(tx) = tx_of(&entry.sink) else {
            let f = RunFailure::new(
                codes::INTERNAL,
                502,
                FailureSource::Node,
                "node answered with the wrong kind of frame",
            );
            fail(&entry.sink, f);
            self.runs.remove(id);
            return Routed::CancelOnNode("protocol_violation");
        };
        if seq != entry.next_seq {
            let f = RunFailure::new(
                codes::INTERNAL,
                502,
                FailureSource::Node,
                format!("node sent item {seq} of a stream out of order (expected {})", entry.next_seq),
            );
            tx.send_terminal(T::failed(f));
            self.runs.remove(id);
            return Routed::CancelOnNode("protocol_violation");
        }
        entry.next_seq += 1;
        if item.is_terminal() {
            if let Some(e) = item.failure().and_then(|f| f.stall.as_deref()) {
                handoff(self.reception.as_ref(), entry.lease.as_ref(), &mut entry.target, e);
            }
            // Its slot is always free (see below); a gone client just misses it.
            tx.send_terminal(item);
            // The lease goes with the entry: released exactly once.
            self.runs.remove(id);
            return Routed::Done;
        }
        // Keep one slot free so a slow consumer can still be told why it failed.
        match tx.try_send(item, 1) {
            Ok(()) => Routed::Done,
            Err(Undelivered::Full) => {
                let f =
                    RunFailure::new(codes::SLOW_CONSUMER, 503, FailureSource::Client, "client is reading too slowly");
                tx.send_terminal(T::failed(f));
                self.runs.remove(id);
                Routed::CancelOnNode("slow_consumer")
            }
            Err(Undelivered::Closed) => {
                self.runs.remove(id);
                Routed::CancelOnNode("client_gone")
            }
        }
    }

    /// Ends every stream with `failure`. `fenced`: the connection was just
    /// fenced, and the leases go back through their owners (see
    /// [`Lease::release_after_fence`]).
    pub fn fail_all(&mut self, failure: &RunFailure, fenced: bool) {
        for (_, e) in self.runs.drain() {
            fail(&e.sink, failure.clone());
            if let (true, Some(lease)) = (fenced, e.lease) {
                lease.release_after_fence();
            }
        }
    }
}

/// The edge's terminal health handoff: stall evidence is applied only when
/// the lease it arrived under was granted on this very connection (node and
/// generation) — the resource is the lease's, never the node's say — and it
/// goes to the resource's owner core, which keeps the overlay.
fn handoff(
    reception: Option<&Reception>,
    lease: Option<&Lease>,
    target: &mut String,
    evidence: &iop_core::liveness::StallEvidence,
) {
    let (Some(rx), Some(lease)) = (reception, lease) else { return };
    let bound = *lease.key().node == *rx.node && lease.route().is_some_and(|r| r.generation == rx.generation);
    if !bound {
        tracing::warn!(
            node = %rx.node,
            provider = %lease.key().provider,
            "edge_provider_health_observation: stall evidence for a lease of another connection ignored"
        );
        return;
    }
    lease.report_health(HealthReport {
        key: lease.key().clone(),
        generation: rx.generation,
        link: rx.link,
        seq: evidence.seq,
        health: evidence.health,
        target: std::mem::take(target),
        source: Source::Stall,
    });
}

fn fail(sink: &Sink, f: RunFailure) {
    match sink {
        Sink::Run(tx) => tx.send_terminal(ExecEvent::Error(f)),
        Sink::Tunnel(tx) => tx.send_terminal(TunnelItem::Error(f)),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::stream::channel;
    use iop_core::flow::WINDOW_BYTES;

    #[test]
    fn delivers_in_order_and_forgets_after_terminal() {
        let mut t = RunTable::default();
        let (tx, rx) = channel();
        t.insert("r".into(), tx, None);
        assert_eq!(t.route("r", 0, ExecEvent::content("a")), Routed::Done);
        let done = ExecEvent::Complete { finish_reason: "stop".into(), usage: None };
        assert_eq!(t.route("r", 1, done.clone()), Routed::Done);
        assert_eq!(t.len(), 0);
        assert_eq!(t.route("r", 2, ExecEvent::content("late")), Routed::Done);
        assert_eq!(t.ignored_events, 1);
        assert_eq!(rx.try_recv(), Some(ExecEvent::content("a")));
        assert_eq!(rx.try_recv(), Some(done));
        assert_eq!(rx.try_recv(), None, "nothing after the terminal");
    }

    #[test]
    fn out_of_order_fails_the_run() {
        let mut t = RunTable::default();
        let (tx, rx) = channel();
        t.insert("r".into(), tx, None);
        assert_eq!(t.route("r", 1, ExecEvent::content("x")), Routed::CancelOnNode("protocol_violation"));
        assert!(matches!(rx.try_recv(), Some(ExecEvent::Error(_))));
    }

    #[test]
    fn slow_consumer_fails_without_blocking() {
        let mut t = RunTable::default();
        let (tx, rx) = channel();
        t.insert("r".into(), tx, None);
        let mut seq = 0;
        let outcome = loop {
            match t.route("r", seq, ExecEvent::content("x")) {
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
    fn a_node_beyond_its_window_fails_the_stream() {
        let mut t = RunTable::default();
        let (tx, rx) = channel();
        t.insert("r".into(), tx, None);
        let window = WINDOW_BYTES as usize;
        // Below the window the node may send an item of any size.
        let huge = "y".repeat(window * 3);
        assert_eq!(t.route("r", 0, ExecEvent::content(huge)), Routed::Done);
        assert_eq!(rx.queued_bytes(), window * 3);
        assert!(rx.try_recv().is_some());
        assert_eq!(rx.queued_bytes(), 0);
        let quarter = "x".repeat(window / 4);
        let mut seq = 1;
        let outcome = loop {
            match t.route("r", seq, ExecEvent::content(quarter.clone())) {
                Routed::Done => seq += 1,
                other => break other,
            }
        };
        assert_eq!(outcome, Routed::CancelOnNode("slow_consumer"));
        assert_eq!(seq - 1, 4, "exactly one window was queued");
        assert!(rx.queued_bytes() <= window + 256);
        let mut last = None;
        while let Some(ev) = rx.try_recv() {
            last = Some(ev);
        }
        assert!(matches!(last, Some(ExecEvent::Error(f)) if f.code == codes::SLOW_CONSUMER));
        assert_eq!(rx.queued_bytes(), 0);
    }

    #[test]
    fn tunnels_share_the_table_and_wrong_kinds_are_violations() {
        let mut t = RunTable::default();
        let (tx, rx) = channel();
        t.insert_tunnel("t".into(), tx, None);
        let start = TunnelItem::Start { status: 200, headers: vec![] };
        assert_eq!(t.route_tunnel("t", 0, start.clone()), Routed::Done);
        assert_eq!(t.route_tunnel("t", 1, TunnelItem::Body(bytes::Bytes::from_static(b"x"))), Routed::Done);
        assert_eq!(t.route_tunnel("t", 2, TunnelItem::End { usage: None }), Routed::Done);
        assert_eq!(t.len(), 0);
        assert_eq!(rx.try_recv(), Some(start));
        // A whole answer is its tunnel's only item, and its terminal.
        let (tx, rx) = channel::<TunnelItem>();
        t.insert_tunnel("w".into(), tx, None);
        let whole = iop_core::tunnel::Whole { status: 200, headers: vec![], body: vec![], usage: None };
        assert_eq!(t.route_tunnel("w", 0, TunnelItem::Whole(Box::new(whole))), Routed::Done);
        assert_eq!(t.len(), 0);
        assert!(matches!(rx.try_recv(), Some(TunnelItem::Whole(_))));
        let (tx, rx) = channel::<TunnelItem>();
        t.insert_tunnel("u".into(), tx, None);
        assert_eq!(t.route("u", 0, ExecEvent::content("x")), Routed::CancelOnNode("protocol_violation"));
        assert!(matches!(rx.try_recv(), Some(TunnelItem::Error(_))));
    }

    #[test]
    fn client_gone_asks_node_to_cancel() {
        let mut t = RunTable::default();
        let (tx, rx) = channel();
        t.insert("r".into(), tx, None);
        drop(rx);
        assert_eq!(t.route("r", 0, ExecEvent::content("x")), Routed::CancelOnNode("client_gone"));
        assert_eq!(t.len(), 0);
    }
}
