//! Node transport: the listener nodes dial, the registration/ready
//! handshake, and one session task per node connection.

mod runs;
mod session;

use std::{rc::Rc, time::Duration};

use iop_core::{exec::ExecEvent, rt::mailbox, wire::pb};

use crate::worker::Worker;

/// Events of one run, delivered to the core serving its client.
pub type RunEvents = mailbox::Sender<ExecEvent>;

/// Capacity of one run's event mailbox; beyond it the client is too slow
/// and the run is failed instead of stalling the node connection. Large
/// enough to absorb a burst from a fast provider (memory is allocated only
/// as the queue fills).
pub const RUN_EVENT_CAPACITY: usize = 4096;

/// Frames a session routes before letting other tasks on its core (e.g. the
/// clients consuming those events) run.
pub const FRAMES_PER_YIELD: u32 = 256;

/// Capacity of a session's command mailbox.
pub const SESSION_CMD_CAPACITY: usize = 4096;

/// Commands other cores send to a node session.
pub enum SessionCmd {
    /// Start a run; its events go to `events`.
    Run {
        /// The request as sent to the node (boxed: mailbox slots are
        /// preallocated at the size of the largest command).
        req: Box<pb::RunRequest>,
        /// Where the run's events go.
        events: RunEvents,
        /// The run's capacity: the session owns it for the run's lifetime
        /// and drops it when the run ends, however it ends.
        lease: crate::pool::Lease,
    },
    /// Cancel a run (client gone).
    Cancel {
        /// Run id.
        run_id: String,
        /// Why, for the node's logs.
        reason: &'static str,
    },
    /// Push a changed node config (live reload).
    Refresh {
        /// The node's new config.
        payload: pb::NodeConfigPayload,
    },
    /// Close the connection (e.g. the node was removed from the config).
    Close {
        /// Logged close reason.
        reason: String,
    },
}

/// Accepts node connections on this core.
pub async fn accept_loop(worker: Rc<Worker>, listener: monoio::net::TcpListener) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                monoio::spawn(session::serve(worker.clone(), stream, peer));
            }
            Err(e) => {
                tracing::warn!(error = %e, "node accept failed");
                monoio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}
