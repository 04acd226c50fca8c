//! Retention: rows past `max_age` or beyond `max_rows` are deleted, oldest
//! first, a bounded step at a time (the writer thread interleaves the steps
//! with its batches), then the freed pages go back to the file system
//! (`auto_vacuum = INCREMENTAL`, `incremental_vacuum`, a checkpoint).
//!
//! Rows are numbered in the order they ended and only this deletes them,
//! always from the front: the ids held are one contiguous range, so the
//! count is `max - min + 1` and the age cut is the first recent id.

use rusqlite::{params, Connection, OptionalExtension};

/// Rows deleted per step (one short transaction).
pub(crate) const STEP_ROWS: i64 = 5000;
/// Pages handed back per vacuum step.
const VACUUM_PAGES: i64 = 2048;
/// Routes are swept of the ones no row uses once they outnumber this (a
/// sweep reads the whole table; a node has few providers and targets).
const ROUTES_SWEEP_ABOVE: i64 = 4096;

/// What to keep.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Policy {
    /// Rows that ended before this (Unix ms) go.
    pub cutoff_ms: i64,
    /// At most this many rows stay.
    pub max_rows: i64,
}

/// Deletes at most [`STEP_ROWS`] rows the policy no longer keeps; returns
/// how many went (0: nothing left to delete).
pub(crate) fn delete_step(conn: &Connection, policy: Policy) -> rusqlite::Result<usize> {
    let (min, max): (Option<i64>, Option<i64>) = conn.query_row(ENDS, [], |r| Ok((r.get(0)?, r.get(1)?)))?;
    let (Some(min), Some(max)) = (min, max) else { return Ok(0) };
    let window_end = min.saturating_add(STEP_ROWS);
    // Keep the newest `max_rows`.
    let by_count = max.saturating_sub(policy.max_rows).saturating_add(1);
    // The first row of this step's window that is recent enough; the scan
    // stops there, so it reads at most one step of old rows.
    let by_age: i64 = conn
        .query_row(FIRST_RECENT, params![window_end, policy.cutoff_ms], |r| r.get(0))
        .optional()?
        .unwrap_or(window_end);
    let keep_from = by_count.max(by_age).min(window_end);
    if keep_from <= min {
        return Ok(0);
    }
    conn.execute(DELETE_BEFORE, params![keep_from])
}

/// The first and last ids: two subqueries, each one seek at an end of the
/// table. `min(id), max(id)` in one SELECT escapes SQLite's min/max
/// optimization and reads every row: at a million rows each step took
/// a second, the writer fell behind and rows were dropped.
pub(crate) const ENDS: &str = "SELECT (SELECT min(id) FROM runs), (SELECT max(id) FROM runs)";
/// The first id of a step's window recent enough to keep.
pub(crate) const FIRST_RECENT: &str = "SELECT id FROM runs WHERE id < ?1 AND ended_at_ms >= ?2 ORDER BY id LIMIT 1";
/// A step's delete.
pub(crate) const DELETE_BEFORE: &str = "DELETE FROM runs WHERE id < ?1";

/// Forgets routes no row uses, once there are many.
pub(crate) fn sweep_routes(conn: &Connection) -> rusqlite::Result<bool> {
    let routes: i64 = conn.query_row("SELECT count(*) FROM routes", [], |r| r.get(0))?;
    if routes <= ROUTES_SWEEP_ABOVE {
        return Ok(false);
    }
    conn.execute("DELETE FROM routes WHERE id NOT IN (SELECT route FROM runs)", [])?;
    Ok(true)
}

/// Hands back up to [`VACUUM_PAGES`] free pages; returns whether any
/// remain.
pub(crate) fn vacuum_step(conn: &Connection) -> rusqlite::Result<bool> {
    let free: i64 = conn.pragma_query_value(None, "freelist_count", |r| r.get(0))?;
    if free == 0 {
        return Ok(false);
    }
    // The pragma frees pages as it is stepped: step it to its end.
    let mut stmt = conn.prepare_cached(&format!("PRAGMA incremental_vacuum({VACUUM_PAGES})"))?;
    let mut rows = stmt.query([])?;
    while rows.next()?.is_some() {}
    Ok(free > VACUUM_PAGES)
}

/// Copies the WAL into the file and cuts both: the file shrinks by what
/// the vacuum freed.
pub(crate) fn checkpoint(conn: &Connection) -> rusqlite::Result<()> {
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
}
