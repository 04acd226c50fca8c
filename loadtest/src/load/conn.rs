//! The I/O side: one task per connection, sending the same request over and
//! over with HTTP/1.1 keep-alive while the budget allows, reconnecting when
//! the server closes or a response is unusable.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use iop_core::rt::io::read_append;
use monoio::io::AsyncWriteRentExt;
use monoio::net::TcpStream;

use super::exchange::{Done, Exchange};
use super::stats::{Failure, Recorder};

/// Bytes asked of one read.
const READ_CHUNK: usize = 16 * 1024;
/// Pause after a failed connect, so a dead server is not hammered in a loop.
const CONNECT_BACKOFF: Duration = Duration::from_millis(10);

/// Requests handed out across all workers.
#[derive(Debug)]
pub(crate) struct Budget {
    issued: AtomicU64,
    limit: Option<u64>,
}

impl Budget {
    pub(crate) fn new(limit: Option<u64>) -> Self {
        Self { issued: AtomicU64::new(0), limit }
    }

    /// Takes one request unless the count or the deadline is reached.
    fn claim(&self, deadline: Option<Instant>) -> bool {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return false;
        }
        match self.limit {
            Some(limit) => self.issued.fetch_add(1, Ordering::Relaxed) < limit,
            None => true,
        }
    }
}

/// What the connections of one worker share (one thread, no locks).
#[derive(Debug)]
pub(crate) struct WorkerCtx {
    pub(crate) addr: SocketAddr,
    /// The whole request, written as is every time.
    pub(crate) request: Bytes,
    pub(crate) stream: bool,
    pub(crate) timeout: Duration,
    pub(crate) budget: std::sync::Arc<Budget>,
    pub(crate) deadline: Option<Instant>,
    pub(crate) recorder: RefCell<Recorder>,
}

impl WorkerCtx {
    fn record(&self, result: &Result<super::stats::Measure, Failure>) {
        let mut rec = self.recorder.borrow_mut();
        match result {
            Ok(m) => rec.ok(m),
            Err(f) => rec.fail(*f),
        }
    }
}

/// Runs requests on one connection at a time until the budget is spent.
pub(crate) async fn drive(ctx: std::rc::Rc<WorkerCtx>) {
    let mut conn: Option<TcpStream> = None;
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    while ctx.budget.claim(ctx.deadline) {
        let stream = match conn.take() {
            Some(s) => s,
            None => match connect(ctx.addr, ctx.timeout).await {
                Ok(s) => {
                    ctx.recorder.borrow_mut().connections += 1;
                    buf.clear();
                    s
                }
                Err(failure) => {
                    ctx.record(&Err(failure));
                    monoio::time::sleep(CONNECT_BACKOFF).await;
                    continue;
                }
            },
        };
        let start = Instant::now();
        // On timeout the exchange future (and with it the socket) is dropped.
        match monoio::time::timeout(ctx.timeout, exchange(stream, &mut buf, ctx.request.clone(), ctx.stream, start))
            .await
        {
            Err(_) => ctx.record(&Err(Failure::Timeout)),
            Ok((stream, done)) => {
                ctx.record(&done.result);
                // Bytes nobody asked for mean the connection is out of step: drop it.
                if done.keep_alive && buf.is_empty() {
                    conn = Some(stream);
                }
            }
        }
    }
}

async fn connect(addr: SocketAddr, timeout: Duration) -> Result<TcpStream, Failure> {
    match monoio::time::timeout(timeout, TcpStream::connect_addr(addr)).await {
        Ok(Ok(stream)) => {
            // Requests are small and must not wait for Nagle.
            if let Err(e) = stream.set_nodelay(true) {
                tracing::debug!(error = %e, "could not set TCP_NODELAY");
            }
            Ok(stream)
        }
        Ok(Err(e)) => {
            tracing::debug!(%addr, error = %e, "connect failed");
            Err(Failure::Connect)
        }
        Err(_) => Err(Failure::Connect),
    }
}

/// Writes the request and reads one response.
async fn exchange(
    mut stream: TcpStream,
    buf: &mut BytesMut,
    request: Bytes,
    want_stream: bool,
    start: Instant,
) -> (TcpStream, Done) {
    let (res, _) = stream.write_all(request).await;
    if let Err(e) = res {
        tracing::debug!(error = %e, "write failed");
        return (stream, Done { keep_alive: false, result: Err(Failure::Io) });
    }
    let mut ex = Exchange::new(want_stream, start);
    loop {
        match read_append(&mut stream, buf, READ_CHUNK).await {
            Ok(0) => {
                let done = ex.eof(Instant::now());
                return (stream, done);
            }
            Ok(_) => {
                if let Some(done) = ex.feed(buf, Instant::now()) {
                    return (stream, done);
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "read failed");
                return (stream, Done { keep_alive: false, result: Err(Failure::Io) });
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn budget_counts_and_deadline() {
        let b = Budget::new(Some(3));
        assert_eq!((0..5).filter(|_| b.claim(None)).count(), 3);
        let b = Budget::new(None);
        assert!(b.claim(None));
        assert!(b.claim(Some(Instant::now() + Duration::from_secs(60))));
        assert!(!b.claim(Some(Instant::now())));
    }
}
