//! Worker threads: build a monoio runtime, pin it, run a root future.

use std::{future::Future, io, thread};

/// The I/O driver a reactor runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driver {
    /// io_uring (the fast path).
    IoUring,
    /// epoll, used where io_uring is unavailable or `MONOIO_FORCE_LEGACY_DRIVER=1`.
    Epoll,
}

impl Driver {
    /// The driver `FusionDriver` will pick on this machine.
    pub fn detect() -> Self {
        if monoio::utils::detect_uring() {
            Driver::IoUring
        } else {
            Driver::Epoll
        }
    }

    /// Name for logs.
    pub fn name(self) -> &'static str {
        match self {
            Driver::IoUring => "io_uring",
            Driver::Epoll => "epoll",
        }
    }
}

/// Runs `root` to completion on a new monoio runtime on the current thread.
pub fn block_on_current<F: Future>(root: F) -> io::Result<F::Output> {
    let mut builder = monoio::RuntimeBuilder::<monoio::FusionDriver>::new().enable_timer();
    if let Some(urb) = coop_taskrun() {
        builder = builder.uring_builder(urb);
    }
    let mut rt = builder.build()?;
    Ok(rt.block_on(async {
        let out = root.await;
        // Inside the runtime: the tasks its deadlines' wakers may free are
        // dropped while their runtime is current.
        super::timers::reset();
        out
    }))
}

/// Whether rings are set up with `IORING_SETUP_COOP_TASKRUN` (kernel 5.19+):
/// a completion for a thread that is running then waits for its next
/// trip into the kernel (each reactor turn makes one) instead of an
/// inter-processor interrupt that stops it at once. A kernel without it
/// gets the plain ring (`None`), never the epoll fallback.
fn coop_taskrun() -> Option<io_uring::Builder> {
    static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let mut urb = io_uring::IoUring::<io_uring::squeue::Entry>::builder();
    urb.setup_coop_taskrun();
    let ok = *OK.get_or_init(|| std::env::var_os("IOP_NO_COOP_TASKRUN").is_none() && urb.build(2).is_ok());
    ok.then_some(urb)
}

/// Starts worker `index` on its own thread, pinned to core `index % cores`
/// when `pin` is set, and runs the future made by `make` there. The factory
/// is `Send`; the future it makes need not be (it never leaves the thread).
pub fn spawn_worker<M, F>(name: &str, index: usize, pin: bool, make: M) -> io::Result<thread::JoinHandle<()>>
where
    M: FnOnce() -> F + Send + 'static,
    F: Future<Output = ()> + 'static,
{
    thread::Builder::new().name(format!("{name}-{index}")).spawn(move || {
        if pin {
            let cores = thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
            if let Err(e) = monoio::utils::bind_to_cpu_set([index % cores]) {
                tracing::warn!(worker = index, error = ?e, "could not pin worker thread");
            }
        }
        let driver = Driver::detect();
        match block_on_current(make()) {
            Ok(()) => tracing::debug!(worker = index, driver = driver.name(), "worker stopped"),
            Err(e) => tracing::error!(worker = index, error = %e, "could not build the runtime"),
        }
    })
}

/// Lets every task that is ready on this thread run, then continues; costs
/// two trips through the run queue (about a microsecond), never a timer
/// tick. monoio 0.2.4 puts a task that wakes itself at the *front* of its
/// queue (it would starve its siblings), but a wake from another task at
/// the back: so the wake comes from a tiny task spawned for it, which runs
/// after everything already queued.
pub async fn yield_now() {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if yielded {
            return std::task::Poll::Ready(());
        }
        yielded = true;
        let waker = cx.waker().clone();
        monoio::spawn(async move { waker.wake() });
        std::task::Poll::Pending
    })
    .await
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use std::{
        cell::RefCell,
        rc::Rc,
        time::{Duration, Instant},
    };

    use super::*;

    #[test]
    fn yield_lets_siblings_run_in_turn() {
        let order = block_on_current(async {
            let order = Rc::new(RefCell::new(Vec::new()));
            let tasks: Vec<_> = (0..3)
                .map(|t| {
                    let order = order.clone();
                    monoio::spawn(async move {
                        for _ in 0..3 {
                            order.borrow_mut().push(t);
                            yield_now().await;
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await;
            }
            Rc::try_unwrap(order).unwrap().into_inner()
        })
        .unwrap();
        // Round robin: nobody runs twice while another is ready.
        assert_eq!(order, vec![0, 1, 2, 0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn yield_costs_no_timer_tick_and_starves_no_io() {
        block_on_current(async {
            // A thousand yields through the timer would take a second (a
            // tick each); these take a few milliseconds at most.
            let start = Instant::now();
            for _ in 0..1000 {
                yield_now().await;
            }
            assert!(start.elapsed() < Duration::from_millis(250), "{:?}", start.elapsed());

            // A task that only yields must not keep a socket read from completing.
            let listener = monoio::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let spinning = Rc::new(std::cell::Cell::new(true));
            let spin = spinning.clone();
            let spinner = monoio::spawn(async move {
                let mut n = 0u64;
                while spin.get() {
                    yield_now().await;
                    n += 1;
                }
                n
            });
            let writer = thread::spawn(move || {
                use std::io::Write;
                let mut s = std::net::TcpStream::connect(addr).unwrap();
                s.write_all(b"ping").unwrap();
            });
            let (mut conn, _) = listener.accept().await.unwrap();
            let (res, buf) = monoio::io::AsyncReadRentExt::read_exact(&mut conn, vec![0u8; 4]).await;
            res.unwrap();
            assert_eq!(&buf, b"ping");
            spinning.set(false);
            assert!(spinner.await > 0);
            writer.join().unwrap();
        })
        .unwrap();
    }
}
