//! The channel between a node session and the client task of one run or
//! tunnel. It counts the cost of what is queued (see [`iop_core::flow`]):
//! a node that respects the stream's credit window never fills it, so a
//! full channel means the node broke the window, and that stream alone
//! fails (`slow_consumer`) instead of stalling the node connection.
//!
//! Body bytes arrive as slices of the link's read buffer (no copy), and a
//! queued slice keeps that whole buffer alive. Bursts are normal (a session
//! routes many frames before its client's task runs), stalls are not: a
//! stream with at least [`COMPACT_AFTER`] queued whose client took nothing
//! for [`STALL`] gets its new items copied out ("compacted"), so a stalled
//! client cannot keep read buffers alive beyond what arrived in [`STALL`].
//! The clock is read only for an item that shares a buffer, sent to a deep
//! queue: a busy stream of owned items (most run events) never reads it.

use std::{
    collections::VecDeque,
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Arc, OnceLock,
    },
    time::{Duration, Instant},
};

use bytes::Bytes;
use iop_core::{exec::RunFailure, flow, rt::mailbox, tunnel::TunnelItem};

use crate::run_item::RunItem;

/// An item that can also carry a failure (the terminal a stream gets when
/// the edge ends it).
pub trait Failing: Queued {
    /// The error terminal for `f`.
    fn failed(f: RunFailure) -> Self;
    /// The failure this item ends the stream with, if it is one.
    fn failure(&self) -> Option<&RunFailure>;
}

impl Failing for TunnelItem {
    fn failed(f: RunFailure) -> Self {
        TunnelItem::Error(f)
    }

    fn failure(&self) -> Option<&RunFailure> {
        match self {
            TunnelItem::Error(f) => Some(f),
            _ => None,
        }
    }
}

/// Events of one run, delivered to the core serving its client.
pub type RunEvents = StreamTx<RunItem>;
/// Items of one tunnel, delivered to the core serving its client.
pub type TunnelEvents = StreamTx<TunnelItem>;
/// The client side of [`TunnelEvents`].
pub type TunnelReceiver = StreamRx<TunnelItem>;

/// Capacity of one stream's mailbox, in items: everything the window
/// allows, plus room for the terminal (memory is allocated as it fills).
pub const RUN_EVENT_CAPACITY: usize = flow::MAX_QUEUED_ITEMS + 8;

/// Queued cost from which a stalled stream's new items are compacted.
pub const COMPACT_AFTER: usize = 8 * 1024;
/// A client that took nothing for this long while its stream had at least
/// [`COMPACT_AFTER`] queued is stalled.
pub const STALL: Duration = Duration::from_millis(20);

/// Nanoseconds on a process-wide monotonic clock.
fn now_nanos() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    u64::try_from(EPOCH.get_or_init(Instant::now).elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// [`Shared::still_since`]: the client took an item since the sender last
/// looked.
const MOVED: u64 = u64::MAX;

/// What both sides of a stream channel see.
struct Shared {
    /// Cost of what is queued.
    queued: AtomicUsize,
    /// Since when the client has taken nothing, as first seen by a send to
    /// a deep queue (nanoseconds, [`now_nanos`]), or [`MOVED`]. The client
    /// only marks that it moved, so taking an item reads no clock.
    still_since: AtomicU64,
}

impl Default for Shared {
    fn default() -> Self {
        Self { queued: AtomicUsize::new(0), still_since: AtomicU64::new(MOVED) }
    }
}

/// An item that travels in a stream channel.
pub trait Queued {
    /// Bytes it holds while queued.
    fn payload_bytes(&self) -> usize;
    /// Whether it ends the stream.
    fn is_terminal(&self) -> bool;
    /// Whether it shares bytes with a larger buffer (what [`Self::compact`]
    /// would copy out).
    fn shares(&self) -> bool;
    /// Copies the bytes it shares with a larger buffer into its own.
    fn compact(&mut self);
    /// Its cost against the stream's window.
    fn cost(&self) -> usize {
        usize::try_from(flow::cost(self.payload_bytes())).unwrap_or(usize::MAX)
    }
    /// For an item that stands for several the node sent one by one, the
    /// cost of all but its last: what was queued before the last arrived
    /// is that much more than before the first.
    fn cost_ahead(&self) -> usize {
        0
    }
    /// How many of the node's items it stands for.
    fn events(&self) -> usize {
        1
    }
    /// Where its channels' queue buffers come from and go back to.
    fn spares() -> mailbox::SpareSlots<Self>
    where
        Self: Sized;
}

// A stream channel's queue is emptied and its buffer given back before the
// client waits (a paced stream holds none meanwhile); kept per core
// instead of freed, the next item of any stream here takes one again
// without an allocation.
thread_local! {
    static SPARE_TUNNEL: mailbox::Spares<TunnelItem> = const { mailbox::Spares::new() };
}

/// `parts` as one piece in memory of its own (one allocation for all).
fn joined(parts: &[Bytes]) -> Bytes {
    Bytes::from(parts.concat())
}

/// `b`, in memory of its own.
fn compacted(b: &mut Bytes) {
    if !b.is_empty() {
        *b = Bytes::copy_from_slice(b);
    }
}

impl Queued for TunnelItem {
    fn payload_bytes(&self) -> usize {
        TunnelItem::payload_bytes(self)
    }

    fn spares() -> mailbox::SpareSlots<Self> {
        mailbox::SpareSlots::new(|b| mailbox::Spares::slots(&SPARE_TUNNEL, b))
    }

    fn is_terminal(&self) -> bool {
        TunnelItem::is_terminal(self)
    }

    fn shares(&self) -> bool {
        !matches!(self, TunnelItem::End { .. } | TunnelItem::Error(_))
    }

    fn compact(&mut self) {
        match self {
            TunnelItem::Body(b) => compacted(b),
            TunnelItem::Parts(parts) => *self = TunnelItem::Body(joined(parts)),
            TunnelItem::Start { headers, .. } => headers.iter_mut().for_each(|(_, v)| compacted(v)),
            TunnelItem::Whole(w) => {
                w.headers.iter_mut().for_each(|(_, v)| compacted(v));
                if !w.body.is_empty() {
                    w.body = vec![joined(&w.body)];
                }
            }
            TunnelItem::End { .. } | TunnelItem::Error(_) => {}
        }
    }
}

/// The session's side of a stream channel.
pub struct StreamTx<T> {
    tx: mailbox::Sender<T>,
    shared: Arc<Shared>,
}

/// The client's side of a stream channel.
pub struct StreamRx<T> {
    rx: mailbox::Receiver<T>,
    shared: Arc<Shared>,
    /// Items taken from the channel at once, not yet handed out (still
    /// counted as queued).
    taken: VecDeque<T>,
    /// Cost handed out and still in the shared count (see [`Self::settle`]).
    handed: usize,
}

/// A stream's channel.
pub fn channel<T: Queued>() -> (StreamTx<T>, StreamRx<T>) {
    let (tx, rx) = mailbox::stream_mailbox_with(RUN_EVENT_CAPACITY, T::spares());
    let shared = Arc::new(Shared::default());
    (StreamTx { tx, shared: shared.clone() }, StreamRx { rx, shared, taken: VecDeque::new(), handed: 0 })
}

/// Why an item was not queued.
#[derive(Debug, PartialEq, Eq)]
pub enum Undelivered {
    /// The client is too far behind (items or bytes).
    Full,
    /// The client is gone.
    Closed,
}

impl<T: Queued> StreamTx<T> {
    /// Queues `item` unless the stream is already at its window (the node
    /// may send an item while it has credit, so what is queued before it
    /// stays below the window); `reserve` keeps that many item slots free
    /// (for the error telling why the stream failed).
    pub fn try_send(&self, item: T, reserve: usize) -> Result<(), Undelivered> {
        self.send_at(item, reserve, now_nanos)
    }

    /// [`Self::try_send`] on the clock `now` (read only for an item that
    /// shares a buffer, sent to a deep queue).
    fn send_at(&self, mut item: T, reserve: usize, now: impl Fn() -> u64) -> Result<(), Undelivered> {
        let queued = self.shared.queued.load(Ordering::Acquire);
        let size = self.admit(&mut item, reserve, queued, self.tx.len(), now)?;
        self.shared.queued.fetch_add(size, Ordering::AcqRel);
        self.tx.try_send(item).map_err(|e| {
            self.shared.queued.fetch_sub(size, Ordering::AcqRel);
            match e {
                mailbox::SendError::Full(_) => Undelivered::Full,
                mailbox::SendError::Closed(_) => Undelivered::Closed,
            }
        })
    }

    /// Whether `item` may follow `queued` cost in `len` items (see
    /// [`Self::try_send`]), compacting it for a stalled client; its cost.
    fn admit(
        &self,
        item: &mut T,
        reserve: usize,
        queued: usize,
        len: usize,
        now: impl Fn() -> u64,
    ) -> Result<usize, Undelivered> {
        if queued >= COMPACT_AFTER && item.shares() {
            let now = now();
            // The first look since the client moved starts the stall clock.
            let shared = &*self.shared;
            if let Err(since) = shared.still_since.compare_exchange(MOVED, now, Ordering::AcqRel, Ordering::Acquire) {
                if now.saturating_sub(since) > STALL.as_nanos() as u64 {
                    item.compact();
                }
            }
        }
        let over_window = queued + item.cost_ahead() >= flow::WINDOW_BYTES as usize;
        if reserve > 0 && (over_window || len + reserve >= RUN_EVENT_CAPACITY) {
            return Err(Undelivered::Full);
        }
        Ok(cost_of(item))
    }

    /// Queues a terminal item past the bounds (its reserved slot).
    pub fn send_terminal(&self, item: T) {
        let _ = self.try_send(item, 0);
    }

    /// A batch of items for this stream, staged in `staged` (empty) and
    /// queued together when the batch is dropped: one lock, one wake and
    /// one update of the queued cost for all of them. Each item is judged
    /// as [`Self::try_send`] would judge it after the ones before it.
    pub fn batch<'a>(&'a self, staged: &'a mut Vec<T>) -> Batch<'a, T> {
        staged.clear();
        let queued = self.shared.queued.load(Ordering::Acquire);
        Batch { len: self.tx.len(), closed: self.tx.is_closed(), tx: self, staged, began: queued, queued }
    }
}

/// Where a session delivers a stream's items: straight into its channel
/// (`&StreamTx`), or staged in a [`Batch`] queued at once.
pub trait Deliver<T> {
    /// Queues `item` (see [`StreamTx::try_send`]).
    fn try_send(&mut self, item: T, reserve: usize) -> Result<(), Undelivered>;
    /// Queues a terminal item past the bounds (its reserved slot).
    fn send_terminal(&mut self, item: T);
}

impl<T: Queued> Deliver<T> for &StreamTx<T> {
    fn try_send(&mut self, item: T, reserve: usize) -> Result<(), Undelivered> {
        StreamTx::try_send(self, item, reserve)
    }

    fn send_terminal(&mut self, item: T) {
        StreamTx::send_terminal(self, item);
    }
}

impl<T: Queued> Deliver<T> for Batch<'_, T> {
    fn try_send(&mut self, item: T, reserve: usize) -> Result<(), Undelivered> {
        Batch::try_send(self, item, reserve)
    }

    fn send_terminal(&mut self, item: T) {
        Batch::send_terminal(self, item);
    }
}

/// Items staged for one stream (see [`StreamTx::batch`]); queued when
/// dropped. The stream has one sender, so nothing is queued meanwhile.
pub struct Batch<'a, T: Queued> {
    tx: &'a StreamTx<T>,
    staged: &'a mut Vec<T>,
    /// Cost queued when the batch began.
    began: usize,
    /// That plus the staged items' cost.
    queued: usize,
    /// Items queued when the batch began.
    len: usize,
    /// The client was gone when the batch began (one that goes meanwhile
    /// misses the batch).
    closed: bool,
}

impl<T: Queued> Batch<'_, T> {
    /// Stages `item` (see [`StreamTx::try_send`]).
    pub fn try_send(&mut self, mut item: T, reserve: usize) -> Result<(), Undelivered> {
        if self.closed {
            return Err(Undelivered::Closed);
        }
        let size = self.tx.admit(&mut item, reserve, self.queued, self.len + self.staged.len(), now_nanos)?;
        self.queued += size;
        self.staged.push(item);
        Ok(())
    }

    /// Stages a terminal item past the bounds (its reserved slot).
    pub fn send_terminal(&mut self, item: T) {
        let _ = self.try_send(item, 0);
    }
}

impl<T: Queued> Drop for Batch<'_, T> {
    fn drop(&mut self) {
        if self.staged.is_empty() {
            return;
        }
        let shared = &*self.tx.shared;
        let size = self.queued - self.began;
        shared.queued.fetch_add(size, Ordering::AcqRel);
        // Staged within the bounds, by the only sender: it fits, unless
        // the client went meanwhile (then nothing is owed to it).
        if self.tx.tx.try_send_all(self.staged).is_err() {
            shared.queued.fetch_sub(size, Ordering::AcqRel);
            self.staged.clear();
        }
    }
}

/// An item's cost against the stream's window.
pub fn cost_of<T: Queued>(item: &T) -> usize {
    item.cost()
}

impl<T: Queued> StreamRx<T> {
    /// Gives back the queue's memory while it is empty (see
    /// [`mailbox::Receiver::shrink`]).
    pub fn shrink(&mut self) {
        self.rx.shrink();
        if self.taken.is_empty() {
            self.rx.give_back(std::mem::take(&mut self.taken));
        }
    }

    /// The node's items queued and not yet handed out (an item standing
    /// for several counted as those). Takes everything queued from the
    /// channel (one lock), as the next [`Self::try_recv`] would.
    pub fn pending(&mut self) -> usize {
        self.rx.take_all(&mut self.taken);
        self.taken.iter().map(Queued::events).sum()
    }

    /// Next item without waiting. Everything queued is taken at once (one
    /// lock for a burst) and handed out from here.
    pub fn try_recv(&mut self) -> Option<T> {
        self.try_recv_costed().map(|(item, _)| item)
    }

    /// [`Self::try_recv`], with the item's cost. The cost stays in the
    /// count the session sees until [`Self::settle`]: one atomic update
    /// per write rather than per item, on a line both cores touch.
    pub fn try_recv_costed(&mut self) -> Option<(T, usize)> {
        if self.taken.is_empty() && self.rx.take_all(&mut self.taken) > 0 {
            // The client is moving: the stall clock restarts at the next look.
            self.shared.still_since.store(MOVED, Ordering::Release);
        }
        let item = self.taken.pop_front()?;
        let cost = cost_of(&item);
        self.handed += cost;
        Some((item, cost))
    }

    /// Next item and its cost; `None` once the sender is gone and the
    /// queue is empty. The count is settled before the client waits.
    pub async fn recv_costed(&mut self) -> Option<(T, usize)> {
        if let Some(got) = self.try_recv_costed() {
            return Some(got);
        }
        self.settle();
        let item = self.rx.recv().await?;
        self.shared.still_since.store(MOVED, Ordering::Release);
        let cost = cost_of(&item);
        self.handed += cost;
        Some((item, cost))
    }

    /// Next item; `None` once the sender is gone and the queue is empty.
    pub async fn recv(&mut self) -> Option<T> {
        self.recv_costed().await.map(|(item, _)| item)
    }

    /// Takes what was handed out off the count the session judges new
    /// items by. Must come before credit for those items goes back to the
    /// node: counted any longer, a node that kept to its window would be
    /// failed for it (a slow tunnel reader was, before).
    pub fn settle(&mut self) {
        if self.handed > 0 {
            self.shared.queued.fetch_sub(std::mem::take(&mut self.handed), Ordering::AcqRel);
            self.shared.still_since.store(MOVED, Ordering::Release);
        }
    }

    /// Cost of what is queued now and not handed out (including what was
    /// taken from the channel at once).
    pub fn queued_bytes(&self) -> usize {
        self.shared.queued.load(Ordering::Acquire).saturating_sub(self.handed)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn body(item: &TunnelItem) -> &Bytes {
        match item {
            TunnelItem::Body(b) => b,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn items_share_the_read_buffer_unless_the_client_stalls() {
        let read_buffer = Bytes::from(vec![7u8; 64 * 1024]);
        let inside = |b: &Bytes| read_buffer.as_ptr_range().contains(&b.as_ptr());
        let piece = |i: usize| TunnelItem::Body(read_buffer.slice(i * 1000..(i + 1) * 1000));
        let (tx, mut rx) = channel::<TunnelItem>();
        let stall = STALL.as_nanos() as u64;
        // A burst far past COMPACT_AFTER, all within STALL: shared.
        for i in 0..40 {
            tx.send_at(piece(i), 1, || 1_000 + i as u64).unwrap();
        }
        // The client takes one item: progress, the clock restarts at the
        // next send (however late it comes).
        let first = rx.try_recv().unwrap();
        assert!(inside(body(&first)));
        tx.send_at(piece(40), 1, || 1_000_000 + stall).unwrap();
        // Within STALL of that: still shared; past it: copied.
        tx.send_at(piece(41), 1, || 1_000_000 + 2 * stall).unwrap();
        tx.send_at(piece(42), 1, || 1_000_001 + 2 * stall).unwrap();
        let mut got = Vec::new();
        while let Some(item) = rx.try_recv() {
            got.push(item);
        }
        assert_eq!(got.len(), 42);
        assert!(got[..41].iter().all(|i| inside(body(i))), "burst and in-time items share the buffer");
        assert!(!inside(body(&got[41])), "an item sent to a stalled client is compacted");
        assert_eq!(&body(&got[41])[..], &read_buffer[42_000..43_000]);
        // Drained: shallow again, shared whatever the clock says.
        tx.send_at(piece(43), 1, || u64::MAX).unwrap();
        assert!(inside(body(&rx.try_recv().unwrap())));
    }
}
