//! Moving an accepted TCP connection to another worker core: detached from
//! this core's runtime as a `std::net::TcpStream` (which is `Send`), then
//! adopted by the other core's runtime. For node links, which the edge
//! places on a core by their index once it has read who they are.
//!
//! `unsafe` here: monoio hands out the raw descriptor (`into_raw_fd`, which
//! deregisters it from this runtime without closing it), and std can only
//! take ownership of a raw descriptor through `FromRawFd`.

use std::{
    io,
    os::fd::{FromRawFd, IntoRawFd},
};

/// Releases `stream` from this core's runtime. No operation may be in
/// flight on it (none is between two awaited reads or writes).
pub fn detach(stream: monoio::net::TcpStream) -> std::net::TcpStream {
    let fd = stream.into_raw_fd();
    // SAFETY: `into_raw_fd` just gave up the only owner of `fd` (monoio
    // deregistered it and will not close it), so the new owner is unique.
    #[allow(unsafe_code)]
    unsafe {
        std::net::TcpStream::from_raw_fd(fd)
    }
}

/// Adopts a detached stream into the current core's runtime.
pub fn adopt(stream: std::net::TcpStream) -> io::Result<monoio::net::TcpStream> {
    monoio::net::TcpStream::from_std(stream)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use std::io::{Read, Write};

    use monoio::io::{AsyncReadRentExt, AsyncWriteRentExt};

    use super::*;

    #[test]
    fn a_connection_moves_between_runtimes_without_losing_bytes() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let peer = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            s.write_all(b"one two ").unwrap();
            let mut buf = [0u8; 5];
            s.read_exact(&mut buf).unwrap();
            buf
        });
        // Core A reads a first part, then lets the connection go.
        let detached = crate::rt::block_on_current(async move {
            let mut s = monoio::net::TcpStream::connect(addr).await.unwrap();
            let (res, buf) = s.read_exact(vec![0u8; 4]).await;
            res.unwrap();
            assert_eq!(&buf, b"one ");
            detach(s)
        })
        .unwrap();
        // Core B (another thread, another runtime) carries on.
        let got = std::thread::spawn(move || {
            crate::rt::block_on_current(async move {
                let mut s = adopt(detached).unwrap();
                let (res, buf) = s.read_exact(vec![0u8; 4]).await;
                res.unwrap();
                let (res, _) = s.write_all(b"hello").await;
                res.unwrap();
                buf
            })
            .unwrap()
        })
        .join()
        .unwrap();
        assert_eq!(&got, b"two ");
        assert_eq!(&peer.join().unwrap(), b"hello");
    }
}
