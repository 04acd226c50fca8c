//! The deployment files: every example config in `configs/examples/` passes
//! its binary's `--check-config` (TLS files included, with throwaway
//! certificates standing in for `/etc/iop/tls/`), a broken copy fails naming
//! the key, and the systemd units in `deploy/systemd/` pass
//! `systemd-analyze verify` without a warning.
//!
//! Needs the `iop-node` binary beside `iop-edge` (`cargo test --workspace`
//! builds both).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::{Command, Output},
};

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, KeyUsagePurpose};

/// Where the examples name their files; the test points it elsewhere.
const ETC: &str = "/etc/iop/";

/// The scenarios `configs/examples/` must hold, each an `edge.toml` and at
/// least one `node*.toml`.
const SCENARIOS: [&str; 6] = ["llamacpp", "managed-mtls", "ollama", "two-edges", "two-nodes", "vllm"];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A built binary: `iop-edge` from Cargo, the others beside it (this test
/// runs from target/<profile>/deps/).
fn bin(name: &str) -> PathBuf {
    if name == "iop-edge" {
        return PathBuf::from(env!("CARGO_BIN_EXE_iop-edge"));
    }
    let exe = std::env::current_exe().expect("current exe");
    let path = exe.parent().and_then(|d| d.parent()).expect("target dir").join(name);
    assert!(path.exists(), "{} is not built; run `cargo test --workspace` (it builds every binary)", path.display());
    path
}

/// A fresh directory of this test process.
fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("iop-deploy-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// One example file and which binary reads it.
struct Example {
    path: PathBuf,
    text: String,
    binary: &'static str,
}

impl Example {
    fn name(&self) -> String {
        self.path.strip_prefix(repo().join("configs/examples")).unwrap_or(&self.path).display().to_string()
    }
}

/// Every `*.toml` under `configs/examples/<scenario>/`: `edge.toml` is the
/// edge's, `node*.toml` a node's (any other name fails the test).
fn examples() -> Vec<Example> {
    let root = repo().join("configs/examples");
    let mut out = Vec::new();
    let mut scenarios = BTreeSet::new();
    for dir in std::fs::read_dir(&root).unwrap() {
        let dir = dir.unwrap().path();
        if !dir.is_dir() {
            continue;
        }
        let scenario = dir.file_name().unwrap().to_string_lossy().into_owned();
        let mut kinds = BTreeSet::new();
        for file in std::fs::read_dir(&dir).unwrap() {
            let path = file.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if !name.ends_with(".toml") {
                continue;
            }
            let binary = match name.as_str() {
                "edge.toml" => "iop-edge",
                n if n.starts_with("node") => "iop-node",
                n => panic!("{scenario}/{n}: name it edge.toml or node*.toml so the test knows its binary"),
            };
            kinds.insert(binary);
            let text = std::fs::read_to_string(&path).unwrap();
            out.push(Example { path, text, binary });
        }
        assert_eq!(kinds.len(), 2, "{scenario}: needs an edge.toml and a node*.toml");
        scenarios.insert(scenario);
    }
    assert_eq!(scenarios.iter().map(String::as_str).collect::<Vec<_>>(), SCENARIOS);
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

/// The names `${NAME}` (no default) in `text`: what the examples take from
/// the environment, required.
fn required_vars(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("${") {
        rest = &rest[i + 2..];
        let end = rest.find('}').expect("unclosed ${");
        let inner = &rest[..end];
        if !inner.contains(":-") {
            out.insert(inner.to_owned());
        }
        rest = &rest[end..];
    }
    out
}

/// A value for each required variable, distinct per name (node tokens must
/// differ), 64 hex digits for a `*_SHA256`, a Redis URL for a `*_REDIS_URL`.
fn env_for(text: &str) -> Vec<(String, String)> {
    required_vars(text)
        .into_iter()
        .map(|name| {
            let value = if name.ends_with("_SHA256") {
                let n = name.bytes().fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
                format!("{n:016x}").repeat(4)
            } else if name.ends_with("_REDIS_URL") {
                "redis://redis.test.invalid:6379/0".to_owned()
            } else {
                format!("test-{}", name.to_lowercase())
            };
            (name, value)
        })
        .collect()
}

/// A stand-in for `/etc/iop/`: every `/etc/iop/tls/<stem>.pem|.key` the
/// examples name, `ca` a CA and the others certificates it signed (for the
/// DNS name `<stem>`, so `node-1.pem` names node id `node-1`).
fn fake_etc(examples: &[Example], tag: &str) -> PathBuf {
    let etc = scratch(tag);
    let tls = etc.join("tls");
    std::fs::create_dir_all(&tls).unwrap();
    let mut stems = BTreeSet::new();
    for e in examples {
        let mut rest = e.text.as_str();
        // In string values (comments mention other files under /etc/iop).
        while let Some(i) = rest.find("\"/etc/iop/") {
            rest = &rest[i + 1 + ETC.len()..];
            let end = rest.find('"').expect("a path ends with its string");
            let file = &rest[..end];
            let stem = file
                .strip_prefix("tls/")
                .and_then(|f| f.strip_suffix(".pem").or_else(|| f.strip_suffix(".key")))
                .unwrap_or_else(|| panic!("{}: /etc/iop/{file}: expected /etc/iop/tls/<name>.pem|.key", e.name()));
            stems.insert(stem.to_owned());
        }
    }
    assert!(stems.contains("ca"), "the examples trust /etc/iop/tls/ca.pem: {stems:?}");
    let mut params = CertificateParams::new(Vec::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
    let ca_key = KeyPair::generate().unwrap();
    std::fs::write(tls.join("ca.pem"), params.self_signed(&ca_key).unwrap().pem()).unwrap();
    std::fs::write(tls.join("ca.key"), ca_key.serialize_pem()).unwrap();
    let issuer = Issuer::new(params, ca_key);
    for stem in stems.iter().filter(|s| *s != "ca") {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec![stem.clone()]).unwrap().signed_by(&key, &issuer).unwrap();
        std::fs::write(tls.join(format!("{stem}.pem")), cert.pem()).unwrap();
        std::fs::write(tls.join(format!("{stem}.key")), key.serialize_pem()).unwrap();
    }
    etc
}

/// `<binary> --check-config --config <text written to a file>`, with only
/// `env` in its environment.
fn check(binary: &str, dir: &Path, name: &str, text: &str, env: &[(String, String)]) -> Output {
    let path = dir.join(name.replace('/', "_"));
    std::fs::write(&path, text).unwrap();
    Command::new(bin(binary))
        .arg("--check-config")
        .arg("--config")
        .arg(&path)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap_or_else(|e| panic!("run {binary}: {e}"))
}

fn localized(text: &str, etc: &Path) -> String {
    text.replace(ETC, &format!("{}/", etc.display()))
}

#[test]
fn every_example_config_passes_check_config() {
    let examples = examples();
    let etc = fake_etc(&examples, "checked-etc");
    let dir = scratch("checked");
    let mut failed = Vec::new();
    for e in &examples {
        let out = check(e.binary, &dir, &e.name(), &localized(&e.text, &etc), &env_for(&e.text));
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() || !stderr.contains("is valid") {
            failed.push(format!("{} --check-config {}: {:?}\n{stderr}", e.binary, e.name(), out.status));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// A check that fails names the key (and exits 1): a value out of range, a
/// secret missing from the environment, a TLS file that is not there.
#[test]
fn a_broken_example_fails_naming_the_key() {
    let examples = examples();
    let etc = fake_etc(&examples, "broken-etc");
    let dir = scratch("broken");
    let find = |name: &str| examples.iter().find(|e| e.name() == name).unwrap_or_else(|| panic!("no {name}"));
    let fails = |e: &Example, text: &str, env: &[(String, String)], key: &str| {
        let out = check(e.binary, &dir, &e.name(), text, env);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{}: {stderr}", e.name());
        assert!(stderr.contains(&format!("`{key}`")), "{}: `{key}` not named: {stderr}", e.name());
    };

    let edge = find("vllm/edge.toml");
    let text = localized(&edge.text, &etc);
    let env = env_for(&edge.text);
    assert!(text.contains("\ncapacity = 56\n"));
    fails(edge, &text.replace("\ncapacity = 56\n", "\ncapacity = 0\n"), &env, "nodes[0].providers[0].capacity");
    let without_token: Vec<_> = env.iter().filter(|(k, _)| k != "IOP_NODE_1_TOKEN").cloned().collect();
    fails(edge, &text, &without_token, "nodes[0].token");
    let missing_key = text.replace("edge-http.key", "absent.key");
    fails(edge, &missing_key, &env, "http.tls.key");

    let node = find("managed-mtls/node.toml");
    let text = localized(&node.text, &etc);
    let env = env_for(&node.text);
    assert!(text.contains("\ninterval_sec = 5\n"));
    fails(node, &text.replace("\ninterval_sec = 5\n", "\ninterval_sec = 0\n"), &env, "reconnect.interval_sec");
    fails(node, &text.replace("node-1.pem", "absent.pem"), &env, "edge_tls.cert");
}

/// The units' stop timeout leaves room for every example's drain.
#[test]
fn units_outlast_the_examples_shutdown_grace() {
    for unit in ["iop-edge.service", "iop-node.service"] {
        let text = std::fs::read_to_string(repo().join("deploy/systemd").join(unit)).unwrap();
        let stop: u64 = setting(&text, "TimeoutStopSec=").parse().unwrap();
        for e in examples() {
            if let Some(line) = e.text.lines().find(|l| l.starts_with("shutdown_grace_sec = ")) {
                let grace: u64 = line["shutdown_grace_sec = ".len()..].trim().parse().unwrap();
                assert!(stop > grace, "{unit}: TimeoutStopSec={stop} cuts {}'s drain ({grace} s)", e.name());
            }
        }
    }
}

fn setting<'a>(unit: &'a str, key: &str) -> &'a str {
    unit.lines().find_map(|l| l.strip_prefix(key)).unwrap_or_else(|| panic!("no {key}"))
}

/// `systemd-analyze verify` on both units, `ExecStart=` (and `ExecReload=`)
/// pointed at the built binaries: it checks that they exist, and reports
/// unknown or malformed settings as warnings, which fail this test too.
#[test]
fn systemd_units_verify_clean() {
    let version = Command::new("systemd-analyze").arg("--version").output();
    assert!(
        version.as_ref().is_ok_and(|o| o.status.success()),
        "systemd-analyze is not installed (Debian: apt-get install systemd): {version:?}"
    );
    let dir = scratch("units");
    let mut units = Vec::new();
    for (unit, binary) in [("iop-edge.service", "iop-edge"), ("iop-node.service", "iop-node")] {
        let text = std::fs::read_to_string(repo().join("deploy/systemd").join(unit)).unwrap();
        let installed = format!("/usr/local/bin/{binary} ");
        assert!(setting(&text, "ExecStart=").starts_with(&installed), "{unit}: ExecStart runs {installed}");
        let path = dir.join(unit);
        std::fs::write(&path, text.replace(&installed, &format!("{} ", bin(binary).display()))).unwrap();
        units.push(path);
    }
    let out = Command::new("systemd-analyze").arg("verify").args(&units).output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && said.trim().is_empty(), "systemd-analyze verify: {:?}\n{said}", out.status);

    // The check itself fails on a bad setting (not a test that cannot fail).
    let bad = dir.join("iop-bad.service");
    let text = std::fs::read_to_string(&units[0]).unwrap();
    std::fs::write(&bad, text.replace("ProtectSystem=strict", "ProtectSystem=stricter")).unwrap();
    let out = Command::new("systemd-analyze").arg("verify").arg(&bad).output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("ProtectSystem") || said.contains("protect system"), "not caught: {said}");
}
