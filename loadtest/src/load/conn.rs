//! The I/O side: one task per connection, sending the same request over and
//! over with HTTP/1.1 keep-alive while the budget allows, reconnecting when
//! the server closes or a response is unusable.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use iop_core::rt::io::read_append;
use monoio::io::AsyncWriteRentExt;
use monoio::net::TcpStream;

use super::args::RequestBytes;
use super::exchange::{Done, Exchange};
use super::progress::Live;
use super::stats::{Failure, Recorder, LATE_START};

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

    /// Takes one request unless the count or the deadline is reached;
    /// returns its number (from 0, in the order they are taken).
    fn claim(&self, deadline: Option<Instant>) -> Option<u64> {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return None;
        }
        let n = self.issued.fetch_add(1, Ordering::Relaxed);
        match self.limit {
            Some(limit) if n >= limit => None,
            _ => Some(n),
        }
    }
}

/// Open loop: request `n` is due at `start + n / rate`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Schedule {
    pub(crate) start: Instant,
    pub(crate) rate: f64,
}

impl Schedule {
    /// When request `n` is due.
    pub(crate) fn slot(&self, n: u64) -> Instant {
        // Far beyond any run when the slot cannot be represented.
        let far = Duration::from_secs(1 << 32);
        let after = Duration::try_from_secs_f64(n as f64 / self.rate).unwrap_or(far).min(far);
        self.start.checked_add(after).unwrap_or(self.start)
    }
}

/// What the connections of one worker share (one thread, no locks).
#[derive(Debug)]
pub(crate) struct WorkerCtx {
    pub(crate) addr: SocketAddr,
    /// The requests (one per prompt size), request `n` sends `n % len`.
    pub(crate) requests: Vec<RequestBytes>,
    pub(crate) api: super::api::Api,
    pub(crate) stream: bool,
    /// Open loop, when set.
    pub(crate) schedule: Option<Schedule>,
    /// Close each stream after this many tokens.
    pub(crate) disconnect_after: Option<u64>,
    pub(crate) timeout: Duration,
    pub(crate) budget: std::sync::Arc<Budget>,
    pub(crate) deadline: Option<Instant>,
    pub(crate) recorder: RefCell<Recorder>,
    /// The run's start: the timeline counts from it.
    pub(crate) start: Instant,
    /// The progress line's counters, when there is one.
    pub(crate) live: Option<std::sync::Arc<Live>>,
}

impl WorkerCtx {
    fn record(&self, result: &Result<super::stats::Measure, Failure>) {
        let at = self.start.elapsed();
        let mut rec = self.recorder.borrow_mut();
        match result {
            Ok(m) => {
                rec.ok(m);
                rec.timeline.ok(at, m.tokens);
                if let Some(live) = &self.live {
                    live.ok(m.ttft.unwrap_or(m.total));
                }
            }
            Err(f) => {
                rec.fail(*f);
                rec.timeline.error(at);
                if let Some(live) = &self.live {
                    live.error();
                }
            }
        }
    }
}

/// Runs requests on one connection at a time until the budget is spent,
/// the first one not before `first`.
pub(crate) async fn drive(ctx: std::rc::Rc<WorkerCtx>, first: Instant) {
    let now = Instant::now();
    if first > now {
        if ctx.deadline.is_some_and(|d| first >= d) {
            return;
        }
        monoio::time::sleep(first - now).await;
    }
    let mut conn: Option<TcpStream> = None;
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    while let Some(n) = ctx.budget.claim(ctx.deadline) {
        if let Some(schedule) = ctx.schedule {
            let slot = schedule.slot(n);
            if ctx.deadline.is_some_and(|d| slot >= d) {
                break;
            }
            let now = Instant::now();
            if slot > now {
                monoio::time::sleep(slot - now).await;
            } else if now - slot >= LATE_START {
                ctx.recorder.borrow_mut().late_starts += 1;
            }
        }
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
        let request = match usize::try_from(n % ctx.requests.len().max(1) as u64).ok().and_then(|i| ctx.requests.get(i))
        {
            Some(r) => r.for_request(n),
            None => break,
        };
        let ex = Exchange::new(ctx.stream, Instant::now()).with_api(ctx.api).cut_after(ctx.disconnect_after);
        // On timeout the exchange future (and with it the socket) is dropped.
        match monoio::time::timeout(ctx.timeout, exchange(stream, &mut buf, request, ex)).await {
            Err(_) => ctx.record(&Err(Failure::Timeout)),
            Ok((stream, done)) => {
                if matches!(&done.result, Ok(m) if m.cut) {
                    // The instant the client leaves, on the clock the mock stamps with.
                    let at = unix_nanos();
                    drop(stream);
                    ctx.recorder.borrow_mut().disconnects.push((n, at));
                    ctx.record(&done.result);
                    continue;
                }
                ctx.record(&done.result);
                // Bytes nobody asked for mean the connection is out of step: drop it.
                if done.keep_alive && buf.is_empty() {
                    conn = Some(stream);
                }
            }
        }
    }
}

/// Wall-clock time in ns since the Unix epoch (0 before it).
fn unix_nanos() -> u64 {
    let d = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
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

/// Writes the request and reads one response (the clock of `ex` started
/// just before).
async fn exchange(mut stream: TcpStream, buf: &mut BytesMut, request: Bytes, mut ex: Exchange) -> (TcpStream, Done) {
    let (res, _) = stream.write_all(request).await;
    if let Err(e) = res {
        tracing::debug!(error = %e, "write failed");
        return (stream, Done { keep_alive: false, result: Err(Failure::Io) });
    }
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
        assert_eq!((0..5).filter_map(|_| b.claim(None)).collect::<Vec<_>>(), [0, 1, 2]);
        let b = Budget::new(None);
        assert_eq!(b.claim(None), Some(0));
        assert_eq!(b.claim(Some(Instant::now() + Duration::from_secs(60))), Some(1));
        assert_eq!(b.claim(Some(Instant::now())), None);
    }

    #[test]
    fn schedule_spaces_the_slots() {
        let start = Instant::now();
        let s = Schedule { start, rate: 4.0 };
        assert_eq!(s.slot(0), start);
        assert_eq!(s.slot(3), start + Duration::from_millis(750));
        assert!(Schedule { start, rate: 1e-300 }.slot(5) > start + Duration::from_secs(1 << 30));
    }
}
