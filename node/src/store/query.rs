//! What the node commands `RUNS` and `RUN` read, answered on the store's
//! thread as the JSON the edge passes on.

use rusqlite::{params, Connection, OptionalExtension, Row};
use serde_json::{json, Value};

use super::row::{self, Status};

/// The most rows one `RUNS` answer holds.
pub const MAX_LIMIT: u32 = 500;
/// `RUNS` without a limit.
pub const DEFAULT_LIMIT: u32 = 50;

/// A read of the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Query {
    /// The newest `limit` rows (`1..=MAX_LIMIT`), of one status or all.
    Runs {
        /// How many at most.
        limit: u32,
        /// Only these.
        status: Option<Status>,
    },
    /// The newest row of one run or tunnel id.
    Run {
        /// Its id.
        run_id: String,
    },
}

const COLUMNS: &str = "SELECT r.run_id, r.session_id, ro.adapter, ro.target, r.kind, r.status, r.code,
    r.ended_at_ms, r.total_ms, r.start_ms, r.first_byte_ms,
    r.input_tokens, r.output_tokens, r.reasoning_tokens, r.cached_tokens, r.error_class
    FROM runs r JOIN routes ro ON ro.id = r.route";

/// Runs `q`: `Ok(None)` when `RUN` finds no such id.
pub(crate) fn answer(conn: &Connection, q: &Query) -> rusqlite::Result<Option<Value>> {
    match q {
        Query::Runs { limit, status } => {
            let limit = i64::from((*limit).clamp(1, MAX_LIMIT));
            let mut stmt = conn.prepare_cached(&runs_sql(*status))?;
            let rows = match status {
                Some(s) if *s != Status::Complete => stmt.query_map(params![limit, s.code()], to_json)?,
                _ => stmt.query_map(params![limit], to_json)?,
            }
            .collect::<Result<Vec<_>, _>>()?;
            Ok(Some(json!({ "runs": rows })))
        }
        Query::Run { run_id } => {
            let mut stmt = conn.prepare_cached(&run_sql())?;
            stmt.query_row(params![run_id], to_json).optional()
        }
    }
}

/// `RUNS`'s statement: `?1` the limit, `?2` the status.
pub(crate) fn runs_sql(status: Option<Status>) -> String {
    match status {
        None => format!("{COLUMNS} ORDER BY r.id DESC LIMIT ?1"),
        // Nearly every row is complete: newest first, the scan stops soon.
        Some(Status::Complete) => format!("{COLUMNS} WHERE r.status = 0 ORDER BY r.id DESC LIMIT ?1"),
        // `status != 0` repeated: what lets SQLite use the partial index.
        Some(_) => format!("{COLUMNS} WHERE r.status = ?2 AND r.status != 0 ORDER BY r.id DESC LIMIT ?1"),
    }
}

/// `RUN`'s statement: `?1` the id. Newest first, so the recent runs an
/// operator asks about are found after a short scan; an unknown id reads
/// the whole table, which retention bounds (`store.max_rows`).
pub(crate) fn run_sql() -> String {
    format!("{COLUMNS} WHERE r.run_id = ?1 ORDER BY r.id DESC LIMIT 1")
}

/// One row as the commands answer it.
fn to_json(r: &Row<'_>) -> rusqlite::Result<Value> {
    let ended_at: i64 = r.get(7)?;
    let queued_at = ended_at - r.get::<_, i64>(8)?;
    let at = |offset: Option<i64>| offset.map(|o| queued_at + o);
    let input: Option<i64> = r.get(11)?;
    let output: Option<i64> = r.get(12)?;
    let usage = match (input, output) {
        (Some(input), Some(output)) => json!({
            "input": input,
            "output": output,
            "reasoning": r.get::<_, Option<i64>>(13)?,
            "cached": r.get::<_, Option<i64>>(14)?,
        }),
        _ => Value::Null,
    };
    let (path, operation, background) = row::kind_names(r.get(4)?);
    Ok(json!({
        "run_id": r.get::<_, String>(0)?,
        "session_id": r.get::<_, Option<String>>(1)?,
        "adapter": r.get::<_, String>(2)?,
        "target": r.get::<_, String>(3)?,
        "path": path,
        "operation": operation,
        "background": background,
        "status": Status::name(r.get(5)?),
        "code": r.get::<_, Option<i64>>(6)?,
        "queued_at_ms": queued_at,
        "started_at_ms": at(r.get(9)?),
        "first_byte_at_ms": at(r.get(10)?),
        "ended_at_ms": ended_at,
        "usage": usage,
        "error_class": r.get::<_, Option<String>>(15)?,
    }))
}
