//! File operations inside one workspace: read (bounded), list (bounded
//! batches), write (a temp file in the same directory, then rename) and
//! delete (one file, non-recursive). Blocking: run on the blocking thread,
//! never on a reactor.
//!
//! The root is opened once as a directory descriptor. Every path resolves
//! beneath it with `openat2` and `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//! RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV`: no `..` out of it, no symlink
//! followed anywhere on the path (one swapped in between two calls
//! included), no other mount. The last component of a write or delete is
//! looked at without following it. Paths are checked before any system
//! call: relative, no `.` or `..`, nothing under `.iop` (the node's own
//! state). Symlinks, FIFOs, sockets and devices are refused before any
//! effect.

use std::{
    collections::BinaryHeap,
    os::fd::{AsFd, OwnedFd},
};

use rustix::{
    fs::{self, AtFlags, FileType, Mode, OFlags, ResolveFlags},
    io::Errno,
};

/// The node's own directory in every workspace: no request reaches it.
pub const RESERVED: &str = ".iop";

/// Longest path accepted, in bytes.
const MAX_PATH_BYTES: usize = 4096;

/// Why an operation was refused or failed: a closed set, safe to return to
/// the edge (it names no path).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FileError {
    /// Empty, absolute, with `.`, `..`, an empty component or a NUL byte.
    #[error("path_invalid")]
    PathInvalid,
    /// Under `.iop`.
    #[error("path_reserved")]
    PathReserved,
    /// A symlink on the path or at its end.
    #[error("symlink")]
    Symlink,
    /// The path leaves the root (or crosses into another mount).
    #[error("escapes_root")]
    EscapesRoot,
    /// Nothing there.
    #[error("not_found")]
    NotFound,
    /// A directory where a file was needed.
    #[error("not_a_file")]
    NotAFile,
    /// A file where a directory was needed.
    #[error("not_a_directory")]
    NotADirectory,
    /// A FIFO, socket or device.
    #[error("special_file")]
    SpecialFile,
    /// More bytes than the workspace allows.
    #[error("too_large")]
    TooLarge,
    /// The file system refused (permissions, read-only).
    #[error("denied")]
    Denied,
    /// This kernel has no `openat2` (Linux before 5.6).
    #[error("unsupported")]
    Unsupported,
    /// Any other I/O failure.
    #[error("io")]
    Io,
}

impl From<Errno> for FileError {
    fn from(e: Errno) -> Self {
        match e {
            Errno::LOOP => FileError::Symlink,
            Errno::XDEV => FileError::EscapesRoot,
            Errno::NOENT => FileError::NotFound,
            Errno::NOTDIR => FileError::NotADirectory,
            Errno::ISDIR => FileError::NotAFile,
            Errno::ACCESS | Errno::PERM | Errno::ROFS => FileError::Denied,
            Errno::NOSYS => FileError::Unsupported,
            Errno::NAMETOOLONG => FileError::PathInvalid,
            _ => FileError::Io,
        }
    }
}

impl From<std::io::Error> for FileError {
    fn from(e: std::io::Error) -> Self {
        e.raw_os_error().map_or(FileError::Io, |n| Errno::from_raw_os_error(n).into())
    }
}

/// The kind of a listed entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A directory.
    Directory,
    /// A symlink (listed, never followed).
    Symlink,
    /// A FIFO, socket or device.
    Other,
}

/// One listed entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Its name in the directory.
    pub name: String,
    /// Its kind, as the directory says.
    pub kind: EntryKind,
}

/// An entry ordered by its name alone (names are unique in a directory).
struct ByName(Entry);

impl PartialEq for ByName {
    fn eq(&self, other: &Self) -> bool {
        self.0.name == other.0.name
    }
}

impl Eq for ByName {}

impl PartialOrd for ByName {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ByName {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.name.cmp(&other.0.name)
    }
}

/// A batch of a listing, by name, after a cursor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing {
    /// The entries, sorted by name.
    pub entries: Vec<Entry>,
    /// More entries follow the last one.
    pub more: bool,
}

/// What a read returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read {
    /// The file's first bytes (at most the limit).
    pub bytes: Vec<u8>,
    /// The file holds more than the limit.
    pub truncated: bool,
}

/// A workspace's root, opened once.
#[derive(Debug)]
pub struct Root {
    fd: OwnedFd,
}

impl AsFd for Root {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

pub(super) const RESOLVE: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS)
    .union(ResolveFlags::NO_XDEV);

impl Root {
    /// Opens `path` (absolute) as the root directory.
    pub fn open(path: &str) -> Result<Self, FileError> {
        let fd = fs::open(path, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
        Ok(Self { fd })
    }

    /// Reads the file at `path`: its first `max` bytes.
    pub fn read(&self, path: &str, max: u64) -> Result<Read, FileError> {
        check(path)?;
        let fd = self.resolve(path, OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK)?;
        read_file(fd, max)
    }

    /// Lists the directory at `path` (`""`: the root) by name: at most
    /// `max` entries whose names sort after `after`. Memory stays within
    /// `max` entries however large the directory.
    pub fn list(&self, path: &str, after: Option<&str>, max: usize) -> Result<Listing, FileError> {
        let fd = if path.is_empty() {
            self.dir()?
        } else {
            check(path)?;
            self.resolve(path, OFlags::RDONLY | OFlags::DIRECTORY)?
        };
        let mut best: BinaryHeap<ByName> = BinaryHeap::with_capacity(max.saturating_add(1));
        let mut more = false;
        for entry in fs::Dir::read_from(&fd)? {
            let entry = entry?;
            let Ok(name) = entry.file_name().to_str() else { continue };
            let hidden = name == "." || name == ".." || (path.is_empty() && name == RESERVED);
            if hidden || after.is_some_and(|a| name <= a) {
                continue;
            }
            let kind = match entry.file_type() {
                FileType::RegularFile => EntryKind::File,
                FileType::Directory => EntryKind::Directory,
                FileType::Symlink => EntryKind::Symlink,
                _ => EntryKind::Other,
            };
            best.push(ByName(Entry { name: name.to_owned(), kind }));
            if best.len() > max {
                best.pop();
                more = true;
            }
        }
        Ok(Listing { entries: best.into_sorted_vec().into_iter().map(|e| e.0).collect(), more })
    }

    /// Writes `bytes` as the file at `path` (created, or replaced whole):
    /// into a temp file beside it, then renamed over it, so a reader sees
    /// the old file or the new one, never a part.
    pub fn write(&self, path: &str, bytes: &[u8], max: u64) -> Result<(), FileError> {
        check(path)?;
        if bytes.len() as u64 > max {
            return Err(FileError::TooLarge);
        }
        let (dir, name) = self.parent(path)?;
        replace_in(&dir, name, bytes)
    }

    /// Deletes the file at `path` (not a directory, not a symlink).
    pub fn delete(&self, path: &str) -> Result<(), FileError> {
        check(path)?;
        let (dir, name) = self.parent(path)?;
        let st = fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW)?;
        kind_is_file(FileType::from_raw_mode(st.st_mode))?;
        fs::unlinkat(&dir, name, AtFlags::empty())?;
        Ok(())
    }

    /// The root directory itself, as a descriptor of its own.
    pub(super) fn dir(&self) -> Result<OwnedFd, FileError> {
        Ok(fs::openat(&self.fd, ".", OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?)
    }

    /// Opens `path` beneath the root (never following a link).
    pub(super) fn resolve(&self, path: &str, flags: OFlags) -> Result<OwnedFd, FileError> {
        Ok(fs::openat2(&self.fd, path, flags | OFlags::CLOEXEC, Mode::empty(), RESOLVE)?)
    }

    /// The directory holding `path`'s last component, and that component.
    fn parent<'p>(&self, path: &'p str) -> Result<(OwnedFd, &'p str), FileError> {
        let (dir, name) = match path.rsplit_once('/') {
            Some((dir, name)) => (self.resolve(dir, OFlags::RDONLY | OFlags::DIRECTORY)?, name),
            None => (self.dir()?, path),
        };
        Ok((dir, name))
    }
}

/// Reads an open file's first `max` bytes (a regular file only).
pub(super) fn read_file(fd: OwnedFd, max: u64) -> Result<Read, FileError> {
    regular(&fd)?;
    let mut file = std::fs::File::from(fd);
    let mut bytes = Vec::new();
    // One byte past the limit tells whether there was more.
    let limit = max.saturating_add(1);
    std::io::Read::read_to_end(&mut std::io::Read::take(&mut file, limit), &mut bytes)?;
    let truncated = bytes.len() as u64 > max;
    bytes.truncate(usize::try_from(max).unwrap_or(usize::MAX));
    Ok(Read { bytes, truncated })
}

/// Writes `bytes` as file `name` of directory `dir` (created, or replaced
/// whole unless it is not a regular file): a temp file beside it, then a
/// rename over it, so a reader sees the old file or the new one.
pub(super) fn replace_in(dir: &OwnedFd, name: &str, bytes: &[u8]) -> Result<(), FileError> {
    match fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => kind_is_file(FileType::from_raw_mode(st.st_mode))?,
        Err(Errno::NOENT) => {}
        Err(e) => return Err(e.into()),
    }
    // Unique per write: two writes of one file never share a temp file.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = format!(".{name}.iop-tmp-{}-{n}", std::process::id());
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = fs::openat(dir, tmp.as_str(), flags, Mode::from_raw_mode(0o644))?;
    let written = (|| {
        let mut file = std::fs::File::from(fd);
        std::io::Write::write_all(&mut file, bytes)?;
        file.sync_data()?;
        fs::renameat(dir, tmp.as_str(), dir, name).map_err(std::io::Error::from)
    })();
    if let Err(e) = written {
        let _ = fs::unlinkat(dir, tmp.as_str(), AtFlags::empty());
        return Err(e.into());
    }
    Ok(())
}

/// A path a request may name: relative, plain components, not `.iop`.
fn check(path: &str) -> Result<(), FileError> {
    if path.is_empty() || path.len() > MAX_PATH_BYTES || path.starts_with('/') || path.contains('\0') {
        return Err(FileError::PathInvalid);
    }
    if path.split('/').any(|c| c.is_empty() || c == "." || c == "..") {
        return Err(FileError::PathInvalid);
    }
    if path.split('/').next() == Some(RESERVED) {
        return Err(FileError::PathReserved);
    }
    Ok(())
}

fn regular(fd: &OwnedFd) -> Result<(), FileError> {
    kind_is_file(FileType::from_raw_mode(fs::fstat(fd.as_fd())?.st_mode))
}

fn kind_is_file(kind: FileType) -> Result<(), FileError> {
    match kind {
        FileType::RegularFile => Ok(()),
        FileType::Directory => Err(FileError::NotAFile),
        FileType::Symlink => Err(FileError::Symlink),
        _ => Err(FileError::SpecialFile),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#[path = "files_tests.rs"]
mod tests;
