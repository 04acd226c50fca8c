//! A stream's run store row while it runs: its emitter notes the first
//! output and the terminal, and the row goes to the store when the record
//! drops (at the terminal, or with the stream: then it was cancelled).

use iop_core::{
    exec::{ExecEvent, RunFailure, Usage},
    tunnel::TunnelItem,
};
use monoio::time::Instant;

use crate::store::{row, Path, RunRow, Status, Store};

/// One stream's row in the making. Its row is the one allocation a run
/// makes for the store: the box goes to the store's thread as it is.
pub struct Record {
    store: Store,
    /// None once sent or discarded.
    row: Option<Box<RunRow>>,
    /// When the request arrived (the clock the offsets are on).
    queued: Instant,
    /// Its first output was noted: only a terminal can change the row now.
    first_noted: bool,
}

/// Who a stream is, as its request said.
pub(crate) struct Origin {
    pub run_id: String,
    pub session_id: String,
    pub adapter: String,
    pub target: String,
    pub path: Path,
    pub operation: Option<super::Operation>,
}

impl Record {
    /// A stream that arrived now.
    pub(crate) fn new(store: Store, o: Origin) -> Self {
        let row = RunRow {
            run_id: o.run_id,
            session_id: row::clip(o.session_id, row::MAX_SESSION_ID),
            adapter: o.adapter,
            target: o.target,
            path: o.path,
            operation: o.operation,
            background: false,
            status: Status::Cancelled,
            code: None,
            queued_at_ms: crate::store::writer::now_ms(),
            started_ms: None,
            first_byte_ms: None,
            ended_ms: 0,
            usage: None,
            error_class: None,
        };
        Self { store, row: Some(Box::new(row)), queued: iop_core::rt::clock::now(), first_noted: false }
    }

    /// The row, until it is sent.
    fn row(&mut self) -> Option<&mut RunRow> {
        self.row.as_deref_mut()
    }

    fn since_queued(&self) -> u64 {
        let d = iop_core::rt::clock::now().saturating_duration_since(self.queued);
        u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
    }

    /// Admitted and handed to its adapter.
    pub(crate) fn started(&mut self) {
        let at = self.since_queued();
        if let Some(r) = self.row() {
            r.started_ms = Some(at);
        }
    }

    /// Its first output went out (no-op after the first).
    pub(crate) fn first_output(&mut self) {
        if !self.first_noted {
            self.first_noted = true;
            let at = self.since_queued();
            if let Some(r) = self.row() {
                r.first_byte_ms = Some(at);
            }
        }
    }

    /// Whether `item` can still change the row: a terminal, or anything
    /// before the first output (a stream's many deltas after it cannot).
    pub(crate) fn wants(&self, terminal: bool) -> bool {
        terminal || !self.first_noted
    }

    /// No row for this one.
    pub(crate) fn discard(mut self) {
        self.row = None;
    }

    fn complete(&mut self, code: Option<u16>, usage: Option<&Usage>) {
        if let Some(r) = self.row() {
            r.status = Status::Complete;
            r.code = code;
            r.usage = usage.cloned();
        }
    }

    fn failed(&mut self, f: &RunFailure) {
        if let Some(r) = self.row() {
            r.status = Status::Error;
            // A tunnel keeps the status its provider answered with.
            r.code = r.code.or(Some(f.status));
            r.error_class = Some(f.code);
        }
    }

    fn cancelled(&mut self) {
        if let Some(r) = self.row() {
            r.status = Status::Cancelled;
        }
    }

    fn provider_status(&mut self, status: u16) {
        if let Some(r) = self.row() {
            r.code = Some(status);
        }
    }

    fn code(&self) -> Option<u16> {
        self.row.as_ref().and_then(|r| r.code)
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        if let Some(mut row) = self.row.take() {
            row.ended_ms = self.since_queued();
            self.store.record(row);
        }
    }
}

/// What an item tells a stream's record.
pub trait Noted {
    /// Notes `self` in `r` (before it is sent).
    fn note(&self, r: &mut Record);
}

impl Noted for ExecEvent {
    fn note(&self, r: &mut Record) {
        match self {
            ExecEvent::Start { .. } => {}
            ExecEvent::Delta(_) | ExecEvent::ChoiceFinish { .. } | ExecEvent::Embeddings(_) => r.first_output(),
            ExecEvent::Complete { usage, .. } => r.complete(Some(200), usage.as_ref()),
            ExecEvent::Error(f) => r.failed(f),
            ExecEvent::Cancelled { .. } => r.cancelled(),
        }
    }
}

impl Noted for TunnelItem {
    fn note(&self, r: &mut Record) {
        match self {
            TunnelItem::Start { status, .. } => r.provider_status(*status),
            TunnelItem::Body(_) | TunnelItem::Parts(_) => r.first_output(),
            TunnelItem::Whole(w) => {
                r.first_output();
                r.complete(Some(w.status), w.usage.as_ref());
            }
            TunnelItem::End { usage } => r.complete(r.code(), usage.as_ref()),
            TunnelItem::Error(f) => r.failed(f),
        }
    }
}

#[cfg(test)]
#[path = "record_tests.rs"]
mod tests;
