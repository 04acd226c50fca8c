//! One timer per core for every deadline on it. A monoio `Sleep` holds its
//! timer entry inline: 640 bytes aligned to 128, for as long as it is armed
//! (an open stream's run deadline: its whole life). Here a deadline is an
//! instant and a number; armed, it is a heap entry and a waker in this
//! core's table, and one task per core sleeps until the earliest of them.

use std::{
    cell::RefCell,
    cmp::Reverse,
    collections::{hash_map::Entry, BinaryHeap, HashMap},
    future::Future,
    hash::{BuildHasherDefault, Hasher},
    pin::Pin,
    task::{Context, Poll, Waker},
};

use monoio::time::Instant;

thread_local! {
    static TIMERS: RefCell<Timers> = RefCell::new(Timers::default());
}

/// Ids are unique counters: one multiplication makes their hash. Not the
/// id itself: the table files an entry by the hash's low bits and tells
/// entries apart by its top 7, which small counters all share (every
/// lookup then compared against every entry of its group).
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        // Fibonacci hashing: spreads consecutive ids over the top bits too.
        self.0 = n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

#[derive(Default)]
struct Timers {
    /// (deadline, id) of armed sleeps. A dropped sleep's entry stays until
    /// it surfaces, or until dropped ones are the majority (then swept).
    heap: BinaryHeap<Reverse<(Instant, u64)>>,
    /// The wakers of armed sleeps.
    armed: HashMap<u64, Waker, BuildHasherDefault<IdHasher>>,
    last_id: u64,
    /// The driver task of this thread's runtime, once spawned.
    driver: Option<DriverSlot>,
}

#[derive(Default)]
struct DriverSlot {
    waker: Option<Waker>,
    /// What it sleeps until (None: nothing armed).
    until: Option<Instant>,
}

impl Timers {
    /// Takes the wakers of every sleep due at `now`; returns them and the
    /// earliest deadline still armed.
    fn fire(&mut self, now: Instant) -> (Vec<Waker>, Option<Instant>) {
        let mut due = Vec::new();
        while let Some(&Reverse((at, id))) = self.heap.peek() {
            if !self.armed.contains_key(&id) {
                self.heap.pop();
                continue;
            }
            if at > now {
                return (due, Some(at));
            }
            self.heap.pop();
            due.extend(self.armed.remove(&id));
        }
        (due, None)
    }

    fn disarm(&mut self, id: u64) -> Option<Waker> {
        let waker = self.armed.remove(&id);
        if self.heap.len() > 64 && self.heap.len() > 2 * self.armed.len() {
            let armed = &self.armed;
            self.heap.retain(|Reverse((_, id))| armed.contains_key(id));
        }
        waker
    }
}

/// Wakes every sleep of this thread due at `now` (a manual clock moved).
pub(crate) fn fire_due(now: Instant) {
    let due = TIMERS.with(|t| t.try_borrow_mut().map(|mut t| t.fire(now).0).unwrap_or_default());
    for w in due {
        w.wake();
    }
}

/// Forgets every deadline of this thread (its runtime is ending). Called
/// inside the runtime, so the tasks the dropped wakers may free are dropped
/// there.
pub(crate) fn reset() {
    let old = TIMERS.with(|t| std::mem::take(&mut *t.borrow_mut()));
    drop(old);
}

/// Completes at its deadline. Costs its deadline and an id; a heap entry
/// and a waker in this core's table only while polled and pending.
#[derive(Debug)]
pub struct Sleep {
    at: Instant,
    /// 0: not armed.
    id: u64,
    /// Armed, it is an entry of this thread's table: it stays on the thread.
    _thread: std::marker::PhantomData<*const ()>,
}

impl Sleep {
    /// A sleep until `at`.
    pub fn until(at: Instant) -> Self {
        Self { at, id: 0, _thread: std::marker::PhantomData }
    }

    /// The deadline.
    pub fn deadline(&self) -> Instant {
        self.at
    }

    fn disarm(&mut self) {
        if self.id == 0 {
            return;
        }
        let id = std::mem::take(&mut self.id);
        // Not borrowed only while the table itself drops wakers (reset).
        let waker = TIMERS.try_with(|t| t.try_borrow_mut().ok().and_then(|mut t| t.disarm(id))).ok().flatten();
        drop(waker);
    }
}

impl Future for Sleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.id != 0 {
            // Armed: due once the driver took its waker (no clock read: an
            // armed sleep is polled again whenever its task is, e.g. every
            // item of a stream under a deadline).
            let id = self.id;
            let (fired, replaced) = TIMERS.with(|t| match t.borrow_mut().armed.get_mut(&id) {
                None => (true, None),
                Some(w) if !w.will_wake(cx.waker()) => (false, Some(std::mem::replace(w, cx.waker().clone()))),
                Some(_) => (false, None),
            });
            drop(replaced);
            if fired {
                self.id = 0;
                return Poll::Ready(());
            }
            return Poll::Pending;
        }
        if super::clock::now() >= self.at {
            self.disarm();
            return Poll::Ready(());
        }
        let at = self.at;
        let mut id = self.id;
        let (replaced, wake_driver, spawn) = TIMERS.with(|t| {
            let mut t = t.borrow_mut();
            if id == 0 {
                t.last_id += 1;
                id = t.last_id;
                t.heap.push(Reverse((at, id)));
            }
            let replaced = match t.armed.entry(id) {
                Entry::Occupied(mut e) if !e.get().will_wake(cx.waker()) => Some(e.insert(cx.waker().clone())),
                Entry::Occupied(_) => None,
                Entry::Vacant(e) => {
                    e.insert(cx.waker().clone());
                    None
                }
            };
            match &mut t.driver {
                None => {
                    t.driver = Some(DriverSlot::default());
                    (replaced, None, true)
                }
                // Earlier than what the driver sleeps until: it re-arms.
                Some(d) if d.until.is_none_or(|u| at < u) => (replaced, d.waker.take(), false),
                Some(_) => (replaced, None, false),
            }
        });
        self.id = id;
        drop(replaced);
        if let Some(w) = wake_driver {
            w.wake();
        }
        if spawn {
            monoio::spawn(Driver { sleep: Box::pin(monoio::time::sleep_until(at)) });
        }
        Poll::Pending
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        self.disarm();
    }
}

/// The one task per runtime that sleeps until the earliest deadline and
/// wakes the sleeps that are due.
struct Driver {
    sleep: Pin<Box<monoio::time::Sleep>>,
}

impl Future for Driver {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            let (due, next) = TIMERS.with(|t| {
                let mut t = t.borrow_mut();
                let (due, next) = t.fire(super::clock::now());
                let slot = t.driver.get_or_insert_with(DriverSlot::default);
                slot.until = next;
                let old = slot.waker.replace(cx.waker().clone());
                (due, next.map(|n| (n, old)))
            });
            for w in due {
                w.wake();
            }
            let Some((next, _old)) = next else { return Poll::Pending };
            if super::clock::is_manual() {
                // A manual clock's advance fires what is due; real time never does.
                return Poll::Pending;
            }
            if self.sleep.deadline() != next {
                self.sleep.as_mut().reset(next);
            }
            if self.sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = TIMERS.try_with(|t| {
            if let Ok(mut t) = t.try_borrow_mut() {
                t.driver = None;
            }
        });
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use std::{cell::RefCell, rc::Rc, time::Duration};

    use super::*;

    fn after(ms: u64) -> Sleep {
        Sleep::until(Instant::now() + Duration::from_millis(ms))
    }

    #[test]
    fn sleeps_end_in_deadline_order_whatever_the_order_armed() {
        crate::rt::block_on_current(async {
            let order = Rc::new(RefCell::new(Vec::new()));
            let mut tasks = Vec::new();
            // The later one first: the driver must re-arm for the earlier.
            for (name, ms) in [("c", 60u64), ("a", 10), ("b", 30)] {
                let order = order.clone();
                tasks.push(monoio::spawn(async move {
                    after(ms).await;
                    order.borrow_mut().push(name);
                }));
            }
            for t in tasks {
                t.await;
            }
            assert_eq!(*order.borrow(), ["a", "b", "c"]);
        })
        .unwrap();
    }

    #[test]
    fn a_dropped_sleep_leaves_nothing_behind() {
        crate::rt::block_on_current(async {
            for _ in 0..1000 {
                let mut s = std::pin::pin!(after(60_000));
                assert!(futures_poll_once(s.as_mut()).await.is_pending());
            }
            let (heap, armed) = TIMERS.with(|t| (t.borrow().heap.len(), t.borrow().armed.len()));
            assert_eq!(armed, 0);
            assert!(heap <= 64, "dropped sleeps are swept: {heap} heap entries");
            // A short one still fires after a long one was dropped.
            after(5).await;
        })
        .unwrap();
    }

    #[test]
    fn works_again_on_a_new_runtime_of_the_same_thread() {
        for _ in 0..2 {
            crate::rt::block_on_current(async { after(5).await }).unwrap();
        }
    }

    async fn futures_poll_once<F: Future + Unpin>(f: F) -> Poll<F::Output> {
        let mut f = f;
        std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut f).poll(cx))).await
    }
}
