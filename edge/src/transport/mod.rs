//! Node transport: the listener nodes dial, the registration/ready
//! handshake, and one session task per node connection.

mod runs;
mod session;

use std::{
    rc::Rc,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use iop_core::{exec::ExecEvent, limits::LogThrottle, rt::mailbox, wire::pb};

use crate::worker::Worker;

/// Capacity of one run's event mailbox; beyond it the client is too slow
/// and the run is failed instead of stalling the node connection. Large
/// enough to absorb a burst from a fast provider (memory is allocated only
/// as the queue fills).
pub const RUN_EVENT_CAPACITY: usize = 4096;

/// Bytes of event text one run may hold queued for its client; a client
/// further behind fails alone (`slow_consumer`). One event is always taken
/// into an empty queue, however large (it is within `max_frame_bytes`).
pub const RUN_BUFFER_BYTES: usize = 4 * 1024 * 1024;

/// Events of one run, delivered to the core serving its client, with the
/// bytes queued so far (counted here, subtracted by [`RunReceiver`]).
pub struct RunEvents {
    tx: mailbox::Sender<ExecEvent>,
    queued: Arc<AtomicUsize>,
}

/// The client side of [`RunEvents`].
pub struct RunReceiver {
    rx: mailbox::Receiver<ExecEvent>,
    queued: Arc<AtomicUsize>,
}

/// A run's event channel.
pub fn run_events() -> (RunEvents, RunReceiver) {
    let (tx, rx) = mailbox::mailbox(RUN_EVENT_CAPACITY);
    let queued = Arc::new(AtomicUsize::new(0));
    (RunEvents { tx, queued: queued.clone() }, RunReceiver { rx, queued })
}

/// Why an event was not queued.
#[derive(Debug, PartialEq, Eq)]
pub enum Undelivered {
    /// The client is too far behind (events or bytes).
    Full,
    /// The client is gone.
    Closed,
}

impl RunEvents {
    /// Queues `ev` unless the run is over its event or byte bound; `reserve`
    /// keeps that many event slots free (for the error telling a slow
    /// consumer why it failed).
    pub fn try_send(&self, ev: ExecEvent, reserve: usize) -> Result<(), Undelivered> {
        let size = ev.payload_bytes();
        let queued = self.queued.load(Ordering::Acquire);
        let over_bytes = queued > 0 && queued + size > RUN_BUFFER_BYTES;
        if reserve > 0 && (over_bytes || self.tx.len() + reserve >= RUN_EVENT_CAPACITY) {
            return Err(Undelivered::Full);
        }
        self.queued.fetch_add(size, Ordering::AcqRel);
        self.tx.try_send(ev).map_err(|e| {
            self.queued.fetch_sub(size, Ordering::AcqRel);
            match e {
                mailbox::SendError::Full(_) => Undelivered::Full,
                mailbox::SendError::Closed(_) => Undelivered::Closed,
            }
        })
    }

    /// Queues a terminal event past the bounds (its reserved slot).
    pub fn send_terminal(&self, ev: ExecEvent) {
        let _ = self.try_send(ev, 0);
    }
}

impl RunReceiver {
    /// Next event without waiting.
    pub fn try_recv(&self) -> Option<ExecEvent> {
        let ev = self.rx.try_recv()?;
        self.queued.fetch_sub(ev.payload_bytes(), Ordering::AcqRel);
        Some(ev)
    }

    /// Next event; `None` once the sender is gone and the queue is empty.
    pub async fn recv(&self) -> Option<ExecEvent> {
        let ev = self.rx.recv().await?;
        self.queued.fetch_sub(ev.payload_bytes(), Ordering::AcqRel);
        Some(ev)
    }

    /// Bytes of event text queued now.
    pub fn queued_bytes(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }
}

/// Frames a session routes before letting other tasks on its core (e.g. the
/// clients consuming those events) run.
pub const FRAMES_PER_YIELD: u32 = 256;

/// Frame bytes a session routes before letting other tasks on its core run
/// (large frames reach this long before `FRAMES_PER_YIELD`).
pub const BYTES_PER_YIELD: u64 = 1024 * 1024;

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

/// One warning per interval for floods of refused or failed node accepts.
static REFUSED_LOG: LogThrottle = LogThrottle::new(Duration::from_secs(10));
static FAILED_LOG: LogThrottle = LogThrottle::new(Duration::from_secs(10));

/// Accepts node connections on this core. At most
/// `node_listener.max_handshakes` connections may be in the handshake at
/// once on the edge; more are closed at accept. Sessions outlive a
/// shutdown (runs in flight finish), so this loop does too.
pub async fn accept_loop(worker: Rc<Worker>, listener: monoio::net::TcpListener) {
    let gate = crate::accept::Gate {
        what: "node handshake",
        key: "node_listener.max_handshakes",
        slots: worker.shared.node_handshakes.clone(),
        refused_log: &REFUSED_LOG,
        failed_log: &FAILED_LOG,
    };
    let limit = || worker.config.borrow().node_handshake.max_pending;
    let serve = |stream, peer, slot| {
        monoio::spawn(session::serve(worker.clone(), stream, peer, slot));
    };
    crate::accept::accept_loop(listener, None, &gate, limit, serve).await;
}
