//! State shared by every worker thread (cold paths only: registry, config,
//! the inboxes used to broadcast to cores).

use std::{net::SocketAddr, sync::Arc};

use iop_core::{config::EdgeConfig, limits::Slots, rt::mailbox};
use parking_lot::Mutex;

use crate::{mesh::CoreMsg, registry::Registry};

/// Process-wide edge state.
pub struct Shared {
    /// Active configuration.
    pub config: Arc<EdgeConfig>,
    /// Authoritative node ownership.
    pub registry: Mutex<Registry<crate::link::LinkHandle>>,
    /// Inbox of each worker core, by index.
    pub inboxes: Vec<mailbox::Sender<CoreMsg>>,
    /// Prefix making run ids unique across edge processes.
    pub instance: String,
    /// Bound client HTTP address.
    pub http_addr: SocketAddr,
    /// Bound node listener address.
    pub node_addr: SocketAddr,
    /// Number of worker cores.
    pub workers: usize,
    /// Lifecycle events.
    pub events: crate::events::EventBus,
    /// Client requests being handled (head parsed, response not yet complete).
    pub active_requests: std::sync::atomic::AtomicUsize,
    /// Shutting down: no new connections; connections close after their
    /// current response.
    pub draining: std::sync::atomic::AtomicBool,
    /// Open client connections (bounded by `http.max_connections`).
    pub connections: Slots,
    /// Open Responses API WebSockets (bounded by `http.max_websockets`).
    pub websockets: Slots,
    /// `http.max_connections` when the config leaves it unset.
    pub default_max_connections: usize,
    /// Node connections that have not yet completed the handshake.
    pub handshakes: Arc<crate::limits::handshakes::HandshakeTable>,
    /// Failed credential checks per address, one table per kind of credential.
    pub auth: crate::limits::failures::AuthLimits,
    /// TLS handshakes per address on the client listener.
    pub http_tls_limit: Arc<crate::limits::tls::TlsLimiter>,
    /// TLS handshakes per address on the node listener.
    pub node_tls_limit: Arc<crate::limits::tls::TlsLimiter>,
    /// TLS of the client listener (`[http.tls]`), reloaded on SIGHUP.
    pub http_tls: Option<iop_core::net::tls::ServerTls>,
    /// TLS of the node listener (`[node_listener.tls]`), reloaded on SIGHUP.
    pub node_tls: Option<iop_core::net::tls::ServerTls>,
    /// Managed mode (`node_listener.tls.client_ca`): the key credential
    /// leases are signed with (made at start, never stored).
    pub leases: Option<Arc<iop_core::lease::Issuer>>,
    /// The workspaces each node's generation refused.
    pub workspaces: crate::workspaces::Served,
    /// API key limits set at run time (the admin API; with `[cluster]`,
    /// the engine's copy).
    pub key_limits: Arc<crate::pool::keys::LimitTable>,
    /// The shared limits engine (`[cluster]`).
    pub cluster: Option<Arc<crate::cluster::Engine>>,
}

/// Counts one client request as active while it lives.
pub struct ActiveRequest<'a>(&'a Shared);

impl<'a> ActiveRequest<'a> {
    /// Starts counting.
    pub fn new(shared: &'a Shared) -> Self {
        shared.active_requests.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        Self(shared)
    }
}

impl Drop for ActiveRequest<'_> {
    fn drop(&mut self) {
        self.0.active_requests.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

impl Shared {
    /// Delivers a message made by `make` to every core, waiting for inbox
    /// room rather than dropping a fence.
    pub async fn broadcast(&self, make: impl Fn() -> CoreMsg) {
        for inbox in &self.inboxes {
            if inbox.send(make()).await.is_err() {
                tracing::debug!("core inbox closed during broadcast");
            }
        }
    }
}
