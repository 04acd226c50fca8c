//! A queued request: one shared slot registered in the FIFO of every
//! candidate's owner core. The first owner that can switch it from
//! `Waiting` to `Granted` deposits a lease; everyone else skips it.

use std::{
    future::poll_fn,
    sync::atomic::{AtomicIsize, AtomicU8, Ordering},
    task::{Context, Poll},
};

use atomic_waker::AtomicWaker;
use parking_lot::Mutex;

use super::{Lease, LeaseClass};

/// Where a waiter stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum WaiterState {
    /// In the queues.
    Waiting = 0,
    /// An owner granted a lease.
    Granted = 1,
    /// The client left or timed out.
    Cancelled = 2,
    /// Every candidate went offline.
    Unavailable = 3,
}

impl WaiterState {
    fn from_u8(v: u8) -> Self {
        match v {
            0 => WaiterState::Waiting,
            1 => WaiterState::Granted,
            2 => WaiterState::Cancelled,
            _ => WaiterState::Unavailable,
        }
    }
}

#[derive(Default)]
struct Slot {
    lease: Option<Lease>,
    abandoned: bool,
}

/// One queued request.
pub struct Waiter {
    state: AtomicU8,
    /// Capacity pool requested.
    pub class: LeaseClass,
    /// Arrival order (global), for logs and tests.
    pub seq: u64,
    /// Candidates that could still serve it; at 0 it ends as unavailable.
    live: AtomicIsize,
    slot: Mutex<Slot>,
    waker: AtomicWaker,
}

impl Waiter {
    /// A waiter for `candidates` resources.
    pub fn new(class: LeaseClass, seq: u64, candidates: usize) -> Self {
        Self {
            state: AtomicU8::new(WaiterState::Waiting as u8),
            class,
            seq,
            live: AtomicIsize::new(candidates as isize),
            slot: Mutex::new(Slot::default()),
            waker: AtomicWaker::new(),
        }
    }

    /// Current state.
    pub fn state(&self) -> WaiterState {
        WaiterState::from_u8(self.state.load(Ordering::Acquire))
    }

    /// Still queued.
    pub fn is_waiting(&self) -> bool {
        self.state() == WaiterState::Waiting
    }

    fn transition(&self, to: WaiterState) -> bool {
        self.state.compare_exchange(WaiterState::Waiting as u8, to as u8, Ordering::AcqRel, Ordering::Acquire).is_ok()
    }

    /// Owner side: claims the waiter for a grant. On success the caller must
    /// then `deposit` a lease.
    pub fn try_claim(&self) -> bool {
        self.transition(WaiterState::Granted)
    }

    /// Owner side: hands the lease over (or drops it, releasing the
    /// capacity, if the client already left).
    pub fn deposit(&self, lease: Lease) {
        let mut slot = self.slot.lock();
        if slot.abandoned {
            drop(slot);
            drop(lease);
        } else {
            slot.lease = Some(lease);
            drop(slot);
        }
        self.waker.wake();
    }

    /// Owner side: one candidate went offline (`false`) or came back (`true`).
    /// Ends the waiter as unavailable when no candidate is left.
    pub fn candidate_changed(&self, online: bool) {
        if online {
            self.live.fetch_add(1, Ordering::AcqRel);
        } else if self.live.fetch_sub(1, Ordering::AcqRel) <= 1 && self.transition(WaiterState::Unavailable) {
            self.waker.wake();
        }
    }

    /// Client side: waits for the outcome. `Ok(lease)` when granted,
    /// `Err(state)` when it ended otherwise.
    pub async fn outcome(&self) -> Result<Lease, WaiterState> {
        poll_fn(|cx| self.poll_outcome(cx)).await
    }

    /// Client side: the outcome if there is one, else `cx` is woken when
    /// there is (what [`Self::outcome`] awaits; the simulation polls it).
    pub fn poll_outcome(&self, cx: &mut Context<'_>) -> Poll<Result<Lease, WaiterState>> {
        self.waker.register(cx.waker());
        match self.state() {
            WaiterState::Waiting => Poll::Pending,
            WaiterState::Granted => match self.slot.lock().lease.take() {
                Some(l) => Poll::Ready(Ok(l)),
                // Claimed; the owner deposits right after and wakes us.
                None => Poll::Pending,
            },
            other => Poll::Ready(Err(other)),
        }
    }

    /// Client side: gives up (timeout, client gone). A lease granted in the
    /// meantime is released, now or when the owner deposits it.
    pub fn abandon(&self) {
        if self.transition(WaiterState::Cancelled) {
            self.waker.wake();
            return;
        }
        let mut slot = self.slot.lock();
        slot.abandoned = true;
        let lease = slot.lease.take();
        drop(slot);
        drop(lease);
    }
}
