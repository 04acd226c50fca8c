//! Small read helpers over monoio's owned-buffer I/O.

use std::io;

use bytes::BytesMut;
use monoio::{buf::IoBufMut, io::AsyncReadRent};

/// Reads once, appending to `buf` (monoio reads overwrite from index 0, so
/// the read goes into the spare tail). Returns the bytes read; 0 = EOF.
/// The buffer travels with the read: dropping the future before it
/// completes (a timeout) leaves `buf` empty.
pub async fn read_append<R: AsyncReadRent>(io: &mut R, buf: &mut BytesMut, reserve: usize) -> io::Result<usize> {
    let mut owned = std::mem::take(buf);
    if owned.capacity() - owned.len() < reserve {
        owned.reserve(reserve);
    }
    let len = owned.len();
    let cap = owned.capacity();
    let (res, slice) = io.read(owned.slice_mut(len..cap)).await;
    *buf = slice.into_inner();
    res
}
