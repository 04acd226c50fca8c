//! The channel between a node session and the client task of one run or
//! tunnel. It counts the cost of what is queued (see [`iop_core::flow`]):
//! a node that respects the stream's credit window never fills it, so a
//! full channel means the node broke the window, and that stream alone
//! fails (`slow_consumer`) instead of stalling the node connection.

use std::sync::{
    atomic::{AtomicUsize, Ordering},
    Arc,
};

use iop_core::{exec::ExecEvent, flow, rt::mailbox, tunnel::TunnelItem};

/// Capacity of one stream's mailbox, in items: everything the window
/// allows, plus room for the terminal (memory is allocated as it fills).
pub const RUN_EVENT_CAPACITY: usize = flow::MAX_QUEUED_ITEMS + 8;

/// An item that travels in a stream channel.
pub trait Queued {
    /// Bytes it holds while queued.
    fn payload_bytes(&self) -> usize;
    /// Whether it ends the stream.
    fn is_terminal(&self) -> bool;
}

impl Queued for ExecEvent {
    fn payload_bytes(&self) -> usize {
        ExecEvent::payload_bytes(self)
    }

    fn is_terminal(&self) -> bool {
        ExecEvent::is_terminal(self)
    }
}

impl Queued for TunnelItem {
    fn payload_bytes(&self) -> usize {
        TunnelItem::payload_bytes(self)
    }

    fn is_terminal(&self) -> bool {
        TunnelItem::is_terminal(self)
    }
}

/// The session's side of a stream channel.
pub struct StreamTx<T> {
    tx: mailbox::Sender<T>,
    queued: Arc<AtomicUsize>,
}

/// The client's side of a stream channel.
pub struct StreamRx<T> {
    rx: mailbox::Receiver<T>,
    queued: Arc<AtomicUsize>,
}

/// A stream's channel.
pub fn channel<T>() -> (StreamTx<T>, StreamRx<T>) {
    let (tx, rx) = mailbox::mailbox(RUN_EVENT_CAPACITY);
    let queued = Arc::new(AtomicUsize::new(0));
    (StreamTx { tx, queued: queued.clone() }, StreamRx { rx, queued })
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
        let size = cost_of(&item);
        let queued = self.queued.load(Ordering::Acquire);
        let over_window = queued >= flow::WINDOW_BYTES as usize;
        if reserve > 0 && (over_window || self.tx.len() + reserve >= RUN_EVENT_CAPACITY) {
            return Err(Undelivered::Full);
        }
        self.queued.fetch_add(size, Ordering::AcqRel);
        self.tx.try_send(item).map_err(|e| {
            self.queued.fetch_sub(size, Ordering::AcqRel);
            match e {
                mailbox::SendError::Full(_) => Undelivered::Full,
                mailbox::SendError::Closed(_) => Undelivered::Closed,
            }
        })
    }

    /// Queues a terminal item past the bounds (its reserved slot).
    pub fn send_terminal(&self, item: T) {
        let _ = self.try_send(item, 0);
    }
}

/// An item's cost against the stream's window.
pub fn cost_of<T: Queued>(item: &T) -> usize {
    usize::try_from(flow::cost(item.payload_bytes())).unwrap_or(usize::MAX)
}

impl<T: Queued> StreamRx<T> {
    /// Next item without waiting.
    pub fn try_recv(&self) -> Option<T> {
        let item = self.rx.try_recv()?;
        self.queued.fetch_sub(cost_of(&item), Ordering::AcqRel);
        Some(item)
    }

    /// Next item; `None` once the sender is gone and the queue is empty.
    pub async fn recv(&self) -> Option<T> {
        let item = self.rx.recv().await?;
        self.queued.fetch_sub(cost_of(&item), Ordering::AcqRel);
        Some(item)
    }

    /// Cost of what is queued now.
    pub fn queued_bytes(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }
}
