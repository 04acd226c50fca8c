//! The accept loop shared by the client and node listeners: each accepted
//! connection is admitted by its listener's limits (connection cap,
//! handshake slots, per-address TLS handshakes) or closed at once, before
//! any work is spent on it, with throttled logs for floods.

use std::{net::SocketAddr, time::Duration};

use iop_core::{limits::LogThrottle, rt::signal::LocalCancel};
use monoio::net::{TcpListener, TcpStream};

use crate::limits::tls::TlsRefusal;

/// How a listener's floods are logged.
pub struct Gate {
    /// `client connection`, `node connection`: for the log lines.
    pub what: &'static str,
    /// One line per interval when connections are refused.
    pub refused_log: &'static LogThrottle,
    /// One line per interval when accept fails (descriptors exhausted).
    pub failed_log: &'static LogThrottle,
    /// Let the connection just served run before the next accept: with
    /// epoll an accept finds a backlog without waiting, and a burst (a
    /// node's links) would otherwise all be admitted before any of them
    /// has spoken, counting against its address at once.
    pub yield_after_accept: bool,
}

/// Why an accepted connection is closed at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused {
    /// The config key of the limit it met, for the log line.
    pub key: &'static str,
    /// The limit's value.
    pub limit: usize,
}

impl Refused {
    /// A TLS handshake refusal on the listener whose TLS section is `section`
    /// (`http.tls` or `node_listener.tls`).
    pub fn tls(section: &'static str, why: TlsRefusal, limits: iop_core::config::TlsHandshakeLimits) -> Self {
        let node = section.starts_with("node");
        let key = match (node, why) {
            (false, TlsRefusal::Rate) => "http.tls.handshakes_per_sec_per_address",
            (false, _) => "http.tls.max_handshakes_per_address",
            (true, TlsRefusal::Rate) => "node_listener.tls.handshakes_per_sec_per_address",
            (true, _) => "node_listener.tls.max_handshakes_per_address",
        };
        let limit = match why {
            TlsRefusal::Rate => limits.per_sec,
            TlsRefusal::Concurrency | TlsRefusal::TableFull => limits.concurrent,
        };
        Self { key, limit: usize::try_from(limit).unwrap_or(usize::MAX) }
    }
}

/// Accepts until `stop` (if any) is raised. `admit` decides, per peer,
/// what the connection holds (`T`) or why it is closed at once; admitted
/// connections go to `serve`.
pub async fn accept_loop<T>(
    listener: TcpListener,
    stop: Option<&LocalCancel>,
    gate: &Gate,
    admit: impl Fn(SocketAddr) -> Result<T, Refused>,
    serve: impl Fn(TcpStream, SocketAddr, T),
) {
    loop {
        let accepted = match stop {
            Some(stop) => monoio::select! {
                r = listener.accept() => r,
                _ = stop.cancelled() => return,
            },
            None => listener.accept().await,
        };
        match accepted {
            Ok((stream, peer)) => match admit(peer) {
                Ok(held) => {
                    serve(stream, peer, held);
                    if gate.yield_after_accept {
                        iop_core::rt::yield_now().await;
                    }
                }
                Err(Refused { key, limit }) => {
                    drop(stream);
                    if let Some(more) = gate.refused_log.allow() {
                        tracing::warn!(
                            limit,
                            %peer,
                            refused_since_last_report = more + 1,
                            "{} limit ({}) reached; refusing new connections",
                            gate.what,
                            key
                        );
                    }
                }
            },
            Err(e) => {
                if let Some(more) = gate.failed_log.allow() {
                    tracing::warn!(error = %e, failed_since_last_report = more + 1, "{} accept failed", gate.what);
                }
                // EMFILE and friends: back off instead of spinning.
                monoio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}
