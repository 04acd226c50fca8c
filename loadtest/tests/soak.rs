//! The soak test (`loadtest/soak.py`) in its short form, from cargo.
//!
//! - `two_minute_soak_passes`: two minutes of mixed load with node restarts
//!   (SIGTERM and SIGKILL) and edge reloads; the script's verdict must be a
//!   pass, with the restarts, reloads and cut streams it promises done.
//! - `growth_beyond_the_bound_fails`: 30 s with bounds no process can meet
//!   (RSS must shrink by 8 MiB, descriptors by 100): the script must fail
//!   and say why, so the verdict is known to bite.
//!
//! Both are ignored in `cargo test`: they take 2.5 minutes and need the
//! iop-edge and iop-node binaries beside this test, which `cargo test -p
//! iop-loadtest` does not build (`cargo test --workspace` does). `.ci/run`
//! runs them:
//!
//! ```sh
//! cargo build -p iop-edge -p iop-node -p iop-loadtest --bins
//! cargo test -p iop-loadtest --test soak -- --ignored
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use serde_json::Value;

/// One soak at a time: they share the machine's cores.
static ONE: Mutex<()> = Mutex::new(());

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

/// Where this build's binaries are.
fn bin_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_BIN_EXE_iop-loadtest")).parent().unwrap().to_path_buf();
    for bin in ["iop-edge", "iop-node", "iop-mockprov"] {
        assert!(
            dir.join(bin).exists(),
            "{bin} missing in {}: cargo build -p iop-edge -p iop-node -p iop-loadtest --bins",
            dir.display()
        );
    }
    dir
}

/// Runs the script with `args`; its success, output, result.json and
/// output directory (the caller removes it once its assertions hold).
fn soak(name: &str, args: &[&str]) -> (bool, String, Value, PathBuf) {
    let out_dir = std::env::temp_dir().join(format!("iop-soak-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out_dir);
    let out = Command::new("python3")
        .arg(repo_root().join("loadtest/soak.py"))
        .arg("--bin-dir")
        .arg(bin_dir())
        .arg("--out")
        .arg(&out_dir)
        .args(args)
        .output()
        .expect("python3 (3.11 or newer) must be installed to run the soak test");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let text = std::fs::read_to_string(out_dir.join("result.json"))
        .unwrap_or_else(|e| panic!("no result.json ({e}):\n{stdout}\n{stderr}"));
    let result: Value = serde_json::from_str(&text).unwrap();
    assert!(out_dir.join("samples.csv").exists() && out_dir.join("soak.svg").exists(), "{stdout}");
    (out.status.success(), format!("{stdout}\n{stderr}"), result, out_dir)
}

#[test]
#[ignore = "2-minute soak; needs iop-edge and iop-node beside this test; .ci/run runs it"]
fn two_minute_soak_passes() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let (ok, out, r, dir) = soak("2m", &["--duration", "2m", "--seed", "7"]);
    assert!(ok, "the soak failed:\n{out}");
    assert_eq!(r["pass"], true, "{out}");
    let restarts = r["restarts"].as_array().unwrap();
    assert!(restarts.len() >= 5, "restarts: {restarts:?}\n{out}");
    let kinds: Vec<&str> = restarts.iter().map(|m| m[1].as_str().unwrap()).collect();
    assert!(kinds.contains(&"SIGTERM") && kinds.contains(&"SIGKILL"), "{kinds:?}");
    assert!(r["reloads"].as_u64().unwrap() >= 5, "{out}");
    assert!(r["requests_ok"].as_u64().unwrap() > 100, "{out}");
    assert!(r["requests"]["cut stream"].as_u64().unwrap() > 0, "{out}");
    // The edge, the long last node incarnation and two short ones judged.
    assert_eq!(r["checks"].as_array().unwrap().len(), 3, "{out}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
#[ignore = "30-second soak; needs iop-edge and iop-node beside this test; .ci/run runs it"]
fn growth_beyond_the_bound_fails() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let (ok, out, r, dir) =
        soak("bounds", &["--duration", "30s", "--rss-pct", "-50", "--rss-mib", "-8", "--fd-slack", "-100"]);
    assert!(!ok, "bounds below any process passed:\n{out}");
    let failures: Vec<&str> = r["failures"].as_array().unwrap().iter().map(|f| f.as_str().unwrap()).collect();
    for what in ["edge: RSS median", "edge: ", "descriptors (median) in the last window"] {
        assert!(failures.iter().any(|f| f.contains(what)), "no failure saying {what:?}: {failures:?}");
    }
    // Only the bounds failed: the load itself was clean.
    assert!(failures.iter().all(|f| f.contains("RSS") || f.contains("descriptors")), "{failures:?}");
    std::fs::remove_dir_all(&dir).ok();
}
