//! iop-node: runs beside model servers, dials out to the edge, registers,
//! receives its provider config and executes runs.
//!
//! - [`run()`](fn@run): the node's root future ([`supervisor`] → [`session`]).
//! - [`adapter`]: provider adapters (`mock`, `openai_compat`, `ollama`) over the
//!   [`upstream`] HTTP client.
//! - [`run`](mod@run): admission by provider concurrency (one gate for runs
//!   and tunnels), event sinks, credit windows, cancellation.
//! - [`tunnel`]: provider tunnels (the provider's bytes, usage read beside them).
//! - [`command`]: node commands from the edge (capabilities, transport
//!   status, a provider's own API).

pub mod adapter;
pub mod command;
pub mod run;
pub mod session;
pub mod supervisor;
pub mod tunnel;
pub mod upstream;

use iop_core::{
    config::NodeConfig,
    rt::{self, mailbox, signal::LocalCancel},
};
pub use supervisor::NodeError;

/// Runs the node until shutdown (a message or every sender of `shutdown`
/// dropped), a fatal error, or reconnect exhaustion.
pub async fn run(config: NodeConfig, shutdown: mailbox::Receiver<()>) -> Result<(), NodeError> {
    let cancel = LocalCancel::new();
    let trigger = cancel.clone();
    monoio::spawn(async move {
        let _ = shutdown.recv().await;
        trigger.cancel();
    });
    supervisor::supervise(config, cancel).await
}

/// Starts a node on its own reactor thread inside this process (the edge's
/// embedded node). It speaks the same protocol over loopback TCP.
pub fn spawn_embedded(config: NodeConfig) -> std::io::Result<std::thread::JoinHandle<()>> {
    rt::spawn_worker("iop-node", 0, false, move || async move {
        // The sender lives as long as the node: it stops with the process.
        let (keep, rx) = mailbox::mailbox(1);
        if let Err(e) = run(config, rx).await {
            tracing::error!(error = %e, "embedded node stopped");
        }
        drop(keep);
    })
}
