//! The node's run store (spec: "Node local run store"): one SQLite row per
//! run and tunnel, as it ended — ids, small integers and closed labels,
//! never a prompt, a body or a credential.
//!
//! - [`Store`]: the process's handle (links share it). Reactors only ever
//!   `try_send` rows into a bounded channel; a full channel drops the row
//!   and counts it (metric, throttled warning): the relay never waits.
//! - [`writer`]: the thread that owns the connection: batched
//!   transactions, the commands' queries, retention.
//! - [`schema`]: opening (WAL, `synchronous = NORMAL`) and migrations by
//!   `user_version`; [`retention`]: by age and row count, space handed back.
//! - [`row`]: what a row holds; [`query`]: what `RUNS`/`RUN` answer.
//!
//! Acknowledged means committed: [`Store::stats`] counts a batch only after
//! its COMMIT returned, and a committed batch survives the process being
//! killed (see [`schema::open`]).

pub mod query;
pub mod retention;
pub mod row;
pub mod schema;
pub mod writer;

#[cfg(test)]
mod tests;

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    thread::JoinHandle,
    time::Duration,
};

use crossbeam_channel::{bounded, Sender, TrySendError};
use iop_core::{
    config::StoreSettings,
    rt::oneshot::{oneshot, OneshotSender},
};

pub use query::{Query, DEFAULT_LIMIT, MAX_LIMIT};
pub use row::{Names, Path, RunRow, Status};

/// Why the store could not start.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The file could not be opened or set up.
    #[error("cannot open the run store (config key `store.path`, value `{path}`): {source}")]
    Open {
        /// `store.path`.
        path: String,
        /// SQLite's reason.
        source: rusqlite::Error,
    },
    /// A newer node wrote the file.
    #[error(
        "the run store's schema version {found} is newer than this node knows ({known}): run a newer iop-node or set another `store.path`"
    )]
    TooNew {
        /// The file's `user_version`.
        found: i64,
        /// The newest this node knows.
        known: i64,
    },
    /// Its thread could not start.
    #[error("cannot start the run store's thread: {0}")]
    Thread(std::io::Error),
    /// Its thread is gone.
    #[error("the run store's thread is gone")]
    Gone,
}

/// Why a query got no rows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    /// `RUN`: no such id in the store.
    #[error("no such run in this node's run store")]
    NotFound,
    /// The channel is full: the store is behind.
    #[error("the run store is busy; try again")]
    Busy,
    /// The store's thread is gone.
    #[error("the run store is unavailable")]
    Unavailable,
    /// SQLite failed.
    #[error("the run store failed to answer: {0}")]
    Failed(String),
}

impl QueryError {
    /// The HTTP status to answer with.
    pub fn status(&self) -> u16 {
        match self {
            QueryError::NotFound => 404,
            QueryError::Busy | QueryError::Unavailable => 503,
            QueryError::Failed(_) => 500,
        }
    }
}

/// What goes to the store's thread.
pub(crate) enum Msg {
    Row(Box<RunRow>),
    Query(Query, OneshotSender<Result<Vec<u8>, QueryError>>),
    /// Commit what is queued; reply with the batches committed so far.
    Flush(crossbeam_channel::Sender<u64>),
    /// Run retention to its end now; reply as `Flush`.
    Prune(crossbeam_channel::Sender<u64>),
    Close,
}

/// The store's own counters (the process's metrics count the same).
#[derive(Debug, Default)]
pub(crate) struct Stats {
    written: AtomicU64,
    batches: AtomicU64,
    dropped: AtomicU64,
    failed: AtomicU64,
    pruned: AtomicU64,
}

/// A snapshot of a store's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Rows committed (acknowledged).
    pub written: u64,
    /// Transactions committed.
    pub batches: u64,
    /// Rows dropped because the channel was full (or the thread gone).
    pub dropped: u64,
    /// Rows whose batch failed to commit.
    pub failed: u64,
    /// Rows retention deleted.
    pub pruned: u64,
}

/// How the writer batches and when retention runs.
#[derive(Debug, Clone, Copy)]
pub struct Tuning {
    /// Rows the channel holds; beyond, rows are dropped.
    pub capacity: usize,
    /// Largest batch (one transaction).
    pub batch_rows: usize,
    /// A batch takes what arrives within this of its first row.
    pub batch_window: Duration,
    /// Retention runs this often (and at start).
    pub prune_every: Duration,
}

impl Default for Tuning {
    /// A commit's own work (its WAL frames, the partly filled pages it
    /// writes again, the writer's sleep and wake) is paid per batch: at
    /// 15 000 runs a second, 50 ms batches took half the writer's CPU of
    /// 10 ms ones (0.76 against 1.6 µs a row). A row is durable within
    /// the window; the channel holds twice the largest batch.
    fn default() -> Self {
        Self {
            capacity: 8192,
            batch_rows: 4096,
            batch_window: Duration::from_millis(50),
            prune_every: Duration::from_secs(60),
        }
    }
}

struct Shared {
    tx: Sender<Msg>,
    stats: Arc<Stats>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// The run store of a node process. Cheap to clone; the thread ends at
/// [`Store::close`] (or when the last clone drops).
#[derive(Clone)]
pub struct Store(Arc<Shared>);

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("stats", &self.stats()).finish()
    }
}

/// Warned about dropped rows at most this often.
const DROP_WARN_EVERY_MS: u64 = 10_000;

impl Store {
    /// Opens (creating, migrating) the store and starts its thread. Blocks
    /// on file I/O: call before any reactor runs.
    pub fn open(settings: &StoreSettings) -> Result<Self, StoreError> {
        Self::open_with(settings, Tuning::default())
    }

    /// As [`Store::open`], with its batching and retention timing.
    pub fn open_with(settings: &StoreSettings, tuning: Tuning) -> Result<Self, StoreError> {
        let conn = schema::open(&settings.path)?;
        let stats = Arc::new(Stats::default());
        let (tx, rx) = bounded(tuning.capacity.max(1));
        let w = writer::Writer::new(conn, stats.clone(), tuning, settings.max_age, settings.max_rows);
        let thread = std::thread::Builder::new()
            .name("iop-node-store".into())
            .spawn(move || {
                background();
                w.run(rx)
            })
            .map_err(StoreError::Thread)?;
        Ok(Self(Arc::new(Shared { tx, stats, thread: Mutex::new(Some(thread)) })))
    }

    /// Queues `row`; never waits. A full channel drops it (counted).
    pub fn record(&self, row: Box<RunRow>) {
        if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) = self.0.tx.try_send(Msg::Row(row)) {
            let n = self.0.stats.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            crate::metrics::store_rows(crate::metrics::StoreRows::Dropped, 1);
            if warn_due() {
                tracing::warn!(dropped_total = n, "run store behind: rows dropped (the relay does not wait for it)");
            }
        }
    }

    /// Asks the store's thread `q`: the JSON answer.
    pub async fn query(&self, q: Query) -> Result<Vec<u8>, QueryError> {
        let (reply, answer) = oneshot();
        match self.0.tx.try_send(Msg::Query(q, reply)) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => return Err(QueryError::Busy),
            Err(TrySendError::Disconnected(_)) => return Err(QueryError::Unavailable),
        }
        answer.await.unwrap_or(Err(QueryError::Unavailable))
    }

    /// Waits until everything queued before it is committed; returns the
    /// batches committed so far. Blocks: not for a reactor.
    pub fn flush(&self) -> Result<u64, StoreError> {
        self.ask(Msg::Flush)
    }

    /// Runs retention to its end now (after committing what is queued).
    /// Blocks: not for a reactor.
    pub fn prune_now(&self) -> Result<u64, StoreError> {
        self.ask(Msg::Prune)
    }

    fn ask(&self, msg: impl FnOnce(crossbeam_channel::Sender<u64>) -> Msg) -> Result<u64, StoreError> {
        let (tx, rx) = bounded(1);
        self.0.tx.send(msg(tx)).map_err(|_| StoreError::Gone)?;
        rx.recv().map_err(|_| StoreError::Gone)
    }

    /// Its counters.
    pub fn stats(&self) -> StoreStats {
        let s = &self.0.stats;
        StoreStats {
            written: s.written.load(Ordering::Relaxed),
            batches: s.batches.load(Ordering::Relaxed),
            dropped: s.dropped.load(Ordering::Relaxed),
            failed: s.failed.load(Ordering::Relaxed),
            pruned: s.pruned.load(Ordering::Relaxed),
        }
    }

    /// Commits what is queued and stops the thread (waiting for it).
    /// Blocks: for the end of the process.
    pub fn close(&self) {
        // `send` waits for room: what was queued is written, then it stops.
        let _ = self.0.tx.send(Msg::Close);
        let thread = self.0.thread.lock().ok().and_then(|mut t| t.take());
        if let Some(t) = thread {
            let _ = t.join();
        }
    }
}

/// Lowers the calling thread (the store's) to the weakest scheduling
/// weight (nice 19: a thread, not the process, on Linux). The rows wait
/// without harm; the reactors should not. Measured on 2 busy cores (S1,
/// 37 000 runs a second, alternated): at nice 0 the writer, waking with a
/// batch, preempted reactors mid-request and cost 6-10% of the
/// throughput, several times its own CPU; at nice 19 it runs in their
/// gaps. Rows still drop (counted) only if the channel fills.
fn background() {
    let me = rustix::thread::gettid();
    if let Err(e) = rustix::process::setpriority_process(Some(me), 19) {
        tracing::debug!(error = %e, "run store: could not lower the writer's priority");
    }
}

/// Whether a dropped-rows warning may be logged now (at most one per
/// [`DROP_WARN_EVERY_MS`] in the process).
fn warn_due() -> bool {
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = writer::now_ms();
    let last = LAST.load(Ordering::Relaxed);
    now.saturating_sub(last) >= DROP_WARN_EVERY_MS
        && LAST.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok()
}
