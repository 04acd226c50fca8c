//! The one stream type above TCP: plain or TLS, split into halves that
//! every reader and writer of the edge and the node use, so the two share
//! every code path above this module.

use std::{cell::RefCell, future::Future, io, rc::Rc};

use monoio::{
    buf::{IoBuf, IoBufMut, IoVecBuf, IoVecBufMut},
    io::{
        AsyncReadRent, AsyncWriteRent, CancelHandle, CancelableAsyncReadRent, OwnedReadHalf, OwnedWriteHalf, Splitable,
    },
    net::TcpStream,
    BufResult,
};
use rustls_pki_types::CertificateDer;

use super::tls_io::{self, Inbound, Session};
use crate::rt::either::Either;

/// A connection, plain or TLS (handshake done).
pub enum Stream {
    /// Plain TCP.
    Plain(TcpStream),
    /// TLS over TCP.
    Tls(Box<TlsStream>),
}

/// A TLS connection before it is split.
pub struct TlsStream {
    tcp: TcpStream,
    session: Session,
    inbound: Inbound,
    out: Vec<u8>,
}

impl TlsStream {
    /// Runs the handshake of `conn` (client or server side) on `tcp`. The
    /// caller bounds it in time.
    pub(crate) async fn handshake(mut tcp: TcpStream, conn: rustls::Connection) -> io::Result<Self> {
        let session: Session = Rc::new(RefCell::new(Box::new(conn)));
        let (mut inbound, mut out) = (Inbound::default(), Vec::new());
        tls_io::handshake(&mut tcp, &session, &mut inbound, &mut out).await?;
        Ok(Self { tcp, session, inbound, out })
    }
}

impl Stream {
    /// Sets `TCP_NODELAY`.
    pub fn set_nodelay(&self, on: bool) -> io::Result<()> {
        match self {
            Stream::Plain(s) => s.set_nodelay(on),
            Stream::Tls(t) => t.tcp.set_nodelay(on),
        }
    }

    /// Whether an idle connection (no read in flight) can carry a request:
    /// nothing has arrived on it and the peer has not closed it. Asked of
    /// the kernel without waiting (one non-blocking peek: no submission, no
    /// cancellation, no round trip through the ring). EOF, an error or
    /// unsolicited bytes (a late answer, a TLS alert) mean it cannot.
    pub fn idle_and_open(&self) -> bool {
        if let Stream::Tls(t) = self {
            if t.inbound.has_pending() {
                return false;
            }
        }
        let mut byte = [std::mem::MaybeUninit::uninit(); 1];
        match self.with_socket(|s| s.recv_with_flags(&mut byte, libc::MSG_PEEK | libc::MSG_DONTWAIT)) {
            Err(e) => e.kind() == io::ErrorKind::WouldBlock,
            // 0: EOF; more: bytes nobody asked for.
            Ok(_) => false,
        }
    }

    /// Shuts the connection down both ways now (the peer sees it end at
    /// once), for a connection abandoned mid-exchange. Dropping the stream
    /// alone ends it only after the ring has cancelled the read in flight
    /// and then closed the descriptor: two trips through a reactor that
    /// may be busy. No TLS close_notify: the exchange was cut, not ended.
    pub fn shutdown_now(&self) {
        // An error (already shut down, or reset by the peer) leaves nothing to do.
        let _ = self.with_socket(|s| s.shutdown(std::net::Shutdown::Both));
    }

    /// Runs `f` on the TCP socket under the stream, for calls that never
    /// block (no submission, no round trip through the ring).
    fn with_socket<R>(&self, f: impl FnOnce(socket2::SockRef<'_>) -> R) -> R {
        let tcp = match self {
            Stream::Plain(s) => s,
            Stream::Tls(t) => &t.tcp,
        };
        use std::os::fd::{AsRawFd, BorrowedFd};
        // SAFETY: the descriptor belongs to `tcp`, which outlives this borrow.
        #[allow(unsafe_code)]
        let fd = unsafe { BorrowedFd::borrow_raw(tcp.as_raw_fd()) };
        f(socket2::SockRef::from(&fd))
    }

    /// Whether this is a TLS connection.
    pub fn is_tls(&self) -> bool {
        matches!(self, Stream::Tls(_))
    }

    /// The peer's certificate chain (TLS with a client certificate, or any
    /// TLS client connection), leaf first.
    pub fn peer_certificates(&self) -> Option<Vec<CertificateDer<'static>>> {
        match self {
            Stream::Plain(_) => None,
            Stream::Tls(t) => {
                t.session.borrow().peer_certificates().map(|c| c.iter().map(|d| d.clone().into_owned()).collect())
            }
        }
    }

    /// The protocol ALPN settled on, if any.
    pub fn alpn_protocol(&self) -> Option<Vec<u8>> {
        match self {
            Stream::Plain(_) => None,
            Stream::Tls(t) => t.session.borrow().alpn_protocol().map(<[u8]>::to_vec),
        }
    }

    /// Splits the stream into a read and a write half.
    pub fn into_split(self) -> (ReadHalf, WriteHalf) {
        match self {
            Stream::Plain(s) => {
                let (r, w) = s.into_split();
                (ReadHalf::Plain(r), WriteHalf::Plain(w))
            }
            Stream::Tls(t) => {
                let TlsStream { tcp, session, inbound, out } = *t;
                let (r, w) = tcp.into_split();
                (
                    ReadHalf::Tls(Box::new(TlsRead { tcp: r, session: session.clone(), inbound })),
                    WriteHalf::Tls(Box::new(TlsWrite { tcp: w, session, out })),
                )
            }
        }
    }

    /// Releases the stream from this core's runtime to be adopted by
    /// another's (nothing may be in flight on it).
    pub fn detach(self) -> io::Result<Detached> {
        match self {
            Stream::Plain(s) => Ok(Detached::Plain(crate::rt::handoff::detach(s))),
            Stream::Tls(t) => {
                let TlsStream { tcp, session, inbound, out: _ } = *t;
                let conn = Rc::try_unwrap(session)
                    .map_err(|_| io::Error::other("a TLS stream still shared cannot move"))?
                    .into_inner();
                Ok(Detached::Tls(Box::new(DetachedTls { tcp: crate::rt::handoff::detach(tcp), conn, inbound })))
            }
        }
    }
}

/// A stream between two cores' runtimes (`Send`).
pub enum Detached {
    /// Plain TCP.
    Plain(std::net::TcpStream),
    /// TLS, with its session and the ciphertext already read.
    Tls(Box<DetachedTls>),
}

/// The parts of a detached TLS stream.
pub struct DetachedTls {
    tcp: std::net::TcpStream,
    conn: Box<rustls::Connection>,
    inbound: Inbound,
}

impl Detached {
    /// Adopts the stream into the current core's runtime.
    pub fn adopt(self) -> io::Result<Stream> {
        match self {
            Detached::Plain(s) => Ok(Stream::Plain(crate::rt::handoff::adopt(s)?)),
            Detached::Tls(t) => {
                let DetachedTls { tcp, conn, inbound } = *t;
                Ok(Stream::Tls(Box::new(TlsStream {
                    tcp: crate::rt::handoff::adopt(tcp)?,
                    session: Rc::new(RefCell::new(conn)),
                    inbound,
                    out: Vec::new(),
                })))
            }
        }
    }
}

/// The read half of a [`Stream`].
pub enum ReadHalf {
    /// Plain TCP.
    Plain(OwnedReadHalf<TcpStream>),
    /// TLS.
    Tls(Box<TlsRead>),
}

/// The read half of a TLS stream.
pub struct TlsRead {
    tcp: OwnedReadHalf<TcpStream>,
    session: Session,
    inbound: Inbound,
}

/// The write half of a [`Stream`].
pub enum WriteHalf {
    /// Plain TCP.
    Plain(OwnedWriteHalf<TcpStream>),
    /// TLS.
    Tls(Box<TlsWrite>),
}

/// The write half of a TLS stream.
pub struct TlsWrite {
    tcp: OwnedWriteHalf<TcpStream>,
    session: Session,
    out: Vec<u8>,
}

// The TLS arms are boxed: an I/O future of a plain connection (held by
// every open stream, e.g. its posted read) stays the size of a plain one.
// Reads and writes of a half return the arm's future itself (`Either`:
// plain left, TLS right), not an `async fn` over both: that would hold the
// buffer a second time.
impl AsyncReadRent for ReadHalf {
    fn read<T: IoBufMut>(&mut self, buf: T) -> impl Future<Output = BufResult<usize, T>> {
        match self {
            ReadHalf::Plain(r) => Either::Left { fut: r.read(buf) },
            ReadHalf::Tls(t) => {
                Either::Right { fut: Box::pin(tls_io::read(&mut t.tcp, &t.session, &mut t.inbound, buf, None)) }
            }
        }
    }

    async fn readv<T: IoVecBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            ReadHalf::Plain(r) => r.readv(buf).await,
            // Not used above this layer: no vectored reads of TLS.
            ReadHalf::Tls(_) => (Err(io::Error::from(io::ErrorKind::Unsupported)), buf),
        }
    }
}

impl AsyncWriteRent for WriteHalf {
    fn write<T: IoBuf>(&mut self, buf: T) -> impl Future<Output = BufResult<usize, T>> {
        match self {
            WriteHalf::Plain(w) => Either::Left { fut: w.write(buf) },
            WriteHalf::Tls(t) => Either::Right {
                fut: async move {
                    let res =
                        Box::pin(tls_io::write(&mut t.tcp, &t.session, &mut t.out, tls_io::write_bytes(&buf))).await;
                    (res, buf)
                },
            },
        }
    }

    fn writev<T: IoVecBuf>(&mut self, buf: T) -> impl Future<Output = BufResult<usize, T>> {
        match self {
            WriteHalf::Plain(w) => Either::Left { fut: w.writev(buf) },
            WriteHalf::Tls(t) => Either::Right {
                fut: async move {
                    let res =
                        Box::pin(tls_io::write(&mut t.tcp, &t.session, &mut t.out, tls_io::write_slices(&buf))).await;
                    (res, buf)
                },
            },
        }
    }

    async fn flush(&mut self) -> io::Result<()> {
        match self {
            WriteHalf::Plain(w) => w.flush().await,
            WriteHalf::Tls(t) => Box::pin(tls_io::send_pending(&mut t.tcp, &t.session, &mut t.out)).await,
        }
    }

    async fn shutdown(&mut self) -> io::Result<()> {
        match self {
            WriteHalf::Plain(w) => w.shutdown().await,
            WriteHalf::Tls(t) => {
                t.session.borrow_mut().send_close_notify();
                Box::pin(tls_io::send_pending(&mut t.tcp, &t.session, &mut t.out)).await?;
                t.tcp.shutdown().await
            }
        }
    }
}

impl AsyncReadRent for Stream {
    async fn read<T: IoBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            Stream::Plain(s) => s.read(buf).await,
            Stream::Tls(t) => {
                let t = &mut **t;
                Box::pin(tls_io::read(&mut t.tcp, &t.session, &mut t.inbound, buf, None)).await
            }
        }
    }

    async fn readv<T: IoVecBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            Stream::Plain(s) => s.readv(buf).await,
            Stream::Tls(_) => (Err(io::Error::from(io::ErrorKind::Unsupported)), buf),
        }
    }
}

impl AsyncWriteRent for Stream {
    async fn write<T: IoBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            Stream::Plain(s) => s.write(buf).await,
            Stream::Tls(t) => {
                let t = &mut **t;
                let res = Box::pin(tls_io::write(&mut t.tcp, &t.session, &mut t.out, tls_io::write_bytes(&buf))).await;
                (res, buf)
            }
        }
    }

    async fn writev<T: IoVecBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            Stream::Plain(s) => s.writev(buf).await,
            Stream::Tls(t) => {
                let t = &mut **t;
                let res = Box::pin(tls_io::write(&mut t.tcp, &t.session, &mut t.out, tls_io::write_slices(&buf))).await;
                (res, buf)
            }
        }
    }

    async fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush().await,
            Stream::Tls(t) => {
                let t = &mut **t;
                Box::pin(tls_io::send_pending(&mut t.tcp, &t.session, &mut t.out)).await
            }
        }
    }

    async fn shutdown(&mut self) -> io::Result<()> {
        match self {
            Stream::Plain(s) => s.shutdown().await,
            Stream::Tls(t) => {
                let t = &mut **t;
                t.session.borrow_mut().send_close_notify();
                Box::pin(tls_io::send_pending(&mut t.tcp, &t.session, &mut t.out)).await?;
                t.tcp.shutdown().await
            }
        }
    }
}

impl CancelableAsyncReadRent for ReadHalf {
    async fn cancelable_read<T: IoBufMut>(&mut self, buf: T, c: CancelHandle) -> BufResult<usize, T> {
        match self {
            ReadHalf::Plain(r) => r.cancelable_read(buf, c).await,
            ReadHalf::Tls(t) => Box::pin(tls_io::read(&mut t.tcp, &t.session, &mut t.inbound, buf, Some(c))).await,
        }
    }

    async fn cancelable_readv<T: IoVecBufMut>(&mut self, buf: T, c: CancelHandle) -> BufResult<usize, T> {
        match self {
            ReadHalf::Plain(r) => r.cancelable_readv(buf, c).await,
            ReadHalf::Tls(_) => (Err(io::Error::from(io::ErrorKind::Unsupported)), buf),
        }
    }
}

impl CancelableAsyncReadRent for Stream {
    async fn cancelable_read<T: IoBufMut>(&mut self, buf: T, c: CancelHandle) -> BufResult<usize, T> {
        match self {
            Stream::Plain(s) => s.cancelable_read(buf, c).await,
            Stream::Tls(t) => {
                let t = &mut **t;
                Box::pin(tls_io::read(&mut t.tcp, &t.session, &mut t.inbound, buf, Some(c))).await
            }
        }
    }

    async fn cancelable_readv<T: IoVecBufMut>(&mut self, buf: T, c: CancelHandle) -> BufResult<usize, T> {
        match self {
            Stream::Plain(s) => s.cancelable_readv(buf, c).await,
            Stream::Tls(_) => (Err(io::Error::from(io::ErrorKind::Unsupported)), buf),
        }
    }
}
