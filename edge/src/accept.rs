//! The accept loop shared by the client and node listeners: a counted cap
//! on what the accepted connections hold (client connections, node
//! handshakes), refusals at accept, and throttled logs for floods.

use std::{net::SocketAddr, time::Duration};

use iop_core::{
    limits::{LogThrottle, SlotGuard, Slots},
    rt::signal::LocalCancel,
};
use monoio::net::{TcpListener, TcpStream};

/// What a listener caps and how its floods are logged.
pub struct Gate {
    /// `client connection`, `node handshake`: for the log lines.
    pub what: &'static str,
    /// The config key of the cap, for the log line.
    pub key: &'static str,
    /// Held by every accepted connection until it no longer counts.
    pub slots: Slots,
    /// One line per interval when connections are refused.
    pub refused_log: &'static LogThrottle,
    /// One line per interval when accept fails (descriptors exhausted).
    pub failed_log: &'static LogThrottle,
}

/// Accepts until `stop` (if any) is raised. A connection beyond `limit()`
/// is closed at once, before descriptors run out; the others go to `serve`
/// with their slot.
pub async fn accept_loop(
    listener: TcpListener,
    stop: Option<&LocalCancel>,
    gate: &Gate,
    limit: impl Fn() -> usize,
    serve: impl Fn(TcpStream, SocketAddr, SlotGuard),
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
            Ok((stream, peer)) => {
                let limit = limit();
                match gate.slots.try_acquire(limit) {
                    Some(slot) => serve(stream, peer, slot),
                    None => {
                        drop(stream);
                        if let Some(more) = gate.refused_log.allow() {
                            tracing::warn!(
                                limit,
                                refused_since_last_report = more + 1,
                                "{} limit ({}) reached; refusing new connections",
                                gate.what,
                                gate.key
                            );
                        }
                    }
                }
            }
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
