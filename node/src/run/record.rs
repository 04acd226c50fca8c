//! A stream's run store row while it runs: its emitter notes the first
//! output and the terminal, and the row goes to the store when the record
//! drops (at the terminal, or with the stream: then it was cancelled).

use iop_core::{
    exec::{ExecEvent, RunFailure, Usage},
    tunnel::TunnelItem,
};
use monoio::time::Instant;

use crate::store::{row, Path, RunRow, Status, Store};

/// One stream's row in the making.
pub struct Record {
    store: Store,
    row: RunRow,
    /// When the request arrived (the clock the offsets are on).
    queued: Instant,
    /// Dropped without a row (a request ignored as a duplicate).
    discarded: bool,
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
    pub(crate) fn new(store: Store, o: Origin) -> Box<Self> {
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
        Box::new(Self { store, row, queued: iop_core::rt::clock::now(), discarded: false })
    }

    fn since_queued(&self) -> u64 {
        let d = iop_core::rt::clock::now().saturating_duration_since(self.queued);
        u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
    }

    /// Admitted and handed to its adapter.
    pub(crate) fn started(&mut self) {
        self.row.started_ms = Some(self.since_queued());
    }

    /// Its first output went out (no-op after the first).
    pub(crate) fn first_output(&mut self) {
        if self.row.first_byte_ms.is_none() {
            self.row.first_byte_ms = Some(self.since_queued());
        }
    }

    /// No row for this one.
    pub(crate) fn discard(mut self: Box<Self>) {
        self.discarded = true;
    }

    fn complete(&mut self, code: Option<u16>, usage: Option<&Usage>) {
        self.row.status = Status::Complete;
        self.row.code = code;
        self.row.usage = usage.cloned();
    }

    fn failed(&mut self, f: &RunFailure) {
        self.row.status = Status::Error;
        // A tunnel keeps the status its provider answered with.
        self.row.code = self.row.code.or(Some(f.status));
        self.row.error_class = Some(f.code);
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        if self.discarded {
            return;
        }
        self.row.ended_ms = self.since_queued();
        let row = std::mem::replace(&mut self.row, RunRow::EMPTY);
        self.store.record(Box::new(row));
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
            ExecEvent::Cancelled { .. } => r.row.status = Status::Cancelled,
        }
    }
}

impl Noted for TunnelItem {
    fn note(&self, r: &mut Record) {
        match self {
            TunnelItem::Start { status, .. } => r.row.code = Some(*status),
            TunnelItem::Body(_) | TunnelItem::Parts(_) => r.first_output(),
            TunnelItem::Whole(w) => {
                r.first_output();
                r.complete(Some(w.status), w.usage.as_ref());
            }
            TunnelItem::End { usage } => r.complete(r.row.code, usage.as_ref()),
            TunnelItem::Error(f) => r.failed(f),
        }
    }
}

#[cfg(test)]
#[path = "record_tests.rs"]
mod tests;
