//! The `iop-node` binary on its own: config checking and the reconnect
//! policy's exhaustion exit.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

fn node() -> Command {
    Command::new(env!("CARGO_BIN_EXE_iop-node"))
}

fn write(name: &str, text: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("iop-node-cli-{}-{name}", std::process::id()));
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn check_config_accepts_the_example_and_names_bad_keys() {
    let ok = node()
        .args(["--check-config", "--config", concat!(env!("CARGO_MANIFEST_DIR"), "/../configs/node.toml")])
        .output()
        .unwrap();
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));

    let bad = write("bad.toml", "edge = \"127.0.0.1:7070\"\ntoken = \"t\"\n[reconnect]\ninterval_sec = 0\n");
    let out = node().args(["--check-config", "--config", bad.to_str().unwrap()]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("reconnect.interval_sec"), "{err}");
}

#[test]
fn finite_reconnect_attempts_exhaust_with_a_non_zero_exit() {
    // A port nobody listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let cfg = write(
        "exhaust.toml",
        &format!(
            "edge = \"127.0.0.1:{port}\"\ntoken = \"t\"\nstore = false\n[reconnect]\nmax_attempts = 2\ninterval_sec = 1\n"
        ),
    );
    let mut child =
        node().args(["--config", cfg.to_str().unwrap()]).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "node did not give up");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(3));
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(err.contains("gave up after 2 failed connection attempts"), "{err}");
}

#[test]
fn the_run_store_opens_where_configured_and_a_bad_path_stops_the_node() {
    let dir = std::env::temp_dir().join(format!("iop-node-cli-{}-store", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let config = |path: &str| {
        format!(
            "edge = \"127.0.0.1:{port}\"\ntoken = \"t\"\n[store]\npath = \"{path}\"\n[reconnect]\nmax_attempts = 1\ninterval_sec = 1\n"
        )
    };
    let bad = dir.join("no/such/dir/iop.db");
    let cfg = write("store-bad.toml", &config(bad.to_str().unwrap()));
    let out = node().args(["--config", cfg.to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("`store.path`") && err.contains("no/such/dir/iop.db"), "{err}");

    // Opened (created, migrated) at start, closed cleanly at the end.
    let good = dir.join("runs.db");
    let cfg = write("store-good.toml", &config(good.to_str().unwrap()));
    let out = node().args(["--config", cfg.to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(good.exists());
    assert!(!dir.join("runs.db-wal").exists(), "the WAL was folded in at exit");
    let _ = std::fs::remove_dir_all(&dir);
}
