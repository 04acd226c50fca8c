//! Opening upstream TCP connections without blocking the reactor.

use std::{
    io,
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use monoio::net::TcpStream;

use super::{authority, UpstreamError};

/// Connects to `host:port`: IP literals directly, names through the blocking
/// resolver thread (monoio's own `connect` would resolve on the reactor).
/// Tries each address in order; the whole attempt is bounded by `timeout`.
pub(crate) async fn connect(host: &str, port: u16, timeout: Duration) -> Result<TcpStream, UpstreamError> {
    let attempt = async {
        let addrs = match host.parse::<IpAddr>() {
            Ok(ip) => vec![SocketAddr::new(ip, port)],
            Err(_) => iop_core::rt::blocking::resolve(authority(host, port))
                .await
                .map_err(|source| UpstreamError::Resolve { authority: authority(host, port), source })?,
        };
        let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
        if addrs.is_empty() {
            return Err(UpstreamError::Resolve { authority: authority(host, port), source: last });
        }
        for addr in addrs {
            match TcpStream::connect_addr(addr).await {
                Ok(stream) => {
                    // Small SSE requests and heads must not wait for Nagle.
                    if let Err(e) = stream.set_nodelay(true) {
                        tracing::debug!(error = %e, "could not set TCP_NODELAY");
                    }
                    return Ok(stream);
                }
                Err(e) => last = e,
            }
        }
        Err(UpstreamError::Connect { authority: authority(host, port), source: last })
    };
    match iop_core::rt::time::timeout(timeout, attempt).await {
        Ok(res) => res,
        Err(_) => Err(UpstreamError::ConnectTimeout { authority: authority(host, port) }),
    }
}
