//! The run store survives `kill -9` mid-batch: a child process (this test
//! binary again, in child mode) writes batch after batch and prints each
//! batch it saw acknowledged (committed); the parent kills it with SIGKILL
//! while it writes, reopens the file, and finds it intact with every
//! acknowledged batch whole. Six rounds on the same file, each killing
//! at another point of the writer's cycle (its 50 ms batch window, then
//! the transaction of about 2000 rows).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    io::{BufRead, BufReader, Write},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use iop_core::config::StoreSettings;
use iop_node::store::{Names, Path, RunRow, Status, Store};

/// Set in the child: the database path.
const CHILD_ENV: &str = "IOP_STORE_KILL_CHILD";
/// Set in the child: its round, so run ids never repeat across rounds.
const ROUND_ENV: &str = "IOP_STORE_KILL_ROUND";
const BATCH_ROWS: u64 = 2000;

fn settings(path: &str) -> StoreSettings {
    StoreSettings { path: path.to_owned(), ..StoreSettings::default() }
}

fn row(batch: &str, n: u64) -> Box<RunRow> {
    Box::new(RunRow {
        names: Names::new(&format!("{batch}-{n}"), batch, "p", "m"),
        path: Path::Normalized,
        operation: None,
        background: false,
        status: Status::Complete,
        code: Some(200),
        queued_at_ms: 1_800_000_000_000 + n,
        started_ms: Some(1),
        first_byte_ms: Some(20),
        ended_ms: 300,
        usage: None,
        error_class: None,
    })
}

/// Child mode: writes batches until killed, printing `ack <batch>` once each is committed.
#[test]
fn store_kill_child() {
    let Ok(path) = std::env::var(CHILD_ENV) else { return };
    let round = std::env::var(ROUND_ENV).unwrap();
    let store = Store::open(&settings(&path)).unwrap();
    let mut out = std::io::stdout();
    for b in 0u64.. {
        let batch = format!("r{round}b{b}");
        for n in 0..BATCH_ROWS {
            store.record(row(&batch, n));
        }
        // Everything recorded before it is committed when it returns.
        store.flush().unwrap();
        let s = store.stats();
        assert_eq!((s.dropped, s.failed), (0, 0), "an acknowledgement would be a lie");
        writeln!(out, "ack {batch}").unwrap();
        out.flush().unwrap();
    }
}

#[test]
fn kill_9_mid_batch_leaves_every_acknowledged_batch() {
    let dir = std::env::temp_dir().join(format!("iop-store-kill-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("iop.db").to_str().unwrap().to_owned();
    let mut acked = Vec::new();
    for round in 0..6 {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["store_kill_child", "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, &path)
            .env(ROUND_ENV, round.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut this_round = 0;
        // A few acknowledgements, then the kill lands while the next
        // batch is being written.
        while this_round < 2 + round {
            assert!(Instant::now() < deadline, "the child acknowledged {this_round} batches in a minute");
            let line = lines.next().expect("the child ended early").unwrap();
            if let Some(batch) = line.strip_prefix("ack ") {
                acked.push(batch.to_owned());
                this_round += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(10 * round as u64));
        child.kill().unwrap(); // SIGKILL
        let status = child.wait().unwrap();
        assert!(!status.success(), "{status:?}");
        // What it printed before dying was acknowledged too.
        for line in lines.map_while(Result::ok) {
            if let Some(batch) = line.strip_prefix("ack ") {
                acked.push(batch.to_owned());
            }
        }

        // Reopened the way a restarted node opens it (recovering the WAL).
        let store = Store::open(&settings(&path)).unwrap();
        store.flush().unwrap();
        store.close();
        let c = rusqlite::Connection::open(&path).unwrap();
        let check: String = c.query_row("PRAGMA integrity_check", [], |r| r.get(0)).unwrap();
        assert_eq!(check, "ok", "round {round}");
        let total: i64 = c.query_row("SELECT count(*) FROM runs", [], |r| r.get(0)).unwrap();
        // Rows beyond the acknowledged ones: the batch the kill interrupted.
        eprintln!("round {round}: {} batches acknowledged, {total} rows", acked.len());
        for batch in &acked {
            let n: i64 = c.query_row("SELECT count(*) FROM runs WHERE session_id = ?1", [batch], |r| r.get(0)).unwrap();
            assert_eq!(n as u64, BATCH_ROWS, "acknowledged batch {batch} after round {round}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
