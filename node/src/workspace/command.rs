//! Commands inside one workspace: only a template's fixed argv, no shell,
//! started in the workspace root (entered through its open descriptor, so
//! a root renamed or replaced since it was opened is not followed), with
//! only the allowed environment names, stdin closed, stdout and stderr
//! drained together into one capped buffer, in a process group of its
//! own that is killed whole on timeout, on cancel, and once the command
//! exits (so nothing it started outlives it). Blocking: run on the
//! blocking thread, never on a reactor.

use std::{
    io::Read,
    os::{
        fd::{AsFd, AsRawFd},
        unix::process::{CommandExt, ExitStatusExt},
    },
    process::{Command, Stdio},
    time::Duration,
};

use crossbeam_channel::{after, bounded, select, Receiver};
use rustix::process::{kill_process_group, Pid, Signal};

use super::files::Root;

/// How a command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandResult {
    /// Its exit code; `None` when a signal ended it.
    pub exit_code: Option<i32>,
    /// The signal that ended it, if one did.
    pub signal: Option<i32>,
    /// stdout and stderr as they came, at most the cap.
    pub output: Vec<u8>,
    /// More output came than the cap kept.
    pub truncated: bool,
    /// Killed at its timeout.
    pub timed_out: bool,
    /// Killed because the request was cancelled.
    pub cancelled: bool,
}

/// Why a command did not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CommandError {
    /// The template has no program.
    #[error("template_empty")]
    TemplateEmpty,
    /// The program could not be started (not found, not executable).
    #[error("spawn_failed")]
    SpawnFailed,
    /// The output pipe could not be made.
    #[error("io")]
    Io,
}

/// Limits and context of one command.
pub struct Spec<'a> {
    /// The template's argv: the program, then its fixed arguments.
    pub argv: &'a [String],
    /// Names of the node's environment variables the command sees.
    pub env: &'a [String],
    /// Longest run.
    pub timeout: Duration,
    /// Output bytes kept.
    pub max_output: usize,
    /// Start it under this binary's supervisor (`supervise.rs`): the group
    /// is killed when the node dies.
    pub supervised: bool,
}

/// Runs `spec` in `root` until it exits, times out, or `cancel` yields
/// (or disconnects).
pub fn run(root: &Root, spec: &Spec<'_>, cancel: &Receiver<()>) -> Result<CommandResult, CommandError> {
    let (program, args) = spec.argv.split_first().ok_or(CommandError::TemplateEmpty)?;
    let (reader, writer) = std::io::pipe().map_err(|_| CommandError::Io)?;
    let err_writer = writer.try_clone().map_err(|_| CommandError::Io)?;
    let mut cmd = if spec.supervised {
        // The running binary itself, even if its file was replaced since.
        let mut c = Command::new("/proc/self/exe");
        c.arg(super::supervise::SUPERVISE).arg(program);
        c
    } else {
        Command::new(program)
    };
    // The root as the descriptor holds it, not by its path.
    cmd.args(args)
        .current_dir(format!("/proc/self/fd/{}", root.as_fd().as_raw_fd()))
        .env_clear()
        .envs(spec.env.iter().filter_map(|name| std::env::var_os(name).map(|v| (name, v))))
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(err_writer)
        .process_group(0);
    let mut child = cmd.spawn().map_err(|_| CommandError::SpawnFailed)?;
    // The pipe's write ends now live only in the command's processes.
    drop(cmd);
    let group = Pid::from_child(&child);
    let max = spec.max_output;
    let drain = std::thread::Builder::new()
        .name("iop-ws-output".into())
        .spawn(move || drain(reader, max))
        .map_err(|_| CommandError::Io);
    let (status_tx, status_rx) = bounded(1);
    let waiter = std::thread::Builder::new().name("iop-ws-wait".into()).spawn(move || {
        let _ = status_tx.send(child.wait());
    });
    let (mut timed_out, mut cancelled) = (false, false);
    let status = select! {
        recv(status_rx) -> s => s.ok(),
        recv(cancel) -> _ => { cancelled = true; None },
        recv(after(spec.timeout)) -> _ => { timed_out = true; None },
    };
    // The whole group goes, whatever ended the wait: what the command left
    // running would hold the output open and outlive the request.
    let _ = kill_process_group(group, Signal::KILL);
    let status = match status {
        Some(s) => Some(s),
        None => status_rx.recv().ok(),
    };
    if let Ok(w) = waiter {
        let _ = w.join();
    }
    let (output, truncated) = match drain {
        Ok(d) => d.join().unwrap_or_default(),
        Err(_) => (Vec::new(), false),
    };
    let status = status.and_then(Result::ok);
    if spec.supervised
        && status.and_then(|s| s.code()) == Some(super::supervise::SPAWN_FAILED_CODE)
        && output == super::supervise::SPAWN_FAILED_MARK
    {
        return Err(CommandError::SpawnFailed);
    }
    Ok(CommandResult {
        exit_code: status.and_then(|s| s.code()),
        signal: status.and_then(|s| s.signal()),
        output,
        truncated,
        timed_out,
        cancelled,
    })
}

/// Reads the pipe to its end, keeping the first `max` bytes (and reading
/// on past them, so the command never blocks on a full pipe).
fn drain(mut pipe: std::io::PipeReader, max: usize) -> (Vec<u8>, bool) {
    let mut kept = Vec::new();
    let mut truncated = false;
    let mut buf = [0u8; 8192];
    loop {
        match pipe.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = max.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
                truncated |= n > room;
            }
        }
    }
    (kept, truncated)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#[path = "command_tests.rs"]
mod tests;
