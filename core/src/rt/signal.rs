//! Signals for tasks: on one reactor, a cancel flag a task can await and a
//! notify that wakes one waiting task; across reactors, a cancel flag that
//! another core raises ([`SharedCancel`]).

use std::{
    cell::{Cell, RefCell},
    future::{poll_fn, Future},
    pin::Pin,
    rc::Rc,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    task::{Context, Poll, Waker},
};

use atomic_waker::AtomicWaker;

/// A cancellation flag shared by the tasks of one core. Cloning shares it.
#[derive(Clone, Default)]
pub struct LocalCancel {
    inner: Rc<CancelInner>,
}

#[derive(Default)]
struct CancelInner {
    cancelled: Cell<bool>,
    waiters: RefCell<Waiters>,
}

/// One slot per waiting [`Cancelled`] future, freed when it is dropped, so
/// the list holds only live waiters however often they are polled or
/// re-created (a loop that selects on the flag makes one per iteration).
#[derive(Default)]
struct Waiters {
    slots: Vec<Option<Waker>>,
    free: Vec<usize>,
}

impl Waiters {
    fn insert(&mut self, w: Waker) -> usize {
        match self.free.pop() {
            Some(i) if i < self.slots.len() => {
                self.slots[i] = Some(w);
                i
            }
            _ => {
                self.slots.push(Some(w));
                self.slots.len() - 1
            }
        }
    }

    fn remove(&mut self, i: usize) {
        if let Some(slot) = self.slots.get_mut(i) {
            if slot.take().is_some() {
                self.free.push(i);
            }
        }
    }
}

impl LocalCancel {
    /// A flag not yet raised.
    pub fn new() -> Self {
        Self::default()
    }

    /// Raises the flag and wakes every waiter. Idempotent.
    pub fn cancel(&self) {
        if !self.inner.cancelled.replace(true) {
            let waiters = self.inner.waiters.take();
            for w in waiters.slots.into_iter().flatten() {
                w.wake();
            }
        }
    }

    /// Whether the flag is raised.
    pub fn is_cancelled(&self) -> bool {
        self.inner.cancelled.get()
    }

    /// Resolves once the flag is raised.
    pub fn cancelled(&self) -> Cancelled<'_> {
        Cancelled { inner: &self.inner, slot: None }
    }

    /// Waiters registered now (for tests).
    #[cfg(test)]
    fn waiters(&self) -> usize {
        self.inner.waiters.borrow().slots.iter().filter(|s| s.is_some()).count()
    }
}

/// Future returned by [`LocalCancel::cancelled`].
pub struct Cancelled<'a> {
    inner: &'a CancelInner,
    slot: Option<usize>,
}

impl Future for Cancelled<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.inner.cancelled.get() {
            return Poll::Ready(());
        }
        let mut waiters = self.inner.waiters.borrow_mut();
        let registered = self.slot.and_then(|i| waiters.slots.get_mut(i)).and_then(Option::as_mut);
        match registered {
            // `will_wake` may say no for the same task (a waker and its
            // clone can carry different vtables): then it is replaced in
            // place, never added.
            Some(w) if w.will_wake(cx.waker()) => {}
            Some(w) => *w = cx.waker().clone(),
            None => {
                let i = waiters.insert(cx.waker().clone());
                drop(waiters);
                self.slot = Some(i);
            }
        }
        Poll::Pending
    }
}

impl Drop for Cancelled<'_> {
    fn drop(&mut self) {
        if let Some(i) = self.slot {
            if let Ok(mut waiters) = self.inner.waiters.try_borrow_mut() {
                waiters.remove(i);
            }
        }
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

/// A cancellation flag any thread may raise, awaited by one task (on
/// whichever core owns it): monoio's `sync` feature makes its waker callable
/// from another thread. Cloning shares it.
#[derive(Clone, Default, Debug)]
pub struct SharedCancel {
    inner: Arc<SharedInner>,
}

#[derive(Default, Debug)]
struct SharedInner {
    cancelled: AtomicBool,
    waker: AtomicWaker,
}

impl SharedCancel {
    /// A flag not yet raised.
    pub fn new() -> Self {
        Self::default()
    }

    /// Raises the flag and wakes the waiting task, if any. Idempotent.
    pub fn cancel(&self) {
        if !self.inner.cancelled.swap(true, Ordering::AcqRel) {
            self.inner.waker.wake();
        }
    }

    /// Whether the flag is raised.
    pub fn is_cancelled(&self) -> bool {
        self.inner.cancelled.load(Ordering::Acquire)
    }

    /// Resolves once the flag is raised. One waiter at a time: a second
    /// task awaiting the same flag would take the first one's waker.
    pub async fn cancelled(&self) {
        poll_fn(|cx| {
            if self.is_cancelled() {
                return Poll::Ready(());
            }
            self.inner.waker.register(cx.waker());
            // Raised between the check and the registration: seen now.
            if self.is_cancelled() {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn shared_cancel_wakes_a_task_from_another_thread() {
        let flag = SharedCancel::new();
        let raiser = flag.clone();
        crate::rt::block_on_current(async move {
            let t = std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(20));
                raiser.cancel();
                raiser.cancel();
            });
            flag.cancelled().await;
            assert!(flag.is_cancelled());
            // Raised already: resolves at once.
            flag.cancelled().await;
            t.join().unwrap();
        })
        .unwrap();
    }

    #[test]
    fn waiters_are_only_the_live_ones() {
        crate::rt::block_on_current(async {
            let cancel = LocalCancel::new();
            // A loop that selects on the flag, as sessions and accept loops do.
            for _ in 0..1000 {
                monoio::select! {
                    _ = cancel.cancelled() => unreachable!(),
                    _ = crate::rt::yield_now() => {}
                }
            }
            assert_eq!(cancel.waiters(), 0, "dropped futures leave no waker behind");
            let mut held = std::pin::pin!(cancel.cancelled());
            for _ in 0..1000 {
                let polled = std::future::poll_fn(|cx| Poll::Ready(held.as_mut().poll(cx))).await;
                assert!(polled.is_pending());
            }
            assert_eq!(cancel.waiters(), 1, "polling again replaces, never adds");
            let c2 = cancel.clone();
            let task = monoio::spawn(async move { c2.cancelled().await });
            crate::rt::yield_now().await;
            assert_eq!(cancel.waiters(), 2);
            cancel.cancel();
            task.await;
            held.as_mut().await;
        })
        .unwrap();
    }
}
