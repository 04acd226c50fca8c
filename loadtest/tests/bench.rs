//! The benchmark harness (`loadtest/bench/run.py`) end to end in `--quick`
//! mode: every system (the mock, one and two nginx, iop on both paths and
//! with its in-process mock) through every scenario, then `compare`.
//!
//! Needs nginx (`apt-get install nginx`), `python3`, and the `iop-edge` and
//! `iop-node` binaries beside this package's (`cargo build -p iop-edge -p
//! iop-node`, or after `cargo test --workspace`):
//!
//! ```sh
//! cargo build -p iop-edge -p iop-node && cargo test -p iop-loadtest --test bench -- --ignored
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

#[test]
#[ignore = "needs nginx (apt-get install nginx); CI runs it"]
fn quick_benchmark_runs_every_system_and_scenario() {
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_iop-loadtest")).parent().unwrap().to_path_buf();
    for bin in ["iop-edge", "iop-node"] {
        assert!(
            bin_dir.join(bin).exists(),
            "{bin} missing in {}: cargo build -p iop-edge -p iop-node",
            bin_dir.display()
        );
    }
    let out_dir = std::env::temp_dir().join(format!("iop-bench-test-{}", std::process::id()));
    std::fs::create_dir_all(&out_dir).unwrap();
    let results = out_dir.join("results.json");
    let script = repo_root().join("loadtest/bench/run.py");
    let run = Command::new("python3")
        .arg(&script)
        .args(["run", "--quick", "--duration", "1", "--systems", "all", "--wait-idle", "0", "--bin-dir"])
        .arg(&bin_dir)
        .arg("--out")
        .arg(&results)
        .output()
        .expect("run python3");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "run.py failed: {}\n{stdout}", String::from_utf8_lossy(&run.stderr));

    let r: Value = serde_json::from_str(&std::fs::read_to_string(&results).unwrap()).unwrap();
    let meta = &r["meta"];
    for key in ["machine", "versions", "command", "binaries_built"] {
        assert!(!meta[key].is_null(), "meta.{key} missing");
    }
    let runs = r["runs"].as_array().unwrap();
    // 7 scenarios × 6 systems, less S5 on the in-process mock and S7 on the
    // mock alone, S7 twice (1 and 2 workers) on the 5 others.
    assert_eq!(runs.len(), 7 * 6 - 2 + 5, "{stdout}");
    for rec in runs {
        let what = format!("{} {} w{}", rec["scenario"], rec["system"], rec["workers"]);
        assert!(rec.get("error").is_none(), "{what}: {}", rec["error"]);
        assert!(!rec["commands"].as_array().unwrap().is_empty(), "{what}");
        assert!(rec["loadavg_before"].is_array() && rec["other_cpu_sec"].is_number(), "{what}");
        let errors = rec["load"]["errors"]["total"].as_u64().unwrap()
            + rec.get("with_big").map_or(0, |w| w["errors"]["total"].as_u64().unwrap())
            + rec.get("big").map_or(0, |b| b["errors"]["total"].as_u64().unwrap());
        assert_eq!(errors, 0, "{what}: request errors");
        assert!(rec["load"]["completed"].as_u64().unwrap() > 0, "{what}");
        if rec["scenario"] == "S5" {
            let d = &rec["disconnect"];
            assert!(d["cut"].as_u64().unwrap() > 0, "{what}: {d}");
            assert_eq!(d["never_closed"], 0, "{what}: {d}");
        }
    }
    // Every target has a verdict.
    for out in [stdout.to_string(), compare(&script, &results, false), compare(&script, &results, true)] {
        for sid in ["S1", "S2", "S3", "S4", "S5", "S6", "S7"] {
            assert!(out.contains(&format!("{sid}  ")), "no {sid} section:\n{out}");
        }
        let targets = out.split_once("Targets (iop").expect("a targets table").1;
        let rows: Vec<&str> = targets
            .lines()
            .map(|l| l.trim().trim_start_matches('|').trim())
            .filter(|l| l.starts_with('S') && l.as_bytes().get(1).is_some_and(u8::is_ascii_digit))
            .collect();
        assert_eq!(rows.len(), 19, "19 targets expected:\n{out}");
        for row in rows {
            let row = row.trim_end_matches('|').trim_end();
            assert!(row.ends_with(" met") || row.ends_with("NOT MET"), "no verdict: {row}\n{out}");
        }
    }
    std::fs::remove_dir_all(&out_dir).ok();
}

fn compare(script: &Path, results: &Path, markdown: bool) -> String {
    let mut cmd = Command::new("python3");
    cmd.arg(script).arg("compare").arg(results);
    if markdown {
        cmd.arg("--markdown");
    }
    let out = cmd.output().expect("run python3");
    assert!(out.status.success(), "compare failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}
