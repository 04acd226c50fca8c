//! TLS over a monoio TCP stream, on rustls' sans-I/O connection: ciphertext
//! is read and written by us, so the two halves of a split stream share only
//! the rustls state, borrowed briefly and never across an await. A read
//! half decrypts; a write half encrypts and sends. TLS records the read side
//! causes to be sent (a key update's answer) go out with the next write.

use std::{
    cell::RefCell,
    io::{self, Read, Write},
    rc::Rc,
};

use bytes::{Buf, BytesMut};
use monoio::{
    buf::{IoBuf, IoBufMut, IoVecBuf},
    io::{AsyncWriteRent, AsyncWriteRentExt, CancelHandle, CancelableAsyncReadRent},
    BufResult,
};

use super::buf;

/// Ciphertext read at a time: a whole record and its overhead.
const CIPHER_RESERVE: usize = 16 * 1024 + 512;

/// The rustls state both halves of a stream share.
pub(crate) type Session = Rc<RefCell<Box<rustls::Connection>>>;

/// Ciphertext received and not yet handed to rustls.
#[derive(Default)]
pub(crate) struct Inbound {
    pub(crate) cipher: BytesMut,
    eof: bool,
}

impl Inbound {
    /// Whether bytes or the peer's EOF were read and not yet consumed.
    pub(crate) fn has_pending(&self) -> bool {
        self.eof || !self.cipher.is_empty()
    }
}

/// Hands buffered ciphertext to rustls while it takes more.
fn feed(conn: &mut rustls::Connection, inbound: &mut Inbound) -> io::Result<()> {
    while !inbound.cipher.is_empty() && conn.wants_read() {
        let mut rd: &[u8] = &inbound.cipher[..];
        let n = conn.read_tls(&mut rd)?;
        inbound.cipher.advance(n);
        conn.process_new_packets().map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        if n == 0 {
            break;
        }
    }
    Ok(())
}

/// Reads ciphertext once into `inbound` (0 = the peer closed); `cancel`
/// can end the read (then with an error, nothing lost).
async fn read_cipher<R: CancelableAsyncReadRent>(
    tcp: &mut R,
    conn: &Session,
    inbound: &mut Inbound,
    cancel: Option<CancelHandle>,
) -> io::Result<usize> {
    let n = match cancel {
        None => crate::rt::io::read_append(tcp, &mut inbound.cipher, CIPHER_RESERVE).await?,
        Some(c) => {
            let mut owned = std::mem::take(&mut inbound.cipher);
            if owned.capacity() - owned.len() < CIPHER_RESERVE {
                owned.reserve(CIPHER_RESERVE);
            }
            let (len, cap) = (owned.len(), owned.capacity());
            let (res, slice) = tcp.cancelable_read(owned.slice_mut(len..cap), c).await;
            inbound.cipher = slice.into_inner();
            res?
        }
    };
    if n == 0 {
        inbound.eof = true;
        // rustls learns of the end (a read of nothing).
        conn.borrow_mut().read_tls(&mut &[][..])?;
    }
    Ok(n)
}

/// Reads decrypted bytes into `buf`. 0 = the stream ended (with or without
/// the peer's close_notify: HTTP and the wire frame their own messages, so
/// a cut-off message is told apart above this).
pub(crate) async fn read<R: CancelableAsyncReadRent, T: IoBufMut>(
    tcp: &mut R,
    conn: &Session,
    inbound: &mut Inbound,
    mut buf: T,
    cancel: Option<CancelHandle>,
) -> BufResult<usize, T> {
    loop {
        let got = {
            let mut c = conn.borrow_mut();
            match feed(&mut c, inbound) {
                Ok(()) => buf::read_into(&mut buf, |room| c.reader().read(room)),
                Err(e) => Err(e),
            }
        };
        match got {
            Ok(n) => return (Ok(n), buf),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && !inbound.eof => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::UnexpectedEof => {
                return (Ok(0), buf)
            }
            Err(e) => return (Err(e), buf),
        }
        if let Err(e) = read_cipher(tcp, conn, inbound, cancel.clone()).await {
            return (Err(e), buf);
        }
    }
}

/// Sends what rustls has to send (reusing `out` for the ciphertext).
pub(crate) async fn send_pending<W: AsyncWriteRent>(tcp: &mut W, conn: &Session, out: &mut Vec<u8>) -> io::Result<()> {
    loop {
        let mut cipher = std::mem::take(out);
        {
            let mut c = conn.borrow_mut();
            while c.wants_write() {
                c.write_tls(&mut cipher)?;
            }
        }
        if cipher.is_empty() {
            *out = cipher;
            return Ok(());
        }
        let (res, mut back) = tcp.write_all(cipher).await;
        back.clear();
        *out = back;
        res?;
    }
}

/// Encrypts and sends as much of `plain` as rustls takes now; returns how
/// much that was.
pub(crate) async fn write<W: AsyncWriteRent>(
    tcp: &mut W,
    conn: &Session,
    out: &mut Vec<u8>,
    plain: impl FnOnce(&mut rustls::Writer<'_>) -> io::Result<usize>,
) -> io::Result<usize> {
    // Room first: what an earlier write or the read side left queued.
    send_pending(tcp, conn, out).await?;
    let n = plain(&mut conn.borrow_mut().writer())?;
    send_pending(tcp, conn, out).await?;
    Ok(n)
}

/// Completes the handshake on a stream not yet split, within no deadline
/// of its own (the caller bounds it).
pub(crate) async fn handshake<S: CancelableAsyncReadRent + AsyncWriteRent>(
    tcp: &mut S,
    conn: &Session,
    inbound: &mut Inbound,
    out: &mut Vec<u8>,
) -> io::Result<()> {
    loop {
        send_pending(tcp, conn, out).await?;
        if !conn.borrow().is_handshaking() {
            return Ok(());
        }
        let fed = {
            let mut c = conn.borrow_mut();
            feed(&mut c, inbound)
        };
        if let Err(e) = fed {
            // Tell the peer why (an alert), then give up.
            let _ = send_pending(tcp, conn, out).await;
            return Err(e);
        }
        let (handshaking, wants_read, wants_write) = {
            let c = conn.borrow();
            (c.is_handshaking(), c.wants_read(), c.wants_write())
        };
        if !handshaking || wants_write {
            continue;
        }
        if !wants_read {
            return Err(io::Error::other("the TLS handshake stalled"));
        }
        if inbound.eof {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the peer closed during the TLS handshake"));
        }
        read_cipher(tcp, conn, inbound, None).await?;
    }
}

/// The plaintext of a vectored write.
pub(crate) fn write_slices<T: IoVecBuf>(buf: &T) -> impl FnOnce(&mut rustls::Writer<'_>) -> io::Result<usize> + '_ {
    move |w| buf::with_slices(buf, |s| w.write_vectored(s))
}

/// The plaintext of a one-buffer write.
pub(crate) fn write_bytes<T: IoBuf>(buf: &T) -> impl FnOnce(&mut rustls::Writer<'_>) -> io::Result<usize> + '_ {
    move |w| w.write(buf::bytes_of(buf))
}
