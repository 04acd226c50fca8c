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
    routes: Routes,
    /// [`INSERT`] for [`PACK`] rows.
    insert_packed: String,
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
            routes: Routes::default(),
            insert_packed: packed_insert(PACK),
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
                self.routes.clear();
                self.stats.failed.fetch_add(n, Ordering::Relaxed);
                crate::metrics::store_rows(crate::metrics::StoreRows::Failed, n);
                self.log_failure("writing a batch", &e);
            }
        }
        batch.clear();
    }

    fn insert(&mut self, batch: &[RunRow]) -> rusqlite::Result<()> {
        // The write lock taken at BEGIN, waiting (busy timeout) for another
        // writer: a deferred transaction reads first (a route's id) and,
        // had another writer committed while it waited to write, would
        // fail at once (its snapshot stale) and lose the batch.
        let tx = self.conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        {
            // Rows bound in place, [`PACK`] to a statement: a statement's
            // own work (its cursor, its start and end) is then paid once
            // for all of them; the rest one at a time.
            // A value the same as the one bound in its place by the last
            // execution is not bound again: SQLite keeps a statement's
            // bindings across executions, and a statement starts a batch
            // with all of them NULL (new, or cleared by the cache).
            let mut packs = batch.chunks_exact(PACK);
            let mut stmt = tx.prepare_cached(&self.insert_packed)?;
            let mut bound = Bound::new(PACK);
            for pack in &mut packs {
                for (i, r) in pack.iter().enumerate() {
                    let route = self.routes.id(&tx, r.names.adapter(), r.names.target())?;
                    bound.row(&mut stmt, i * COLUMNS, r, route)?;
                }
                stmt.raw_execute()?;
            }
            let mut stmt = tx.prepare_cached(INSERT)?;
            let mut bound = Bound::new(1);
            for r in packs.remainder() {
                let route = self.routes.id(&tx, r.names.adapter(), r.names.target())?;
                bound.row(&mut stmt, 0, r, route)?;
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
                    if retention::sweep_routes(&self.conn)? {
                        self.routes.clear();
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

/// Route ids (a provider and a target) as committed. A node's runs
/// mostly go the way the last one went: that route is compared first,
/// without hashing.
#[derive(Default)]
struct Routes {
    ids: HashMap<String, HashMap<String, i64>>,
    last: Option<(String, String, i64)>,
}

impl Routes {
    /// The id of `adapter` and `target` in `routes`, added when new.
    fn id(&mut self, tx: &Transaction<'_>, adapter: &str, target: &str) -> rusqlite::Result<i64> {
        if let Some((a, t, id)) = &self.last {
            if a == adapter && t == target {
                return Ok(*id);
            }
        }
        let id = match self.ids.get(adapter).and_then(|m| m.get(target)) {
            Some(id) => *id,
            None => {
                let id = route_id(tx, adapter, target)?;
                self.ids.entry(adapter.to_owned()).or_default().insert(target.to_owned(), id);
                id
            }
        };
        // The last route's buffers are reused: no allocation when runs alternate.
        let (a, t, last) = self.last.get_or_insert_with(Default::default);
        a.clear();
        a.push_str(adapter);
        t.clear();
        t.push_str(target);
        *last = id;
        Ok(id)
    }

    fn clear(&mut self) {
        self.ids.clear();
        self.last = None;
    }
}

/// The id of a route in the file, added when new.
fn route_id(tx: &Transaction<'_>, adapter: &str, target: &str) -> rusqlite::Result<i64> {
    let found: Option<i64> = {
        let mut stmt = tx.prepare_cached("SELECT id FROM routes WHERE adapter = ?1 AND target = ?2")?;
        rusqlite::OptionalExtension::optional(stmt.query_row(params![adapter, target], |r| r.get(0)))?
    };
    match found {
        Some(id) => Ok(id),
        None => {
            tx.prepare_cached("INSERT INTO routes (adapter, target) VALUES (?1, ?2)")?
                .execute(params![adapter, target])?;
            Ok(tx.last_insert_rowid())
        }
    }
}

/// Rows per execution of the packed insert. Measured (callgrind, 15
/// columns): ~6100 instructions a row one to a statement, ~4900 at 16,
/// ~4800 at 32.
const PACK: usize = 16;

/// The columns of a row, in [`INSERT`]'s order.
const COLUMNS: usize = 15;

/// One row of `runs`.
const INSERT: &str = "INSERT INTO runs (run_id, session_id, route, kind, status, code, error_class, ended_at_ms, \
    total_ms, start_ms, first_byte_ms, input_tokens, output_tokens, reasoning_tokens, cached_tokens) \
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)";

/// [`INSERT`] for `rows` rows.
fn packed_insert(rows: usize) -> String {
    let (head, _) = INSERT.split_at(INSERT.find("VALUES").unwrap_or(INSERT.len()));
    let mut sql = format!("{head}VALUES ");
    for r in 0..rows {
        sql.push_str(if r == 0 { "(" } else { ", (" });
        for c in 1..=COLUMNS {
            if c > 1 {
                sql.push_str(", ");
            }
            sql.push('?');
            sql.push_str(&(r * COLUMNS + c).to_string());
        }
        sql.push(')');
    }
    sql
}

/// What each parameter of a statement holds now: an integer, [`NULL`] or
/// [`OTHER`] (text). Of a row's 15 values, most are as the last row had
/// them in the same place (the route, kind, status and code, the NULLs):
/// not bound again, each saves rusqlite's and SQLite's work on it.
struct Bound(Vec<i64>);

/// A parameter bound to NULL. No value bound is negative.
const NULL: i64 = i64::MIN;
/// A parameter bound to text: bound again each time.
const OTHER: i64 = i64::MIN + 1;

impl Bound {
    /// A statement of `rows` rows, as prepared or as the cache clears it.
    fn new(rows: usize) -> Self {
        Self(vec![NULL; rows * COLUMNS])
    }

    /// Binds row `r` to the parameters after `at` (the row's first is `at + 1`).
    fn row(
        &mut self,
        stmt: &mut rusqlite::CachedStatement<'_>,
        at: usize,
        r: &RunRow,
        route: i64,
    ) -> rusqlite::Result<()> {
        let usage = r.usage.as_ref();
        self.text(stmt, at + 1, Some(r.names.run_id()))?;
        self.text(stmt, at + 2, Some(r.names.session_id()).filter(|s| !s.is_empty()))?;
        self.int(stmt, at + 3, Some(route))?;
        self.int(stmt, at + 4, Some(row::kind_code(r.path, r.operation, r.background)))?;
        self.int(stmt, at + 5, Some(r.status.code()))?;
        self.int(stmt, at + 6, r.code.map(i64::from))?;
        self.text(stmt, at + 7, r.error_class)?;
        self.int(stmt, at + 8, Some(sat(r.queued_at_ms.saturating_add(r.ended_ms))))?;
        self.int(stmt, at + 9, Some(sat(r.ended_ms)))?;
        self.int(stmt, at + 10, r.started_ms.map(sat))?;
        self.int(stmt, at + 11, r.first_byte_ms.map(sat))?;
        self.int(stmt, at + 12, usage.map(|u| sat(u.input_tokens)))?;
        self.int(stmt, at + 13, usage.map(|u| sat(u.output_tokens)))?;
        self.int(stmt, at + 14, usage.and_then(|u| u.reasoning_tokens).map(sat))?;
        self.int(stmt, at + 15, usage.and_then(|u| u.cached_input_tokens).map(sat))
    }

    /// Binds `v` (none: NULL) to parameter `i` (one-based) unless it holds it already.
    #[inline]
    fn int(&mut self, stmt: &mut rusqlite::CachedStatement<'_>, i: usize, v: Option<i64>) -> rusqlite::Result<()> {
        let v = v.unwrap_or(NULL);
        if let Some(slot) = self.0.get_mut(i.wrapping_sub(1)) {
            if *slot == v {
                return Ok(());
            }
            *slot = v;
        }
        if v == NULL {
            stmt.raw_bind_parameter(i, rusqlite::types::Null)
        } else {
            stmt.raw_bind_parameter(i, v)
        }
    }

    /// Binds `v` (none: NULL) to parameter `i`.
    #[inline]
    fn text(&mut self, stmt: &mut rusqlite::CachedStatement<'_>, i: usize, v: Option<&str>) -> rusqlite::Result<()> {
        let Some(s) = v else { return self.int(stmt, i, None) };
        if let Some(slot) = self.0.get_mut(i.wrapping_sub(1)) {
            *slot = OTHER;
        }
        stmt.raw_bind_parameter(i, s)
    }
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
