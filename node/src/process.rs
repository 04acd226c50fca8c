//! The node process: `workers` threads (one reactor each), each
//! with its own link to the edge, its own run manager, upstream connection
//! pools and frame codec, so a run's bytes stay on the core that serves it.
//! The links of one process share an `instance` id: the edge joins them into
//! one registration and generation (see DESIGN.md, "Node links"). What is
//! per process is shared by the workers: the concurrency gate per provider,
//! the workspace state, the run store.

use std::{
    sync::{mpsc, Arc},
    thread::JoinHandle,
    time::{SystemTime, UNIX_EPOCH},
};

use iop_core::net::tls::ClientTls;
use iop_core::{
    config::NodeConfig,
    rt::{self, mailbox, signal::LocalCancel},
};

use crate::{
    run::Gates,
    supervisor,
    workspace::{Limits, Workspaces},
    NodeError,
};

/// Who one link is, and what it shares with the process's other links.
#[derive(Debug, Clone)]
pub struct LinkSpec {
    /// The edge this link goes to (`host:port`, one of `edges`).
    pub edge: Arc<str>,
    /// Its position in `edges` (the process's name for that edge).
    pub edge_index: usize,
    /// The process's instance id (non-zero, random per start).
    pub instance: u64,
    /// This link's index.
    pub index: u32,
    /// How many links the process opens.
    pub count: u32,
    /// The process's provider gates.
    pub gates: Arc<Gates>,
    /// TLS to the edge (`[edge_tls]`, loaded at start); none: plain TCP.
    pub tls: Option<ClientTls>,
    /// The process's credential lease key (its public half is sent at
    /// registration; an edge in managed mode seals credentials to it).
    pub leases: Arc<iop_core::lease::Opener>,
    /// The process's workspace state (a request's calls may come on any
    /// link).
    pub workspaces: Arc<Workspaces>,
    /// The process's run store (none: `store = false`).
    pub store: Option<crate::store::Store>,
    /// The capacity share table, when the node serves several edges.
    pub shares: Option<Arc<crate::share::Shares>>,
}

/// A running node process.
pub struct NodeHandle {
    threads: Vec<JoinHandle<()>>,
    store: Option<crate::store::Store>,
    stop: Stopper,
    done: mpsc::Receiver<Result<(), NodeError>>,
}

/// Asks every worker of a node to shut down (drain, then exit).
#[derive(Clone)]
pub struct Stopper(Arc<Vec<mailbox::Sender<()>>>);

impl Stopper {
    /// Starts the shutdown of every link.
    pub fn stop(&self) {
        for tx in self.0.iter() {
            let _ = tx.try_send(());
        }
    }
}

/// A random, non-zero instance id (0 is a single-link node's).
fn new_instance() -> u64 {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let mixed = (nanos ^ (u64::from(std::process::id()) << 32)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    mixed.max(1)
}

/// Loads the TLS client of `[edge_tls]` (file reads, and the system's
/// roots when no CA is given: call before any reactor runs).
pub fn edge_tls(config: &NodeConfig) -> Result<Option<ClientTls>, iop_core::config::ConfigError> {
    config.edge_tls.as_ref().map(iop_core::config::tls::client_tls).transpose()
}

/// Starts the node's workers. `pin`: pin each to a core (a standalone
/// node; the edge's embedded one shares the edge's cores unpinned). `tls`:
/// from [`edge_tls`].
pub fn start(config: NodeConfig, pin: bool, tls: Option<ClientTls>) -> std::io::Result<NodeHandle> {
    let count = config.workers.max(1);
    // https providers without a CA of their own use these; read here, not
    // on a reactor when the first such config arrives.
    if let Err(e) = iop_core::net::tls::load_system_roots() {
        tracing::debug!(error = %e, "no system TLS roots: https providers need a tls_ca");
    }
    let instance = new_instance();
    let leases = Arc::new(iop_core::lease::Opener::generate().map_err(std::io::Error::other)?);
    let gates = Gates::new();
    let shares = (config.edges.len() > 1).then(|| crate::share::Shares::new(config.edges.len(), gates.clone()));
    let workspaces = Workspaces::new(Limits { supervised: true, ..Limits::default() });
    // Opened here, before any reactor: its file I/O and migrations block.
    let store = config.store.as_ref().map(crate::store::Store::open).transpose().map_err(std::io::Error::other)?;
    let (done_tx, done) = mpsc::channel();
    let mut stops = Vec::with_capacity(count);
    let mut threads = Vec::with_capacity(count);
    for index in 0..count {
        let (stop_tx, stop_rx) = mailbox::mailbox(1);
        stops.push(stop_tx);
        let link = LinkSpec {
            edge: Arc::from(""),
            edge_index: 0,
            instance,
            index: index as u32,
            count: count as u32,
            gates: gates.clone(),
            tls: tls.clone(),
            leases: leases.clone(),
            workspaces: workspaces.clone(),
            store: store.clone(),
            shares: shares.clone(),
        };
        let (config, done_tx) = (config.clone(), done_tx.clone());
        let t = rt::spawn_worker("iop-node", index, pin, move || async move {
            let _ = done_tx.send(run_link(config, link, stop_rx).await);
        })?;
        threads.push(t);
    }
    Ok(NodeHandle { threads, store, stop: Stopper(Arc::new(stops)), done })
}

/// This worker's links, one to each edge, until shutdown, or until every
/// one has ended with a fatal error or exhaustion. Each edge is served and
/// reconnected on its own: one that fails or goes away leaves the others
/// alone (its error is logged when others still serve).
async fn run_link(config: NodeConfig, link: LinkSpec, stop: mailbox::Receiver<()>) -> Result<(), NodeError> {
    let cancel = LocalCancel::new();
    let trigger = cancel.clone();
    monoio::spawn(async move {
        let _ = stop.recv().await;
        trigger.cancel();
    });
    let edges = config.edges.clone();
    if let [edge] = edges.as_slice() {
        return supervisor::supervise(config, LinkSpec { edge: Arc::from(edge.as_str()), ..link }, cancel).await;
    }
    let (tx, rx) = mailbox::mailbox(edges.len());
    for (edge_index, edge) in edges.iter().enumerate() {
        let spec = LinkSpec { edge: Arc::from(edge.as_str()), edge_index, ..link.clone() };
        let (config, cancel, tx) = (config.clone(), cancel.clone(), tx.clone());
        monoio::spawn(async move {
            let _ = tx.try_send(supervisor::supervise(config, spec, cancel).await);
        });
    }
    drop(tx);
    let mut first_err = None;
    let mut ok = false;
    while let Some(end) = rx.recv().await {
        match end {
            Ok(()) => ok = true,
            Err(e) => {
                tracing::error!(link = link.index, error = %e, "a link to one of the edges stopped for good");
                first_err.get_or_insert(e);
            }
        }
    }
    match first_err {
        Some(e) if !ok => Err(e),
        _ => Ok(()),
    }
}

impl NodeHandle {
    /// A handle that stops the node from another thread (a signal handler).
    pub fn stopper(&self) -> Stopper {
        self.stop.clone()
    }

    /// Waits for every worker. The first that fails (fatal, or out of
    /// reconnect attempts) stops the others; its error is the result.
    pub fn wait(self) -> Result<(), NodeError> {
        let mut result = Ok(());
        for _ in 0..self.threads.len() {
            match self.done.recv() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    if result.is_ok() {
                        self.stop.stop();
                        result = Err(e);
                    }
                }
                // A worker thread died without reporting (it panicked).
                Err(_) => break,
            }
        }
        for t in self.threads {
            let _ = t.join();
        }
        // The rows of the last runs are committed before the process ends.
        if let Some(store) = self.store {
            store.close();
        }
        result
    }
}
