use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Sender};

use super::*;

struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("iop-cmd-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn root(&self) -> Root {
        Root::open(self.0.to_str().unwrap()).unwrap()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn sh(script: &str) -> Vec<String> {
    vec!["/bin/sh".into(), "-c".into(), script.into()]
}

/// Runs `argv` on a thread of its own; the test fails (instead of hanging)
/// when it does not end within 20 s.
fn run_bounded(
    root: Root,
    argv: Vec<String>,
    env: Vec<String>,
    timeout: Duration,
    max_output: usize,
) -> (Sender<()>, crossbeam_channel::Receiver<Result<CommandResult, CommandError>>) {
    let (cancel_tx, cancel_rx) = bounded(1);
    let (done_tx, done_rx) = bounded(1);
    std::thread::spawn(move || {
        let spec = Spec { argv: &argv, env: &env, timeout, max_output, supervised: false };
        let _ = done_tx.send(run(&root, &spec, &cancel_rx));
    });
    (cancel_tx, done_rx)
}

fn result(
    rx: &crossbeam_channel::Receiver<Result<CommandResult, CommandError>>,
) -> Result<CommandResult, CommandError> {
    rx.recv_timeout(Duration::from_secs(20)).expect("the command ended")
}

#[test]
fn a_command_runs_in_the_root_with_only_its_allowed_env_and_one_output() {
    let s = Scratch::new("env");
    let script = "pwd -P; echo out; echo err >&2; exit 3";
    let (_c, rx) = run_bounded(s.root(), sh(script), vec![], Duration::from_secs(10), 4096);
    let r = result(&rx).unwrap();
    let cwd = std::fs::canonicalize(&s.0).unwrap();
    assert_eq!(String::from_utf8(r.output).unwrap(), format!("{}\nout\nerr\n", cwd.display()));
    assert_eq!((r.exit_code, r.signal, r.truncated, r.timed_out, r.cancelled), (Some(3), None, false, false, false));
    // The whole environment it sees (no shell adding its own defaults).
    let allowed = vec!["HOME".to_owned(), "IOP_SURELY_UNSET".to_owned()];
    let (_c, rx) = run_bounded(s.root(), vec!["/usr/bin/env".into()], allowed, Duration::from_secs(10), 4096);
    let home = std::env::var("HOME").unwrap();
    assert_eq!(String::from_utf8(result(&rx).unwrap().output).unwrap(), format!("HOME={home}\n"));
}

#[test]
fn a_renamed_root_is_still_the_one_opened() {
    let s = Scratch::new("rename");
    let root = s.root();
    std::fs::write(s.0.join("marker"), b"here").unwrap();
    let moved = s.0.with_extension("moved");
    std::fs::rename(&s.0, &moved).unwrap();
    std::fs::create_dir_all(&s.0).unwrap();
    let (_c, rx) = run_bounded(root, sh("cat marker"), vec![], Duration::from_secs(10), 4096);
    let r = result(&rx).unwrap();
    std::fs::remove_dir_all(&moved).unwrap();
    assert_eq!(r.output, b"here");
}

#[test]
fn a_timeout_kills_the_whole_group() {
    let s = Scratch::new("timeout");
    // The background sleep holds the output open: the result comes only
    // once the whole group is gone.
    let started = Instant::now();
    let (_c, rx) =
        run_bounded(s.root(), sh("sleep 30 & echo started; sleep 30"), vec![], Duration::from_millis(300), 4096);
    let r = result(&rx).unwrap();
    assert!(r.timed_out && !r.cancelled, "{r:?}");
    assert_eq!(r.signal, Some(9));
    assert_eq!(r.output, b"started\n");
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn a_cancel_kills_the_whole_group() {
    let s = Scratch::new("cancel");
    let (cancel, rx) = run_bounded(s.root(), sh("sleep 30 & sleep 30"), vec![], Duration::from_secs(60), 4096);
    cancel.send(()).unwrap();
    let r = result(&rx).unwrap();
    assert!(r.cancelled && !r.timed_out, "{r:?}");
}

#[test]
fn what_a_finished_command_left_running_is_killed() {
    let s = Scratch::new("leftover");
    let (_c, rx) = run_bounded(s.root(), sh("sleep 30 & echo done"), vec![], Duration::from_secs(60), 4096);
    let r = result(&rx).unwrap();
    assert_eq!((r.exit_code, r.output.as_slice(), r.timed_out), (Some(0), &b"done\n"[..], false));
}

#[test]
fn output_is_capped_and_the_command_is_not_blocked_by_it() {
    let s = Scratch::new("cap");
    let (_c, rx) = run_bounded(s.root(), sh("head -c 300000 /dev/zero"), vec![], Duration::from_secs(10), 1000);
    let r = result(&rx).unwrap();
    assert_eq!((r.output.len(), r.truncated, r.exit_code), (1000, true, Some(0)));
}

#[test]
fn a_missing_program_does_not_start() {
    let s = Scratch::new("missing");
    let (_c, rx) = run_bounded(s.root(), vec!["/nonexistent/tool".into()], vec![], Duration::from_secs(10), 10);
    assert_eq!(result(&rx), Err(CommandError::SpawnFailed));
    let (_c, rx) = run_bounded(s.root(), vec![], vec![], Duration::from_secs(10), 10);
    assert_eq!(result(&rx), Err(CommandError::TemplateEmpty));
}
