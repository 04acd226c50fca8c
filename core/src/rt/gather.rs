//! Gathered writes: bytes queued as a list of [`Bytes`] segments and
//! written with `writev`, so relayed body bytes go from the buffer they
//! were read into straight to the socket, never copied. Framing bytes
//! (chunk sizes, frame prefixes) are appended to a small "glue" buffer that
//! becomes a segment of its own where a body segment follows.
//!
//! One of the few modules allowed `unsafe` (Cargo.toml lists them): monoio's
//! [`IoVecBuf`] is an unsafe trait (the kernel reads the iovec array and
//! the memory it points to while the write is in flight), and no type it
//! ships can hold `Bytes`.

use std::{future::Future, io};

use bytes::{Buf, Bytes, BytesMut};
use monoio::{buf::IoVecBuf, io::AsyncWriteRent};

/// Most segments one `writev` takes (Linux's `IOV_MAX`).
const MAX_IOVECS: usize = 1024;
/// Glue is allocated in blocks of this size: sealing shares the block
/// with the segment, so without a block size every seal would allocate.
const GLUE_BLOCK: usize = 512;

/// Bytes waiting to be written, in order. See the module docs.
#[derive(Debug, Default)]
pub struct Gather {
    /// Sealed segments, in order, all before `glue`.
    segments: Vec<Bytes>,
    /// Framing bytes after the last segment.
    glue: BytesMut,
    /// Total bytes queued (segments and glue).
    len: usize,
    /// Body segments pushed since creation (for tests and benches).
    pushed: u64,
    /// The iovec array of the last write, kept for its allocation (empty
    /// between writes).
    iovecs: Vec<libc::iovec>,
}

impl Gather {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends framing bytes (copied; they are small).
    pub fn put_slice(&mut self, b: &[u8]) {
        self.room(b.len());
        self.glue.extend_from_slice(b);
        self.len += b.len();
    }

    /// Appends whatever `write` puts into the glue buffer (copied; for
    /// encoders that write into a `BytesMut`).
    pub fn put_with<R>(&mut self, write: impl FnOnce(&mut BytesMut) -> R) -> R {
        // Small framing fits the block; larger writers reserve themselves.
        self.room(64);
        let before = self.glue.len();
        let r = write(&mut self.glue);
        self.len += self.glue.len() - before;
        r
    }

    /// Appends `b` as its own segment, without copying it.
    pub fn push(&mut self, b: Bytes) {
        if b.is_empty() {
            return;
        }
        self.seal();
        self.len += b.len();
        self.pushed += 1;
        self.segments.push(b);
    }

    /// Moves every byte of `other` to the end of this queue (no copy).
    pub fn append(&mut self, other: &mut Gather) {
        self.seal();
        other.seal();
        self.len += std::mem::take(&mut other.len);
        self.segments.append(&mut other.segments);
    }

    /// Bytes queued.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Body segments pushed so far.
    pub fn pushed(&self) -> u64 {
        self.pushed
    }

    /// Gives back the memory of an empty queue (its glue block and lists),
    /// for a stream that waits: one that idles between writes holds none.
    pub fn release(&mut self) {
        if self.is_empty() {
            *self = Self::new();
        }
    }

    /// Drops everything queued.
    pub fn clear(&mut self) {
        self.segments.clear();
        self.glue.clear();
        self.len = 0;
    }

    /// The queued bytes as one buffer (copies; for tests and small replies).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len);
        for s in &self.segments {
            v.extend_from_slice(s);
        }
        v.extend_from_slice(&self.glue);
        v
    }

    /// Makes room for `n` more glue bytes, a block at a time.
    fn room(&mut self, n: usize) {
        if self.glue.capacity() - self.glue.len() < n {
            self.glue.reserve(n.max(GLUE_BLOCK));
        }
    }

    /// Turns the glue written so far into a segment (shares its memory).
    fn seal(&mut self) {
        if !self.glue.is_empty() {
            self.segments.push(self.glue.split().freeze());
        }
    }

    /// Writes everything queued to `io` with vectored writes; the queue is
    /// empty afterwards, also on error (what was not written is dropped:
    /// a failed write ends the connection).
    pub fn write_to<'a, W: AsyncWriteRent>(&'a mut self, io: &'a mut W) -> impl Future<Output = io::Result<()>> + 'a {
        self.seal();
        // The lists go to the kernel inside the write and come back after
        // it: only the write's own state holds them while it is in flight
        // (this future lives under every open stream's write).
        async move {
            let mut start = 0;
            let res = loop {
                if start >= self.segments.len() {
                    break Ok(());
                }
                let slices =
                    IoSlices::describe(std::mem::take(&mut self.segments), std::mem::take(&mut self.iovecs), start);
                let (res, mut back) = io.writev(slices).await;
                let res = match res {
                    Ok(0) => Err(io::ErrorKind::WriteZero.into()),
                    res => res,
                };
                if let Ok(n) = res {
                    back.advance(n);
                }
                start = back.start;
                self.segments = back.bufs;
                self.iovecs = back.iovecs;
                if let Err(e) = res {
                    break Err(e);
                }
            };
            // Keep both lists' allocations for the next round.
            self.segments.clear();
            self.iovecs.clear();
            self.len = 0;
            res
        }
    }
}

/// Segments handed to the kernel: `bufs[start..]`, described by `iovecs`.
struct IoSlices {
    bufs: Vec<Bytes>,
    iovecs: Vec<libc::iovec>,
    start: usize,
}

impl IoSlices {
    /// `bufs[start..]`, up to [`MAX_IOVECS`] of them described.
    fn describe(bufs: Vec<Bytes>, iovecs: Vec<libc::iovec>, start: usize) -> Self {
        let mut slices = Self { bufs, iovecs, start };
        slices.fill_iovecs();
        slices
    }

    /// Describes up to [`MAX_IOVECS`] segments from `start`.
    fn fill_iovecs(&mut self) {
        self.iovecs.clear();
        for b in self.bufs[self.start..].iter().take(MAX_IOVECS) {
            // The kernel only reads through this pointer (writev).
            self.iovecs.push(libc::iovec { iov_base: b.as_ptr() as *mut libc::c_void, iov_len: b.len() });
        }
    }

    /// Skips the first `n` written bytes.
    fn advance(&mut self, mut n: usize) {
        while n > 0 && self.start < self.bufs.len() {
            let first = &mut self.bufs[self.start];
            if n < first.len() {
                first.advance(n);
                return;
            }
            n -= first.len();
            // Release written memory now, not at the end of the batch.
            *first = Bytes::new();
            self.start += 1;
        }
    }
}

/// Where the segments of a vectored write are: (address, length) of each
/// iovec of `buf`. For tests and benches that check no byte was copied on
/// its way to the kernel (a fake writer records these).
pub fn iovec_spans<T: IoVecBuf>(buf: &T) -> Vec<(usize, usize)> {
    let (ptr, len) = (buf.read_iovec_ptr(), buf.read_iovec_len());
    (0..len)
        .map(|i| {
            // SAFETY: `IoVecBuf`'s contract: `ptr` points to `len` valid iovecs.
            #[allow(unsafe_code)]
            let v = unsafe { *ptr.add(i) };
            (v.iov_base as usize, v.iov_len)
        })
        .collect()
}

// SAFETY: `iovecs` describes memory owned by `bufs` (`Bytes` never moves
// its bytes, also when the `Bytes` value itself moves), and neither vector
// is changed while the runtime owns the value: `fill_iovecs` and `advance`
// run only between writes, when the value is ours again. The pointer stays
// valid across moves of `IoSlices` because it points into the vector's
// heap buffer.
#[allow(unsafe_code)]
unsafe impl IoVecBuf for IoSlices {
    fn read_iovec_ptr(&self) -> *const libc::iovec {
        self.iovecs.as_ptr()
    }

    fn read_iovec_len(&self) -> usize {
        self.iovecs.len()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use std::{
        io::Read,
        net::TcpListener,
        thread,
        time::{Duration, Instant},
    };

    use super::*;

    #[test]
    fn framing_and_segments_keep_their_order() {
        let mut g = Gather::new();
        g.put_slice(b"a");
        g.push(Bytes::from_static(b"BB"));
        g.push(Bytes::new());
        g.put_with(|b| b.extend_from_slice(b"cc"));
        g.put_slice(b"d");
        g.push(Bytes::from_static(b"E"));
        let mut other = Gather::new();
        other.put_slice(b"f");
        other.push(Bytes::from_static(b"G"));
        g.append(&mut other);
        assert!(other.is_empty());
        assert_eq!(g.to_vec(), b"aBBccdEfG");
        assert_eq!((g.len(), g.pushed()), (9, 2));
    }

    /// Writes `segments` (each also shared with the caller) to a socket
    /// whose reader is slow, forcing partial writes.
    #[test]
    fn partial_writes_resume_where_they_stopped_and_nothing_is_copied() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        // More segments than one writev takes, and more bytes than socket buffers hold.
        let segments: Vec<Bytes> =
            (0..3000u32).map(|i| Bytes::from(vec![(i % 251) as u8; 700 + (i % 13) as usize])).collect();
        let mut expected = Vec::new();
        for (i, s) in segments.iter().enumerate() {
            expected.extend_from_slice(format!("<{i}>").as_bytes());
            expected.extend_from_slice(s);
        }
        let reader = thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 8192];
            let start = Instant::now();
            loop {
                // Slow at first, so the writer's socket buffer fills.
                if start.elapsed() < Duration::from_millis(200) {
                    thread::sleep(Duration::from_millis(20));
                }
                let n = s.read(&mut buf).unwrap();
                if n == 0 {
                    return got;
                }
                got.extend_from_slice(&buf[..n]);
            }
        });
        let ptrs: std::collections::HashSet<usize> = segments.iter().map(|s| s.as_ptr() as usize).collect();
        crate::rt::block_on_current(async move {
            let mut io = monoio::net::TcpStream::connect(addr).await.unwrap();
            let mut g = Gather::new();
            for (i, s) in segments.iter().enumerate() {
                g.put_slice(format!("<{i}>").as_bytes());
                g.push(s.clone());
            }
            // The queued segments are the caller's memory, not copies.
            assert!(g.segments.iter().filter(|s| ptrs.contains(&(s.as_ptr() as usize))).count() == segments.len());
            g.write_to(&mut io).await.unwrap();
            assert!(g.is_empty());
        })
        .unwrap();
        assert_eq!(reader.join().unwrap(), expected);
    }
}
