#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{path::PathBuf, time::Duration};

use iop_core::{config::StoreSettings, exec::Usage};
use rusqlite::Connection;
use serde_json::{json, Value};

use super::{
    row::{Names, Path, RunRow, Status},
    schema, Query, QueryError, Store, StoreError, Tuning,
};
use crate::run::Operation;

/// A fresh directory for one test's database.
fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("iop-store-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn settings(dir: &std::path::Path) -> StoreSettings {
    StoreSettings { path: dir.join("iop.db").to_str().unwrap().to_owned(), ..StoreSettings::default() }
}

/// Retention only when a test asks for it.
fn tuning() -> Tuning {
    Tuning { prune_every: Duration::from_secs(3600), ..Tuning::default() }
}

const DAY_MS: u64 = 86_400_000;

/// The tests' now (one, so a row built twice is the same row).
fn now() -> u64 {
    static NOW: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *NOW.get_or_init(super::writer::now_ms)
}

/// A realistic row: an id like the edge's, a chat run that completed.
fn row(n: u64, ended_ago_ms: u64) -> Box<RunRow> {
    let now = now();
    Box::new(RunRow {
        names: Names::new(
            &format!("5f3a9c1e-{}-{n}", n % 2),
            &if n.is_multiple_of(3) { format!("sess-{}", n / 3) } else { String::new() },
            &format!("vllm-{}", n % 2),
            "Qwen/Qwen2.5-7B-Instruct",
        ),
        path: if n.is_multiple_of(4) { Path::Tunnel } else { Path::Normalized },
        operation: (!n.is_multiple_of(4)).then_some(Operation::Chat),
        background: false,
        status: Status::Complete,
        code: Some(200),
        queued_at_ms: now - ended_ago_ms - 1500,
        started_ms: Some(1),
        first_byte_ms: Some(180 + n % 200),
        ended_ms: 1500,
        usage: Some(Usage {
            input_tokens: 900 + n % 1000,
            output_tokens: 200 + n % 300,
            reasoning_tokens: None,
            cached_input_tokens: n.is_multiple_of(5).then_some(512),
        }),
        error_class: None,
    })
}

fn count(path: &std::path::Path) -> i64 {
    let c = Connection::open(path.join("iop.db")).unwrap();
    c.query_row("SELECT count(*) FROM runs", [], |r| r.get(0)).unwrap()
}

fn file_bytes(dir: &std::path::Path) -> u64 {
    ["iop.db", "iop.db-wal"].iter().map(|f| std::fs::metadata(dir.join(f)).map_or(0, |m| m.len())).sum()
}

fn query(store: &Store, q: Query) -> Result<Value, QueryError> {
    let store = store.clone();
    iop_core::rt::block_on_current(async move { store.query(q).await })
        .unwrap()
        .map(|bytes| serde_json::from_slice(&bytes).unwrap())
}

#[test]
fn rows_are_committed_in_batches_and_acknowledged_after_commit() {
    let d = dir("batches");
    // A batch ends at 100 rows (or a second after its first: not here).
    let t = Tuning { batch_rows: 100, batch_window: Duration::from_secs(1), ..tuning() };
    let store = Store::open_with(&settings(&d), t).unwrap();
    for n in 0..250 {
        store.record(row(n, 0));
    }
    // The last 50 are committed when the flush arrives.
    let batches = store.flush().unwrap();
    assert_eq!(batches, 3, "{:?}", store.stats());
    let s = store.stats();
    assert_eq!((s.written, s.batches, s.dropped, s.failed), (250, 3, 0, 0));
    assert_eq!(count(&d), 250);
    store.close();
    // Closed cleanly: the WAL was folded into the file and removed.
    assert!(!d.join("iop.db-wal").exists());
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_full_channel_drops_rows_and_counts_them_without_waiting() {
    let d = dir("full");
    let t = Tuning { capacity: 4, batch_rows: 1, batch_window: Duration::ZERO, ..tuning() };
    let store = Store::open_with(&settings(&d), t).unwrap();
    // Another process holds the write lock: the writer's first commit waits.
    let other = Connection::open(d.join("iop.db")).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let before = crate::metrics::render();
    let started = std::time::Instant::now();
    for n in 0..20 {
        store.record(row(n, 0));
    }
    assert!(started.elapsed() < Duration::from_millis(500), "record waited: {:?}", started.elapsed());
    let dropped = store.stats().dropped;
    // One row at most in the writer's hands, four in the channel.
    assert!(dropped >= 14, "{:?}", store.stats());
    let metric = |text: &str| -> u64 {
        text.lines()
            .find(|l| l.starts_with("iop_node_run_store_rows_total{result=\"dropped\"}"))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap()
    };
    assert!(metric(&crate::metrics::render()) >= metric(&before) + dropped);
    other.execute_batch("COMMIT").unwrap();
    store.flush().unwrap();
    let s = store.stats();
    // A batch that waited for the other writer's lock was written, not
    // failed (a transaction that read before it wrote was refused at once).
    assert_eq!((s.written + s.dropped, s.failed), (20, 0), "{s:?}");
    assert_eq!(count(&d), s.written as i64);
    store.close();
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn retention_by_age_and_count_deletes_the_oldest_and_gives_the_space_back() {
    let d = dir("retention");
    let s = StoreSettings { max_age: Duration::from_millis(30 * DAY_MS), max_rows: 3000, ..settings(&d) };
    let store = Store::open_with(&s, tuning()).unwrap();
    // The round every start runs is over before the old rows come.
    store.prune_now().unwrap();
    // 40000 rows past the age, then 5000 recent ones.
    for n in 0..45_000 {
        let ago = if n < 40_000 { 40 * DAY_MS } else { 0 };
        store.record(row(n, ago));
        if n % 4000 == 0 {
            store.flush().unwrap();
        }
    }
    store.flush().unwrap();
    assert_eq!(count(&d), 45_000, "{:?}", store.stats());
    // Measured with the WAL folded in, as the file will be after.
    let c = Connection::open(d.join("iop.db")).unwrap();
    super::retention::checkpoint(&c).unwrap();
    drop(c);
    let before = file_bytes(&d);
    store.prune_now().unwrap();
    // The age took 40000, the count 2000 more: the newest 3000 stay.
    assert_eq!(count(&d), 3000);
    let c = Connection::open(d.join("iop.db")).unwrap();
    let oldest: String = c.query_row("SELECT run_id FROM runs ORDER BY id LIMIT 1", [], |r| r.get(0)).unwrap();
    assert_eq!(oldest, row(42_000, 0).names.run_id().to_owned());
    let free: i64 = c.pragma_query_value(None, "freelist_count", |r| r.get(0)).unwrap();
    assert_eq!(free, 0, "every freed page was handed back");
    drop(c);
    let after = file_bytes(&d);
    eprintln!("retention: {before} bytes before, {after} after (45000 rows -> 3000)");
    assert!(after * 4 < before, "{before} -> {after}");
    assert_eq!(store.stats().pruned, 42_000);
    // Nothing more to do: a second round deletes nothing.
    store.prune_now().unwrap();
    assert_eq!(count(&d), 3000);
    store.close();
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn an_older_schema_is_migrated_and_a_newer_one_refused() {
    let d = dir("migrate");
    let path = d.join("iop.db");
    {
        // A store as the first version of the schema left it, with a row.
        let c = Connection::open(&path).unwrap();
        assert_eq!(schema::migrate(&c, &schema::MIGRATIONS[..1]).unwrap(), 0);
        c.execute_batch(
            "INSERT INTO names (id, name) VALUES (1, 'p'), (2, 'm');
             INSERT INTO runs (id, run_id, adapter, target, path, op, background, status, code, ended_at_ms, total_ms)
             VALUES (7, 'old-1', 1, 2, 0, 0, 0, 1, 502, 0, 10);",
        )
        .unwrap();
        c.execute("UPDATE runs SET ended_at_ms = ?1", [now() as i64]).unwrap();
    }
    let store = Store::open_with(&settings(&d), tuning()).unwrap();
    store.flush().unwrap();
    let c = Connection::open(&path).unwrap();
    let version: i64 = c.pragma_query_value(None, "user_version", |r| r.get(0)).unwrap();
    assert_eq!(version, schema::MIGRATIONS.len() as i64);
    let index: i64 = c
        .query_row("SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name = 'runs_not_complete'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(index, 1, "the second migration's index survived the third");
    // The third: the names moved to `routes`, the row kept its id and fields.
    let (id, adapter, target, path, status): (i64, String, String, String, String) = c
        .query_row("SELECT id, adapter, target, path, status FROM runs_view WHERE run_id = 'old-1'", [], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })
        .unwrap();
    assert_eq!((id, &*adapter, &*target, &*path, &*status), (7, "p", "m", "normalized", "error"));
    let tables: i64 =
        c.query_row("SELECT count(*) FROM sqlite_master WHERE name IN ('names', 'runs_v3')", [], |r| r.get(0)).unwrap();
    assert_eq!(tables, 0);
    let v = query(&store, Query::Run { run_id: "old-1".into() }).unwrap();
    assert_eq!(
        (v["status"].as_str(), v["code"].as_i64(), v["queued_at_ms"].as_i64()),
        (Some("error"), Some(502), Some(now() as i64 - 10))
    );
    let errors = query(&store, Query::Runs { limit: 10, status: Some(Status::Error) }).unwrap();
    assert_eq!(errors["runs"].as_array().unwrap().len(), 1);
    store.close();
    // Migrating again is a no-op.
    assert_eq!(schema::migrate(&c, schema::MIGRATIONS).unwrap(), schema::MIGRATIONS.len() as i64);
    c.pragma_update(None, "user_version", 99).unwrap();
    drop(c);
    match Store::open_with(&settings(&d), tuning()) {
        Err(e @ StoreError::TooNew { found: 99, .. }) => assert!(e.to_string().contains("store.path"), "{e}"),
        other => panic!("{other:?}"),
    }
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn queries_answer_newest_first_filtered_and_bounded() {
    let d = dir("query");
    let store = Store::open_with(&settings(&d), tuning()).unwrap();
    // 32 rows in one batch: two packed statements (`writer::PACK`).
    for n in 0..30 {
        store.record(row(n, 0));
    }
    let mut failed = row(30, 0);
    (failed.status, failed.code, failed.usage, failed.error_class) =
        (Status::Error, Some(429), None, Some(iop_core::exec::codes::CAPACITY));
    failed.started_ms = None;
    failed.first_byte_ms = None;
    store.record(failed);
    let mut cancelled = row(31, 0);
    (cancelled.status, cancelled.code) = (Status::Cancelled, None);
    store.record(cancelled);
    let ids = |v: &Value| -> Vec<String> {
        v["runs"].as_array().unwrap().iter().map(|r| r["run_id"].as_str().unwrap().to_owned()).collect()
    };
    let all = query(&store, Query::Runs { limit: 3, status: None }).unwrap();
    assert_eq!(
        ids(&all),
        [
            row(31, 0).names.run_id().to_owned(),
            row(30, 0).names.run_id().to_owned(),
            row(29, 0).names.run_id().to_owned()
        ]
    );
    let errors = query(&store, Query::Runs { limit: 50, status: Some(Status::Error) }).unwrap();
    assert_eq!(ids(&errors), [row(30, 0).names.run_id().to_owned()]);
    let complete = query(&store, Query::Runs { limit: 500, status: Some(Status::Complete) }).unwrap();
    assert_eq!(ids(&complete).len(), 30);
    let cancelled = query(&store, Query::Runs { limit: 50, status: Some(Status::Cancelled) }).unwrap();
    assert_eq!(ids(&cancelled), [row(31, 0).names.run_id().to_owned()]);
    // A limit beyond the bound is clamped; every row, in order.
    let many = query(&store, Query::Runs { limit: 10_000, status: None }).unwrap();
    assert_eq!(ids(&many), (0..32).rev().map(|n| row(n, 0).names.run_id().to_owned()).collect::<Vec<_>>());

    // Every field, as the edge receives it.
    let r = row(30, 0);
    let v = query(&store, Query::Run { run_id: r.names.run_id().to_owned() }).unwrap();
    let queued = r.queued_at_ms as i64;
    assert_eq!(
        v,
        json!({
            "run_id": r.names.run_id(), "session_id": "sess-10", "adapter": "vllm-0", "target": "Qwen/Qwen2.5-7B-Instruct",
            "path": "normalized", "operation": "chat", "background": false, "status": "error", "code": 429,
            "queued_at_ms": queued, "started_at_ms": null, "first_byte_at_ms": null, "ended_at_ms": queued + 1500,
            "usage": null, "error_class": "capacity",
        })
    );
    let r = row(0, 0);
    let v = query(&store, Query::Run { run_id: r.names.run_id().to_owned() }).unwrap();
    let queued = r.queued_at_ms as i64;
    assert_eq!(
        v,
        json!({
            "run_id": r.names.run_id(), "session_id": "sess-0", "adapter": "vllm-0", "target": "Qwen/Qwen2.5-7B-Instruct",
            "path": "tunnel", "operation": null, "background": false, "status": "complete", "code": 200,
            "queued_at_ms": queued, "started_at_ms": queued + 1, "first_byte_at_ms": queued + 180,
            "ended_at_ms": queued + 1500, "usage": {"input": 900, "output": 200, "reasoning": null, "cached": 512},
            "error_class": null,
        })
    );
    assert_eq!(query(&store, Query::Run { run_id: "nope".into() }), Err(QueryError::NotFound));
    store.close();
    assert_eq!(query(&store, Query::Run { run_id: "x".into() }), Err(QueryError::Unavailable));
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_row_takes_about_this_many_bytes() {
    let d = dir("bytes");
    let store = Store::open_with(&settings(&d), tuning()).unwrap();
    const ROWS: u64 = 20_000;
    for n in 0..ROWS {
        store.record(row(n, 0));
        if n % 4000 == 0 {
            store.flush().unwrap();
        }
    }
    store.flush().unwrap();
    store.close();
    // Closed: the WAL is in the file.
    let bytes = std::fs::metadata(d.join("iop.db")).unwrap().len();
    let per_row = bytes / ROWS;
    eprintln!("run store: {bytes} bytes for {ROWS} rows = {per_row} bytes per row");
    assert!(per_row < 120, "{per_row} bytes per row");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_uri_path_and_a_session_id_too_long_are_handled() {
    let d = dir("uri");
    let uri = format!("file:{}?cache=shared&mode=rwc", d.join("iop.db").to_str().unwrap());
    let store = Store::open_with(&StoreSettings { path: uri, ..StoreSettings::default() }, tuning()).unwrap();
    let mut r = row(1, 0);
    r.names = Names::new(r.names.run_id(), &"é".repeat(200), r.names.adapter(), r.names.target());
    store.record(r);
    store.flush().unwrap();
    let v = query(&store, Query::Run { run_id: row(1, 0).names.run_id().to_owned() }).unwrap();
    assert_eq!(v["session_id"].as_str().unwrap().len(), 256);
    store.close();
    assert_eq!(count(&d), 1);
    // An unopenable path names the key and the value.
    let bad =
        StoreSettings { path: d.join("no/such/dir/iop.db").to_str().unwrap().to_owned(), ..StoreSettings::default() };
    let e = Store::open(&bad).unwrap_err();
    assert!(e.to_string().contains("`store.path`") && e.to_string().contains("no/such/dir"), "{e}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn the_status_filter_reads_the_partial_index_a_run_scans_newest_first_and_retention_seeks() {
    let c = Connection::open_in_memory().unwrap();
    schema::migrate(&c, schema::MIGRATIONS).unwrap();
    let plan = |sql: &str| -> String {
        let mut stmt = c.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let unbound = vec![None::<i64>; stmt.parameter_count()];
        let rows = stmt.query_map(rusqlite::params_from_iter(unbound), |r| r.get::<_, String>(3)).unwrap();
        rows.map(Result::unwrap).collect::<Vec<_>>().join("; ")
    };
    let p = plan(&super::query::runs_sql(Some(Status::Error)));
    assert!(p.contains("runs_not_complete"), "{p}");
    let p = plan(&super::query::runs_sql(None));
    assert!(!p.contains("TEMP B-TREE"), "newest first without a sort: {p}");
    let p = plan(&super::query::run_sql());
    assert!(!p.contains("TEMP B-TREE"), "newest first without a sort: {p}");
    // Retention's statements seek; none reads the whole table.
    use super::retention::{DELETE_BEFORE, ENDS, FIRST_RECENT};
    for sql in [ENDS, FIRST_RECENT, DELETE_BEFORE] {
        let p = plan(sql);
        assert!(!p.contains("SCAN runs"), "{sql}: {p}");
    }
}

#[test]
fn a_kind_holds_path_operation_and_background() {
    use super::row::{kind_code, kind_names};
    let cases = [
        (Path::Tunnel, None, false, ("tunnel", None, false)),
        (Path::Tunnel, None, true, ("tunnel", None, true)),
        (Path::Normalized, Some(Operation::Chat), false, ("normalized", Some("chat"), false)),
        (Path::Normalized, Some(Operation::Embeddings), true, ("normalized", Some("embeddings"), true)),
        (Path::Normalized, Some(Operation::Tokenize), false, ("normalized", Some("tokenize"), false)),
    ];
    for (path, op, background, names) in cases {
        assert_eq!(kind_names(kind_code(path, op, background)), names, "{path:?} {op:?} {background}");
    }
}

/// What `RUN` answers for `r`.
fn answer(r: &RunRow) -> Value {
    let q = r.queued_at_ms as i64;
    let (path, operation, background) =
        super::row::kind_names(super::row::kind_code(r.path, r.operation, r.background));
    let session = Some(r.names.session_id()).filter(|s| !s.is_empty());
    json!({
        "run_id": r.names.run_id(), "session_id": session, "adapter": r.names.adapter(), "target": r.names.target(),
        "path": path, "operation": operation, "background": background, "status": r.status.as_str(), "code": r.code,
        "queued_at_ms": q, "started_at_ms": r.started_ms.map(|o| q + o as i64),
        "first_byte_at_ms": r.first_byte_ms.map(|o| q + o as i64), "ended_at_ms": q + r.ended_ms as i64,
        "usage": r.usage.as_ref().map(|u| json!({
            "input": u.input_tokens, "output": u.output_tokens, "reasoning": u.reasoning_tokens, "cached": u.cached_input_tokens,
        })),
        "error_class": r.error_class,
    })
}

#[test]
fn every_row_reads_back_as_recorded_whatever_the_row_before_it_in_its_place_bound() {
    // The writer binds a value only where it differs from what the last
    // execution left in that place: rows whose fields change with
    // different periods (NULL to a value and back, text to NULL), over
    // several packed statements and the one-row statement after them.
    let d = dir("places");
    let store = Store::open_with(&settings(&d), tuning()).unwrap();
    let rows: Vec<Box<RunRow>> = (0..16 * 3 + 5)
        .map(|n| {
            let mut r = row(n, 0);
            if n % 7 < 3 {
                (r.status, r.code, r.error_class) =
                    (Status::Error, Some(502), Some(iop_core::exec::codes::UPSTREAM_CONNECT));
            }
            if n % 5 == 1 {
                (r.status, r.code, r.usage, r.started_ms, r.first_byte_ms) =
                    (Status::Cancelled, None, None, None, None);
            }
            if n % 11 == 0 {
                if let Some(u) = r.usage.as_mut() {
                    u.reasoning_tokens = Some(n * 3);
                }
            }
            r
        })
        .collect();
    for r in &rows {
        store.record(r.clone());
    }
    for r in &rows {
        assert_eq!(query(&store, Query::Run { run_id: r.names.run_id().to_owned() }).unwrap(), answer(r));
    }
    store.close();
    let _ = std::fs::remove_dir_all(&d);
}
