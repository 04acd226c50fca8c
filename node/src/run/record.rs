//! A stream's run store row while it runs: its emitter notes the first
//! output and the terminal, and the row goes to the store when the record
//! drops (at the terminal, or with the stream: then it was cancelled).

use iop_core::{
    exec::{ExecEvent, RunFailure, Usage},
    tunnel::TunnelItem,
};
use std::rc::Rc;

use monoio::time::Instant;

use crate::store::{Names, Path, RunRow, Status, Store};

/// One stream's row in the making. While the stream runs it holds its
/// names in one allocation and its times inline; the row is built at its
/// terminal (or drop), the names moved into it, and goes to the store's
/// thread as it is. (A row boxed from the start, with a string per name,
/// was about 0.3 KiB of every open stream's memory.)
pub struct Record {
    store: Rc<Store>,
    /// Moved into the row when it is built.
    names: Option<Names>,
    path: Path,
    operation: Option<super::Operation>,
    /// The provider's status, noted before the terminal (a tunnel's start).
    code: Option<u16>,
    /// When the request arrived (the clock the offsets are on), and on
    /// the wall clock (Unix ms).
    queued: Instant,
    queued_at_ms: u64,
    /// Offsets from `queued` in ms ([`NOT_YET`]: not yet).
    started_ms: u32,
    first_byte_ms: u32,
    /// Its first output was noted: only a terminal can change the row now.
    first_noted: bool,
    /// Built at the terminal; sent when the record drops.
    row: Option<Box<RunRow>>,
    /// Discarded: no row.
    discarded: bool,
}

/// An offset not reached.
const NOT_YET: u32 = u32::MAX;

/// Who a stream is, as its request said (borrowed: the record copies the
/// names into one allocation).
pub(crate) struct Origin<'a> {
    pub run_id: &'a str,
    pub session_id: &'a str,
    pub adapter: &'a str,
    pub target: &'a str,
    pub path: Path,
    pub operation: Option<super::Operation>,
}

impl Record {
    /// A stream that arrived now.
    pub(crate) fn new(store: Rc<Store>, o: Origin<'_>) -> Self {
        Self {
            store,
            names: Some(Names::new(o.run_id, o.session_id, o.adapter, o.target)),
            path: o.path,
            operation: o.operation,
            code: None,
            queued: iop_core::rt::clock::now(),
            queued_at_ms: crate::store::writer::now_ms(),
            started_ms: NOT_YET,
            first_byte_ms: NOT_YET,
            first_noted: false,
            row: None,
            discarded: false,
        }
    }

    /// The row, built from what was noted so far on its first use.
    fn row(&mut self) -> Option<&mut RunRow> {
        if self.discarded {
            return None;
        }
        if let Some(names) = self.names.take() {
            self.row = Some(Box::new(self.build(names)));
        }
        self.row.as_deref_mut()
    }

    fn build(&self, names: Names) -> RunRow {
        let offset = |ms: u32| (ms != NOT_YET).then_some(u64::from(ms));
        RunRow {
            names,
            path: self.path,
            operation: self.operation,
            background: false,
            status: Status::Cancelled,
            code: self.code,
            queued_at_ms: self.queued_at_ms,
            started_ms: offset(self.started_ms),
            first_byte_ms: offset(self.first_byte_ms),
            ended_ms: 0,
            usage: None,
            error_class: None,
        }
    }

    /// Milliseconds since the request arrived.
    fn since_queued(&self) -> u64 {
        let d = iop_core::rt::clock::now().saturating_duration_since(self.queued);
        u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
    }

    /// [`Self::since_queued`] as an offset (saturating below [`NOT_YET`]).
    fn offset_now(&self) -> u32 {
        u32::try_from(self.since_queued()).unwrap_or(NOT_YET - 1).min(NOT_YET - 1)
    }

    /// Admitted and handed to its adapter.
    pub(crate) fn started(&mut self) {
        self.started_ms = self.offset_now();
    }

    /// Its first output went out (no-op after the first).
    pub(crate) fn first_output(&mut self) {
        if !self.first_noted {
            self.first_noted = true;
            self.first_byte_ms = self.offset_now();
        }
    }

    /// Whether `item` can still change the row: a terminal, or anything
    /// before the first output (a stream's many deltas after it cannot).
    pub(crate) fn wants(&self, terminal: bool) -> bool {
        terminal || !self.first_noted
    }

    /// No row for this one.
    pub(crate) fn discard(mut self) {
        self.discarded = true;
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
        self.code = Some(status);
        if let Some(r) = self.row.as_deref_mut() {
            r.code = Some(status);
        }
    }

    fn code(&self) -> Option<u16> {
        self.row.as_ref().map_or(self.code, |r| r.code)
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        let ended = self.since_queued();
        if let Some(row) = self.row() {
            row.ended_ms = ended;
        }
        if let Some(row) = self.row.take().filter(|_| !self.discarded) {
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
