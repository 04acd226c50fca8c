//! A request's own directory in a workspace, `.iop/job/<request_id>`:
//! where its plan and review live (`plan.md`, `review.md`), created when
//! the request opens the workspace and removed by its cleanup. Nothing a
//! request's tools name can reach it (`files` refuses `.iop`), and the
//! cleanup follows no entry: it walks the tree by descriptor, removes
//! deepest first, and touches nothing outside the job's directory. Job
//! directories a crash left behind are cleaned when the node starts.
//! Blocking: run on the blocking thread.

use std::os::fd::OwnedFd;

use rustix::{
    fs::{self, AtFlags, FileType, Mode, OFlags},
    io::Errno,
};

use super::files::{read_file, replace_in, FileError, Read, Root, RESERVED, RESOLVE};

/// `.iop/job`, beneath a workspace root.
const JOBS: &str = ".iop/job";

/// Deepest tree a cleanup walks (the node writes two files, flat).
const MAX_DEPTH: usize = 8;

/// Most entries a cleanup removes.
const MAX_ENTRIES: usize = 4096;

/// One of a request's two artifacts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Artifact {
    /// `plan.md`.
    Plan,
    /// `review.md`.
    Review,
}

impl Artifact {
    fn file(self) -> &'static str {
        match self {
            Artifact::Plan => "plan.md",
            Artifact::Review => "review.md",
        }
    }
}

/// A request's job directory, open.
#[derive(Debug)]
pub struct Job {
    dir: OwnedFd,
}

/// A request id usable as a directory name.
fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && id != "."
        && id != ".."
}

impl Job {
    /// Creates the job directory of request `id` (a second open of the same
    /// request is refused: a request opens its workspace once).
    pub fn create(root: &Root, id: &str) -> Result<Self, FileError> {
        if !valid_id(id) {
            return Err(FileError::PathInvalid);
        }
        let iop = ensure_dir(&root.dir()?, RESERVED)?;
        let jobs = ensure_dir(&iop, "job")?;
        match fs::mkdirat(&jobs, id, Mode::from_raw_mode(0o700)) {
            Ok(()) => {}
            Err(Errno::EXIST) => return Err(FileError::Io),
            Err(e) => return Err(e.into()),
        }
        Ok(Self { dir: open_dir(&jobs, id)? })
    }

    /// Writes an artifact (replaced whole).
    pub fn write(&self, a: Artifact, bytes: &[u8], max: u64) -> Result<(), FileError> {
        if bytes.len() as u64 > max {
            return Err(FileError::TooLarge);
        }
        replace_in(&self.dir, a.file(), bytes)
    }

    /// Reads an artifact's first `max` bytes.
    pub fn read(&self, a: Artifact, max: u64) -> Result<Read, FileError> {
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
        read_file(fs::openat2(&self.dir, a.file(), flags, Mode::empty(), RESOLVE)?, max)
    }
}

/// Removes request `id`'s job directory and all in it; `Ok` when there was
/// none. Nothing outside it is touched: every entry is looked at without
/// following it, directories are entered by descriptor beneath their
/// parent, and a symlink is removed as a link.
pub fn cleanup(root: &Root, id: &str) -> Result<(), FileError> {
    if !valid_id(id) {
        return Err(FileError::PathInvalid);
    }
    let jobs = match root.resolve(JOBS, OFlags::RDONLY | OFlags::DIRECTORY) {
        Ok(fd) => fd,
        Err(FileError::NotFound) => return Ok(()),
        Err(e) => return Err(e),
    };
    let mut budget = MAX_ENTRIES;
    remove_tree(&jobs, id, 0, &mut budget)
}

/// Cleans every job directory in the workspace (at node start: what a
/// crash left). Returns how many were removed.
pub fn cleanup_all(root: &Root) -> Result<usize, FileError> {
    let jobs = match root.resolve(JOBS, OFlags::RDONLY | OFlags::DIRECTORY) {
        Ok(fd) => fd,
        Err(FileError::NotFound) => return Ok(0),
        Err(e) => return Err(e),
    };
    let mut names = Vec::new();
    for entry in fs::Dir::read_from(&jobs)? {
        let entry = entry?;
        match entry.file_name().to_str() {
            Ok("." | "..") => {}
            Ok(name) if names.len() < MAX_ENTRIES => names.push(name.to_owned()),
            _ => return Err(FileError::Io),
        }
    }
    for name in &names {
        let mut budget = MAX_ENTRIES;
        remove_tree(&jobs, name, 0, &mut budget)?;
    }
    Ok(names.len())
}

/// Removes `name` in `dir`: a file or link by unlinking it, a directory
/// by emptying it (deepest first) and then removing it.
fn remove_tree(dir: &OwnedFd, name: &str, depth: usize, budget: &mut usize) -> Result<(), FileError> {
    *budget = budget.checked_sub(1).ok_or(FileError::TooLarge)?;
    let st = match fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(Errno::NOENT) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
        // A file, or a link removed as the link (never followed).
        fs::unlinkat(dir, name, AtFlags::empty())?;
        return Ok(());
    }
    if depth >= MAX_DEPTH {
        return Err(FileError::TooLarge);
    }
    let sub = open_dir(dir, name)?;
    // The same directory as the one looked at (not one swapped in since).
    let opened = fs::fstat(&sub)?;
    if (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino) {
        return Err(FileError::Io);
    }
    let mut names = Vec::new();
    for entry in fs::Dir::read_from(&sub)? {
        let entry = entry?;
        let Ok(n) = entry.file_name().to_str() else { return Err(FileError::Io) };
        if n != "." && n != ".." {
            if names.len() >= *budget {
                return Err(FileError::TooLarge);
            }
            names.push(n.to_owned());
        }
    }
    for n in &names {
        remove_tree(&sub, n, depth + 1, budget)?;
    }
    fs::unlinkat(dir, name, AtFlags::REMOVEDIR)?;
    Ok(())
}

/// Opens directory `name` of `dir`, following no link (`NO_SYMLINKS`
/// refuses one at the end too, as `ELOOP`: a link is told as a link).
fn open_dir(dir: &OwnedFd, name: &str) -> Result<OwnedFd, FileError> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    Ok(fs::openat2(dir, name, flags, Mode::empty(), RESOLVE)?)
}

/// Directory `name` of `dir`, made (owner-only) when missing; one that is
/// not a directory (a link among them) is refused.
fn ensure_dir(dir: &OwnedFd, name: &str) -> Result<OwnedFd, FileError> {
    match fs::mkdirat(dir, name, Mode::from_raw_mode(0o700)) {
        Ok(()) | Err(Errno::EXIST) => {}
        Err(e) => return Err(e.into()),
    }
    open_dir(dir, name)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#[path = "jobs_tests.rs"]
mod tests;
