//! The benchmark harness (`loadtest/bench/run.py`), exercised from cargo.
//!
//! - `dry_run_interleaves_rounds`, `dry_run_of_the_dialects_...`: the run
//!   plan (python3 only).
//! - `quick_run_direct_and_compare`: a short `--quick` run of every scenario
//!   that applies to `direct` (the mock alone: S1-S6) with this package's
//!   binaries, then `compare` as text, as markdown and as HTML charts
//!   (`--html`). Needs python3 only.
//! - `quick_run_nginx_and_iop` (ignored: it needs nginx, HAProxy and the iop-edge and
//!   iop-node binaries, which `cargo test -p iop-loadtest` does not build):
//!   a short `--quick` run through one and two nginx and both iop paths,
//!   then one of S2 beside the Messages and Responses scenarios (M2, R4).
//! - `quick_paths_...` (ignored, as the one above): `run.py paths --quick`,
//!   every path (chat, Messages, Responses; tunnel, native, translated)
//!   in one edge and node, then `--store` (the run store on and off, in
//!   two nodes).
//!
//! ```sh
//! cargo test -p iop-loadtest --test bench
//! cargo build -p iop-edge -p iop-node && cargo test -p iop-loadtest --test bench -- --ignored
//! ```
//!
//! `IOP_BENCH_BIN_DIR` points the last one at other binaries (e.g.
//! `target/release`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use serde_json::Value;

/// The load runs one at a time: they share the machine's cores.
static LOAD: Mutex<()> = Mutex::new(());

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

fn script() -> PathBuf {
    repo_root().join("loadtest/bench/run.py")
}

/// Where `iop-mockprov` and `iop-loadtest` of this build are.
fn own_bin_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_iop-loadtest")).parent().unwrap().to_path_buf()
}

fn python(args: &[&str]) -> (bool, String, String) {
    let out = Command::new("python3")
        .arg(script())
        .args(args)
        .output()
        .expect("python3 (3.11 or newer) must be installed to test the benchmark harness");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("iop-bench-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `run.py run --quick` with `args`; the results file, parsed, and stdout.
fn quick_run(name: &str, bin_dir: &Path, args: &[&str]) -> (Value, String, PathBuf) {
    let dir = scratch(name);
    let results = dir.join("results.json");
    let mut all = vec!["run", "--quick", "--duration", "1", "--warmup", "0", "--wait-idle", "0", "--bin-dir"];
    all.push(bin_dir.to_str().unwrap());
    all.extend(["--out", results.to_str().unwrap()]);
    all.extend(args);
    let (ok, stdout, stderr) = python(&all);
    assert!(ok, "run.py failed:\n{stderr}\n{stdout}");
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&results).unwrap()).unwrap();
    (r, stdout, dir)
}

/// What every run record must hold, and no request errors.
fn check_runs(r: &Value, stdout: &str) {
    let meta = &r["meta"];
    for key in ["machine", "versions", "command", "binaries_built", "params"] {
        assert!(!meta[key].is_null(), "meta.{key} missing");
    }
    for rec in r["runs"].as_array().unwrap() {
        let what = format!("{} {} w{}", rec["scenario"], rec["system"], rec["workers"]);
        assert!(rec.get("error").is_none(), "{what}: {}\n{stdout}", rec["error"]);
        assert!(!rec["commands"].as_array().unwrap().is_empty(), "{what}");
        assert!(rec["loadavg_before"].is_array() && rec["other_cpu_sec"].is_number(), "{what}");
        let errors = rec["load"]["errors"]["total"].as_u64().unwrap()
            + rec.get("with_big").map_or(0, |w| w["errors"]["total"].as_u64().unwrap())
            + rec.get("big").map_or(0, |b| b["errors"]["total"].as_u64().unwrap());
        assert_eq!(errors, 0, "{what}: request errors");
        assert!(rec["load"]["completed"].as_u64().unwrap() > 0, "{what}");
        match rec["scenario"].as_str().unwrap() {
            "S4" | "M4" | "R4" => {
                // Read from /proc with every stream open before and after the reading.
                let n = rec["streams"].as_u64().unwrap();
                assert_eq!(rec["open_at_sample"], serde_json::json!([n, n]), "{what}");
                for (group, pids) in rec["rss_kib_during"].as_object().unwrap() {
                    for (pid, kib) in pids.as_object().unwrap() {
                        assert!(kib.as_u64().unwrap() > 0, "{what}: {group} {pid} has no VmRSS");
                    }
                }
            }
            "S5" => {
                let d = &rec["disconnect"];
                assert!(d["cut"].as_u64().unwrap() > 0, "{what}: {d}");
                assert_eq!(d["never_closed"], 0, "{what}: {d}");
                assert!(d["p99_ms"].as_f64().unwrap() > 0.0, "{what}: {d}");
            }
            _ => {}
        }
    }
}

/// `compare` as text and as markdown: a section per scenario, and a
/// verdict on every target row.
fn check_compare(results: &Path, sids: &[&str], targets: usize) {
    for md in [false, true] {
        let mut args = vec!["compare", results.to_str().unwrap()];
        if md {
            args.push("--markdown");
        }
        let (ok, out, stderr) = python(&args);
        assert!(ok, "compare failed: {stderr}");
        for sid in sids {
            assert!(out.contains(&format!("{sid}  ")), "no {sid} section:\n{out}");
        }
        if md {
            assert!(out.contains("|---|"), "no markdown table:\n{out}");
        }
        let rest = out.split_once("Targets (iop").expect("a targets table").1;
        let rows: Vec<&str> = rest
            .lines()
            .map(|l| l.trim().trim_start_matches('|').trim())
            .filter(|l| {
                let b = l.as_bytes();
                matches!(b.first(), Some(b'S' | b'M' | b'R')) && b.get(1).is_some_and(u8::is_ascii_digit)
            })
            .collect();
        assert_eq!(rows.len(), targets, "{targets} targets expected:\n{out}");
        for row in rows {
            let row = row.trim_end_matches('|').trim_end();
            assert!(row.ends_with(" met") || row.ends_with("NOT MET"), "no verdict: {row}\n{out}");
        }
    }
}

/// `compare --html`: a section per scenario, each with its charts, every
/// system in the tables (the page is drawn by this build's `iop-loadtest`).
fn check_html(dir: &Path, sids: &[&str], systems: &[&str]) {
    let page = dir.join("charts.html");
    let results = dir.join("results.json");
    let (ok, out, stderr) = python(&[
        "compare",
        results.to_str().unwrap(),
        "--html",
        page.to_str().unwrap(),
        "--bin-dir",
        own_bin_dir().to_str().unwrap(),
    ]);
    assert!(ok && out.contains("charts: "), "compare --html failed: {stderr}\n{out}");
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.contains("<title>iop vs nginx and HAProxy (issues 8, 29 benchmark)</title>"), "{html}");
    for (n, sid) in sids.iter().enumerate() {
        let section =
            html.split(&format!("<h2 id=\"s{}\">{sid}  ", n + 1)).nth(1).unwrap_or_else(|| panic!("no {sid}"));
        let section = section.split("<h2 ").next().unwrap();
        assert!(section.contains("<svg"), "{sid} has no chart");
        assert!(section.contains("Latency CDF"), "{sid} has no latency CDF");
        for system in systems {
            assert!(section.contains(&format!("<td>{system}</td>")), "{sid}: {system} not in the table");
        }
    }
    assert!(!html.contains("<script") && !html.contains("https://"), "self-contained");
}

#[test]
fn dry_run_interleaves_rounds() {
    let (ok, out, stderr) = python(&["run", "--dry-run", "--rounds", "2", "--workers", "2"]);
    assert!(ok, "{stderr}");
    let runs: Vec<Vec<&str>> =
        out.lines().filter(|l| l.contains(" round ")).map(|l| l.split_whitespace().collect()).collect();
    // 7 scenarios x 7 systems x 2 rounds, less S7 on direct, S7 twice (1 and
    // 2 workers), and S3 twice the rounds (2 more of 7 systems); then the
    // bursts S2B16, S3B16 (twice the rounds, as S3) and S1L.
    assert_eq!(runs.len(), (6 * 7 + 6 * 2) * 2 + 7 * 2 + (7 * 2 + 7 * 4 + 7 * 2), "{out}");
    let bursts: Vec<&str> =
        runs.iter().filter(|r| r[4] == "direct").map(|r| r[1]).filter(|s| s.contains(['B', 'L'])).collect();
    assert_eq!(bursts, ["S2B16", "S2B16", "S3B16", "S3B16", "S3B16", "S3B16", "S1L", "S1L"], "{out}");
    let systems = ["direct", "nginx1", "nginx2", "haproxy1", "haproxy2", "iop-tunnel", "iop-normalized"];
    let s1: Vec<(&str, &str)> = runs.iter().filter(|r| r[1] == "S1").map(|r| (r[3], r[4])).collect();
    let want: Vec<(&str, &str)> = ["1", "2"].iter().flat_map(|rnd| systems.iter().map(move |s| (*rnd, *s))).collect();
    assert_eq!(s1, want, "S1 is not A B C D E, A B C D E:\n{out}");
    let s3: Vec<&str> = runs.iter().filter(|r| r[1] == "S3" && r[4] == "direct").map(|r| r[3]).collect();
    assert_eq!(s3, ["1", "2", "3", "4"], "S3 does not run twice the rounds:\n{out}");
    let s7: Vec<(&str, &str)> = runs.iter().filter(|r| r[1] == "S7" && r[3] == "1").map(|r| (r[4], r[6])).collect();
    assert_eq!(s7[..2], [("nginx1", "1"), ("nginx1", "2")], "{out}");
    assert!(out.contains("min"), "no time estimate:\n{out}");
}

#[test]
fn dry_run_of_the_dialects_is_s1_s2_s4_in_the_other_apis() {
    let (ok, out, stderr) = python(&["run", "--dry-run", "--scenarios", "dialects", "--rounds", "1"]);
    assert!(ok, "{stderr}");
    let sids: Vec<&str> =
        out.lines().filter(|l| l.contains(" round ")).filter_map(|l| l.split_whitespace().nth(1)).collect();
    let mut seen = sids.clone();
    seen.dedup();
    assert_eq!(seen, ["M1", "M2", "M4", "R1", "R2", "R4"], "{out}");
    assert_eq!(sids.len(), 6 * 7, "every dialect scenario on the seven systems:\n{out}");
}

#[test]
fn quick_run_direct_and_compare() {
    let _one = LOAD.lock().unwrap_or_else(|e| e.into_inner());
    let sids = ["S1", "S2", "S3", "S4", "S5", "S6"];
    let (r, stdout, dir) =
        quick_run("direct", &own_bin_dir(), &["--systems", "direct", "--scenarios", "S1,S2,S3,S4,S5,S6"]);
    // S3 runs twice the rounds.
    assert_eq!(r["runs"].as_array().unwrap().len(), sids.len() + 1, "{stdout}");
    assert!(stdout.contains("1 rounds (S3: 2) (--quick)"), "the header does not say S3's rounds:\n{stdout}");
    check_runs(&r, &stdout);
    // No iop system ran: the targets table is there, without rows.
    check_compare(&dir.join("results.json"), &sids, 0);
    check_html(&dir, &sids, &["direct"]);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
#[ignore = "needs nginx and haproxy (the harness installs them with apt-get) and iop-edge + iop-node beside this test \
            (cargo build -p iop-edge -p iop-node) or in IOP_BENCH_BIN_DIR"]
fn quick_run_nginx_and_iop() {
    let _one = LOAD.lock().unwrap_or_else(|e| e.into_inner());
    let bin_dir = std::env::var_os("IOP_BENCH_BIN_DIR").map_or_else(own_bin_dir, PathBuf::from);
    for bin in ["iop-edge", "iop-node", "iop-mockprov", "iop-loadtest"] {
        assert!(
            bin_dir.join(bin).exists(),
            "{bin} missing in {}: cargo build -p iop-edge -p iop-node",
            bin_dir.display()
        );
    }
    let (r, stdout, dir) = quick_run(
        "all",
        &bin_dir,
        &[
            "--systems",
            "direct,nginx1,nginx2,haproxy1,haproxy2,iop-tunnel,iop-normalized",
            "--scenarios",
            "S1,S2,S4,S5,S7",
        ],
    );
    // S7: 1 and 2 workers of every system but direct.
    assert_eq!(r["runs"].as_array().unwrap().len(), 4 * 7 + 6 * 2, "{stdout}");
    check_runs(&r, &stdout);
    // S1: 2 per path against nginx2, 3 against HAProxy (two hops, and one:
    // the goal); S2: 3 against nginx, 2 against HAProxy; S4, S5 and S7: 1
    // per path; S4 also 2 per path against HAProxy (two, and one: the goal).
    check_compare(&dir.join("results.json"), &["S1", "S2", "S4", "S5", "S7"], 4 + 6 + 3 + 4 + 2 + 2 + 2 + 4);
    assert!(stdout.contains("CPU per event"), "S7's target does not show the CPU per event:\n{stdout}");
    std::fs::remove_dir_all(&dir).ok();
    // The other dialects, judged against chat in the same run.
    let (r, stdout, dir) = quick_run(
        "dialects",
        &bin_dir,
        &["--systems", "direct,nginx1,nginx2,iop-tunnel,iop-normalized", "--scenarios", "S2,M2,R4"],
    );
    assert_eq!(r["runs"].as_array().unwrap().len(), 3 * 5, "{stdout}");
    check_runs(&r, &stdout);
    check_compare(&dir.join("results.json"), &["S2", "M2", "R4"], DIALECT_TARGETS);
    std::fs::remove_dir_all(&dir).ok();
    // The bursts, judged against two HAProxy in the same run.
    let (r, stdout, dir) = quick_run(
        "bursts",
        &bin_dir,
        &["--systems", "direct,nginx2,haproxy2,iop-tunnel,iop-normalized", "--scenarios", "S1,S2B16,S3B4,S1L"],
    );
    // S3B4 runs twice the rounds, like S3.
    assert_eq!(r["runs"].as_array().unwrap().len(), 5 * 5, "{stdout}");
    check_runs(&r, &stdout);
    // S1: 2 per path against nginx2, 2 against haproxy2; S2B16: 1 per path;
    // S3B4: 2; S1L: 2 (against S1 and haproxy2).
    check_compare(&dir.join("results.json"), &["S1", "S2B16", "S3B4", "S1L"], 4 + 4 + 2 + 4 + 4);
    std::fs::remove_dir_all(&dir).ok();
}

/// Target rows of S2, M2 and R4 on both iop paths: S2's three, M2's
/// native, translated (against the chat tunnel and chat normalized) and
/// rate rows, R4's memory rows.
const DIALECT_TARGETS: usize = 3 + 5 + 2;

#[test]
#[ignore = "needs iop-edge + iop-node beside this test (cargo build -p iop-edge -p iop-node) or in IOP_BENCH_BIN_DIR"]
fn quick_paths_measures_every_path_in_one_edge_and_node() {
    let _one = LOAD.lock().unwrap_or_else(|e| e.into_inner());
    let bin_dir = std::env::var_os("IOP_BENCH_BIN_DIR").map_or_else(own_bin_dir, PathBuf::from);
    let dir = scratch("paths");
    let results = dir.join("paths.json");
    let (ok, stdout, stderr) = python(&[
        "paths",
        "--quick",
        "--bin-dir",
        bin_dir.to_str().unwrap(),
        "--out",
        results.to_str().unwrap(),
        "--markdown",
    ]);
    assert!(ok, "run.py paths failed:\n{stderr}\n{stdout}");
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&results).unwrap()).unwrap();
    for shape in ["S1", "S2"] {
        let rows = r["shapes"][shape]["rows"].as_array().unwrap_or_else(|| panic!("no {shape} rows:\n{stdout}"));
        let paths: Vec<&str> = rows.iter().map(|row| row["path"].as_str().unwrap()).collect();
        assert_eq!(
            paths,
            [
                "chat tunnel",
                "chat normalized",
                "Messages native",
                "Messages translated",
                "Responses native",
                "Responses translated"
            ],
            "{stdout}"
        );
        for row in rows {
            // Both processes did work on every path, and the base is 1.
            for key in ["edge_us", "node_us"] {
                assert!(row[key].as_f64().unwrap() > 0.0, "{shape} {}: {key} is 0:\n{stdout}", row["path"]);
            }
            assert!(row["ratio"].as_f64().unwrap() > 0.0, "{stdout}");
        }
        assert_eq!(rows[0]["ratio"].as_f64(), Some(1.0), "{stdout}");
    }
    assert!(stdout.contains("| Messages translated |") && stdout.contains("≤ 1.10× chat tunnel"), "{stdout}");
    // The run store on against off, in two nodes: every request on the
    // store's node written.
    let results = dir.join("store.json");
    let (ok, stdout, stderr) = python(&[
        "paths",
        "--quick",
        "--store",
        "--shapes",
        "S1",
        "--bin-dir",
        bin_dir.to_str().unwrap(),
        "--out",
        results.to_str().unwrap(),
    ]);
    assert!(ok, "run.py paths --store failed:\n{stderr}\n{stdout}");
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&results).unwrap()).unwrap();
    let rows = r["shapes"]["S1"]["rows"].as_array().unwrap();
    let paths: Vec<&str> = rows.iter().map(|row| row["path"].as_str().unwrap()).collect();
    assert_eq!(
        paths,
        ["chat tunnel, store off", "chat tunnel, store on", "chat normalized, store off", "chat normalized, store on"],
        "{stdout}"
    );
    assert!(r["shapes"]["S1"]["store_rows"]["written"].as_u64().unwrap() >= 80, "{stdout}");
    assert!(stdout.contains("≤ 1.03× chat normalized, store off"), "{stdout}");
    std::fs::remove_dir_all(&dir).ok();
}
