//! A workspace command's supervisor: the node starts its own binary with
//! [`SUPERVISE`] as the leader of the command's process group, and it
//! starts the command in that group. While the node lives it only mirrors
//! the command's exit; when the node dies (killed, crashed: its parent
//! changes) it kills the whole group, itself included, so no command or
//! anything it started outlives the node that admitted it. Safe code only:
//! the parent is polled, no signal is installed between fork and exec.

use std::{
    ffi::{OsStr, OsString},
    os::unix::process::{parent_id, ExitStatusExt},
    process::{Command, ExitStatus},
    time::Duration,
};

use rustix::process::{getpgrp, getpid, kill_process, kill_process_group, Signal};

/// The first argument that makes `iop-node` (or `iop-edge`, which embeds a
/// node) a command's supervisor.
pub const SUPERVISE: &str = "--iop-workspace-supervise";

/// Exit code of a supervisor whose command could not be started.
pub const SPAWN_FAILED_CODE: i32 = 127;
/// What it writes (to the command's output) when it could not: with
/// [`SPAWN_FAILED_CODE`], how the node tells this from a command's own 127.
pub const SPAWN_FAILED_MARK: &[u8] = b"iop: the command could not be started\n";

/// How often the supervisor looks at its command and its parent.
const POLL: Duration = Duration::from_millis(20);

/// When this process was started as a supervisor, supervises and exits;
/// otherwise returns at once. The first thing both binaries' `main` do.
pub fn run_if_asked() {
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() != Some(OsStr::new(SUPERVISE)) {
        return;
    }
    std::process::exit(supervise(args.collect()));
}

fn supervise(argv: Vec<OsString>) -> i32 {
    let parent = parent_id();
    let Some((program, args)) = argv.split_first() else { return spawn_failed() };
    // The command inherits this process's group, directory, environment
    // and output.
    let Ok(mut child) = Command::new(program).args(args).spawn() else { return spawn_failed() };
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return mirror(status),
            Ok(None) => {}
            Err(_) => return 1,
        }
        if parent_id() != parent {
            // The node is gone: the whole group goes, this process too.
            let _ = kill_process_group(getpgrp(), Signal::KILL);
            return 1;
        }
        std::thread::sleep(POLL);
    }
}

fn spawn_failed() -> i32 {
    use std::io::Write;
    let _ = std::io::stderr().write_all(SPAWN_FAILED_MARK);
    SPAWN_FAILED_CODE
}

/// Ends as the command ended: its exit code, or the signal that ended it
/// raised on this process (so the node sees the same).
fn mirror(status: ExitStatus) -> i32 {
    if let Some(code) = status.code() {
        return code;
    }
    if let Some(sig) = status.signal().and_then(Signal::from_named_raw) {
        let _ = kill_process(getpid(), sig);
    }
    128 + status.signal().unwrap_or(0)
}
