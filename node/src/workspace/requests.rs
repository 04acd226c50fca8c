//! The process's workspace state, shared by every link's session: the
//! catalog the latest admission installed, and the requests open now, each
//! with the authority frozen at its open. One lock for all of it (a cold
//! path: a few map operations per call), never held across I/O or an
//! await; a cleanup waits for a request's operations on the condvar beside
//! it, on a thread of its own.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Condvar, Mutex, MutexGuard, PoisonError,
    },
    time::Duration,
};

use crossbeam_channel::Sender;
use iop_core::wire::pb;

use super::{
    files::{FileError, Root},
    jobs::Job,
};

/// Longest request or tool id, in bytes.
pub(super) const MAX_ID_BYTES: usize = 128;

/// Bounds of the workspace state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Requests open at once (an open beyond is BUSY).
    pub max_open: usize,
    /// Workspace operations on threads of their own at once (beyond: BUSY).
    pub max_threads: usize,
    /// Tool ids one request may use.
    pub max_tool_ids: usize,
    /// Cleanup results kept for a repeated cleanup.
    pub max_cleaned: usize,
    /// Commands start under this binary's supervisor (`supervise.rs`), so
    /// none outlives the node. Off where the running binary is not a node
    /// (unit tests).
    pub supervised: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Self { max_open: 64, max_threads: 16, max_tool_ids: 4096, max_cleaned: 256, supervised: false }
    }
}

/// What an open request may do, frozen at its open (a later catalog does
/// not change it).
#[derive(Debug)]
pub(super) struct Authority {
    pub operations: Vec<pb::WorkspaceOperation>,
    /// Command ids granted, with their template's argv.
    pub commands: HashMap<String, Arc<[String]>>,
    pub env: Arc<[String]>,
    pub max_read: u64,
    pub max_write: u64,
    pub max_list: usize,
    pub timeout: Duration,
    pub max_output: usize,
}

impl Authority {
    /// The authority `req` asks for, when it is within `entry`: every
    /// operation, command id and env name among the entry's, every limit
    /// above zero and at most the entry's.
    pub fn granted(entry: &pb::WorkspaceConfig, req: &pb::WorkspaceOpenRequest) -> Option<Self> {
        let mut operations = Vec::with_capacity(req.operations.len());
        for &op in &req.operations {
            match pb::WorkspaceOperation::try_from(op) {
                Ok(o) if o != pb::WorkspaceOperation::Unspecified && entry.operations.contains(&op) => {
                    operations.push(o)
                }
                _ => return None,
            }
        }
        let mut commands = HashMap::with_capacity(req.command_ids.len());
        for id in &req.command_ids {
            let template = entry.commands.iter().find(|c| &c.id == id)?;
            commands.insert(id.clone(), Arc::from(template.argv.as_slice()));
        }
        if !req.env.iter().all(|name| entry.env.contains(name)) {
            return None;
        }
        let within = |asked: u64, allowed: u64| asked > 0 && asked <= allowed;
        let limits_hold = within(req.max_read_bytes, entry.max_read_bytes)
            && within(req.max_write_bytes, entry.max_write_bytes)
            && within(u64::from(req.max_list_entries), u64::from(entry.max_list_entries))
            && within(req.command_timeout_ms, entry.command_timeout_ms)
            && within(req.max_output_bytes, entry.max_output_bytes);
        if !limits_hold {
            return None;
        }
        Some(Self {
            operations,
            commands,
            env: Arc::from(req.env.as_slice()),
            max_read: req.max_read_bytes,
            max_write: req.max_write_bytes,
            max_list: usize::try_from(req.max_list_entries).unwrap_or(usize::MAX),
            timeout: Duration::from_millis(req.command_timeout_ms),
            max_output: usize::try_from(req.max_output_bytes).unwrap_or(usize::MAX),
        })
    }
}

/// A request id usable as a job directory name and a log field.
pub(super) fn safe_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_ID_BYTES
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The root and job directory of an open request.
#[derive(Debug)]
pub(super) struct Opened {
    pub root: Root,
    pub job: Job,
}

/// One request in the table.
#[derive(Debug)]
pub(super) struct Slot {
    pub authority: Arc<Authority>,
    /// `None` while its open runs (or when that open failed under cleanup).
    pub opened: Option<Arc<Opened>>,
    pub tool_ids: HashSet<String>,
    /// The cancel channel of each running command, by tool id.
    pub running: HashMap<String, Sender<()>>,
    /// Operations begun and not yet ended (its open among them).
    pub in_flight: usize,
    /// Cleanup has begun: nothing new is accepted.
    pub closing: bool,
}

impl Slot {
    /// A request whose open is about to run.
    pub fn opening(authority: Authority) -> Self {
        Self {
            authority: Arc::new(authority),
            opened: None,
            tool_ids: HashSet::new(),
            running: HashMap::new(),
            in_flight: 1,
            closing: false,
        }
    }

    /// Ends one operation.
    pub fn end_one(&mut self) {
        self.in_flight = self.in_flight.saturating_sub(1);
    }
}

/// The open requests and the results of recent cleanups.
#[derive(Debug, Default)]
pub(super) struct Table {
    pub open: HashMap<String, Slot>,
    cleaned: VecDeque<(String, Result<(), FileError>)>,
}

impl Table {
    /// An open request that accepts new operations.
    pub fn live(&mut self, id: &str) -> Option<&mut Slot> {
        self.open.get_mut(id).filter(|s| !s.closing && s.opened.is_some())
    }

    /// The result of request `id`'s cleanup, when it is recent.
    pub fn cleaned(&self, id: &str) -> Option<Result<(), FileError>> {
        self.cleaned.iter().find(|(i, _)| i == id).map(|(_, r)| *r)
    }

    /// Keeps a cleanup's result (the oldest goes beyond `cap`).
    pub fn remember(&mut self, id: String, result: Result<(), FileError>, cap: usize) {
        if cap == 0 {
            return;
        }
        while self.cleaned.len() >= cap {
            self.cleaned.pop_front();
        }
        self.cleaned.push_back((id, result));
    }
}

/// The workspace state of one node process.
#[derive(Debug)]
pub struct Workspaces {
    pub(super) limits: Limits,
    catalog: Mutex<HashMap<String, Arc<pb::WorkspaceConfig>>>,
    table: Mutex<Table>,
    /// Signalled whenever an operation ends or a cleanup finishes.
    changed: Condvar,
    threads: AtomicUsize,
}

impl Workspaces {
    /// Empty state (no catalog yet) within `limits`.
    pub fn new(limits: Limits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            catalog: Mutex::default(),
            table: Mutex::default(),
            changed: Condvar::new(),
            threads: AtomicUsize::new(0),
        })
    }

    /// Serves `entries` from now on (the latest admission wins; requests
    /// already open keep the authority they opened with).
    pub fn install(&self, entries: &[pb::WorkspaceConfig]) {
        let by_ref = entries.iter().map(|e| (e.workspace_ref.clone(), Arc::new(e.clone()))).collect();
        *self.catalog.lock().unwrap_or_else(PoisonError::into_inner) = by_ref;
    }

    /// The catalog entry named `workspace_ref`.
    pub(super) fn entry(&self, workspace_ref: &str) -> Option<Arc<pb::WorkspaceConfig>> {
        self.catalog.lock().unwrap_or_else(PoisonError::into_inner).get(workspace_ref).cloned()
    }

    pub(super) fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Releases the table until something changes (off the reactor only).
    pub(super) fn wait<'a>(&self, table: MutexGuard<'a, Table>) -> MutexGuard<'a, Table> {
        self.changed.wait(table).unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn notify(&self) {
        self.changed.notify_all();
    }

    /// A slot for one more operation thread, if under the bound.
    pub fn permit(self: &Arc<Self>) -> Option<Permit> {
        let max = self.limits.max_threads;
        self.threads.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1)).ok()?;
        Some(Permit(self.clone()))
    }

    /// Operation threads running now.
    pub fn threads(&self) -> usize {
        self.threads.load(Ordering::Acquire)
    }
}

/// One operation thread's share of the bound, given back on drop.
#[derive(Debug)]
pub struct Permit(Arc<Workspaces>);

impl Drop for Permit {
    fn drop(&mut self) {
        self.0.threads.fetch_sub(1, Ordering::AcqRel);
    }
}
