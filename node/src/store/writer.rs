//! The store's thread: the only one that touches its connection. It takes
//! rows from the bounded channel, commits them in batches (up to
//! [`Tuning::batch_rows`], or what arrived within [`Tuning::batch_window`]
//! of the first), answers queries between batches, and runs retention
//! every [`Tuning::prune_every`], a step at a time between batches.

use std::{
    collections::HashMap,
    sync::{atomic::Ordering, Arc},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use crossbeam_channel::{Receiver, RecvTimeoutError, TryRecvError};
use rusqlite::{params, Connection, Transaction};

use super::{
    query,
    retention::{self, Policy},
    row::{self, RunRow},
    Msg, QueryError, Stats, Tuning,
};

/// Where retention is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Prune {
    Idle,
    Deleting,
    Vacuuming,
}

pub(crate) struct Writer {
    conn: Connection,
    /// Name → id in `names`, as committed.
    names: HashMap<String, i64>,
    stats: Arc<Stats>,
    tuning: Tuning,
    max_age: Duration,
    max_rows: u64,
    prune: Prune,
    next_prune: Instant,
    /// Whether this retention round deleted anything.
    deleted: bool,
    /// Last write failure logged (at most one a minute).
    last_failure_log: Option<Instant>,
}

impl Writer {
    pub(crate) fn new(conn: Connection, stats: Arc<Stats>, tuning: Tuning, max_age: Duration, max_rows: u64) -> Self {
        Self {
            conn,
            names: HashMap::new(),
            stats,
            tuning,
            max_age,
            max_rows,
            // Retention runs once at start.
            prune: Prune::Deleting,
            next_prune: Instant::now(),
            deleted: false,
            last_failure_log: None,
        }
    }

    /// Serves until [`Msg::Close`] or every sender is gone.
    pub(crate) fn run(mut self, rx: Receiver<Msg>) {
        let mut batch: Vec<RunRow> = Vec::with_capacity(self.tuning.batch_rows);
        loop {
            let wait = match self.prune {
                Prune::Idle => self.next_prune.saturating_duration_since(Instant::now()),
                // A retention step is due: only what is already queued first.
                _ => Duration::ZERO,
            };
            let mut next = match rx.recv_timeout(wait) {
                Ok(msg) => Some(msg),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => break,
            };
            let mut first_at = None;
            let mut open = true;
            while let Some(msg) = next.take() {
                match msg {
                    Msg::Row(r) => {
                        batch.push(*r);
                        let started = *first_at.get_or_insert_with(Instant::now);
                        if batch.len() >= self.tuning.batch_rows {
                            break;
                        }
                        match next_in_window(&rx, started + self.tuning.batch_window) {
                            Ok(msg) => next = msg,
                            Err(()) => open = false,
                        }
                    }
                    Msg::Query(q, reply) => {
                        // What was recorded before the question is in the answer.
                        self.commit(&mut batch);
                        reply.send(self.answer(&q));
                    }
                    Msg::Flush(reply) => {
                        self.commit(&mut batch);
                        let _ = reply.send(self.stats.batches.load(Ordering::Relaxed));
                    }
                    Msg::Prune(reply) => {
                        self.commit(&mut batch);
                        self.prune = Prune::Deleting;
                        while self.prune != Prune::Idle {
                            self.prune_step();
                        }
                        let _ = reply.send(self.stats.batches.load(Ordering::Relaxed));
                    }
                    Msg::Close => open = false,
                }
            }
            self.commit(&mut batch);
            if !open {
                break;
            }
            if self.prune == Prune::Idle && Instant::now() >= self.next_prune {
                self.prune = Prune::Deleting;
            }
            if self.prune != Prune::Idle {
                self.prune_step();
            }
        }
        self.commit(&mut batch);
    }

    /// Writes `batch` in one transaction and empties it. Acknowledged =
    /// committed: the counters move only after COMMIT returned.
    fn commit(&mut self, batch: &mut Vec<RunRow>) {
        if batch.is_empty() {
            return;
        }
        let n = batch.len() as u64;
        match self.insert(batch) {
            Ok(()) => {
                self.stats.written.fetch_add(n, Ordering::Relaxed);
                self.stats.batches.fetch_add(1, Ordering::Relaxed);
                crate::metrics::store_rows(crate::metrics::StoreRows::Written, n);
            }
            Err(e) => {
                // Ids handed out inside the rolled-back transaction are void.
                self.names.clear();
                self.stats.failed.fetch_add(n, Ordering::Relaxed);
                crate::metrics::store_rows(crate::metrics::StoreRows::Failed, n);
                self.log_failure("writing a batch", &e);
            }
        }
        batch.clear();
    }

    fn insert(&mut self, batch: &[RunRow]) -> rusqlite::Result<()> {
        let tx = self.conn.transaction()?;
        {
            // One statement per row, bound in place: measured cheaper than
            // rows packed many to a statement (SQLite then runs a larger
            // program per row) and than binding through `params!`.
            let mut stmt = tx.prepare_cached(INSERT)?;
            for r in batch {
                let adapter = name_id(&tx, &mut self.names, &r.adapter)?;
                let target = name_id(&tx, &mut self.names, &r.target)?;
                bind_row(&mut stmt, r, adapter, target)?;
                stmt.raw_execute()?;
            }
        }
        tx.commit()
    }

    fn answer(&self, q: &query::Query) -> Result<Vec<u8>, QueryError> {
        match query::answer(&self.conn, q) {
            Ok(Some(v)) => serde_json::to_vec(&v).map_err(|e| QueryError::Failed(e.to_string())),
            Ok(None) => Err(QueryError::NotFound),
            Err(e) => {
                self.log_query_failure(&e);
                Err(QueryError::Failed(e.to_string()))
            }
        }
    }

    /// One step of retention: a delete, a name sweep, or a vacuum.
    fn prune_step(&mut self) {
        let step = match self.prune {
            Prune::Idle => return,
            Prune::Deleting => {
                let policy = Policy {
                    cutoff_ms: sat(now_ms()).saturating_sub(sat(self.max_age.as_millis() as u64)),
                    max_rows: sat(self.max_rows),
                };
                retention::delete_step(&self.conn, policy).and_then(|n| {
                    if n > 0 {
                        self.deleted = true;
                        self.stats.pruned.fetch_add(n as u64, Ordering::Relaxed);
                        crate::metrics::store_rows(crate::metrics::StoreRows::Pruned, n as u64);
                        return Ok(Prune::Deleting);
                    }
                    if !self.deleted {
                        return Ok(Prune::Idle);
                    }
                    if retention::sweep_names(&self.conn)? {
                        self.names.clear();
                    }
                    Ok(Prune::Vacuuming)
                })
            }
            Prune::Vacuuming => retention::vacuum_step(&self.conn).and_then(|more| {
                if more {
                    return Ok(Prune::Vacuuming);
                }
                retention::checkpoint(&self.conn)?;
                Ok(Prune::Idle)
            }),
        };
        self.prune = step.unwrap_or_else(|e| {
            self.log_failure("retention", &e);
            Prune::Idle
        });
        if self.prune == Prune::Idle {
            self.deleted = false;
            self.next_prune = Instant::now() + self.tuning.prune_every;
        }
    }

    fn log_failure(&mut self, what: &str, e: &rusqlite::Error) {
        let now = Instant::now();
        if self.last_failure_log.is_none_or(|t| now.duration_since(t) >= Duration::from_secs(60)) {
            self.last_failure_log = Some(now);
            tracing::error!(error = %e, failed_rows = self.stats.failed.load(Ordering::Relaxed), "run store: {what} failed");
        }
    }

    fn log_query_failure(&self, e: &rusqlite::Error) {
        tracing::warn!(error = %e, "run store: a query failed");
    }
}

/// The id of `name` in `names`, added when new.
fn name_id(tx: &Transaction<'_>, cache: &mut HashMap<String, i64>, name: &str) -> rusqlite::Result<i64> {
    if let Some(id) = cache.get(name) {
        return Ok(*id);
    }
    let found: Option<i64> = {
        let mut stmt = tx.prepare_cached("SELECT id FROM names WHERE name = ?1")?;
        rusqlite::OptionalExtension::optional(stmt.query_row(params![name], |r| r.get(0)))?
    };
    let id = match found {
        Some(id) => id,
        None => {
            tx.prepare_cached("INSERT INTO names (name) VALUES (?1)")?.execute(params![name])?;
            tx.last_insert_rowid()
        }
    };
    cache.insert(name.to_owned(), id);
    Ok(id)
}

/// One row of `runs`.
const INSERT: &str = "INSERT INTO runs (run_id, session_id, adapter, target, path, op, background, status, code, \
    ended_at_ms, total_ms, start_ms, first_byte_ms, input_tokens, output_tokens, reasoning_tokens, cached_tokens, \
    error_class) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18)";

/// Binds row `r` to [`INSERT`]'s parameters.
fn bind_row(stmt: &mut rusqlite::CachedStatement<'_>, r: &RunRow, adapter: i64, target: i64) -> rusqlite::Result<()> {
    let usage = r.usage.as_ref();
    stmt.raw_bind_parameter(1, r.run_id.as_str())?;
    stmt.raw_bind_parameter(2, (!r.session_id.is_empty()).then_some(r.session_id.as_str()))?;
    stmt.raw_bind_parameter(3, adapter)?;
    stmt.raw_bind_parameter(4, target)?;
    stmt.raw_bind_parameter(5, r.path.code())?;
    stmt.raw_bind_parameter(6, r.operation.map(row::operation_code))?;
    stmt.raw_bind_parameter(7, i64::from(r.background))?;
    stmt.raw_bind_parameter(8, r.status.code())?;
    stmt.raw_bind_parameter(9, r.code)?;
    stmt.raw_bind_parameter(10, sat(r.queued_at_ms.saturating_add(r.ended_ms)))?;
    stmt.raw_bind_parameter(11, sat(r.ended_ms))?;
    stmt.raw_bind_parameter(12, r.started_ms.map(sat))?;
    stmt.raw_bind_parameter(13, r.first_byte_ms.map(sat))?;
    stmt.raw_bind_parameter(14, usage.map(|u| sat(u.input_tokens)))?;
    stmt.raw_bind_parameter(15, usage.map(|u| sat(u.output_tokens)))?;
    stmt.raw_bind_parameter(16, usage.and_then(|u| u.reasoning_tokens).map(sat))?;
    stmt.raw_bind_parameter(17, usage.and_then(|u| u.cached_input_tokens).map(sat))?;
    stmt.raw_bind_parameter(18, r.error_class)
}

/// SQLite integers are signed.
fn sat(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Now, in Unix ms.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The next message of a batch that closes at `deadline`: what is queued,
/// else (once) a sleep to the deadline and what is queued then. Sleeping
/// instead of waiting on the channel is what keeps the thread off the CPU:
/// a receiver blocked on the channel is woken by every row (a futex wake
/// and a context switch per run, stolen from the reactors), a sleeping
/// one by none. `Err`: every sender is gone.
fn next_in_window(rx: &Receiver<Msg>, deadline: Instant) -> Result<Option<Msg>, ()> {
    match rx.try_recv() {
        Ok(msg) => return Ok(Some(msg)),
        Err(TryRecvError::Disconnected) => return Err(()),
        Err(TryRecvError::Empty) => {}
    }
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Ok(None);
    }
    std::thread::sleep(left);
    match rx.try_recv() {
        Ok(msg) => Ok(Some(msg)),
        Err(TryRecvError::Empty) => Ok(None),
        Err(TryRecvError::Disconnected) => Err(()),
    }
}
