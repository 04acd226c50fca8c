//! Single-thread signals for tasks on one reactor: a cancel flag a task can
//! await, and a notify that wakes one waiting task.

use std::{
    cell::{Cell, RefCell},
    future::poll_fn,
    rc::Rc,
    task::{Poll, Waker},
};

/// A cancellation flag shared by the tasks of one core. Cloning shares it.
#[derive(Clone, Default)]
pub struct LocalCancel {
    inner: Rc<CancelInner>,
}

#[derive(Default)]
struct CancelInner {
    cancelled: Cell<bool>,
    waiters: RefCell<Vec<Waker>>,
}

impl LocalCancel {
    /// A flag not yet raised.
    pub fn new() -> Self {
        Self::default()
    }

    /// Raises the flag and wakes every waiter. Idempotent.
    pub fn cancel(&self) {
        if !self.inner.cancelled.replace(true) {
            for w in self.inner.waiters.take() {
                w.wake();
            }
        }
    }

    /// Whether the flag is raised.
    pub fn is_cancelled(&self) -> bool {
        self.inner.cancelled.get()
    }

    /// Resolves once the flag is raised.
    pub async fn cancelled(&self) {
        poll_fn(|cx| {
            if self.inner.cancelled.get() {
                Poll::Ready(())
            } else {
                let mut ws = self.inner.waiters.borrow_mut();
                if !ws.iter().any(|w| w.will_wake(cx.waker())) {
                    ws.push(cx.waker().clone());
                }
                Poll::Pending
            }
        })
        .await
    }
}

/// Wakes one task that waits for "something changed" (single waiter).
#[derive(Clone, Default)]
pub struct LocalNotify {
    inner: Rc<NotifyInner>,
}

#[derive(Default)]
struct NotifyInner {
    pending: Cell<bool>,
    waker: Cell<Option<Waker>>,
}

impl LocalNotify {
    /// A notify with nothing pending.
    pub fn new() -> Self {
        Self::default()
    }

    /// Marks a change and wakes the waiter, if any.
    pub fn notify(&self) {
        self.inner.pending.set(true);
        if let Some(w) = self.inner.waker.take() {
            w.wake();
        }
    }

    /// Resolves at the next (or an already pending) notification.
    pub async fn notified(&self) {
        poll_fn(|cx| {
            if self.inner.pending.replace(false) {
                Poll::Ready(())
            } else {
                self.inner.waker.set(Some(cx.waker().clone()));
                Poll::Pending
            }
        })
        .await
    }
}
