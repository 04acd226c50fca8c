//! The sink of one run or tunnel: numbers its items, writes them to the edge
//! connection with backpressure, and enforces "exactly one terminal,
//! nothing after it".

use std::{marker::PhantomData, rc::Rc};

use iop_core::{
    exec::{Delta, ExecEvent, Part},
    rt::frames::{FrameWriter, SendError},
    tunnel::TunnelItem,
    wire::pb::{envelope::Body, Envelope},
};

use super::{
    credit::Credit,
    record::{Noted, Record},
    spec::{EventSink, SinkClosed},
    watchdog::Activity,
};

/// An item of a stream the node sends to the edge (and what it tells the
/// stream's run store row).
pub trait Outgoing: Noted {
    /// Whether it ends the stream.
    fn is_terminal(&self) -> bool;
    /// Its payload, for the stream's credit window.
    fn payload_bytes(&self) -> usize;
    /// Queues its frame, numbered `seq` in stream `id`, on `writer`.
    fn queue(self, writer: &FrameWriter, id: &str, seq: u64) -> Result<(), SendError>;
    /// Splits off the first `at` payload bytes, leaving the rest (items
    /// whose bytes may be cut anywhere: a tunnel's body); `None` otherwise.
    fn split_front(&mut self, _at: usize) -> Option<Self>
    where
        Self: Sized,
    {
        None
    }
}

fn queue_body(writer: &FrameWriter, body: Body) -> Result<(), SendError> {
    writer.send(&Envelope { correlation_id: 0, body: Some(body) })
}

impl Outgoing for ExecEvent {
    fn is_terminal(&self) -> bool {
        ExecEvent::is_terminal(self)
    }

    fn payload_bytes(&self) -> usize {
        ExecEvent::payload_bytes(self)
    }

    fn queue(self, writer: &FrameWriter, id: &str, seq: u64) -> Result<(), SendError> {
        let mut wire = self.into_wire_unnamed(seq);
        let sent = writer.send_run_event(id, &wire);
        // Its text's memory holds the next token.
        crate::spare::keep_wire_text(&mut wire);
        sent
    }
}

impl Outgoing for TunnelItem {
    fn is_terminal(&self) -> bool {
        TunnelItem::is_terminal(self)
    }

    fn payload_bytes(&self) -> usize {
        TunnelItem::payload_bytes(self)
    }

    fn queue(self, writer: &FrameWriter, id: &str, seq: u64) -> Result<(), SendError> {
        match self {
            // The provider's bytes go to the socket from the buffer they
            // were read into.
            TunnelItem::Body(b) => writer.send_tunnel_body(id, seq, std::slice::from_ref(&b)),
            TunnelItem::Parts(parts) => writer.send_tunnel_body(id, seq, &parts),
            TunnelItem::Whole(w) => writer.send_tunnel_whole(id, seq, &w),
            TunnelItem::Start { status, headers } => writer.send_tunnel_start(id, seq, status, &headers),
            item => queue_body(writer, Body::ProviderTunnelFrame(item.into_wire(id, seq))),
        }
    }

    fn split_front(&mut self, at: usize) -> Option<Self> {
        self.split_body_front(at)
    }
}

/// Sends one stream's items (run events or tunnel frames) to the edge.
pub struct Emitter<T = ExecEvent> {
    writer: FrameWriter,
    id: String,
    seq: u64,
    terminal: bool,
    slot: Option<super::manager::Slot>,
    /// The stream's credit window (none: unlimited).
    credit: Option<Rc<Credit>>,
    /// Merge consecutive text deltas (the client takes the answer whole).
    merge: bool,
    /// Text merged and not yet sent.
    pending: Option<Delta>,
    /// The stall watchdog's view of this stream's progress.
    activity: Option<Rc<Activity>>,
    /// The stream's run store row (none: the store is off); four words,
    /// the row itself boxed.
    record: Option<Record>,
    /// The edge takes several run events in one frame.
    batches: bool,
    _items: PhantomData<T>,
}

/// Merged text is sent once it reaches this size.
const MAX_MERGED: usize = 16 * 1024;

/// Run events sent together go in frames of at most this many payload
/// bytes (a larger event goes alone).
const MAX_BATCH: usize = 16 * 1024;

/// A body item that does not fit the credit left goes in pieces that do,
/// none smaller than this (but the last): the edge then holds at most the
/// window of a stream whatever the provider's chunk size, in few frames.
const MIN_PIECE: usize = 16 * 1024;

impl<T: Outgoing> Emitter<T> {
    /// An emitter for stream `id` on `writer`.
    pub fn new(writer: FrameWriter, id: String) -> Self {
        Self {
            writer,
            id,
            seq: 0,
            terminal: false,
            slot: None,
            credit: None,
            merge: false,
            pending: None,
            activity: None,
            record: None,
            batches: false,
            _items: PhantomData,
        }
    }

    /// Notes the stream's first output and terminal in `record`, which
    /// goes to the run store at the terminal (or with the emitter).
    pub(crate) fn with_record(mut self, record: Option<Record>) -> Self {
        self.record = record;
        self
    }

    /// Waits for `credit` before each item but the terminal.
    pub(crate) fn with_credit(mut self, credit: Option<Rc<Credit>>) -> Self {
        self.credit = credit;
        self
    }

    /// Reports every non-terminal item to `activity` as the provider's
    /// progress, and waits on the edge as not the provider's.
    pub(crate) fn with_activity(mut self, activity: Rc<Activity>) -> Self {
        self.activity = Some(activity);
        self
    }

    /// Sends events given together in one frame when `on` (the edge said it
    /// takes them).
    pub(crate) fn with_batches(mut self, on: bool) -> Self {
        self.batches = on;
        self
    }

    fn progress(&self, terminal: bool) {
        if let (Some(a), false) = (&self.activity, terminal) {
            a.progress();
        }
    }

    /// Frees `slot` when the terminal item is sent.
    pub(crate) fn with_slot(mut self, slot: super::manager::Slot) -> Self {
        self.slot = Some(slot);
        self
    }

    /// Whether a terminal item was sent.
    pub fn terminal_sent(&self) -> bool {
        self.terminal
    }

    /// Reports `item` as progress and to the stream's row.
    fn observe(&mut self, item: &T) {
        self.progress(item.is_terminal());
        self.note(item);
    }

    /// Reports `item` to the stream's row.
    fn note(&mut self, item: &T) {
        if let Some(r) = self.record.as_mut() {
            let terminal = item.is_terminal();
            if r.wants(terminal) {
                item.note(r);
            }
            if terminal {
                // The stream's outcome is settled: its row goes now.
                self.record = None;
            }
        }
    }

    /// Sends one item, waiting while the connection's buffer is full.
    /// Queued at once when it can be (the usual case), with no await: the
    /// waiting path is boxed, so a stream's task does not hold its state
    /// (nor a copy of the item) while it waits for its provider.
    pub async fn send(&mut self, item: T) -> Result<(), SinkClosed> {
        self.observe(&item);
        if self.beyond_credit(&item) {
            return Box::pin(self.send_in_pieces(item)).await;
        }
        match self.try_send(item)? {
            None => Ok(()),
            Some(item) => Box::pin(self.send_waiting(item)).await,
        }
    }

    /// A body item larger than a piece that does not fit the credit left.
    fn beyond_credit(&self, item: &T) -> bool {
        let Some(credit) = &self.credit else { return false };
        let bytes = item.payload_bytes();
        bytes > MIN_PIECE
            && !item.is_terminal()
            && i64::try_from(iop_core::flow::cost(bytes)).unwrap_or(i64::MAX) > credit.available()
    }

    /// Sends `item` as pieces that each fit the credit left, waiting for
    /// credit between them (items that cannot be cut go whole).
    async fn send_in_pieces(&mut self, mut item: T) -> Result<(), SinkClosed> {
        while let Some(credit) = self.credit.clone().filter(|_| self.beyond_credit(&item)) {
            let activity = self.activity.clone();
            {
                let _hold = activity.as_deref().map(Activity::hold);
                credit.wait_for(MIN_PIECE as u64).await;
            }
            let fits = usize::try_from(credit.available()).unwrap_or(0);
            let Some(front) = item.split_front(fits) else { break };
            match self.try_send(front)? {
                None => {}
                Some(front) => self.send_waiting(front).await?,
            }
        }
        match self.try_send(item)? {
            None => Ok(()),
            Some(item) => self.send_waiting(item).await,
        }
    }

    /// Queues `item` if neither the credit window nor the connection's
    /// buffer makes it wait; gives it back when one would.
    fn try_send(&mut self, item: T) -> Result<Option<T>, SinkClosed> {
        if self.terminal {
            return Err(SinkClosed);
        }
        if !self.writer.writable().map_err(|_| SinkClosed)? {
            return Ok(Some(item));
        }
        let terminal = item.is_terminal();
        if let (Some(credit), false) = (&self.credit, terminal) {
            if !credit.try_take(iop_core::flow::cost(item.payload_bytes())) {
                return Ok(Some(item));
            }
        }
        self.queue(item, terminal)?;
        Ok(None)
    }

    async fn send_waiting(&mut self, item: T) -> Result<(), SinkClosed> {
        let terminal = item.is_terminal();
        let activity = self.activity.clone();
        let _hold = activity.as_deref().map(Activity::hold);
        if let (Some(credit), false) = (&self.credit, terminal) {
            // No credit: this stream's client is behind; wait (and so stop
            // reading this provider) without holding up other streams.
            credit.take(iop_core::flow::cost(item.payload_bytes())).await;
        }
        self.writer.wait_writable().await.map_err(|_| SinkClosed)?;
        self.queue(item, terminal)
    }

    fn queue(&mut self, item: T, terminal: bool) -> Result<(), SinkClosed> {
        item.queue(&self.writer, &self.id, self.seq).map_err(|_| SinkClosed)?;
        self.sent(1, terminal);
        Ok(())
    }

    /// `n` items were queued, the last of them `terminal`.
    fn sent(&mut self, n: u64, terminal: bool) {
        self.seq += n;
        if terminal {
            self.terminal = true;
            // The edge frees its lease on this item: free ours before it can
            // send the next one (an adapter may still be draining its socket).
            self.slot = None;
        }
    }
}

impl Emitter<ExecEvent> {
    /// Merges consecutive text deltas of a choice when `whole` (the edge
    /// aggregates the answer: one event instead of one per token, the same
    /// text in the same order).
    pub(crate) fn merging(mut self, whole: bool) -> Self {
        self.merge = whole;
        self
    }

    /// Sends the merged text, if any.
    async fn flush_merged(&mut self) -> Result<(), SinkClosed> {
        match self.pending.take() {
            Some(d) => self.send(ExecEvent::Delta(d)).await,
            None => Ok(()),
        }
    }

    /// Queues the first `n` of `evs` (a terminal only last) as one frame
    /// if neither the credit window nor the connection's buffer makes them
    /// wait; false (and `evs` untouched) when one would.
    fn try_send_batch(&mut self, evs: &mut Vec<ExecEvent>, n: usize) -> Result<bool, SinkClosed> {
        if self.terminal {
            return Err(SinkClosed);
        }
        if !self.writer.writable().map_err(|_| SinkClosed)? {
            return Ok(false);
        }
        let batch = &evs[..n];
        if let Some(credit) = &self.credit {
            let cost = batch.iter().filter(|e| !e.is_terminal()).map(|e| iop_core::flow::cost(e.payload_bytes())).sum();
            if !credit.try_take_covered(cost) {
                return Ok(false);
            }
        }
        let terminal = batch.last().is_some_and(ExecEvent::is_terminal);
        // One read's events: one progress report (a clock read) for all.
        self.progress(false);
        for ev in batch {
            self.note(ev);
        }
        // Encoded straight from the events (no wire message built first).
        self.writer.send_run_events(&self.id, self.seq, &evs[..n]).map_err(|_| SinkClosed)?;
        evs.drain(..n).for_each(crate::spare::keep_event_text);
        self.sent(n as u64, terminal);
        Ok(true)
    }
}

/// How many of `evs`' first events go in one frame: up to the first
/// terminal, within [`MAX_BATCH`] payload bytes, at least one.
fn batch_len(evs: &[ExecEvent]) -> usize {
    let mut bytes = 0;
    for (i, ev) in evs.iter().enumerate() {
        bytes += ev.payload_bytes();
        if i > 0 && bytes > MAX_BATCH {
            return i;
        }
        if ev.is_terminal() {
            return i + 1;
        }
    }
    evs.len()
}

/// The text of a delta that can be merged with its neighbours.
fn text_mut(d: &mut Delta) -> Option<&mut String> {
    if d.logprobs.is_some() {
        return None;
    }
    match &mut d.part {
        Part::Content(t) | Part::Reasoning(t) | Part::Refusal(t) => Some(t),
        Part::ToolCall(_) => None,
    }
}

impl EventSink for Emitter<ExecEvent> {
    /// Events given together go in one frame (decoded and routed once at
    /// the edge) when the edge takes that and they need not wait; one by
    /// one otherwise.
    async fn emit_many(&mut self, evs: &mut Vec<ExecEvent>) -> Result<(), SinkClosed> {
        while !evs.is_empty() {
            let n = if self.batches && !self.merge { batch_len(evs) } else { 1 };
            if n > 1 && self.try_send_batch(evs, n)? {
                continue;
            }
            for ev in evs.drain(..n) {
                self.emit(ev).await?;
            }
        }
        Ok(())
    }

    async fn emit(&mut self, ev: ExecEvent) -> Result<(), SinkClosed> {
        // `send` reports the progress (a clock read: once per event).
        if !self.merge {
            return self.send(ev).await;
        }
        let ExecEvent::Delta(mut d) = ev else {
            self.flush_merged().await?;
            return self.send(ev).await;
        };
        if text_mut(&mut d).is_none() {
            self.flush_merged().await?;
            return self.send(ExecEvent::Delta(d)).await;
        }
        // Merged text is progress too, though it is sent later.
        self.progress(false);
        if let Some(r) = self.record.as_mut() {
            r.first_output();
        }
        if let Some(p) = &mut self.pending {
            let same = p.choice == d.choice && std::mem::discriminant(&p.part) == std::mem::discriminant(&d.part);
            if same {
                if let (Some(into), Some(from)) = (text_mut(p), text_mut(&mut d)) {
                    into.push_str(from);
                    if into.len() >= MAX_MERGED {
                        return self.flush_merged().await;
                    }
                    return Ok(());
                }
            }
        }
        self.flush_merged().await?;
        self.pending = Some(d);
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use bytes::Bytes;
    use iop_core::flow::WINDOW_BYTES;

    use super::*;

    async fn settle() {
        for _ in 0..16 {
            iop_core::rt::yield_now().await;
        }
    }

    /// The frames `writer` holds, decoded.
    fn frames_of(writer: &FrameWriter) -> Vec<Body> {
        let mut buf = bytes::BytesMut::from(&writer.queued_copy()[..]);
        let mut out = Vec::new();
        while let Some(env) = iop_core::wire::decode(&mut buf, 1 << 30).unwrap() {
            out.push(env.body.unwrap());
        }
        assert!(buf.is_empty());
        out
    }

    fn tokens(n: usize) -> Vec<ExecEvent> {
        (0..n).map(|i| ExecEvent::content(format!("tok{i} "))).collect()
    }

    fn complete() -> ExecEvent {
        ExecEvent::Complete { finish_reason: "stop".into(), usage: None }
    }

    /// What one read held goes in one frame when the edge takes batches,
    /// numbered on from the events before it; one frame each otherwise.
    #[test]
    fn events_given_together_go_in_one_frame() {
        iop_core::rt::block_on_current(async {
            let writer = FrameWriter::new(64 << 20, 64 << 20, 256 << 20);
            let mut e = Emitter::<ExecEvent>::new(writer.clone(), "r".into()).with_batches(true);
            e.emit(ExecEvent::Start { model: "m".into() }).await.unwrap();
            let mut evs = tokens(3);
            evs.push(complete());
            e.emit_many(&mut evs).await.unwrap();
            assert!(evs.is_empty());
            assert!(e.terminal_sent());
            let frames = frames_of(&writer);
            assert_eq!(frames.len(), 2, "{frames:?}");
            let Body::RunEvents(batch) = &frames[1] else { panic!("{:?}", frames[1]) };
            assert_eq!((&batch.run_id[..], batch.seq, batch.events.len()), (&b"r"[..], 1, 4));
            let got: Vec<ExecEvent> = batch
                .events
                .iter()
                .filter_map(|b| ExecEvent::from_wire(prost::Message::decode(b.clone()).unwrap()))
                .collect();
            let mut want = tokens(3);
            want.push(complete());
            assert_eq!(got, want);
            // Nothing after the terminal.
            assert!(e.emit_many(&mut tokens(2)).await.is_err());

            let writer = FrameWriter::new(64 << 20, 64 << 20, 256 << 20);
            let mut e = Emitter::<ExecEvent>::new(writer.clone(), "r".into());
            e.emit_many(&mut tokens(3)).await.unwrap();
            let frames = frames_of(&writer);
            assert_eq!(frames.len(), 3);
            assert!(frames.iter().all(|f| matches!(f, Body::RunEvent(_))));
        })
        .unwrap();
    }

    /// A batch beyond the credit left goes one event at a time, each when
    /// its credit comes; a large read goes in several frames.
    #[test]
    fn a_batch_waits_for_credit_event_by_event_and_large_reads_split() {
        iop_core::rt::block_on_current(async {
            let writer = FrameWriter::new(64 << 20, 64 << 20, 256 << 20);
            let two = 2 * iop_core::flow::cost(5);
            let credit = Rc::new(Credit::new(WINDOW_BYTES));
            // All but two events' worth is unacknowledged.
            assert!(credit.try_take(WINDOW_BYTES - two));
            let mut e = Emitter::<ExecEvent>::new(writer.clone(), "r".into())
                .with_batches(true)
                .with_credit(Some(credit.clone()));
            let task = monoio::spawn(async move {
                e.emit_many(&mut tokens(4)).await.unwrap();
                e
            });
            settle().await;
            let frames_now = frames_of(&writer);
            assert_eq!(frames_now.len(), 2, "as many as the credit allows: {frames_now:?}");
            assert!(frames_now.iter().all(|f| matches!(f, Body::RunEvent(_))));
            credit.grant(two);
            let _e = task.await;
            assert_eq!(frames_of(&writer).len(), 4);

            let writer = FrameWriter::new(64 << 20, 64 << 20, 256 << 20);
            let mut e = Emitter::<ExecEvent>::new(writer.clone(), "r".into()).with_batches(true);
            let big = || ExecEvent::content("x".repeat(MAX_BATCH / 2 + 1));
            e.emit_many(&mut vec![big(), big(), big(), complete()]).await.unwrap();
            let counts: Vec<usize> = frames_of(&writer)
                .iter()
                .map(|f| match f {
                    Body::RunEvents(b) => b.events.len(),
                    _ => 1,
                })
                .collect();
            assert_eq!(counts, [1, 1, 2], "each frame within {MAX_BATCH} payload bytes");
        })
        .unwrap();
    }

    /// A provider chunk larger than the credit left goes in pieces that
    /// fit: the edge never holds more than the window of the stream.
    #[test]
    fn a_large_body_goes_in_pieces_that_fit_the_credit() {
        iop_core::rt::block_on_current(async {
            let writer = FrameWriter::new(64 << 20, 64 << 20, 256 << 20);
            let credit = Rc::new(Credit::new(WINDOW_BYTES));
            let mut e = Emitter::<TunnelItem>::new(writer.clone(), "t".into()).with_credit(Some(credit.clone()));
            // A small item first, so the big one does not fit whole.
            e.send(TunnelItem::Body(Bytes::from_static(b"data: 1\n\n"))).await.unwrap();
            let window = WINDOW_BYTES as usize;
            let big = Bytes::from(vec![7u8; 3 * window + 100]);
            let task = monoio::spawn(async move {
                e.send(TunnelItem::Body(big)).await.unwrap();
                e
            });
            settle().await;
            let framing = 64; // frame heads, generously
            let queued = writer.queued_bytes();
            assert!(queued <= window + framing * 2, "{queued} queued with one window of credit");
            assert!(credit.available() >= 0, "credit overdrawn: {}", credit.available());
            let mut sent = queued;
            for _ in 0..3 {
                // The edge wrote what it had: it grants it back.
                credit.grant(WINDOW_BYTES - u64::try_from(credit.available()).unwrap());
                settle().await;
                let now = writer.queued_bytes();
                assert!(now - sent <= window + framing * 4, "{} queued after one grant", now - sent);
                assert!(credit.available() >= 0, "credit overdrawn: {}", credit.available());
                sent = now;
            }
            let e = task.await;
            assert!(!e.terminal_sent());
            assert!(writer.queued_bytes() >= 3 * window + 100, "every byte went");
        })
        .unwrap();
    }
}
