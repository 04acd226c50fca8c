//! The event sink of one run: numbers events, writes them to the edge
//! connection with backpressure, and enforces "exactly one terminal,
//! nothing after it".

use iop_core::{
    exec::ExecEvent,
    rt::frames::FrameWriter,
    wire::pb::{envelope::Body, Envelope},
};

use super::spec::{EventSink, SinkClosed};

/// Sends one run's events to the edge.
pub struct Emitter {
    writer: FrameWriter,
    run_id: String,
    seq: u64,
    terminal: bool,
    slot: Option<super::manager::Slot>,
}

impl Emitter {
    /// An emitter for `run_id` on `writer`.
    pub fn new(writer: FrameWriter, run_id: String) -> Self {
        Self { writer, run_id, seq: 0, terminal: false, slot: None }
    }

    /// Frees `slot` when the terminal event is sent.
    pub(crate) fn with_slot(mut self, slot: super::manager::Slot) -> Self {
        self.slot = Some(slot);
        self
    }

    /// Whether a terminal event was sent.
    pub fn terminal_sent(&self) -> bool {
        self.terminal
    }
}

impl EventSink for Emitter {
    async fn emit(&mut self, ev: ExecEvent) -> Result<(), SinkClosed> {
        if self.terminal {
            return Err(SinkClosed);
        }
        self.writer.wait_writable().await.map_err(|_| SinkClosed)?;
        let terminal = ev.is_terminal();
        let env = Envelope { correlation_id: 0, body: Some(Body::RunEvent(ev.into_wire(&self.run_id, self.seq))) };
        self.writer.send(&env).map_err(|_| SinkClosed)?;
        self.seq += 1;
        if terminal {
            self.terminal = true;
            // The edge frees its lease on this event: free ours before it can
            // send the next run (an adapter may still be draining its socket).
            self.slot = None;
        }
        Ok(())
    }
}
