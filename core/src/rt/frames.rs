//! Frame I/O over a monoio stream: a reader that decodes frames with a
//! cancellable read, and a shared, bounded write buffer drained by a writer
//! task. Appending never awaits, so a session's read loop can never block on
//! its own writes (which could deadlock two peers with full buffers); the
//! hard limit bounds memory instead, and producers that can wait (run
//! events) use `wait_writable` for backpressure.

use std::{
    cell::{Cell, RefCell},
    future::poll_fn,
    io,
    rc::Rc,
    task::{Poll, Waker},
};

use bytes::{Bytes, BytesMut};
use monoio::{
    buf::IoBufMut,
    io::{AsyncWriteRent, CancelHandle, CancelableAsyncReadRent, Canceller},
};

use super::{gather::Gather, signal::LocalNotify};
use crate::wire::{self, pb::Envelope, WireError};

const READ_CHUNK: usize = 64 * 1024;
/// A read into less spare room than this first makes room for
/// `READ_CHUNK`. Reads fill one buffer until then: decoded frames keep
/// slices of it alive (zero-copy bodies), so a fresh buffer per read would
/// keep a mostly empty 64 KiB alive per small queued frame.
const MIN_READ_SPARE: usize = 4 * 1024;

/// Room for the next read. A frame larger than a read chunk grows into a
/// buffer of its own, doubling with what arrived (never with what its
/// length announces, which a peer could send nothing of) up to exactly its
/// size: its bytes, which the frame's items keep alive while queued (a
/// client that does not read its stream), then pin nothing else, and no
/// other frame pins them. Smaller frames share chunks.
fn make_room(mut buf: BytesMut) -> BytesMut {
    // `decode` left only the start of one frame in `buf`.
    let total = buf.get(..4).map(|p| 4 + u32::from_be_bytes([p[0], p[1], p[2], p[3]]) as usize);
    match total {
        Some(total) if total > READ_CHUNK && total > buf.len() => {
            let cap = (buf.len() * 2).max(buf.len() + READ_CHUNK).min(total);
            let mut own = BytesMut::with_capacity(cap);
            own.extend_from_slice(&buf);
            own
        }
        _ => {
            buf.reserve(READ_CHUNK);
            buf
        }
    }
}

/// Why the frame reader stopped.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// Socket error.
    #[error("read failed: {0}")]
    Io(#[from] io::Error),
    /// The peer sent bytes that are not a valid frame.
    #[error("{0}")]
    Wire(#[from] WireError),
    /// The connection ended in the middle of a frame.
    #[error("connection closed mid-frame")]
    Truncated,
    /// The read was cancelled locally (e.g. heartbeat timeout).
    #[error("read cancelled")]
    Cancelled,
}

/// Decodes frames from a read half.
pub struct FrameReader<R> {
    io: R,
    buf: BytesMut,
    max_frame: usize,
    canceller: Rc<RefCell<Canceller>>,
    stop: Rc<Cell<bool>>,
    /// Bytes of the frames decoded so far.
    decoded: u64,
}

/// Stops a [`FrameReader`] blocked in a read, from another task on the same core.
#[derive(Clone)]
pub struct ReadStopper {
    canceller: Rc<RefCell<Canceller>>,
    stop: Rc<Cell<bool>>,
}

impl ReadStopper {
    /// Makes the reader's current or next read end with `ReadError::Cancelled`.
    pub fn stop(&self) {
        self.stop.set(true);
        let c = std::mem::take(&mut *self.canceller.borrow_mut());
        *self.canceller.borrow_mut() = c.cancel();
    }
}

impl<R: CancelableAsyncReadRent> FrameReader<R> {
    /// A reader accepting frames up to `max_frame` bytes. `initial` holds
    /// bytes already read from the stream.
    pub fn new(io: R, max_frame: usize, initial: BytesMut) -> Self {
        Self {
            io,
            buf: initial,
            max_frame,
            canceller: Rc::new(RefCell::new(Canceller::new())),
            stop: Rc::new(Cell::new(false)),
            decoded: 0,
        }
    }

    /// The stream, e.g. to answer on it before a writer exists.
    pub fn io_mut(&mut self) -> &mut R {
        &mut self.io
    }

    /// The stream and the bytes read past the last decoded frame (no read
    /// is in flight between two `next` calls).
    pub fn into_parts(self) -> (R, BytesMut) {
        (self.io, self.buf)
    }

    /// Bytes of all frames decoded so far (prefixes included).
    pub fn decoded_bytes(&self) -> u64 {
        self.decoded
    }

    /// Changes the largest frame accepted from now on (e.g. raised once the
    /// peer has authenticated).
    pub fn set_max_frame(&mut self, max_frame: usize) {
        self.max_frame = max_frame;
    }

    /// A handle that can stop this reader.
    pub fn stopper(&self) -> ReadStopper {
        ReadStopper { canceller: self.canceller.clone(), stop: self.stop.clone() }
    }

    /// Next frame; `Ok(None)` on a clean end of stream between frames.
    pub async fn next(&mut self) -> Result<Option<Envelope>, ReadError> {
        Ok(self.next_frame().await?.map(wire::Frame::into_envelope))
    }

    /// [`Self::next`], a run's events left as slices of their frame (see
    /// [`wire::decode_frame`]).
    pub async fn next_frame(&mut self) -> Result<Option<wire::Frame>, ReadError> {
        loop {
            let before = self.buf.len();
            if let Some(frame) = wire::decode_frame(&mut self.buf, self.max_frame)? {
                self.decoded += (before - self.buf.len()) as u64;
                return Ok(Some(frame));
            }
            if self.stop.get() {
                return Err(ReadError::Cancelled);
            }
            let handle: CancelHandle = self.canceller.borrow().handle();
            let mut buf = std::mem::take(&mut self.buf);
            if buf.capacity() - buf.len() < MIN_READ_SPARE {
                buf = make_room(buf);
            }
            let len = buf.len();
            let cap = buf.capacity();
            // monoio reads overwrite from index 0: read into the spare tail.
            let (res, slice) = self.io.cancelable_read(buf.slice_mut(len..cap), handle).await;
            self.buf = slice.into_inner();
            match res {
                Ok(0) => {
                    return if self.buf.is_empty() { Ok(None) } else { Err(ReadError::Truncated) };
                }
                Ok(_) => {}
                Err(_) if self.stop.get() => return Err(ReadError::Cancelled),
                Err(e) => return Err(ReadError::Io(e)),
            }
        }
    }
}

/// The frame could not be queued.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// The writer is closed (connection gone or over its limit).
    #[error("connection closed")]
    Closed,
    /// The message cannot be encoded within the frame limit.
    #[error("{0}")]
    Wire(#[from] WireError),
}

struct WriterInner {
    buf: RefCell<Gather>,
    max_frame: usize,
    high_water: usize,
    hard_limit: usize,
    data: LocalNotify,
    drained: RefCell<Vec<Waker>>,
    closed: super::signal::LocalCancel,
}

/// Shared handle to a connection's outbound frame buffer. Frames are
/// encoded into it; tunnel body payloads are queued beside their frame
/// heads and written with vectored writes (see [`Gather`]), never copied.
#[derive(Clone)]
pub struct FrameWriter {
    inner: Rc<WriterInner>,
}

impl FrameWriter {
    /// A writer whose producers wait above `high_water` buffered bytes and
    /// which closes the connection beyond `hard_limit` (a peer that stopped
    /// reading).
    pub fn new(max_frame: usize, high_water: usize, hard_limit: usize) -> Self {
        Self {
            inner: Rc::new(WriterInner {
                buf: RefCell::new(Gather::new()),
                max_frame,
                high_water,
                hard_limit: hard_limit.max(high_water + max_frame),
                data: LocalNotify::new(),
                drained: RefCell::new(Vec::new()),
                closed: super::signal::LocalCancel::new(),
            }),
        }
    }

    /// Queues one frame without waiting.
    pub fn send(&self, env: &Envelope) -> Result<(), SendError> {
        self.queue(|buf, max| buf.put_with(|b| wire::encode(env, b, max)))
    }

    /// Queues the frame of run event `ev` (its `run_id` left empty) of run
    /// `run_id`.
    pub fn send_run_event(&self, run_id: &str, ev: &wire::pb::RunEvent) -> Result<(), SendError> {
        self.queue(|buf, max| buf.put_with(|b| wire::encode_run_event(run_id, ev, b, max)))
    }

    /// Queues one frame of consecutive run events of run `run_id`, the
    /// first numbered `seq`.
    pub fn send_run_events(&self, run_id: &str, seq: u64, events: &[crate::exec::ExecEvent]) -> Result<(), SendError> {
        self.queue(|buf, max| buf.put_with(|b| wire::encode_run_events(run_id, seq, events, b, max)))
    }

    /// Queues the frame of tunnel body `parts` (one or several, in order),
    /// number `seq` of `tunnel_id`; the parts are written from their own
    /// memory.
    pub fn send_tunnel_body(&self, tunnel_id: &str, seq: u64, parts: &[Bytes]) -> Result<(), SendError> {
        self.queue(|buf, max| wire::encode_tunnel_body(tunnel_id, seq, parts, buf, max))
    }

    /// Queues the frame of a run request; its body is written from its own
    /// memory.
    pub fn send_run_request(&self, req: &mut wire::pb::RunRequest) -> Result<(), SendError> {
        self.queue(|buf, max| wire::encode_run_request(req, buf, max))
    }

    /// Queues the frame of a tunnel request; its body is written from its
    /// own memory.
    pub fn send_tunnel_request(&self, req: &wire::pb::ProviderTunnelRequest) -> Result<(), SendError> {
        self.queue(|buf, max| wire::encode_tunnel_request(req, buf, max))
    }

    /// Queues the frame of a whole tunnel answer, number `seq` of
    /// `tunnel_id`; the body is written from its own memory.
    pub fn send_tunnel_whole(&self, tunnel_id: &str, seq: u64, whole: &crate::tunnel::Whole) -> Result<(), SendError> {
        let head = wire::TunnelHead { status: whole.status, headers: &whole.headers };
        let usage = whole.usage.map(wire::pb::Usage::from);
        self.queue(|buf, max| wire::encode_tunnel_whole(tunnel_id, seq, head, &whole.body, usage.as_ref(), buf, max))
    }

    /// Queues the frame that starts a streamed tunnel answer (status and
    /// headers), number `seq` of `tunnel_id`.
    pub fn send_tunnel_start(
        &self,
        tunnel_id: &str,
        seq: u64,
        status: u16,
        headers: &[(crate::http::HeaderName, Bytes)],
    ) -> Result<(), SendError> {
        let head = wire::TunnelHead { status, headers };
        self.queue(|buf, max| wire::encode_tunnel_start(tunnel_id, seq, head, buf, max))
    }

    fn queue(&self, put: impl FnOnce(&mut Gather, usize) -> Result<(), WireError>) -> Result<(), SendError> {
        let inner = &self.inner;
        if inner.closed.is_cancelled() {
            return Err(SendError::Closed);
        }
        {
            let mut buf = inner.buf.borrow_mut();
            put(&mut buf, inner.max_frame)?;
            if buf.len() > inner.hard_limit {
                drop(buf);
                tracing::warn!(limit = inner.hard_limit, "peer stopped reading; closing the connection");
                self.close();
                return Err(SendError::Closed);
            }
        }
        inner.data.notify();
        Ok(())
    }

    /// Whether a frame can be queued now (`Ok(false)`: the buffer is at its
    /// high-water mark; `wait_writable` would wait).
    pub fn writable(&self) -> Result<bool, SendError> {
        if self.inner.closed.is_cancelled() {
            return Err(SendError::Closed);
        }
        Ok(self.inner.buf.borrow().len() < self.inner.high_water)
    }

    /// Waits until the buffer is below the high-water mark.
    pub async fn wait_writable(&self) -> Result<(), SendError> {
        poll_fn(|cx| {
            if self.inner.closed.is_cancelled() {
                Poll::Ready(Err(SendError::Closed))
            } else if self.inner.buf.borrow().len() < self.inner.high_water {
                Poll::Ready(Ok(()))
            } else {
                self.inner.drained.borrow_mut().push(cx.waker().clone());
                Poll::Pending
            }
        })
        .await
    }

    /// Closes the writer: queued bytes are still flushed, new frames refused.
    pub fn close(&self) {
        self.inner.closed.cancel();
        self.inner.data.notify();
        for w in self.inner.drained.take() {
            w.wake();
        }
    }

    /// Bytes queued and not yet written.
    pub fn queued_bytes(&self) -> usize {
        self.inner.buf.borrow().len()
    }

    /// A copy of the bytes queued and not yet written (for tests).
    pub fn queued_copy(&self) -> Vec<u8> {
        self.inner.buf.borrow().to_vec()
    }

    /// Whether the writer was closed.
    pub fn is_closed(&self) -> bool {
        self.inner.closed.is_cancelled()
    }

    /// Resolves once the writer is closed (a write failed, the peer stopped
    /// reading, or the session closed it), so the session can stop reading too.
    pub async fn closed(&self) {
        self.inner.closed.cancelled().await
    }

    /// Drains the buffer into `io` until closed and empty, or a write fails.
    pub async fn run<W: AsyncWriteRent>(self, mut io: W) -> io::Result<()> {
        let mut batch = Gather::new();
        loop {
            {
                let mut buf = self.inner.buf.borrow_mut();
                if !buf.is_empty() {
                    // Take what is queued; producers refill the emptied buffer.
                    std::mem::swap(&mut *buf, &mut batch);
                }
            }
            if !batch.is_empty() {
                let res = batch.write_to(&mut io).await;
                for w in self.inner.drained.take() {
                    w.wake();
                }
                if let Err(e) = res {
                    self.close();
                    return Err(e);
                }
            } else if self.inner.closed.is_cancelled() {
                return Ok(());
            } else {
                self.inner.data.notified().await;
            }
        }
    }
}

/// Pings the peer every `timing.heartbeat_interval` and returns `Silent`
/// as soon as nothing arrived (`last_seen`, updated by the reader) for
/// `timing.heartbeat_wait`; returns `Closed` when `closed` is raised or the
/// writer is gone. Shared by both ends of the edge↔node connection.
pub async fn heartbeat(
    timing: crate::config::TestingSettings,
    writer: &FrameWriter,
    last_seen: &Cell<std::time::Instant>,
    closed: &super::signal::LocalCancel,
) -> Liveness {
    use std::time::Instant;

    use crate::wire::pb::{envelope::Body, Heartbeat};
    let mut next_ping = Instant::now() + timing.heartbeat_interval;
    loop {
        // Wake for the next ping or the moment the peer would count as silent.
        let wake = next_ping.min(last_seen.get() + timing.heartbeat_wait);
        monoio::select! {
            _ = monoio::time::sleep(wake.saturating_duration_since(Instant::now())) => {}
            _ = closed.cancelled() => return Liveness::Closed,
        }
        let now = Instant::now();
        if now >= last_seen.get() + timing.heartbeat_wait {
            return Liveness::Silent;
        }
        if now >= next_ping {
            next_ping = now + timing.heartbeat_interval;
            let ping =
                Envelope { correlation_id: 0, body: Some(Body::Heartbeat(Heartbeat { ping: true, sent_at_ms: 0 })) };
            if writer.send(&ping).is_err() {
                return Liveness::Closed;
            }
        }
    }
}

/// How [`heartbeat`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// The peer stayed silent beyond the wait: close with `heartbeat_timeout`.
    Silent,
    /// The connection closed first.
    Closed,
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn frame_start(total: usize, arrived: usize) -> BytesMut {
        let mut b = BytesMut::with_capacity(arrived);
        b.extend_from_slice(&u32::try_from(total - 4).unwrap().to_be_bytes());
        b.resize(arrived, 7);
        b
    }

    /// A large frame ends in a buffer of exactly its size, grown with the
    /// bytes that arrived (at most doubling them), never with its announced
    /// length alone; small frames share a read chunk.
    #[test]
    fn a_large_frame_grows_into_a_buffer_of_its_own_size() {
        let total = 1_000_000 + 4;
        let mut buf = frame_start(total, 4);
        let mut allocations = 0;
        while buf.len() < total {
            if buf.capacity() - buf.len() < MIN_READ_SPARE {
                let arrived = buf.len();
                buf = make_room(buf);
                allocations += 1;
                assert!(buf.capacity() <= (2 * arrived).max(arrived + READ_CHUNK).max(READ_CHUNK + 4), "{arrived}");
                assert_eq!(
                    &buf[..4],
                    &u32::try_from(total - 4).unwrap().to_be_bytes(),
                    "the bytes that arrived are kept"
                );
            }
            // A read fills the room (at most a chunk at a time).
            let n = (buf.capacity() - buf.len()).min(READ_CHUNK);
            buf.resize(buf.len() + n, 7);
        }
        assert_eq!(buf.len(), total);
        assert!(buf.capacity() < total + MIN_READ_SPARE, "capacity {} for a frame of {total}", buf.capacity());
        assert!(allocations < 12, "{allocations} allocations");
        // A frame that fits a chunk reads into a shared chunk.
        let small = make_room(frame_start(1000, 10));
        assert!(small.capacity() >= READ_CHUNK);
        // Announcing 16 MiB with nothing behind it reserves one chunk.
        let announced = make_room(frame_start(16 << 20, 4));
        assert!(announced.capacity() <= READ_CHUNK + 8, "{}", announced.capacity());
    }
}
