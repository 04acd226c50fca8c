//! Worker threads: build a monoio runtime, pin it, run a root future.

use std::{future::Future, io, thread, time::Duration};

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
    let mut rt = monoio::RuntimeBuilder::<monoio::FusionDriver>::new().enable_timer().build()?;
    Ok(rt.block_on(root))
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

/// Lets sibling tasks run. monoio 0.2.4 has no fair `yield_now` (a task that
/// wakes itself starves the others), so this goes through the timer.
pub async fn yield_now() {
    monoio::time::sleep(Duration::ZERO).await;
}
