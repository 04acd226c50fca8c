//! A dedicated thread for blocking work (DNS, file reads, later SQLite), so
//! no reactor thread ever blocks. Fed by a bounded channel.

use std::sync::OnceLock;

use crossbeam_channel::{bounded, Sender, TrySendError};

use super::oneshot::oneshot;

type Job = Box<dyn FnOnce() + Send + 'static>;

const QUEUE: usize = 1024;

/// The blocking thread could not take the job.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlockingError {
    /// Too many jobs queued.
    #[error("blocking work queue is full")]
    Busy,
    /// The thread is gone (it panicked or could not start).
    #[error("blocking worker is unavailable")]
    Unavailable,
}

fn queue() -> Option<&'static Sender<Job>> {
    static TX: OnceLock<Option<Sender<Job>>> = OnceLock::new();
    TX.get_or_init(|| {
        let (tx, rx) = bounded::<Job>(QUEUE);
        let spawned = std::thread::Builder::new().name("iop-blocking".into()).spawn(move || {
            while let Ok(job) = rx.recv() {
                job();
            }
        });
        match spawned {
            Ok(_) => Some(tx),
            Err(e) => {
                tracing::error!(error = %e, "could not start the blocking worker thread");
                None
            }
        }
    })
    .as_ref()
}

/// Runs `f` on the blocking thread and awaits its result.
pub async fn run_blocking<T, F>(f: F) -> Result<T, BlockingError>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let tx = queue().ok_or(BlockingError::Unavailable)?;
    let (reply, result) = oneshot();
    match tx.try_send(Box::new(move || reply.send(f()))) {
        Ok(()) => {}
        Err(TrySendError::Full(_)) => return Err(BlockingError::Busy),
        Err(TrySendError::Disconnected(_)) => return Err(BlockingError::Unavailable),
    }
    result.await.ok_or(BlockingError::Unavailable)
}

/// Resolves `host:port` on the blocking thread.
pub async fn resolve(authority: String) -> std::io::Result<Vec<std::net::SocketAddr>> {
    use std::net::ToSocketAddrs;
    run_blocking(move || authority.to_socket_addrs().map(|it| it.collect::<Vec<_>>()))
        .await
        .map_err(std::io::Error::other)?
}
