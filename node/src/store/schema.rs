//! Opening the store's file and bringing its schema up to date: a list of
//! migrations numbered by SQLite's `user_version`, each applied once, in
//! order, in a transaction of its own.

use rusqlite::{Connection, OpenFlags};

use super::StoreError;

/// `runs_view`: a row with its names, as the commands answer it
/// (migrations 3 and 4 create it, the same each time).
macro_rules! runs_view {
    () => {
        "CREATE VIEW runs_view AS SELECT r.id, r.run_id, r.session_id, ro.adapter, ro.target,
            CASE WHEN r.kind & 15 = 15 THEN 'tunnel' ELSE 'normalized' END AS path,
            CASE r.kind & 15 WHEN 0 THEN 'chat' WHEN 1 THEN 'embeddings' WHEN 2 THEN 'tokenize' END AS operation,
            (r.kind >> 4) & 1 AS background,
            CASE r.status WHEN 0 THEN 'complete' WHEN 1 THEN 'error' ELSE 'cancelled' END AS status,
            r.code, r.error_class, r.ended_at_ms - r.total_ms AS queued_at_ms,
            r.ended_at_ms - r.total_ms + r.start_ms AS started_at_ms,
            r.ended_at_ms - r.total_ms + r.first_byte_ms AS first_byte_at_ms, r.ended_at_ms,
            r.input_tokens, r.output_tokens, r.reasoning_tokens, r.cached_tokens
        FROM runs r JOIN routes ro ON ro.id = r.route;"
    };
}

/// Migration `i` brings the schema from version `i` to `i + 1`.
pub(crate) const MIGRATIONS: &[&str] = &[
    // 1: names (provider ids and targets, each stored once) and one row per
    // run or tunnel, numbered in the order they ended. Times: `ended_at_ms`
    // is Unix ms; the others are offsets from the arrival (`total_ms` back
    // to it), small numbers SQLite stores in one to three bytes. No index
    // on the run id: its keys are random, so a batch of N rows would dirty
    // N index pages, each written whole to the WAL and again at the
    // checkpoint (measured: a third of the node's CPU at 30k runs/s). A
    // lookup by id scans newest first instead (`query::run_sql`).
    "CREATE TABLE names (
        id INTEGER PRIMARY KEY,
        name TEXT NOT NULL UNIQUE
    );
    CREATE TABLE runs (
        id INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL,
        session_id TEXT,
        adapter INTEGER NOT NULL,
        target INTEGER NOT NULL,
        path INTEGER NOT NULL,
        op INTEGER,
        background INTEGER NOT NULL,
        status INTEGER NOT NULL,
        code INTEGER,
        ended_at_ms INTEGER NOT NULL,
        total_ms INTEGER NOT NULL,
        start_ms INTEGER,
        first_byte_ms INTEGER,
        input_tokens INTEGER,
        output_tokens INTEGER,
        reasoning_tokens INTEGER,
        cached_tokens INTEGER,
        error_class TEXT
    );",
    // 2: the runs that did not complete, for the status filter; complete
    // runs (nearly all of them) cost this index nothing.
    "CREATE INDEX runs_not_complete ON runs(status) WHERE status != 0;",
    // 3: fewer columns per row, each measured at ~210 instructions of an
    // insert (binding, the VDBE's copy, the record): the provider and
    // target become one `routes` id (a pair stored once), and path,
    // operation and the background flag one `kind` (`row::kind_code`).
    // `runs_view` shows a row with its names, as the commands answer it.
    concat!(
        "CREATE TABLE routes (
        id INTEGER PRIMARY KEY,
        adapter TEXT NOT NULL,
        target TEXT NOT NULL,
        UNIQUE (adapter, target)
    );
    INSERT INTO routes (adapter, target)
        SELECT DISTINCT a.name, t.name FROM runs r JOIN names a ON a.id = r.adapter JOIN names t ON t.id = r.target;
    CREATE TABLE runs_v3 (
        id INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL,
        session_id TEXT,
        route INTEGER NOT NULL,
        kind INTEGER NOT NULL,
        status INTEGER NOT NULL,
        code INTEGER,
        error_class TEXT,
        ended_at_ms INTEGER NOT NULL,
        total_ms INTEGER NOT NULL,
        start_ms INTEGER,
        first_byte_ms INTEGER,
        input_tokens INTEGER,
        output_tokens INTEGER,
        reasoning_tokens INTEGER,
        cached_tokens INTEGER
    );
    INSERT INTO runs_v3
        SELECT r.id, r.run_id, r.session_id, ro.id,
            (CASE WHEN r.path = 1 THEN 15 ELSE coalesce(r.op, 0) END) | (r.background << 4),
            r.status, r.code, r.error_class, r.ended_at_ms, r.total_ms, r.start_ms, r.first_byte_ms,
            r.input_tokens, r.output_tokens, r.reasoning_tokens, r.cached_tokens
        FROM runs r JOIN names a ON a.id = r.adapter JOIN names t ON t.id = r.target
            JOIN routes ro ON ro.adapter = a.name AND ro.target = t.name;
    DROP TABLE runs;
    DROP TABLE names;
    ALTER TABLE runs_v3 RENAME TO runs;
    CREATE INDEX runs_not_complete ON runs(status) WHERE status != 0;
    ",
        runs_view!()
    ),
    // 4: the same columns, declared without a type and without NOT NULL:
    // an insert then applies no affinity and checks no constraint value
    // by value (measured: ~460 of ~3,100 instructions of SQLite's a row
    // at 15 columns). The writer is the only one that writes, and binds
    // each column as its comment says; `runs_view` is unchanged.
    concat!(
        "CREATE TABLE runs_v4 (
        id INTEGER PRIMARY KEY,
        run_id,            -- text, always
        session_id,        -- text, or NULL: none
        route,             -- routes.id, always
        kind,              -- row::kind_code, always
        status,            -- 0 complete, 1 error, 2 cancelled
        code,              -- HTTP status, or NULL
        error_class,       -- text, or NULL
        ended_at_ms,       -- Unix ms, always
        total_ms,          -- ms from arrival to the end, always
        start_ms,          -- ms from arrival, or NULL: never admitted
        first_byte_ms,     -- ms from arrival, or NULL: no output
        input_tokens,      -- integers, or NULL: not reported
        output_tokens,
        reasoning_tokens,
        cached_tokens
    );
    INSERT INTO runs_v4 SELECT id, run_id, session_id, route, kind, status, code, error_class, ended_at_ms,
        total_ms, start_ms, first_byte_ms, input_tokens, output_tokens, reasoning_tokens, cached_tokens FROM runs;
    DROP VIEW runs_view;
    DROP TABLE runs;
    ALTER TABLE runs_v4 RENAME TO runs;
    CREATE INDEX runs_not_complete ON runs(status) WHERE status != 0;
    ",
        runs_view!()
    ),
];

/// Opens `path` (a file path or a `file:` URI) and applies its settings.
/// WAL: readers never block the writer, and a commit is one append.
/// `synchronous = NORMAL` is safe in WAL mode: a committed transaction
/// survives the process being killed (its pages are in the OS's cache);
/// only a power loss may take back the last commits, never corrupt the
/// file. Incremental auto-vacuum lets retention give freed pages back.
pub(crate) fn open(path: &str) -> Result<Connection, StoreError> {
    let failed = |source| StoreError::Open { path: path.to_owned(), source };
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_URI
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).map_err(failed)?;
    // Another node process may share the file: wait for its commit.
    conn.busy_timeout(std::time::Duration::from_secs(5)).map_err(failed)?;
    // Before any table exists, or it takes a full VACUUM to change.
    let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0)).map_err(failed)?;
    if version == 0 {
        conn.pragma_update(None, "auto_vacuum", "INCREMENTAL").map_err(failed)?;
    }
    let mode: String = conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0)).map_err(failed)?;
    if !mode.eq_ignore_ascii_case("wal") {
        tracing::warn!(journal_mode = %mode, "the run store could not use WAL (an in-memory database?)");
    }
    conn.pragma_update(None, "synchronous", "NORMAL").map_err(failed)?;
    // The WAL is cut back to this after a checkpoint, not left at its peak.
    conn.pragma_update(None, "journal_size_limit", 8 * 1024 * 1024).map_err(failed)?;
    migrate(&conn, MIGRATIONS).map_err(|e| match e {
        MigrateError::TooNew { found, known } => StoreError::TooNew { found, known },
        MigrateError::Sql(source) => failed(source),
    })?;
    Ok(conn)
}

/// Why migrating failed.
#[derive(Debug)]
pub(crate) enum MigrateError {
    /// A newer node wrote this file.
    TooNew {
        found: i64,
        known: i64,
    },
    Sql(rusqlite::Error),
}

impl From<rusqlite::Error> for MigrateError {
    fn from(e: rusqlite::Error) -> Self {
        MigrateError::Sql(e)
    }
}

/// Applies the migrations `conn` lacks; returns the version it had.
pub(crate) fn migrate(conn: &Connection, migrations: &[&str]) -> Result<i64, MigrateError> {
    let found: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    let known = migrations.len() as i64;
    if found > known {
        return Err(MigrateError::TooNew { found, known });
    }
    for (i, sql) in migrations.iter().enumerate().skip(usize::try_from(found).unwrap_or(0)) {
        // The version moves with the change: a crash leaves either both or neither.
        conn.execute_batch(&format!("BEGIN IMMEDIATE; {sql}\nPRAGMA user_version = {}; COMMIT;", i + 1)).inspect_err(
            |_| {
                let _ = conn.execute_batch("ROLLBACK");
            },
        )?;
    }
    Ok(found)
}
