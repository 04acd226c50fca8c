//! Opening upstream connections (TCP, then TLS for https) without blocking
//! the reactor.

use std::{
    io,
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use iop_core::net::{tls::ClientTls, Stream};
use monoio::net::TcpStream;

use super::{authority, UpstreamError};

/// Connects to `host:port`: IP literals directly, names through the blocking
/// resolver thread (monoio's own `connect` would resolve on the reactor).
/// Tries each address in order; then, with `tls`, the TLS handshake (the
/// host as SNI and the name the certificate must be valid for). The whole
/// attempt is bounded by `timeout`.
pub(crate) async fn connect(
    host: &str,
    port: u16,
    tls: Option<&ClientTls>,
    timeout: Duration,
) -> Result<Stream, UpstreamError> {
    let attempt = async {
        let tcp = connect_tcp(host, port).await?;
        match tls {
            None => Ok(Stream::Plain(tcp)),
            // Boxed: a handshake's state would otherwise be part of every
            // run's future, plain ones included, for as long as it streams.
            Some(tls) => Box::pin(tls.connect(tcp, host))
                .await
                .map_err(|source| UpstreamError::Tls { authority: authority(host, port), source }),
        }
    };
    match iop_core::rt::time::timeout(timeout, attempt).await {
        Ok(res) => res,
        Err(_) => Err(UpstreamError::ConnectTimeout { authority: authority(host, port) }),
    }
}

async fn connect_tcp(host: &str, port: u16) -> Result<TcpStream, UpstreamError> {
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
    attempt.await
}
