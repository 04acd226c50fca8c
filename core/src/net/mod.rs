//! The network seam: one stream type for plain TCP and TLS ([`Stream`],
//! split into [`ReadHalf`] and [`WriteHalf`]) and the TLS configurations
//! that make one ([`tls`]). Everything above reads and writes these halves,
//! so plain and TLS connections share every code path.

mod buf;
mod stream;
pub mod tls;
mod tls_io;

#[cfg(test)]
mod tests;

pub use stream::{Detached, DetachedTls, ReadHalf, Stream, TlsRead, TlsStream, TlsWrite, WriteHalf};
