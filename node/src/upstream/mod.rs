//! HTTP/1.1 client for upstream providers, with keep-alive pooling per
//! `(host, port)`.
//!
//! - [`UpstreamClient`]: cheap to clone (`Rc` inside, one per reactor thread);
//!   [`UpstreamClient::send`] writes one [`Request`] and returns a
//!   [`Response`] once its head arrived.
//! - [`Response::chunk`] yields decoded body chunks. The connection goes back
//!   to the idle pool only when the body was read to the end, the response
//!   allowed keep-alive and no stray bytes followed it; a dropped or
//!   unfinished response closes the connection, which is how cancellation
//!   reaches the provider.
//! - A request sent on a pooled connection that fails before any response
//!   byte (the peer closed a stale keep-alive connection) is retried once on
//!   a fresh connection.
//!
//! Codecs come from [`iop_core::http`]; DNS runs on the blocking thread
//! ([`iop_core::rt::blocking::resolve`]), never on the reactor.

mod client;
mod connect;
mod pace;
mod pool;
#[cfg(test)]
pub(crate) mod test_server;

use std::{io, time::Duration};

use iop_core::http::{HttpError, Limits};

pub use client::{Request, Response, UpstreamClient};

/// Client settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientConfig {
    /// Bound for DNS resolution plus the TCP handshake.
    pub connect_timeout: Duration,
    /// Idle connections kept per `(host, port)`; the oldest go first.
    pub max_idle_per_host: usize,
    /// Idle connections older than this are closed instead of reused.
    pub idle_timeout: Duration,
    /// Response head limits and the largest decoded body accepted.
    pub limits: Limits,
    /// A fast streamed body is read at most once per this window
    /// (`pace.rs`); zero reads every piece as it lands.
    pub coalesce: Duration,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(10),
            max_idle_per_host: 128,
            // Shorter server keep-alive timeouts are covered by the
            // stale-connection retry.
            idle_timeout: Duration::from_secs(30),
            limits: Limits {
                max_head_bytes: 64 * 1024,
                // Streams can be long; callers bound what they buffer themselves.
                max_body_bytes: 1 << 30,
                max_headers: 128,
            },
            coalesce: iop_core::config::DEFAULT_STREAM_COALESCE,
        }
    }
}

/// Why an upstream request failed.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// Name resolution failed or gave no address.
    #[error("cannot resolve {authority}: {source}")]
    Resolve {
        /// `host:port`.
        authority: String,
        /// Resolver error.
        #[source]
        source: io::Error,
    },
    /// Every resolved address refused or failed the TCP handshake.
    #[error("cannot connect to {authority}: {source}")]
    Connect {
        /// `host:port`.
        authority: String,
        /// Error of the last address tried.
        #[source]
        source: io::Error,
    },
    /// The TLS handshake failed (an untrusted or mismatched certificate, a
    /// peer that does not speak TLS).
    #[error("TLS with {authority} failed: {source}")]
    Tls {
        /// `host:port`.
        authority: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Resolution plus handshake took longer than the connect timeout.
    #[error("connecting to {authority} timed out")]
    ConnectTimeout {
        /// `host:port`.
        authority: String,
    },
    /// Reading or writing the connection failed.
    #[error("upstream I/O error: {0}")]
    Io(#[source] io::Error),
    /// The peer closed the connection too early.
    #[error("upstream closed the connection {0}")]
    Closed(&'static str),
    /// The response is malformed or exceeds a limit.
    #[error("invalid upstream response: {0}")]
    Http(#[from] HttpError),
}

impl UpstreamError {
    /// The request never reached the provider (safe to send elsewhere).
    pub fn is_connect(&self) -> bool {
        matches!(self, Self::Resolve { .. } | Self::Connect { .. } | Self::Tls { .. } | Self::ConnectTimeout { .. })
    }

    /// A description for API clients: never the provider's address, which
    /// is internal (the node logs the full error).
    pub fn public_message(&self) -> String {
        match self {
            Self::Resolve { .. } => "the provider's host name could not be resolved".into(),
            Self::Connect { .. } => "the provider refused or failed the connection".into(),
            Self::ConnectTimeout { .. } => "connecting to the provider timed out".into(),
            Self::Tls { .. } => "the TLS handshake with the provider failed".into(),
            other => other.to_string(),
        }
    }
}

/// `host:port`, with brackets around IPv6 literals.
pub fn authority(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}
