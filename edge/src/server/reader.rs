//! A client connection's read side: at most one read posted at a time, and a
//! posted read outlives whatever await gave up on it (a timeout, a
//! disconnect watch whose response ended). So the read that watches for a
//! disconnect while a response is produced stays posted after it and
//! becomes the next request's head read: per keep-alive request one read
//! and no cancellation, where a watch of its own would cost a read, its
//! cancellation and a new head read.

use std::{
    future::{poll_fn, Future},
    io,
    pin::Pin,
    task::{Context, Poll},
};

use bytes::BytesMut;
use iop_core::net::ReadHalf;
use monoio::{buf::IoBufMut, io::AsyncReadRent};

type Half = ReadHalf;
/// The read owns the half while posted (its future borrows it), and gives
/// it back with the buffer.
type Posted = Pin<Box<dyn Future<Output = (Half, io::Result<usize>, BytesMut)>>>;

enum State {
    Idle(Half),
    Posted(Posted),
    /// Only between taking one state and setting the next.
    Moving,
}

/// The read half of a client connection.
pub struct ReadSide {
    state: State,
}

impl ReadSide {
    /// Wraps a read half with no read posted.
    pub fn new(half: Half) -> Self {
        Self { state: State::Idle(half) }
    }

    /// Whether a read is posted (its buffer, the connection's, travels with it).
    pub fn is_posted(&self) -> bool {
        matches!(self.state, State::Posted(_))
    }

    /// Posts a read into the spare tail of `buf` (made at least `reserve`
    /// bytes) unless one is posted already. `buf` travels with the read and
    /// is given back by [`Self::poll_read`]; it must not be written meanwhile.
    pub fn post(&mut self, buf: &mut BytesMut, reserve: usize) {
        let mut half = match std::mem::replace(&mut self.state, State::Moving) {
            State::Idle(half) => half,
            other => {
                self.state = other;
                return;
            }
        };
        let mut owned = std::mem::take(buf);
        if owned.capacity() - owned.len() < reserve {
            owned.reserve(reserve);
        }
        self.state = State::Posted(Box::pin(async move {
            let (len, cap) = (owned.len(), owned.capacity());
            let (res, slice) = half.read(owned.slice_mut(len..cap)).await;
            (half, res, slice.into_inner())
        }));
    }

    /// Polls the posted read. When it completes, `buf` is the connection's
    /// buffer again, with what was read appended; the result is the bytes
    /// read (0 = EOF). With no read posted this is a (pending) no-op.
    pub fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut BytesMut) -> Poll<io::Result<usize>> {
        let State::Posted(read) = &mut self.state else { return Poll::Pending };
        let (half, res, got) = std::task::ready!(read.as_mut().poll(cx));
        debug_assert!(buf.is_empty(), "the connection buffer was written while a read held it");
        *buf = got;
        self.state = State::Idle(half);
        Poll::Ready(res)
    }

    /// Reads once (or finishes the read already posted), appending to
    /// `buf`. Dropping this future leaves the read posted: its bytes are not
    /// lost but land in `buf` at the next read.
    pub async fn read_append(&mut self, buf: &mut BytesMut, reserve: usize) -> io::Result<usize> {
        self.post(buf, reserve);
        poll_fn(|cx| self.poll_read(cx, buf)).await
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use std::time::Duration;

    use monoio::{
        io::AsyncWriteRentExt,
        net::{TcpListener, TcpStream},
    };

    use super::*;

    #[test]
    fn a_read_given_up_on_keeps_its_bytes_for_the_next() {
        iop_core::rt::block_on_current(async {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let mut client = TcpStream::connect(addr).await.unwrap();
            let (server, _) = listener.accept().await.unwrap();
            let (rd, _wr) = iop_core::net::Stream::Plain(server).into_split();
            let mut rd = ReadSide::new(rd);
            let mut buf = BytesMut::from(&b"GET "[..]);

            // Nothing sent yet: the await is given up, the read stays posted
            // with the buffer (and what it held).
            let waited = iop_core::rt::time::timeout(Duration::from_millis(20), rd.read_append(&mut buf, 64)).await;
            assert!(waited.is_err());
            assert!(rd.is_posted());
            assert!(buf.is_empty(), "the buffer travels with the posted read");

            let (res, _) = client.write_all(&b"/ HTTP/1.1\r\n"[..]).await;
            res.unwrap();
            // A later read with another reserve finishes the posted one.
            let n = rd.read_append(&mut buf, 4096).await.unwrap();
            assert_eq!(n, 12);
            assert_eq!(&buf[..], b"GET / HTTP/1.1\r\n");
            assert!(!rd.is_posted());

            // Posting twice keeps the first read; EOF comes through it.
            rd.post(&mut buf, 16);
            rd.post(&mut buf, 16);
            drop(client);
            assert_eq!(rd.read_append(&mut buf, 16).await.unwrap(), 0);
            assert_eq!(&buf[..], b"GET / HTTP/1.1\r\n");
        })
        .unwrap();
    }
}
