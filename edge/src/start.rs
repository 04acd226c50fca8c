//! Starting the edge: bind per-core listeners, start the workers, and the
//! embedded node when configured.

use std::{
    net::{Ipv4Addr, SocketAddr},
    rc::Rc,
    sync::Arc,
    thread::JoinHandle,
    time::{SystemTime, UNIX_EPOCH},
};

use iop_core::{
    config::{EdgeConfig, NodeConfig, ReconnectPolicy},
    rt::{self, listener::bind_reuseport, mailbox},
};
use parking_lot::Mutex;

use crate::{ctx::Ctx, mesh::CoreMsg, pool::PoolView, registry::Registry, shared::Shared, worker};

/// Core inbox capacity (fences and config changes; small messages).
const INBOX_CAPACITY: usize = 4096;

/// The edge could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A listener could not be bound.
    #[error("cannot bind the {what}")]
    Bind {
        /// Which listener.
        what: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A worker thread could not be started.
    #[error("cannot start worker thread: {0}")]
    Thread(std::io::Error),
    /// `embedded_node` names a node that is not configured.
    #[error("embedded node `{0}` is not configured")]
    EmbeddedNode(String),
    /// TLS material that cannot be used (the error names its key).
    #[error("{0}")]
    Tls(#[from] iop_core::config::ConfigError),
    /// The credential lease key could not be made.
    #[error("{0}")]
    Leases(#[from] iop_core::lease::KeyError),
}

/// A running edge.
pub struct EdgeHandle {
    /// Where clients connect.
    pub http_addr: SocketAddr,
    /// Where nodes connect.
    pub node_addr: SocketAddr,
    /// Reactor in use.
    pub driver: rt::Driver,
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    /// Committed revision, config and pool view (for the next reload's diff).
    current: Mutex<(u64, Arc<EdgeConfig>, Arc<PoolView>)>,
    /// The config the process started with: what listeners, workers and
    /// the embedded node actually run with until a restart.
    startup: Arc<EdgeConfig>,
}

/// A live reload was not applied.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// A worker did not stage the config in time.
    #[error("worker cores did not acknowledge the new config in time")]
    Timeout,
    /// The edge is shutting down.
    #[error("the edge is shutting down")]
    Stopped,
    /// A listener's certificate or key could not be loaded again (the
    /// running ones stay, and so does the rest of the config).
    #[error("{0}")]
    Tls(String),
}

impl EdgeHandle {
    /// Starts a graceful shutdown: workers stop accepting clients, each
    /// connection closes after its current response, `/healthz` answers 503.
    /// Runs in flight go on (node sessions and leases keep working).
    pub fn shutdown(&self) {
        self.shared.draining.store(true, std::sync::atomic::Ordering::Release);
        for inbox in &self.shared.inboxes {
            let _ = send_blocking(inbox, CoreMsg::Shutdown);
        }
    }

    /// How long a shutdown waits for requests in flight.
    pub fn shutdown_grace(&self) -> std::time::Duration {
        self.current.lock().1.shutdown_grace
    }

    /// Client requests still being handled.
    pub fn active_requests(&self) -> usize {
        self.shared.active_requests.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Applies a new (validated) config on every core: prepare everywhere,
    /// then commit everywhere, so no core serves a mix. Listen addresses and
    /// the worker count only change on restart. Returns the new revision.
    pub fn reload(&self, config: EdgeConfig) -> Result<u64, ReloadError> {
        let mut current = self.current.lock();
        let (revision, _, old_pool) = &*current;
        let boot = &self.startup;
        if config.http.listen != boot.http.listen || config.node_listen != boot.node_listen {
            tracing::warn!("listen addresses differ from the running ones; they apply after a restart");
        }
        if config.workers != boot.workers || config.pin_workers != boot.pin_workers {
            tracing::warn!("`workers` or `pin_workers` differs from the running value; it applies after a restart");
        }
        if config.embedded_node != boot.embedded_node {
            tracing::warn!("`embedded_node` differs from the running one; it applies after a restart");
        }
        // Handshake limits apply at once; which files (or none) only on a restart.
        let same = |a: &Option<iop_core::config::ListenerTls>, b: &Option<iop_core::config::ListenerTls>| match (a, b) {
            (Some(a), Some(b)) => a.same_files(b),
            (None, None) => true,
            _ => false,
        };
        if !same(&config.http.tls, &boot.http.tls) || !same(&config.node_tls, &boot.node_tls) {
            tracing::warn!("TLS files differ from the running ones; they apply after a restart (the running files are read again now)");
        }
        // Certificates first: a renewed certificate that does not load
        // leaves everything as it was.
        for (section, tls) in [("http.tls", &self.shared.http_tls), ("node_listener.tls", &self.shared.node_tls)] {
            if let Some(tls) = tls {
                tls.reload().map_err(|e| ReloadError::Tls(format!("{section}: {e}")))?;
            }
        }
        let revision = revision + 1;
        let config = Arc::new(config);
        let pool = Arc::new(PoolView::build(&config, Some(old_pool)));
        let (ack_tx, ack_rx) = crossbeam_channel::bounded(self.shared.inboxes.len());
        for inbox in &self.shared.inboxes {
            let msg =
                CoreMsg::PrepareConfig { revision, config: config.clone(), pool: pool.clone(), ack: ack_tx.clone() };
            send_blocking(inbox, msg)?;
        }
        for _ in 0..self.shared.inboxes.len() {
            ack_rx.recv_timeout(std::time::Duration::from_secs(10)).map_err(|_| ReloadError::Timeout)?;
        }
        for inbox in &self.shared.inboxes {
            send_blocking(inbox, CoreMsg::CommitConfig { revision })?;
        }
        *current = (revision, config, pool);
        self.shared.events.publish(crate::events::EdgeEvent::ConfigReloaded { revision });
        tracing::info!(revision, "config reloaded");
        Ok(revision)
    }

    /// Records a config that failed validation (the old one stays).
    pub fn reject_reload(&self, error: String) {
        tracing::error!(%error, "config reload rejected; keeping the current config");
        self.shared.events.publish(crate::events::EdgeEvent::ConfigRejected { error });
    }

    /// Waits for the worker threads.
    pub fn join(self) {
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// Sends from a non-reactor thread, waiting for room.
fn send_blocking(inbox: &mailbox::Sender<CoreMsg>, mut msg: CoreMsg) -> Result<(), ReloadError> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match inbox.try_send(msg) {
            Ok(()) => return Ok(()),
            Err(mailbox::SendError::Closed(_)) => return Err(ReloadError::Stopped),
            Err(mailbox::SendError::Full(m)) => {
                if std::time::Instant::now() > deadline {
                    return Err(ReloadError::Timeout);
                }
                msg = m;
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
    }
}

/// The listeners' TLS material (file reads: before any reactor runs).
pub fn load_tls(
    config: &EdgeConfig,
) -> Result<(Option<iop_core::net::tls::ServerTls>, Option<iop_core::net::tls::ServerTls>), StartError> {
    use iop_core::{config::tls::server_tls, net::tls};
    let http = config.http.tls.as_ref().map(|t| server_tls("http.tls", t, tls::ALPN_HTTP1)).transpose()?;
    let node = config.node_tls.as_ref().map(|t| server_tls("node_listener.tls", t, tls::ALPN_LINK)).transpose()?;
    Ok((http, node))
}

/// Binds the listeners and starts `config.workers` workers (pinned with
/// `pin_workers`).
pub fn start(config: EdgeConfig) -> Result<EdgeHandle, StartError> {
    let workers = config.workers.max(1);
    let pin = config.pin_workers;
    let http = bind_reuseport(config.http.listen, workers)
        .map_err(|source| StartError::Bind { what: "client HTTP listener", source })?;
    let node_listen = config.node_listen.unwrap_or(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)));
    let nodes =
        bind_reuseport(node_listen, workers).map_err(|source| StartError::Bind { what: "node listener", source })?;
    let local = |ls: &[std::net::TcpListener], what| {
        ls.first()
            .and_then(|l| l.local_addr().ok())
            .ok_or_else(|| StartError::Bind { what, source: std::io::Error::other("no listener bound") })
    };
    let http_addr = local(&http, "client HTTP listener")?;
    let node_addr = local(&nodes, "node listener")?;

    let embedded = match &config.embedded_node {
        Some(e) => {
            let node = config.node(&e.node_id).ok_or_else(|| StartError::EmbeddedNode(e.node_id.clone()))?;
            Some(NodeConfig {
                edges: vec![node_addr.to_string()],
                token: node.token.clone(),
                // One link per edge worker, like a node of its own.
                workers: config.workers,
                // It shares the edge's threads' cores: never pinned.
                pin_workers: false,
                reconnect: ReconnectPolicy { max_attempts: None, interval: std::time::Duration::from_secs(1) },
                max_frame_bytes: config.max_frame_bytes,
                shutdown_grace: std::time::Duration::from_secs(5),
                testing: config.testing,
                // Its stall counters are the process's: no listener of its own.
                metrics_listen: None,
                // Loopback; the config refuses an embedded node beside
                // a TLS node listener.
                edge_tls: None,
                stream_coalesce: iop_core::config::DEFAULT_STREAM_COALESCE,
                // No run store: a quickstart leaves no database in its
                // working directory; a node of its own keeps one.
                store: None,
            })
        }
        None => None,
    };

    let (http_tls, node_tls) = load_tls(&config)?;
    let managed = config.node_tls.as_ref().is_some_and(|t| t.client_ca.is_some());
    let leases =
        if managed { Some(Arc::new(iop_core::lease::Issuer::generate(config.testing.lease_ttl)?)) } else { None };
    let driver = rt::Driver::detect();
    let open_files = iop_core::limits::raise_open_file_limit();
    let default_max_connections = iop_core::limits::default_max_connections(open_files);
    let max_connections = config.http.max_connections.unwrap_or(default_max_connections);
    tracing::info!(driver = driver.name(), workers, %http_addr, %node_addr, open_files, max_connections, "iop-edge starting");

    let (inboxes, receivers): (Vec<_>, Vec<_>) = (0..workers).map(|_| mailbox::mailbox(INBOX_CAPACITY)).unzip();
    let instance =
        format!("{:x}", SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros()).unwrap_or(0) & 0xffff_ffff);
    let key_limits = Arc::new(crate::pool::keys::LimitTable::default());
    let (cluster, cluster_runner) = match &config.cluster {
        Some(c) => {
            let (engine, runner) = crate::cluster::Engine::new(c, &instance, key_limits.clone());
            (Some(engine), Some(runner))
        }
        None => (None, None),
    };
    let shared = Arc::new(Shared {
        config: Arc::new(config),
        registry: Mutex::new(Registry::new()),
        inboxes,
        instance,
        http_addr,
        node_addr,
        workers,
        events: crate::events::EventBus::new(),
        active_requests: Default::default(),
        draining: Default::default(),
        connections: Default::default(),
        websockets: Default::default(),
        default_max_connections,
        handshakes: Default::default(),
        auth: Default::default(),
        http_tls_limit: Default::default(),
        node_tls_limit: Default::default(),
        http_tls,
        node_tls,
        leases,
        workspaces: Default::default(),
        key_limits,
        cluster,
    });
    if let Some(runner) = cluster_runner {
        // Not joined: it ends with the process.
        let events = Arc::downgrade(&shared);
        runner
            .spawn(Box::new(move |ev| {
                if let Some(s) = events.upgrade() {
                    s.events.publish(ev);
                }
            }))
            .map_err(StartError::Thread)?;
    }
    let pool = Arc::new(PoolView::build(&shared.config, None));

    let mut threads = Vec::with_capacity(workers + 1);
    for (index, ((http_l, node_l), inbox)) in http.into_iter().zip(nodes).zip(receivers).enumerate() {
        let shared = shared.clone();
        let pool = pool.clone();
        let t = rt::spawn_worker("iop-edge", index, pin, move || async move {
            let w = Rc::new(Ctx::new(index, shared, pool));
            worker::run(w, http_l, node_l, inbox).await;
        })
        .map_err(StartError::Thread)?;
        threads.push(t);
    }
    if let Some(node_cfg) = embedded {
        let t = iop_node::spawn_embedded(node_cfg).map_err(StartError::Thread)?;
        threads.push(t);
    }
    let current = Mutex::new((1, shared.config.clone(), pool));
    let startup = shared.config.clone();
    Ok(EdgeHandle { http_addr, node_addr, driver, shared, threads, current, startup })
}
