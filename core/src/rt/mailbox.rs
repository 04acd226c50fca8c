//! Bounded multi-producer single-consumer mailbox that works across cores:
//! a queue with an atomic length bound, plus an `AtomicWaker` (monoio's
//! `sync` feature makes wakers callable from other threads). Also used
//! within one core, where it costs only a few atomics.
//!
//! Two queues: [`mailbox`] is crossbeam's lock-free `SegQueue` (segments
//! allocated as it fills), for the few long-lived, busy core inboxes.
//! [`stream_mailbox`] is a short-held lock around a `VecDeque` whose memory
//! follows what is queued and is given back once drained, for the one every
//! open stream has: a segment queue keeps a 31-slot block per queue even
//! when empty, which was most of an idle stream's memory. A stream queue
//! may draw its buffer from, and give it back to, a few empty ones kept
//! per thread ([`Spares`]): a paced stream, emptied and given back before
//! every wait, then takes no allocation per item.

use std::{
    cell::RefCell,
    collections::VecDeque,
    future::Future,
    pin::Pin,
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc,
    },
    task::{Context, Poll, Waker},
};

use atomic_waker::AtomicWaker;
use crossbeam_queue::SegQueue;
use parking_lot::Mutex;

/// A drained stream queue holding more slots than this gives them back
/// (a burst); a paced stream's receiver gives back the rest with
/// [`Receiver::shrink`] before it waits.
const KEEP_SLOTS: usize = 16;

/// Slots a receiver's emptied buffer may keep when [`Receiver::take_all`]
/// swaps it in as the queue: a busy stream's bursts then reuse the same two
/// buffers instead of growing one from nothing per burst.
const KEEP_SWAPPED_SLOTS: usize = 128;

/// Empty stream-queue buffers kept on one thread, for the next queue that
/// needs one there (declare one per item type with `thread_local!`). At
/// most [`SPARE_BUFFERS`] of at most [`KEEP_SLOTS`] slots each: a bounded
/// few per core, not per stream.
pub struct Spares<T>(RefCell<Vec<VecDeque<T>>>);

impl<T> Spares<T> {
    /// None kept yet.
    pub const fn new() -> Self {
        Self(RefCell::new(Vec::new()))
    }
}

impl<T> Default for Spares<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// Empty buffers a thread keeps at most.
pub const SPARE_BUFFERS: usize = 32;

impl<T: 'static> Spares<T> {
    /// An empty buffer from this thread's spares `key`, if one is kept.
    pub fn take(key: &'static std::thread::LocalKey<Self>) -> Option<VecDeque<T>> {
        key.try_with(|s| s.0.try_borrow_mut().ok()?.pop()).ok().flatten()
    }

    /// Keeps the empty buffer `buf` in this thread's spares `key` if it is
    /// small and there is room; frees it otherwise.
    pub fn give(key: &'static std::thread::LocalKey<Self>, buf: VecDeque<T>) {
        if buf.capacity() == 0 || buf.capacity() > KEEP_SLOTS || !buf.is_empty() {
            return;
        }
        let mut buf = Some(buf);
        let _ = key.try_with(|s| {
            if let Ok(mut spares) = s.0.try_borrow_mut() {
                if spares.len() < SPARE_BUFFERS {
                    spares.extend(buf.take());
                }
            }
        });
    }
}

/// Where a stream queue takes its buffers from and gives them back to:
/// the calling thread's [`Spares`] of its item type, through one function
/// (so a queue of any item type can hold it, in one word: every stream
/// has a queue). Given `Some` empty buffer it keeps (or frees) it and
/// answers `None`; given `None` it answers a kept buffer, if any.
pub struct SpareSlots<T>(fn(Option<VecDeque<T>>) -> Option<VecDeque<T>>);

impl<T> SpareSlots<T> {
    /// Buffers taken and given back by `f` (usually [`Spares::slots`] of
    /// one `thread_local!`).
    pub const fn new(f: fn(Option<VecDeque<T>>) -> Option<VecDeque<T>>) -> Self {
        Self(f)
    }
}

impl<T: 'static> Spares<T> {
    /// What [`SpareSlots::new`] takes, for the spares `key`: a kept buffer
    /// for `None`, and `Some` buffer kept.
    pub fn slots(key: &'static std::thread::LocalKey<Self>, buf: Option<VecDeque<T>>) -> Option<VecDeque<T>> {
        match buf {
            None => Self::take(key),
            Some(buf) => {
                Self::give(key, buf);
                None
            }
        }
    }
}

impl<T> Clone for SpareSlots<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for SpareSlots<T> {}

impl<T> SpareSlots<T> {
    /// No spares: nothing kept, every buffer freed.
    fn none() -> Self {
        Self(|_| None)
    }
}

/// An empty buffer from `spares`, if one is kept.
fn take_spare<T>(spares: SpareSlots<T>) -> Option<VecDeque<T>> {
    (spares.0)(None)
}

/// Gives `buf` back to `spares` (or frees it).
fn give_spare<T>(spares: SpareSlots<T>, buf: VecDeque<T>) {
    (spares.0)(Some(buf));
}

enum Queue<T> {
    /// Boxed: its two cache-padded ends would make every stream's mailbox
    /// a quarter KiB larger.
    Segments(Box<SegQueue<T>>),
    /// With the thread-local spares its buffers come from and go back to.
    Deque(Mutex<VecDeque<T>>, SpareSlots<T>),
}

impl<T> Queue<T> {
    /// Gives back an empty deque's slots.
    fn shrink(&self) {
        if let Queue::Deque(q, spares) = self {
            let mut q = q.lock();
            if q.is_empty() && q.capacity() > 0 {
                give_spare(*spares, std::mem::take(&mut *q));
            }
        }
    }

    fn push(&self, msg: T) {
        match self {
            Queue::Segments(q) => q.push(msg),
            Queue::Deque(q, spares) => {
                let mut q = q.lock();
                if q.capacity() == 0 {
                    if let Some(buf) = take_spare(*spares) {
                        *q = buf;
                    }
                }
                q.push_back(msg);
            }
        }
    }

    /// Moves every message of `msgs` to the back, in order.
    fn push_all(&self, msgs: &mut Vec<T>) {
        match self {
            Queue::Segments(q) => msgs.drain(..).for_each(|m| q.push(m)),
            Queue::Deque(q, spares) => {
                let mut q = q.lock();
                if q.capacity() == 0 {
                    if let Some(buf) = take_spare(*spares) {
                        *q = buf;
                    }
                }
                q.extend(msgs.drain(..));
            }
        }
    }

    /// The spares this queue's buffers go back to.
    fn spares(&self) -> SpareSlots<T> {
        match self {
            Queue::Segments(_) => SpareSlots::none(),
            Queue::Deque(_, spares) => *spares,
        }
    }

    /// Moves everything queued to the back of `into`; an empty `into` is
    /// swapped in as the queue (no move per message). Returns how many.
    fn take_all(&self, into: &mut VecDeque<T>) -> usize {
        let before = into.len();
        match self {
            Queue::Segments(q) => {
                while let Some(m) = q.pop() {
                    into.push_back(m);
                }
            }
            Queue::Deque(q, _) => {
                let mut q = q.lock();
                if into.is_empty() {
                    std::mem::swap(&mut *q, into);
                    if q.capacity() > KEEP_SWAPPED_SLOTS {
                        *q = VecDeque::new();
                    }
                } else {
                    into.extend(q.drain(..));
                }
            }
        }
        into.len() - before
    }

    fn pop(&self) -> Option<T> {
        match self {
            Queue::Segments(q) => q.pop(),
            Queue::Deque(q, _) => {
                let mut q = q.lock();
                let msg = q.pop_front();
                if q.is_empty() && q.capacity() > KEEP_SLOTS {
                    *q = VecDeque::new();
                }
                msg
            }
        }
    }

    fn clear(&self) {
        match self {
            Queue::Segments(q) => while q.pop().is_some() {},
            Queue::Deque(q, _) => {
                let queued = std::mem::take(&mut *q.lock());
                drop(queued); // outside the lock
            }
        }
    }
}

struct Inner<T> {
    queue: Queue<T>,
    len: AtomicUsize,
    capacity: usize,
    recv_waker: AtomicWaker,
    senders: AtomicUsize,
    receiver_alive: AtomicBool,
    // Senders waiting for room; touched only when the queue was full.
    space_waiters: Mutex<Vec<Waker>>,
    has_space_waiters: AtomicBool,
}

/// Why a message could not be sent; the message is handed back.
#[derive(Debug, PartialEq, Eq)]
pub enum SendError<T> {
    /// The queue is at capacity.
    Full(T),
    /// The receiver is gone.
    Closed(T),
}

impl<T> SendError<T> {
    /// The message that was not sent.
    pub fn into_inner(self) -> T {
        match self {
            SendError::Full(v) | SendError::Closed(v) => v,
        }
    }
}

/// Sending side; cheap to clone, `Send` when `T` is.
pub struct Sender<T> {
    inner: Arc<Inner<T>>,
}

/// Receiving side.
pub struct Receiver<T> {
    inner: Arc<Inner<T>>,
}

/// A mailbox holding at most `capacity` messages (lock-free segments).
pub fn mailbox<T>(capacity: usize) -> (Sender<T>, Receiver<T>) {
    with_queue(Queue::Segments(Box::new(SegQueue::new())), capacity)
}

/// A mailbox holding at most `capacity` messages whose memory follows what
/// is queued (see the module docs).
pub fn stream_mailbox<T>(capacity: usize) -> (Sender<T>, Receiver<T>) {
    with_queue(Queue::Deque(Mutex::new(VecDeque::new()), SpareSlots::none()), capacity)
}

/// [`stream_mailbox`] whose buffers come from and go back to `spares`
/// (the sending and the receiving thread's own).
pub fn stream_mailbox_with<T>(capacity: usize, spares: SpareSlots<T>) -> (Sender<T>, Receiver<T>) {
    with_queue(Queue::Deque(Mutex::new(VecDeque::new()), spares), capacity)
}

fn with_queue<T>(queue: Queue<T>, capacity: usize) -> (Sender<T>, Receiver<T>) {
    let inner = Arc::new(Inner {
        queue,
        len: AtomicUsize::new(0),
        capacity: capacity.max(1),
        recv_waker: AtomicWaker::new(),
        senders: AtomicUsize::new(1),
        receiver_alive: AtomicBool::new(true),
        space_waiters: Mutex::new(Vec::new()),
        has_space_waiters: AtomicBool::new(false),
    });
    (Sender { inner: inner.clone() }, Receiver { inner })
}

impl<T> Sender<T> {
    /// Sends without waiting.
    pub fn try_send(&self, msg: T) -> Result<(), SendError<T>> {
        if !self.inner.receiver_alive.load(Ordering::Acquire) {
            return Err(SendError::Closed(msg));
        }
        // Reserve a slot first so concurrent senders never exceed the bound.
        if self.inner.len.fetch_add(1, Ordering::AcqRel) >= self.inner.capacity {
            self.inner.len.fetch_sub(1, Ordering::AcqRel);
            return Err(SendError::Full(msg));
        }
        self.inner.queue.push(msg);
        self.inner.recv_waker.wake();
        Ok(())
    }

    /// Sends every message of `msgs` at once (one lock, one wake), leaving
    /// it empty; all or none: if they do not all fit, none is sent and
    /// `msgs` is left as it was.
    pub fn try_send_all(&self, msgs: &mut Vec<T>) -> Result<(), SendError<()>> {
        let n = msgs.len();
        if n == 0 {
            return Ok(());
        }
        if !self.inner.receiver_alive.load(Ordering::Acquire) {
            return Err(SendError::Closed(()));
        }
        if self.inner.len.fetch_add(n, Ordering::AcqRel) + n > self.inner.capacity {
            self.inner.len.fetch_sub(n, Ordering::AcqRel);
            return Err(SendError::Full(()));
        }
        self.inner.queue.push_all(msgs);
        self.inner.recv_waker.wake();
        Ok(())
    }

    /// Sends, waiting for room while the queue is full.
    pub async fn send(&self, msg: T) -> Result<(), T> {
        let mut slot = Some(msg);
        std::future::poll_fn(|cx| {
            let Some(msg) = slot.take() else { return Poll::Ready(Ok(())) };
            match self.try_send(msg) {
                Ok(()) => Poll::Ready(Ok(())),
                Err(SendError::Closed(m)) => Poll::Ready(Err(m)),
                Err(SendError::Full(m)) => {
                    self.inner.space_waiters.lock().push(cx.waker().clone());
                    self.inner.has_space_waiters.store(true, Ordering::Release);
                    // Room may have appeared before we registered.
                    match self.try_send(m) {
                        Ok(()) => Poll::Ready(Ok(())),
                        Err(SendError::Closed(m)) => Poll::Ready(Err(m)),
                        Err(SendError::Full(m)) => {
                            slot = Some(m);
                            Poll::Pending
                        }
                    }
                }
            }
        })
        .await
    }

    /// The receiver was dropped.
    pub fn is_closed(&self) -> bool {
        !self.inner.receiver_alive.load(Ordering::Acquire)
    }

    /// Messages waiting (including sends in progress).
    pub fn len(&self) -> usize {
        self.inner.len.load(Ordering::Acquire)
    }

    /// No message waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        self.inner.senders.fetch_add(1, Ordering::Relaxed);
        Self { inner: self.inner.clone() }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        if self.inner.senders.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.inner.recv_waker.wake();
        }
    }
}

impl<T> Receiver<T> {
    /// Gives back the memory of an empty stream queue (for a receiver about
    /// to wait long: a paced stream holds none meanwhile).
    pub fn shrink(&self) {
        self.inner.queue.shrink();
    }

    /// Gives back the memory of `buf`, an emptied buffer the receiver held
    /// (to this thread's spares, if the queue draws on them).
    pub fn give_back(&self, buf: VecDeque<T>) {
        give_spare(self.inner.queue.spares(), buf);
    }

    /// Messages waiting (including sends in progress).
    pub fn len(&self) -> usize {
        self.inner.len.load(Ordering::Acquire)
    }

    /// No message waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Next message without waiting.
    pub fn try_recv(&self) -> Option<T> {
        let msg = self.inner.queue.pop();
        if msg.is_some() {
            self.inner.len.fetch_sub(1, Ordering::AcqRel);
            self.wake_space_waiters();
        }
        msg
    }

    /// Moves every queued message to the back of `into` at once (one lock;
    /// for a stream queue, an empty `into` is swapped with the queue);
    /// returns how many.
    pub fn take_all(&self, into: &mut VecDeque<T>) -> usize {
        let n = self.inner.queue.take_all(into);
        if n > 0 {
            self.inner.len.fetch_sub(n, Ordering::AcqRel);
            self.wake_space_waiters();
        }
        n
    }

    /// Next message; `None` once every sender is gone and the queue is empty.
    pub fn recv(&self) -> Recv<'_, T> {
        Recv { rx: self }
    }

    fn wake_space_waiters(&self) {
        if self.inner.has_space_waiters.swap(false, Ordering::AcqRel) {
            let waiters = std::mem::take(&mut *self.inner.space_waiters.lock());
            for w in waiters {
                w.wake();
            }
        }
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        self.inner.receiver_alive.store(false, Ordering::Release);
        self.wake_space_waiters();
        // Drop queued messages now so resources they own are released.
        self.inner.queue.clear();
    }
}

/// Future returned by [`Receiver::recv`].
pub struct Recv<'a, T> {
    rx: &'a Receiver<T>,
}

impl<T> Future for Recv<'_, T> {
    type Output = Option<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let rx = self.rx;
        if let Some(m) = rx.try_recv() {
            return Poll::Ready(Some(m));
        }
        rx.inner.recv_waker.register(cx.waker());
        if let Some(m) = rx.try_recv() {
            return Poll::Ready(Some(m));
        }
        if rx.inner.senders.load(Ordering::Acquire) == 0 {
            return Poll::Ready(rx.try_recv());
        }
        Poll::Pending
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    type Make = fn(usize) -> (Sender<u64>, Receiver<u64>);

    fn both() -> [Make; 2] {
        [mailbox::<u64>, stream_mailbox::<u64>]
    }

    #[test]
    fn a_stream_queue_is_no_larger_for_its_spares() {
        // Every open stream has one: the spares' function fits in what the
        // queue's layout had room for.
        assert_eq!(std::mem::size_of::<Queue<u64>>(), 48);
        assert_eq!(std::mem::size_of::<Inner<u64>>(), 136);
    }

    #[test]
    fn full_and_closed() {
        for make in both() {
            full_and_closed_with(make);
        }
    }

    fn full_and_closed_with(make: Make) {
        let (tx, rx) = make(2);
        tx.try_send(1).unwrap();
        tx.try_send(2).unwrap();
        assert_eq!(tx.try_send(3), Err(SendError::Full(3)));
        assert_eq!(rx.try_recv(), Some(1));
        drop(rx);
        assert_eq!(tx.try_send(4), Err(SendError::Closed(4)));
    }

    #[test]
    fn stream_queue_gives_back_a_drained_burst() {
        let (tx, rx) = stream_mailbox::<u64>(1024);
        let capacity = |rx: &Receiver<u64>| match &rx.inner.queue {
            Queue::Deque(q, _) => q.lock().capacity(),
            Queue::Segments(_) => unreachable!(),
        };
        for i in 0..500 {
            tx.try_send(i).unwrap();
        }
        assert!(capacity(&rx) >= 500);
        for i in 0..500 {
            assert_eq!(rx.try_recv(), Some(i), "in order");
        }
        assert_eq!(capacity(&rx), 0, "drained: memory given back");
        tx.try_send(7).unwrap();
        assert_eq!(rx.try_recv(), Some(7));
        assert!(capacity(&rx) <= KEEP_SLOTS, "a trickle keeps a few slots");
    }

    thread_local! {
        static SPARES: Spares<u64> = const { Spares::new() };
    }

    fn spares_kept() -> usize {
        SPARES.with(|s| s.0.borrow().len())
    }

    #[test]
    fn a_paced_stream_reuses_its_threads_spare_buffers() {
        let slots = SpareSlots::new(|b| Spares::slots(&SPARES, b));
        let (tx, rx) = stream_mailbox_with::<u64>(1024, slots);
        let mut taken = VecDeque::new();
        tx.try_send(1).unwrap();
        let first = match &rx.inner.queue {
            Queue::Deque(q, _) => q.lock().as_slices().0.as_ptr(),
            Queue::Segments(_) => unreachable!(),
        };
        for i in 2..10 {
            assert_eq!(rx.take_all(&mut taken), 1);
            assert_eq!(taken.pop_front(), Some(i - 1));
            // About to wait: both buffers given back, none freed.
            rx.shrink();
            rx.give_back(std::mem::take(&mut taken));
            assert_eq!(spares_kept(), 1, "one buffer went round");
            tx.try_send(i).unwrap();
            assert_eq!(spares_kept(), 0, "and was taken again");
            let now = match &rx.inner.queue {
                Queue::Deque(q, _) => q.lock().as_slices().0.as_ptr(),
                Queue::Segments(_) => unreachable!(),
            };
            // (The ring's head moves on within it.)
            let within = (0..4).any(|k| first.wrapping_add(k) == now);
            assert!(within, "the same memory");
        }
        // A large buffer is freed, not kept; the spares stay bounded.
        let big = VecDeque::<u64>::with_capacity(4 * KEEP_SLOTS);
        Spares::give(&SPARES, big);
        for _ in 0..2 * SPARE_BUFFERS {
            Spares::give(&SPARES, VecDeque::with_capacity(4));
        }
        assert_eq!(spares_kept(), SPARE_BUFFERS);
    }

    #[test]
    fn all_at_once_in_order_within_the_bound() {
        for make in both() {
            let (tx, rx) = make(4);
            tx.try_send(0).unwrap();
            let mut batch = vec![1, 2, 3, 4];
            assert_eq!(tx.try_send_all(&mut batch), Err(SendError::Full(())), "five do not fit in four");
            assert_eq!(batch, [1, 2, 3, 4], "none sent");
            batch.pop();
            tx.try_send_all(&mut batch).unwrap();
            assert!(batch.is_empty());
            assert_eq!(tx.len(), 4);
            let mut got = VecDeque::from([9]);
            assert_eq!(rx.take_all(&mut got), 4, "appended after what `into` held");
            assert_eq!(got, [9, 0, 1, 2, 3]);
            assert_eq!(tx.len(), 0);
            let mut empty = VecDeque::new();
            assert_eq!(rx.take_all(&mut empty), 0);
            tx.try_send(5).unwrap();
            assert_eq!(rx.take_all(&mut empty), 1);
            assert_eq!(empty, [5]);
            drop(rx);
            assert_eq!(tx.try_send_all(&mut vec![6]), Err(SendError::Closed(())));
        }
    }

    #[test]
    fn a_swapped_buffer_is_reused_up_to_a_bound() {
        let (tx, rx) = stream_mailbox::<u64>(1024);
        let capacity = |rx: &Receiver<u64>| match &rx.inner.queue {
            Queue::Deque(q, _) => q.lock().capacity(),
            Queue::Segments(_) => unreachable!(),
        };
        let mut local = VecDeque::with_capacity(64);
        tx.try_send_all(&mut (0..40).collect()).unwrap();
        assert_eq!(rx.take_all(&mut local), 40);
        assert!(capacity(&rx) >= 64, "the receiver's empty buffer became the queue");
        local.clear();
        let mut big = VecDeque::with_capacity(4 * KEEP_SWAPPED_SLOTS);
        tx.try_send(1).unwrap();
        assert_eq!(rx.take_all(&mut big), 1);
        assert_eq!(capacity(&rx), 0, "a large one is not kept");
    }

    #[test]
    fn cross_thread_wakes_receiver_and_blocked_sender() {
        for make in both() {
            cross_thread_with(make);
        }
    }

    fn cross_thread_with(make: Make) {
        let (tx, rx) = make(4);
        let producer = std::thread::spawn(move || {
            crate::rt::block_on_current(async move {
                for i in 0..10_000u64 {
                    tx.send(i).await.unwrap();
                }
            })
            .unwrap();
        });
        let sum = crate::rt::block_on_current(async move {
            let mut sum = 0u64;
            let mut next = 0u64;
            while let Some(v) = rx.recv().await {
                assert_eq!(v, next, "messages arrive in order");
                next += 1;
                sum += v;
            }
            sum
        })
        .unwrap();
        producer.join().unwrap();
        assert_eq!(sum, (0..10_000u64).sum::<u64>());
    }
}
