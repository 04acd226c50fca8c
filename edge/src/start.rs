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

use crate::{
    pool::PoolView,
    registry::Registry,
    shared::Shared,
    worker::{self, CoreMsg, Worker},
};

/// Core inbox capacity (fences and config changes; small messages).
const INBOX_CAPACITY: usize = 4096;

/// The edge could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A listener could not be bound.
    #[error("{what}: {source}")]
    Bind {
        /// Which listener.
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// A worker thread could not be started.
    #[error("cannot start worker thread: {0}")]
    Thread(std::io::Error),
    /// `embedded_node` names a node that is not configured.
    #[error("embedded node `{0}` is not configured")]
    EmbeddedNode(String),
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
}

impl EdgeHandle {
    /// Asks every worker to stop.
    pub fn shutdown(&self) {
        for inbox in &self.shared.inboxes {
            let _ = inbox.try_send(CoreMsg::Shutdown);
        }
    }

    /// Waits for the worker threads.
    pub fn join(self) {
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// Binds the listeners and starts `config.workers` pinned workers.
pub fn start(config: EdgeConfig) -> Result<EdgeHandle, StartError> {
    let workers = config.workers.max(1);
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
                edge: node_addr.to_string(),
                token: node.token.clone(),
                reconnect: ReconnectPolicy { max_attempts: None, interval: std::time::Duration::from_secs(1) },
                max_frame_bytes: config.max_frame_bytes,
                shutdown_grace: std::time::Duration::from_secs(5),
                testing: config.testing,
            })
        }
        None => None,
    };

    let driver = rt::Driver::detect();
    tracing::info!(driver = driver.name(), workers, %http_addr, %node_addr, "iop-edge starting");

    let (inboxes, receivers): (Vec<_>, Vec<_>) = (0..workers).map(|_| mailbox::mailbox(INBOX_CAPACITY)).unzip();
    let instance =
        format!("{:x}", SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros()).unwrap_or(0) & 0xffff_ffff);
    let shared = Arc::new(Shared {
        config: Arc::new(config),
        registry: Mutex::new(Registry::new()),
        inboxes,
        instance,
        http_addr,
        node_addr,
        workers,
        events: crate::events::EventBus::new(),
    });
    let pool = Arc::new(PoolView::build(&shared.config, None));

    let mut threads = Vec::with_capacity(workers + 1);
    for (index, ((http_l, node_l), inbox)) in http.into_iter().zip(nodes).zip(receivers).enumerate() {
        let shared = shared.clone();
        let pool = pool.clone();
        let t = rt::spawn_worker("iop-edge", index, true, move || async move {
            let w = Rc::new(Worker::new(index, shared, pool));
            worker::run(w, http_l, node_l, inbox).await;
        })
        .map_err(StartError::Thread)?;
        threads.push(t);
    }
    if let Some(node_cfg) = embedded {
        let t = iop_node::spawn_embedded(node_cfg).map_err(StartError::Thread)?;
        threads.push(t);
    }
    Ok(EdgeHandle { http_addr, node_addr, driver, shared, threads })
}
