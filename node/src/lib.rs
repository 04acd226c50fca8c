//! iop-node: runs beside model servers, dials out to the edge, registers,
//! receives its provider config and executes runs.
//!
//! - [`process`]: the node process: one worker per core, each with its
//!   own link to the edge ([`supervisor`] → [`session`]).
//! - [`adapter`]: provider adapters (`mock`, `openai_compat`, `ollama`) over the
//!   [`upstream`] HTTP client.
//! - [`run`](mod@run): admission by provider concurrency (one gate for runs
//!   and tunnels), event sinks, credit windows, cancellation.
//! - [`tunnel`]: provider tunnels (the provider's bytes, usage read beside them).
//! - [`command`]: node commands from the edge (capabilities, transport
//!   status, a provider's own API, the run store's recent runs).
//! - [`store`]: the run store: one SQLite row per run and tunnel, written
//!   by a thread of its own.
//! - [`share`]: capacity shares, when the node serves several edges.
//! - [`workspace`]: the workspaces the edge approved for this node, checked
//!   before ready.

pub mod adapter;
pub mod command;
pub mod metrics;
pub mod process;
pub mod run;
pub mod session;
pub mod share;
pub mod spare;
pub mod store;
pub mod supervisor;
pub mod tunnel;
pub mod upstream;
pub mod workspace;

pub use process::{edge_tls, start, LinkSpec, NodeHandle, Stopper};
pub use supervisor::NodeError;

/// Starts a node inside this process (the edge's embedded node), one link
/// per worker like a standalone node; it speaks the same protocol over
/// loopback TCP. Its workers are not pinned (they share the edge's cores).
pub fn spawn_embedded(config: iop_core::config::NodeConfig) -> std::io::Result<std::thread::JoinHandle<()>> {
    let node = process::start(config, false, None)?;
    std::thread::Builder::new().name("iop-node-wait".into()).spawn(move || {
        if let Err(e) = node.wait() {
            tracing::error!(error = %e, "embedded node stopped");
        }
    })
}
