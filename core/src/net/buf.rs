//! The two places the TLS layer touches monoio's owned buffers directly:
//! decrypted bytes are copied into a read's buffer, and a vectored write's
//! iovecs are read as slices to be encrypted.
//!
//! `unsafe` here, as in `rt/gather.rs`: monoio's buffer traits are unsafe
//! traits that hand out raw pointers (the kernel reads and writes through
//! them), and they offer no safe way in or out.

use std::io::{self, IoSlice};

use monoio::buf::{IoBuf, IoBufMut, IoVecBuf};

/// Fills `buf` from `read` (which gets the buffer's whole room as a slice
/// and returns how much it wrote) and marks that much initialized.
pub fn read_into<T: IoBufMut>(buf: &mut T, read: impl FnOnce(&mut [u8]) -> io::Result<usize>) -> io::Result<usize> {
    let total = buf.bytes_total();
    if total == 0 {
        return Ok(0);
    }
    // SAFETY: `IoBufMut`'s contract: `write_ptr` is valid for writes of
    // `bytes_total` bytes while `buf` is borrowed. The bytes may be
    // uninitialized; `read` (rustls' plaintext reader) only writes them.
    #[allow(unsafe_code)]
    let room = unsafe { std::slice::from_raw_parts_mut(buf.write_ptr(), total) };
    let n = read(room)?;
    let n = n.min(total);
    // SAFETY: `read` wrote the first `n` bytes.
    #[allow(unsafe_code)]
    unsafe {
        buf.set_init(n)
    };
    Ok(n)
}

/// The initialized bytes of `buf`.
pub fn bytes_of<T: IoBuf>(buf: &T) -> &[u8] {
    // SAFETY: `IoBuf`'s contract: `read_ptr` is valid for reads of
    // `bytes_init` bytes while `buf` is borrowed.
    #[allow(unsafe_code)]
    unsafe {
        std::slice::from_raw_parts(buf.read_ptr(), buf.bytes_init())
    }
}

/// Calls `f` with the segments of a vectored write as slices.
pub fn with_slices<T: IoVecBuf, R>(buf: &T, f: impl FnOnce(&[IoSlice<'_>]) -> R) -> R {
    let (ptr, len) = (buf.read_iovec_ptr(), buf.read_iovec_len());
    let slices: Vec<IoSlice<'_>> = (0..len)
        .map(|i| {
            // SAFETY: `IoVecBuf`'s contract: `ptr` points to `len` iovecs,
            // each valid for reads of its length while `buf` is borrowed.
            #[allow(unsafe_code)]
            unsafe {
                let v = *ptr.add(i);
                IoSlice::new(std::slice::from_raw_parts(v.iov_base as *const u8, v.iov_len))
            }
        })
        .collect();
    f(&slices)
}
