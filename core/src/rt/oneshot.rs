//! A one-value channel that works across threads (replies to cross-core
//! requests, results from the blocking thread). Cold path: a small lock.

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use atomic_waker::AtomicWaker;
use parking_lot::Mutex;

enum Slot<T> {
    Empty,
    Full(T),
    Taken,
    SenderGone,
}

struct Inner<T> {
    slot: Mutex<Slot<T>>,
    waker: AtomicWaker,
}

/// Sends the value.
pub struct OneshotSender<T> {
    inner: Option<Arc<Inner<T>>>,
}

/// Receives the value; resolves to `None` if the sender was dropped unsent.
pub struct OneshotReceiver<T> {
    inner: Arc<Inner<T>>,
}

/// A new one-value channel.
pub fn oneshot<T>() -> (OneshotSender<T>, OneshotReceiver<T>) {
    let inner = Arc::new(Inner { slot: Mutex::new(Slot::Empty), waker: AtomicWaker::new() });
    (OneshotSender { inner: Some(inner.clone()) }, OneshotReceiver { inner })
}

impl<T> OneshotSender<T> {
    /// Delivers the value (dropped if the receiver is gone).
    pub fn send(mut self, value: T) {
        if let Some(inner) = self.inner.take() {
            *inner.slot.lock() = Slot::Full(value);
            inner.waker.wake();
        }
    }
}

impl<T> Drop for OneshotSender<T> {
    fn drop(&mut self) {
        if let Some(inner) = self.inner.take() {
            let mut slot = inner.slot.lock();
            if matches!(*slot, Slot::Empty) {
                *slot = Slot::SenderGone;
            }
            drop(slot);
            inner.waker.wake();
        }
    }
}

impl<T> Future for OneshotReceiver<T> {
    type Output = Option<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        self.inner.waker.register(cx.waker());
        let mut slot = self.inner.slot.lock();
        match std::mem::replace(&mut *slot, Slot::Taken) {
            Slot::Full(v) => Poll::Ready(Some(v)),
            Slot::Empty => {
                *slot = Slot::Empty;
                Poll::Pending
            }
            Slot::Taken | Slot::SenderGone => Poll::Ready(None),
        }
    }
}
